//! ReCA (TPDS'18 §3.1, Algorithm 2 CHARACTERIZATION)
//! decides what kind of request each one is from the requests around it:
//! *sequential*, *strided* (a small gap to a neighbour), *random*, plus an
//! *overlapped* flag and read or write. Both the ReCA replacement policy (to
//! accumulate per-line priorities) and the ReCA controller (to build the
//! per-window workload vector) need the same answer, so it lives here, with
//! bounded memory and no I/O.
//!
//! How a request is classified (Algorithm 1 ACCESS_HISTORY_MANAGER and
//! Algorithm 2, read as written): each stream keeps a queue of its last
//! `history` requests (64 in the paper). A new request joins the back; when
//! the queue is longer than `history`, the oldest request leaves and is
//! classified against the requests still queued, which are the ones that
//! came after it:
//!
//! - **sequential** if it is larger than `seq_size_bytes` (the paper's
//!   `Seq_threshold`) or one queued request begins exactly where it ends;
//! - else **strided** if one queued request begins less than
//!   `stride_bytes` (8 KiB in the paper) after it ends, or ends less than
//!   `stride_bytes` before it begins;
//! - else **random**;
//! - **overlapped** if its byte range shares at least one byte with a
//!   queued request's.
//!
//! Deviations, and why:
//! - §3.1's prose compares a request with the *earlier* ones, Algorithm 2
//!   with the queue left after it is popped (the *later* ones). We follow
//!   the algorithm (it is what sets the priorities); on a run of sequential
//!   requests the two differ only at its ends (the prose calls the first
//!   request random, the algorithm the last).
//! - Algorithm 2 tests overlap with strict inequalities, so two requests for
//!   the same range would not overlap; §3.1 defines an overlapped request as
//!   one that "shares a data page" with another. We test range intersection.
//! - Algorithm 2 stops looking at the first sequential match (`Break`),
//!   which can miss an overlap further down the queue; we look at every
//!   queued request.
//! - `Seq_threshold` has no value in the paper; the default is 128 KiB, the
//!   paper's large cache line: a request that fills a large line by itself
//!   is served by the disk like a sequential run.
//! - Streams: a queue per volume and process ([`StreamKey`]: the
//!   request's `process`, which traces with a PID (blkparse, FIU) carry and
//!   others leave 0, so their streams are per volume). The paper tags each
//!   request with its application (§4.2); a single queue would compare a
//!   request with other volumes' and processes' requests, which say nothing
//!   of its own stream's pattern.
//! - Age rule (ours): a request of a stream that goes quiet would wait in
//!   its queue indefinitely, and a window's workload vector would then count
//!   requests of long ago; so a request also leaves after `max_wait` (4096)
//!   requests of any stream have arrived after it, classified against the
//!   requests of its stream that came meanwhile. A stream whose queue
//!   empties is forgotten. At most `max_streams` (4096) streams: when a new
//!   one would exceed that, the least recently used stream's queued
//!   requests are classified against each other and it is dropped. Memory:
//!   at most `max_wait` queued requests and `max_wait` arrival records.

use std::collections::VecDeque;

use crate::addr::{IoKind, Request, VolumeId};
use crate::fasthash::FxHashMap;

/// Where a request lies relative to its neighbours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessClass {
    Sequential,
    Strided,
    Random,
}

impl AccessClass {
    pub const ALL: [AccessClass; 3] = [AccessClass::Sequential, AccessClass::Strided, AccessClass::Random];

    /// 0, 1, 2 in the order of [`AccessClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            AccessClass::Sequential => "sequential",
            AccessClass::Strided => "strided",
            AccessClass::Random => "random",
        }
    }
}

/// The class of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestClass {
    pub access: AccessClass,
    pub overlapped: bool,
    pub kind: IoKind,
}

/// What a request's stream is: its volume and the process that issued it
/// (0 when the trace or driver does not say).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    pub volume: VolumeId,
    pub process: u32,
}

impl StreamKey {
    pub fn of(request: &Request) -> StreamKey {
        StreamKey {
            volume: request.volume,
            process: request.process,
        }
    }
}

/// A request that left its stream's queue, with its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classified {
    pub volume: VolumeId,
    pub process: u32,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    pub class: RequestClass,
}

/// The classifier's parameters (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassifierParams {
    /// Requests kept per stream (the paper: 64).
    pub history: usize,
    /// A gap below this is strided (the paper: 8 KiB).
    pub stride_bytes: u64,
    /// A request larger than this is sequential by itself.
    pub seq_size_bytes: u64,
    /// Streams tracked at once.
    pub max_streams: usize,
    /// A request waits at most this many requests (of any stream) before
    /// it is classified, even if its stream's queue is not full.
    pub max_wait: u64,
}

impl Default for ClassifierParams {
    fn default() -> Self {
        ClassifierParams {
            history: 64,
            stride_bytes: 8 << 10,
            seq_size_bytes: 128 << 10,
            max_streams: 4096,
            max_wait: 4096,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Queued {
    begin: u64,
    end: u64,
    kind: IoKind,
    /// Arrival number.
    tick: u64,
}

struct Stream {
    queue: VecDeque<Queued>,
    last_used: u64,
}

/// Per-stream request queues and the classification of requests leaving them.
pub struct Classifier {
    params: ClassifierParams,
    streams: FxHashMap<StreamKey, Stream>,
    /// (arrival number, stream) of the last `max_wait` requests, oldest
    /// first, for the age rule.
    arrivals: VecDeque<(u64, StreamKey)>,
    tick: u64,
    dropped_streams: u64,
}

impl Classifier {
    /// `history`, `max_streams` and `max_wait` are raised to at least 1.
    pub fn new(mut params: ClassifierParams) -> Self {
        params.history = params.history.max(1);
        params.max_streams = params.max_streams.max(1);
        params.max_wait = params.max_wait.max(1);
        Classifier {
            params,
            streams: FxHashMap::default(),
            arrivals: VecDeque::new(),
            tick: 0,
            dropped_streams: 0,
        }
    }

    pub fn params(&self) -> ClassifierParams {
        self.params
    }

    /// Streams dropped to stay within `max_streams`.
    pub fn dropped_streams(&self) -> u64 {
        self.dropped_streams
    }

    /// Requests waiting in queues (not classified yet).
    pub fn queued(&self) -> usize {
        self.streams.values().map(|s| s.queue.len()).sum()
    }

    /// Queues `request`; appends to `out` the request that left its
    /// stream's queue (if any), those that waited `max_wait` requests, and
    /// those of a stream dropped to make room.
    pub fn push(&mut self, request: &Request, out: &mut Vec<Classified>) {
        self.tick += 1;
        let volume = StreamKey::of(request);
        if !self.streams.contains_key(&volume) && self.streams.len() >= self.params.max_streams {
            let oldest = self
                .streams
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(&v, _)| v)
                .expect("at least one stream");
            let mut stream = self.streams.remove(&oldest).expect("present");
            self.dropped_streams += 1;
            Self::drain(&self.params, oldest, &mut stream.queue, out);
            // Their entries in `arrivals` find no queue and are skipped.
        }
        let history = self.params.history;
        let stream = self.streams.entry(volume).or_insert_with(|| Stream {
            queue: VecDeque::with_capacity(history + 1),
            last_used: 0,
        });
        stream.last_used = self.tick;
        stream.queue.push_back(Queued {
            begin: request.offset_bytes,
            end: request.offset_bytes.saturating_add(request.length_bytes),
            kind: request.kind,
            tick: self.tick,
        });
        if stream.queue.len() > history {
            let old = stream.queue.pop_front().expect("non-empty");
            out.push(classify(&self.params, volume, &old, stream.queue.iter()));
        }
        self.arrivals.push_back((self.tick, volume));
        // The age rule: requests that waited `max_wait` requests leave now
        // (those that left by the history rule are skipped); a stream left
        // empty is forgotten, so streams stay within `max_wait`.
        while let Some(&(tick, v)) = self.arrivals.front() {
            if self.tick - tick < self.params.max_wait {
                break;
            }
            self.arrivals.pop_front();
            let Some(stream) = self.streams.get_mut(&v) else {
                continue;
            };
            if stream.queue.front().is_some_and(|q| q.tick == tick) {
                let old = stream.queue.pop_front().expect("non-empty");
                out.push(classify(&self.params, v, &old, stream.queue.iter()));
            }
            if stream.queue.is_empty() {
                self.streams.remove(&v);
            }
        }
    }

    /// Classifies every queued request (oldest first, each against those
    /// after it), leaving the queues empty: the end of a trace.
    pub fn drain_all(&mut self, out: &mut Vec<Classified>) {
        let mut volumes: Vec<StreamKey> = self.streams.keys().copied().collect();
        volumes.sort_unstable();
        for v in volumes {
            let mut stream = self.streams.remove(&v).expect("present");
            Self::drain(&self.params, v, &mut stream.queue, out);
        }
        self.arrivals.clear();
    }

    fn drain(
        params: &ClassifierParams,
        volume: StreamKey,
        queue: &mut VecDeque<Queued>,
        out: &mut Vec<Classified>,
    ) {
        while let Some(old) = queue.pop_front() {
            out.push(classify(params, volume, &old, queue.iter()));
        }
    }
}

/// Algorithm 2 CHARACTERIZATION for `old` against `others` (with the
/// deviations of the module doc).
fn classify<'a>(
    params: &ClassifierParams,
    stream: StreamKey,
    old: &Queued,
    others: impl Iterator<Item = &'a Queued>,
) -> Classified {
    let mut sequential = old.end - old.begin > params.seq_size_bytes;
    let mut strided = false;
    let mut overlapped = false;
    for t in others {
        if old.end == t.begin {
            sequential = true;
        } else if (old.begin > t.end && old.begin - t.end < params.stride_bytes)
            || (old.end < t.begin && t.begin - old.end < params.stride_bytes)
        {
            strided = true;
        }
        if old.begin < t.end && t.begin < old.end {
            overlapped = true;
        }
    }
    let access = if sequential {
        AccessClass::Sequential
    } else if strided {
        AccessClass::Strided
    } else {
        AccessClass::Random
    };
    Classified {
        volume: stream.volume,
        process: stream.process,
        offset_bytes: old.begin,
        length_bytes: old.end - old.begin,
        class: RequestClass {
            access,
            overlapped,
            kind: old.kind,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    fn params(history: usize) -> ClassifierParams {
        ClassifierParams {
            history,
            ..ClassifierParams::default()
        }
    }

    /// Classifies `requests` (volume, offset, length, write) and returns the
    /// classes in arrival order.
    fn run(p: ClassifierParams, requests: &[(u32, u64, u64, bool)]) -> Vec<Classified> {
        let mut c = Classifier::new(p);
        let mut out = Vec::new();
        for (i, &(v, off, len, w)) in requests.iter().enumerate() {
            let r = if w {
                Request::write(v, off, len, i as u64)
            } else {
                Request::read(v, off, len, i as u64)
            };
            c.push(&r, &mut out);
        }
        c.drain_all(&mut out);
        assert_eq!(c.queued(), 0);
        out
    }

    fn accesses(out: &[Classified]) -> Vec<AccessClass> {
        out.iter().map(|c| c.class.access).collect()
    }

    #[test]
    fn a_sequential_run_is_sequential_but_its_last_request() {
        let reqs: Vec<_> = (0..10).map(|i| (0, i * 4 * K, 4 * K, false)).collect();
        let out = run(params(4), &reqs);
        let mut want = vec![AccessClass::Sequential; 9];
        want.push(AccessClass::Random);
        assert_eq!(accesses(&out), want);
        assert!(out
            .iter()
            .all(|c| !c.class.overlapped && c.class.kind == IoKind::Read));
    }

    #[test]
    fn gaps_below_the_stride_are_strided_and_above_are_random() {
        // 4 KiB requests with a 4 KiB gap: strided (gap < 8 KiB).
        let strided: Vec<_> = (0..6).map(|i| (0, i * 8 * K, 4 * K, true)).collect();
        let out = run(params(64), &strided);
        assert!(accesses(&out[..5]).iter().all(|&a| a == AccessClass::Strided));
        assert!(out.iter().all(|c| c.class.kind == IoKind::Write));
        // A gap of exactly 8 KiB is not below the threshold: random.
        let wide: Vec<_> = (0..6).map(|i| (0, i * 12 * K, 4 * K, false)).collect();
        assert!(accesses(&run(params(64), &wide))
            .iter()
            .all(|&a| a == AccessClass::Random));
        // A backward stride counts too: each request ends 4 KiB before the
        // previous one begins.
        let backward: Vec<_> = (0..6).map(|i| (0, (100 - 8 * i) * K, 4 * K, false)).collect();
        assert!(accesses(&run(params(64), &backward)[..5])
            .iter()
            .all(|&a| a == AccessClass::Strided));
    }

    #[test]
    fn a_large_request_is_sequential_by_itself() {
        let out = run(params(64), &[(0, 0, 256 * K, false), (0, 10 << 30, 4 * K, false)]);
        assert_eq!(accesses(&out), vec![AccessClass::Sequential, AccessClass::Random]);
    }

    #[test]
    fn overlaps_are_flagged_including_identical_ranges() {
        let out = run(
            params(64),
            &[
                (0, 0, 8 * K, false),
                (0, 1 << 30, 4 * K, false),
                (0, 4 * K, 8 * K, false),  // overlaps the first
                (0, 1 << 30, 4 * K, true), // same range as the second
                (0, 5 << 30, 4 * K, false),
            ],
        );
        let over: Vec<bool> = out.iter().map(|c| c.class.overlapped).collect();
        assert_eq!(over, vec![true, true, false, false, false]);
        // Touching ranges (end == begin) are sequential, not overlapped.
        let out = run(params(64), &[(0, 0, 4 * K, false), (0, 4 * K, 4 * K, false)]);
        assert!(!out[0].class.overlapped);
        assert_eq!(out[0].class.access, AccessClass::Sequential);
    }

    #[test]
    fn only_the_queue_is_looked_at() {
        // The neighbour arrives 3 requests later: found with a history of 3,
        // not with 2.
        let reqs = [
            (0, 0, 4 * K, false),
            (0, 1 << 30, 4 * K, false),
            (0, 2 << 30, 4 * K, false),
            (0, 4 * K, 4 * K, false),
        ];
        assert_eq!(run(params(3), &reqs)[0].class.access, AccessClass::Sequential);
        assert_eq!(run(params(2), &reqs)[0].class.access, AccessClass::Random);
    }

    #[test]
    fn interleaved_streams_of_different_volumes_are_kept_apart() {
        // Two volumes with the same sequential offsets, interleaved with
        // random requests on a third: each volume's run stays sequential
        // although its neighbours are many requests away in arrival order.
        let mut reqs = Vec::new();
        for i in 0..20u64 {
            reqs.push((1, i * 4 * K, 4 * K, false));
            for j in 0..5u64 {
                reqs.push((9, ((i * 5 + j) * 7919 % 1000) << 20, 4 * K, false));
            }
            reqs.push((2, i * 4 * K, 4 * K, true));
        }
        let out = run(params(4), &reqs);
        for v in [1, 2] {
            let classes: Vec<_> = out.iter().filter(|c| c.volume == v).collect();
            assert_eq!(classes.len(), 20);
            assert!(
                classes[..19]
                    .iter()
                    .all(|c| c.class.access == AccessClass::Sequential),
                "{v}"
            );
            assert!(classes.iter().all(|c| !c.class.overlapped));
        }
        assert!(out
            .iter()
            .filter(|c| c.volume == 9)
            .all(|c| c.class.access == AccessClass::Random));
        // In one volume the same interleaving hides the runs from a
        // history of 4.
        let merged: Vec<_> = reqs
            .iter()
            .map(|&(v, off, len, w)| (0, off + u64::from(v) * (1 << 40), len, w))
            .collect();
        let out = run(params(4), &merged);
        let seq = out
            .iter()
            .filter(|c| c.class.access == AccessClass::Sequential)
            .count();
        assert_eq!(seq, 0);
    }

    #[test]
    fn processes_of_one_volume_are_streams_of_their_own() {
        // 100 processes read files of their own sequentially, in turn, on
        // one volume: a history of 64 never holds a request's successor
        // when the volume is one stream, always when each process is one.
        let mut reqs = Vec::new();
        for i in 0..20u64 {
            for p in 0..100u32 {
                let offset = (u64::from(p) << 30) + i * 4 * K;
                reqs.push(Request::read(3, offset, 4 * K, 0).from_process(p + 1));
            }
        }
        let classify_all = |reqs: &[Request]| {
            let mut c = Classifier::new(params(64));
            let mut out = Vec::new();
            for r in reqs {
                c.push(r, &mut out);
            }
            c.drain_all(&mut out);
            out
        };
        let out = classify_all(&reqs);
        assert_eq!(out.len(), 2000);
        let sequential = |out: &[Classified]| {
            out.iter()
                .filter(|c| c.class.access == AccessClass::Sequential)
                .count()
        };
        // All but each process's last request.
        assert_eq!(sequential(&out), 1900);
        assert!(out
            .iter()
            .all(|c| c.volume == 3 && (1..=100).contains(&c.process)));
        // The same requests without a process: one stream, no run seen.
        let anonymous: Vec<Request> = reqs.iter().map(|r| r.from_process(0)).collect();
        assert_eq!(sequential(&classify_all(&anonymous)), 0);
    }

    #[test]
    fn a_request_waits_at_most_max_wait_requests() {
        let p = ClassifierParams {
            max_wait: 10,
            ..params(64)
        };
        let mut c = Classifier::new(p);
        let mut out = Vec::new();
        // Volume 1 sends two adjacent requests, then goes quiet.
        c.push(&Request::read(1, 0, 4096, 0), &mut out);
        c.push(&Request::read(1, 4096, 4096, 0), &mut out);
        for i in 0..8u64 {
            c.push(&Request::read(2, i << 30, 4096, 0), &mut out);
        }
        assert!(out.is_empty());
        // The 10th request after the first makes it leave, classified
        // against its stream's later request (sequential).
        c.push(&Request::read(2, 9 << 30, 4096, 0), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].volume, out[0].class.access), (1, AccessClass::Sequential));
        c.push(&Request::read(2, 10 << 30, 4096, 0), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!((out[1].volume, out[1].class.access), (1, AccessClass::Random));
        // Nothing waits longer than 10 requests, so at most 10 are queued.
        for i in 0..100u64 {
            c.push(&Request::read((i % 7) as u32, i << 20, 4096, 0), &mut out);
            assert!(c.queued() <= 10);
        }
    }

    #[test]
    fn streams_beyond_the_bound_are_dropped_after_classification() {
        let p = ClassifierParams {
            max_streams: 2,
            ..params(64)
        };
        let mut c = Classifier::new(p);
        let mut out = Vec::new();
        for v in 0..5u32 {
            c.push(&Request::read(v, 0, 4096, 0), &mut out);
            c.push(&Request::read(v, 4096, 4096, 0), &mut out);
        }
        assert_eq!(c.dropped_streams(), 3);
        assert_eq!(out.len(), 6);
        assert!(c.queued() <= 2 * 64);
        assert_eq!(out[0].class.access, AccessClass::Sequential);
    }
}

#[cfg(test)]
mod model_tests {
    use super::*;
    use proptest::prelude::*;

    /// Request `i` of one stream is compared with requests `i+1 ..= i+history`
    /// (those in the queue when it leaves; fewer at the end of the trace).
    fn naive(p: &ClassifierParams, reqs: &[(u64, u64, bool)]) -> Vec<(AccessClass, bool)> {
        (0..reqs.len())
            .map(|i| {
                let (b, len, _) = reqs[i];
                let e = b + len;
                let later = &reqs[i + 1..reqs.len().min(i + 1 + p.history)];
                let seq = len > p.seq_size_bytes || later.iter().any(|&(tb, _, _)| tb == e);
                let strided = later.iter().any(|&(tb, tl, _)| {
                    let te = tb + tl;
                    (b > te && b - te < p.stride_bytes) || (e < tb && tb - e < p.stride_bytes)
                });
                let over = later.iter().any(|&(tb, tl, _)| b < tb + tl && tb < e);
                let access = if seq {
                    AccessClass::Sequential
                } else if strided {
                    AccessClass::Strided
                } else {
                    AccessClass::Random
                };
                (access, over)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn the_classifier_matches_a_direct_reading_of_its_definition(
            history in 1usize..6,
            reqs in prop::collection::vec((0u64..48, 1u64..5, any::<bool>()), 1..60),
        ) {
            let p = ClassifierParams { history, stride_bytes: 2048, seq_size_bytes: 1536, max_streams: 4, max_wait: 1000 };
            let reqs: Vec<(u64, u64, bool)> = reqs.into_iter().map(|(s, n, w)| (s * 512, n * 512, w)).collect();
            let mut c = Classifier::new(p);
            let mut out = Vec::new();
            for &(b, len, w) in &reqs {
                let r = if w { Request::write(3, b, len, 0) } else { Request::read(3, b, len, 0) };
                c.push(&r, &mut out);
            }
            c.drain_all(&mut out);
            let got: Vec<(AccessClass, bool)> = out.iter().map(|c| (c.class.access, c.class.overlapped)).collect();
            prop_assert_eq!(got, naive(&p, &reqs));
            for (c, &(b, len, w)) in out.iter().zip(&reqs) {
                prop_assert_eq!((c.offset_bytes, c.length_bytes), (b, len));
                prop_assert_eq!(c.class.kind == IoKind::Write, w);
            }
        }
    }
}
