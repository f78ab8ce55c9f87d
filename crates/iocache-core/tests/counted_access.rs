//! `Cache::access_counted` (the simulator's counting-only path: no op list)
//! must make exactly the decisions `Cache::access` makes: two caches fed the
//! same random requests, one through each, agree on every per-request
//! summary, every counter the simulator reports, the policy's own counters
//! and the final contents, for every registered policy, line sizes with one
//! and several bitmap words, every write policy and both promotion modes,
//! with reads short and longer than the counting walk's prefetch ring.

use iocache_core::policy::POLICIES;
use iocache_core::{
    Cache, CacheConfig, FlushOrder, LineKey, LineSize, OpList, PolicySpec, Promotion, Request, WritePolicy,
};
use proptest::prelude::*;

mod common;

#[derive(Clone, Debug)]
enum Step {
    Read {
        offset_sectors: u64,
        sectors: u64,
    },
    Write {
        offset_sectors: u64,
        sectors: u64,
    },
    /// Flush up to this many dirty lines (writes back, then completes).
    Flush(usize),
}

fn step() -> impl Strategy<Value = Step> {
    // A small address space so lines are hit again, partially and fully.
    prop_oneof![
        6 => (0u64..400, 1u64..40).prop_map(|(offset_sectors, sectors)| Step::Read { offset_sectors, sectors }),
        // Longer than the counting walk's 32-line prefetch ring at 512 B lines.
        1 => (0u64..400, 60u64..200).prop_map(|(offset_sectors, sectors)| Step::Read { offset_sectors, sectors }),
        3 => (0u64..400, 1u64..40).prop_map(|(offset_sectors, sectors)| Step::Write { offset_sectors, sectors }),
        1 => (1usize..8).prop_map(Step::Flush),
    ]
}

impl Step {
    /// The request of a read or write step, at `now`.
    fn request(&self, now: u64) -> Option<Request> {
        match *self {
            Step::Read {
                offset_sectors,
                sectors,
            } => Some(Request::read(0, offset_sectors * 512, sectors * 512, now)),
            Step::Write {
                offset_sectors,
                sectors,
            } => Some(Request::write(0, offset_sectors * 512, sectors * 512, now)),
            Step::Flush(_) => None,
        }
    }
}

/// A configuration of any registered policy, 1 to 47 lines of `512 << s`
/// bytes for an `s` of `line_shifts`; with that `s`.
fn any_config(line_shifts: Vec<u32>) -> impl Strategy<Value = (CacheConfig, u32)> {
    (0..POLICIES.len(), 1u64..48, prop::sample::select(line_shifts)).prop_map(
        |(policy, capacity, line_shift)| {
            let spec: PolicySpec = POLICIES[policy].name.parse().unwrap();
            (
                CacheConfig::new(capacity, LineSize::new(512 << line_shift).unwrap(), spec),
                line_shift,
            )
        },
    )
}

/// `a` and `b` hold every line the steps can touch (lines of `512 <<
/// line_shift` bytes) in the same state.
fn same_lines(a: &Cache, b: &Cache, line_shift: u32) -> Result<(), TestCaseError> {
    let lines_touched = (600 * 512) >> (9 + line_shift);
    for line_index in 0..=lines_touched {
        let key = LineKey {
            volume: 0,
            line_index,
        };
        prop_assert_eq!(a.line_state(key), b.line_state(key), "line {}", line_index);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn counted_access_decides_as_access_does(
        (mut config, line_shift) in any_config(vec![0, 1, 3, 7]),
        write_policy in prop::sample::select(&WritePolicy::ALL[..]),
        nhit in any::<bool>(),
        inline_dirty_eviction in any::<bool>(),
        steps in prop::collection::vec(step(), 1..200),
    ) {
        config.write_policy = write_policy;
        config.inline_dirty_eviction = inline_dirty_eviction;
        if nhit {
            config.promotion = Promotion::NHit { threshold: 2, trigger_percent: 0 };
        }
        let mut full = Cache::new(config.clone()).unwrap();
        let mut counted = Cache::new(config).unwrap();
        let (mut ops, mut tokens) = (OpList::new(), Vec::new());
        for (now, step) in steps.iter().enumerate() {
            let now = now as u64 * 1000;
            if let Step::Flush(lines) = *step {
                for cache in [&mut full, &mut counted] {
                    cache.begin_flush(FlushOrder::Oldest, lines, &mut ops, &mut tokens);
                    for token in &tokens {
                        cache.complete_flush(token, true);
                    }
                }
                continue;
            }
            let request = step.request(now).expect("a read or a write");
            let a = full.access(&request, &mut ops).unwrap();
            let b = counted.access_counted(&request, Default::default()).unwrap();
            prop_assert_eq!(a, b, "summary of {:?}", request);
            prop_assert_eq!(full.stats(), counted.stats(), "counters after {:?}", request);
        }
        prop_assert_eq!(full.policy_counters(), counted.policy_counters());
        prop_assert_eq!(full.resident_lines(), counted.resident_lines());
        prop_assert_eq!(full.dirty_lines(), counted.dirty_lines());
        same_lines(&full, &counted, line_shift)?;
        counted.check_invariants();
    }
}

/// The counting walk at the top of the address space (line indices near
/// 2^55) and over more lines than its 32-line prefetch ring, at 512 B and
/// 4 KiB lines, partial first and last lines included: as `access` decides.
#[test]
fn counted_access_at_the_top_of_the_address_space_and_over_long_reads() {
    let top = (u64::MAX / 512 - 400) * 512;
    let reads = [
        (top, 40),
        (top + 3 * 512, 390),
        (top + 20 * 512, 180),
        (0, 300),
        (7 * 512, 1000),
        (top + 399 * 512, 1),
        (top, 400),
    ];
    for line_bytes in [512u64, 4096] {
        let config = CacheConfig::new(16, LineSize::new(line_bytes).unwrap(), "lru".parse().unwrap());
        let mut full = Cache::new(config.clone()).unwrap();
        let mut counted = Cache::new(config).unwrap();
        let mut ops = OpList::new();
        for (now, &(offset_bytes, sectors)) in reads.iter().enumerate() {
            let request = Request::read(0, offset_bytes, sectors * 512, now as u64);
            let a = full.access(&request, &mut ops).unwrap();
            let b = counted.access_counted(&request, Default::default()).unwrap();
            assert_eq!(a, b, "summary of {request:?} at {line_bytes} B lines");
            assert_eq!(full.stats(), counted.stats(), "counters after {request:?}");
        }
        assert_eq!(full.resident_lines(), counted.resident_lines());
        counted.check_invariants();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// `Cache::prefetch_ahead` is a hint: a cache told about the next
    /// requests (as the simulator's runner does) decides
    /// exactly as one that is not, and any request, valid or not, is
    /// accepted without a panic.
    #[test]
    fn prefetch_ahead_changes_no_decision(
        (config, line_shift) in any_config(vec![0, 3]),
        steps in prop::collection::vec(step(), 1..150),
        odd_offset in any::<u64>(),
        odd_length in any::<u64>(),
    ) {
        let mut plain = Cache::new(config.clone()).unwrap();
        let mut hinted = Cache::new(config).unwrap();
        let requests: Vec<Request> = steps
            .iter()
            .enumerate()
            .filter_map(|(now, step)| step.request(now as u64))
            .collect();
        let odd = Request::read(7, odd_offset, odd_length, 0);
        for (at, request) in requests.iter().enumerate() {
            for ahead in requests.iter().skip(at + 1).take(3) {
                hinted.prefetch_ahead(ahead);
            }
            hinted.prefetch_ahead(&odd);
            let a = plain.access_counted(request, Default::default()).unwrap();
            let b = hinted.access_counted(request, Default::default()).unwrap();
            prop_assert_eq!(a, b, "summary of {:?}", request);
            prop_assert_eq!(plain.stats(), hinted.stats(), "counters after {:?}", request);
        }
        prop_assert_eq!(plain.policy_counters(), hinted.policy_counters());
        same_lines(&plain, &hinted, line_shift)?;
    }
}
