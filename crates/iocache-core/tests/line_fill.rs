//! Whole-line fills (`Fill::Line`) against request fills and a reference
//! model: the same lines are resident either way (the policy sees the
//! same line accesses), a line fill never hits less, on reads alone every
//! access to a resident line is a full hit (an LRU of line keys counts
//! them), line-aligned requests behave the same under both, and the ops of
//! a line fill cover exactly what they must in the widened buffer.

use std::collections::VecDeque;

use iocache_core::{Cache, CacheConfig, Fill, IoKind, LineKey, LineSize, Op, OpList, PolicySpec, Request};
use proptest::prelude::*;

const LINE: u64 = 4096;

fn cache(lines: u64, fill: Fill) -> Cache {
    let mut c = CacheConfig::new(lines, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    c.fill = fill;
    Cache::new(c).unwrap()
}

/// Requests of 1 to 24 sectors at any sector of a small range, reads or
/// writes.
fn requests(reads_only: bool) -> impl Strategy<Value = Vec<(bool, u64, u64)>> {
    prop::collection::vec((any::<bool>(), 0u64..512, 1u64..=24), 1..300)
        .prop_map(move |v| v.into_iter().map(|(w, s, n)| (w && !reads_only, s, n)).collect())
}

fn request(write: bool, sector: u64, sectors: u64, now: u64) -> Request {
    match write {
        true => Request::write(0, sector * 512, sectors * 512, now),
        false => Request::read(0, sector * 512, sectors * 512, now),
    }
}

proptest! {
    #[test]
    fn the_same_lines_are_resident_and_a_line_fill_never_hits_less(trace in requests(false)) {
        let (mut by_request, mut by_line) = (cache(16, Fill::Request), cache(16, Fill::Line));
        let mut ops = OpList::new();
        for (i, &(write, sector, n)) in trace.iter().enumerate() {
            let r = request(write, sector, n, i as u64);
            let a = by_request.access(&r, &mut ops).unwrap();
            let b = by_line.access(&r, &mut ops).unwrap();
            prop_assert_eq!(a.lines, b.lines);
            prop_assert!(b.full_hits >= a.full_hits, "request {}: {:?} against {:?}", i, b, a);
            prop_assert_eq!(b.line_origin, r.kind == IoKind::Read);
            for line_index in 0..70 {
                let key = LineKey { volume: 0, line_index };
                prop_assert_eq!(by_request.line_state(key).is_some(), by_line.line_state(key).is_some());
            }
        }
        by_line.check_invariants();
    }

    #[test]
    fn on_reads_every_access_to_a_resident_line_is_a_full_hit(trace in requests(true)) {
        let mut c = cache(16, Fill::Line);
        let mut ops = OpList::new();
        // The reference: an LRU of line keys.
        let mut lru: VecDeque<u64> = VecDeque::new();
        let mut expected_hits = 0u64;
        for (i, &(_, sector, n)) in trace.iter().enumerate() {
            let r = request(false, sector, n, i as u64);
            c.access(&r, &mut ops).unwrap();
            let first = sector * 512 / LINE;
            let last = (sector + n) * 512 / LINE - u64::from((sector + n) * 512 % LINE == 0);
            for line in first..=last {
                match lru.iter().position(|&l| l == line) {
                    Some(at) => {
                        expected_hits += 1;
                        lru.remove(at);
                    }
                    None if lru.len() == 16 => {
                        lru.pop_front();
                    }
                    None => {}
                }
                lru.push_back(line);
            }
        }
        prop_assert_eq!(c.stats().full_hits, expected_hits);
        prop_assert_eq!(c.stats().partial_hits, 0);
    }

    #[test]
    fn line_aligned_requests_behave_the_same(trace in prop::collection::vec((any::<bool>(), 0u64..64, 1u64..=4), 1..200)) {
        let (mut by_request, mut by_line) = (cache(8, Fill::Request), cache(8, Fill::Line));
        let (mut ops_a, mut ops_b) = (OpList::new(), OpList::new());
        for (i, &(write, line, n)) in trace.iter().enumerate() {
            let r = request(write, line * 8, n * 8, i as u64);
            by_request.access(&r, &mut ops_a).unwrap();
            by_line.access(&r, &mut ops_b).unwrap();
            prop_assert_eq!(ops_a.ops(), ops_b.ops());
        }
        prop_assert_eq!(by_request.stats(), by_line.stats());
    }

    #[test]
    fn a_line_fill_reads_the_request_and_fills_whole_lines(trace in requests(false)) {
        let mut c = cache(16, Fill::Line);
        let mut ops = OpList::new();
        for (i, &(write, sector, n)) in trace.iter().enumerate() {
            let r = request(write, sector, n, i as u64);
            let summary = c.access(&r, &mut ops).unwrap();
            if write {
                continue;
            }
            prop_assert!(summary.line_origin);
            let shift = r.offset_bytes % LINE;
            let widened = (r.offset_bytes + r.length_bytes).div_ceil(LINE) * LINE - (r.offset_bytes - shift);
            // What reaches the buffer: every byte of the request exactly once.
            let mut read = vec![0u8; widened as usize];
            for op in ops.ops() {
                let (at, len) = match *op {
                    Op::ReadCache { buffer_offset_bytes, length_bytes, .. } => (buffer_offset_bytes, u64::from(length_bytes)),
                    Op::ReadBackend { buffer_offset_bytes, length_bytes, .. } => (buffer_offset_bytes, length_bytes),
                    Op::WriteCache { buffer_offset_bytes, length_bytes, .. } => {
                        prop_assert!(buffer_offset_bytes + u64::from(length_bytes) <= widened);
                        continue;
                    }
                    _ => continue,
                };
                prop_assert!(at + len <= widened, "op {:?} outside {} bytes", op, widened);
                for b in &mut read[at as usize..(at + len) as usize] {
                    *b += 1;
                }
            }
            for (i, &b) in read.iter().enumerate() {
                let inside = (i as u64) >= shift && (i as u64) < shift + r.length_bytes;
                if inside {
                    prop_assert_eq!(b, 1, "byte {} of the request read {} times", i, b);
                }
            }
        }
        c.check_invariants();
    }
}
