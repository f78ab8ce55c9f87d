//! Sequential cutoff: large sequential streams bypass the cache, as Open CAS
//! and bcache do, so a backup or a scan does not flush the working set.
//!
//! The detector follows up to `streams` concurrent streams (per volume and
//! direction), each identified by where its last request ended; a request
//! that starts there continues the stream. Once a stream has carried
//! `threshold_bytes`, its further requests bypass the cache. The table is
//! fixed-size and replaces its least recently used stream, so memory is
//! bounded. Open CAS's default threshold is 1 MiB and it tracks several
//! streams (its `OCF_SEQ_CUTOFF_MAX_STREAMS`); bcache's default cutoff is
//! 4 MiB. We default to 1 MiB and 16 streams.

use std::fmt;
use std::str::FromStr;

use crate::addr::{IoKind, Request, VolumeId};
use crate::error::CoreError;
use crate::units::{format_byte_size, parse_byte_size};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqCutoff {
    Off,
    On { threshold_bytes: u64, streams: u32 },
}

impl SeqCutoff {
    pub const SYNTAX: &'static str =
        "off, or a byte threshold with an optional stream count: 1MiB[:streams=16]";
}

impl fmt::Display for SeqCutoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SeqCutoff::Off => f.write_str("off"),
            SeqCutoff::On {
                threshold_bytes,
                streams,
            } => write!(f, "{}:streams={streams}", format_byte_size(threshold_bytes)),
        }
    }
}

impl FromStr for SeqCutoff {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t == "off" {
            return Ok(SeqCutoff::Off);
        }
        let bad = |reason: String| CoreError::BadParameter {
            given: s.to_string(),
            reason,
        };
        let mut parts = t.split(':');
        let threshold_bytes = parse_byte_size(parts.next().unwrap_or(""))
            .map_err(|e| bad(format!("{e}; expected {}", Self::SYNTAX)))?;
        if threshold_bytes == 0 {
            return Err(bad("the threshold must be above 0 (use `off` to disable)".into()));
        }
        let mut streams = 16;
        for part in parts {
            match part.split_once('=') {
                Some(("streams", n)) => streams = parse_streams(n).map_err(bad)?,
                _ => {
                    return Err(bad(format!(
                        "unknown parameter `{part}`; expected {}",
                        Self::SYNTAX
                    )))
                }
            }
        }
        Ok(SeqCutoff::On {
            threshold_bytes,
            streams,
        })
    }
}

/// A stream table's size, as `streams=N` gives it (1 to 1024).
pub(crate) fn parse_streams(n: &str) -> Result<u32, String> {
    n.parse()
        .ok()
        .filter(|n| (1..=1024).contains(n))
        .ok_or_else(|| format!("streams must be 1 to 1024, got `{n}`"))
}

/// One stream of a [`StreamTable`]: requests of one volume and direction,
/// each starting where the one before it ended.
#[derive(Clone, Copy, Debug)]
pub struct Stream<T> {
    pub volume: VolumeId,
    pub kind: IoKind,
    /// Where the stream's last request ended: the next one starts here.
    pub next_offset_bytes: u64,
    /// Bytes the stream has carried, its last request included.
    pub bytes: u64,
    /// Requests in the stream, its last included (1: a new stream).
    pub requests: u64,
    last_used: u64,
    /// What the table's user keeps per stream (reset for a new stream).
    pub state: T,
}

/// A fixed-size table of concurrent sequential streams, the least recently
/// used replaced by a new one: the detection that the sequential cutoff and
/// the readahead share.
#[derive(Clone, Debug)]
pub struct StreamTable<T> {
    streams: Vec<Stream<T>>,
    capacity: usize,
    clock: u64,
}

impl<T: Copy + Default> StreamTable<T> {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a stream table holds at least one stream");
        StreamTable {
            streams: Vec::with_capacity(capacity),
            capacity,
            clock: 0,
        }
    }

    /// Records `request`: the stream it continues, or a new one (replacing
    /// the least recently used when the table is full).
    pub fn observe(&mut self, request: &Request) -> &mut Stream<T> {
        self.clock += 1;
        let end = request.offset_bytes + request.length_bytes;
        let continued = self.streams.iter().position(|s| {
            s.volume == request.volume
                && s.kind == request.kind
                && s.next_offset_bytes == request.offset_bytes
        });
        let at = match continued {
            Some(at) => {
                let s = &mut self.streams[at];
                s.bytes = s.bytes.saturating_add(request.length_bytes);
                s.requests += 1;
                s.next_offset_bytes = end;
                s.last_used = self.clock;
                at
            }
            None => {
                let fresh = Stream {
                    volume: request.volume,
                    kind: request.kind,
                    next_offset_bytes: end,
                    bytes: request.length_bytes,
                    requests: 1,
                    last_used: self.clock,
                    state: T::default(),
                };
                if self.streams.len() < self.capacity {
                    self.streams.push(fresh);
                    self.streams.len() - 1
                } else {
                    let (at, _) = self
                        .streams
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, s)| s.last_used)
                        .expect("a full table has streams");
                    self.streams[at] = fresh;
                    at
                }
            }
        };
        &mut self.streams[at]
    }
}

/// The sequential cutoff's stream table.
pub struct SeqDetector {
    config: SeqCutoff,
    table: StreamTable<()>,
}

impl SeqDetector {
    pub fn new(config: SeqCutoff) -> Self {
        let streams = match config {
            SeqCutoff::Off => 1,
            SeqCutoff::On { streams, .. } => streams as usize,
        };
        SeqDetector {
            config,
            table: StreamTable::new(streams),
        }
    }

    /// Records `request` and says whether it should bypass the cache.
    #[inline]
    pub fn bypass(&mut self, request: &Request) -> bool {
        match self.config {
            SeqCutoff::Off => false,
            SeqCutoff::On { threshold_bytes, .. } => self.bypass_on(request, threshold_bytes),
        }
    }

    /// [`SeqDetector::bypass`] with the cutoff on: out of line, so that a
    /// request costs a compare while it is off.
    #[inline(never)]
    fn bypass_on(&mut self, request: &Request, threshold_bytes: u64) -> bool {
        // The request that crosses the threshold is the first to bypass.
        self.table.observe(request).bytes >= threshold_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_refuses, assert_round_trips};

    #[test]
    fn parses() {
        assert_eq!("off".parse::<SeqCutoff>().unwrap(), SeqCutoff::Off);
        assert_eq!(
            "1MiB".parse::<SeqCutoff>().unwrap(),
            SeqCutoff::On {
                threshold_bytes: 1 << 20,
                streams: 16
            }
        );
        assert_round_trips::<SeqCutoff>(&["4MiB:streams=2"]);
        assert_refuses(str::parse::<SeqCutoff>, &["0", "1MiB:streams=0", "1MiB:lanes=2"]);
    }

    #[test]
    fn a_stream_bypasses_once_it_crosses_the_threshold() {
        let mut d = SeqDetector::new("16KiB:streams=2".parse().unwrap());
        let r = |offset: u64| Request::read(0, offset, 4096, 0);
        let decisions: Vec<bool> = (0..6).map(|i| d.bypass(&r(i * 4096))).collect();
        assert_eq!(decisions, vec![false, false, false, true, true, true]);
        // A random request is its own (short) stream.
        assert!(!d.bypass(&Request::read(0, 1 << 30, 4096, 0)));
    }

    #[test]
    fn concurrent_streams_are_tracked_separately_and_the_oldest_is_replaced() {
        let mut d = SeqDetector::new("8KiB:streams=2".parse().unwrap());
        let a = |i: u64| Request::read(0, i * 4096, 4096, 0);
        let b = |i: u64| Request::read(0, (1 << 30) + i * 4096, 4096, 0);
        let w = |i: u64| Request::write(0, i * 4096, 4096, 0);
        assert!(!d.bypass(&a(0)));
        assert!(!d.bypass(&b(0)));
        assert!(d.bypass(&a(1)), "stream a reached 8 KiB");
        assert!(d.bypass(&b(1)), "stream b reached 8 KiB");
        // A write at a's position is another direction: a new stream, replacing the oldest (a).
        assert!(!d.bypass(&w(2)));
        assert!(!d.bypass(&a(2)), "stream a was forgotten");
        // Other volume, same offset: not a continuation.
        assert!(!d.bypass(&Request::read(1, (1 << 30) + 2 * 4096, 4096, 0)));
    }
}
