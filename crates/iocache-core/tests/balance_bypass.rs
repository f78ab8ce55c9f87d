//! A load balancer's bypass (LBICA's tail bypass, SIB) sends single requests
//! around the cache while its controller switches write policies: checked
//! here against the data model of `common` (no read is stale, the backend
//! holds every write once flushed), with bypasses asked at random, under
//! every policy LBICA sets (WO, RO = `wa`, the configured one), with and
//! without inline dirty eviction.

mod common;

use common::{actions, any_inserting_write_policy, cache, ops_of, read_backend, Action, Harness};
use iocache_core::{AccessHints, Op, OpList, Request, WritePolicy};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Io(Action, bool),
    Controller(Option<WritePolicy>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (actions(64, 20, false), any::<bool>()).prop_map(|(a, bypass)| Step::Io(a, bypass)),
        1 => prop_oneof![
            Just(None),
            Just(Some(WritePolicy::WriteOnly)),
            Just(Some(WritePolicy::WriteAround)),
        ]
        .prop_map(Step::Controller),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn bypassed_requests_never_read_stale_data_nor_lose_writes(
        capacity in 1u64..8,
        line_shift in 0u32..4,
        configured in any_inserting_write_policy(),
        inline in any::<bool>(),
        steps in prop::collection::vec(step(), 1..150),
    ) {
        let c = cache(capacity, 512 << line_shift, |c| {
            c.write_policy = configured;
            c.inline_dirty_eviction = inline;
        });
        let mut h = Harness::new(c);
        for (t, s) in steps.into_iter().enumerate() {
            let now = t as u64;
            match s {
                Step::Io(Action::Read(v, s, n), bypass) => {
                    h.run_with(Request::read(v, s * 512, n * 512, now), AccessHints { balance_bypass: bypass, ..Default::default() })
                }
                Step::Io(Action::Write(v, s, n), bypass) => {
                    h.run_with(Request::write(v, s * 512, n * 512, now), AccessHints { balance_bypass: bypass, ..Default::default() })
                }
                Step::Io(other, _) => h.apply(other, now),
                Step::Controller(p) => h.cache.set_controller_policy(p),
            }
        }
        let stats = *h.cache.stats();
        h.flush_all_and_check_backend();
        prop_assert!(stats.balance_bypasses + stats.balance_bypasses_refused_dirty <= stats.requests);
    }
}

#[test]
fn a_clean_hit_is_read_from_the_backend_and_a_dirty_one_stays() {
    let mut c = cache(8, 4096, |c| c.write_policy = WritePolicy::WriteBack);
    let bypass = AccessHints {
        balance_bypass: true,
        ..Default::default()
    };
    // Line 0 clean (a read miss promotes it), line 1 dirty.
    ops_of(&mut c, Request::read(0, 0, 4096, 0));
    ops_of(&mut c, Request::write(0, 4096, 4096, 1));
    let mut ops = OpList::new();
    c.access_with(&Request::read(0, 0, 4096, 2), bypass, &mut ops)
        .unwrap();
    assert_eq!(ops.ops(), &[read_backend(0, 0, 4096, 0)]);
    c.access_with(&Request::read(0, 4096, 4096, 3), bypass, &mut ops)
        .unwrap();
    assert!(
        matches!(ops.ops(), [Op::ReadCache { .. }]),
        "dirty data is read from the cache: {:?}",
        ops.ops()
    );
    // A request over both lines touches dirty data: not bypassed at all.
    c.access_with(&Request::read(0, 0, 8192, 4), bypass, &mut ops)
        .unwrap();
    assert!(
        ops.ops().iter().all(|op| matches!(op, Op::ReadCache { .. })),
        "{:?}",
        ops.ops()
    );
    let s = c.stats();
    assert_eq!((s.balance_bypasses, s.balance_bypasses_refused_dirty), (1, 2));
    // A bypassed write of a clean line goes around the cache and drops its copy.
    c.access_with(&Request::write(0, 0, 4096, 5), bypass, &mut ops)
        .unwrap();
    assert!(ops.ops().iter().any(|op| matches!(op, Op::WriteBackend { .. })));
    assert!(!ops.ops().iter().any(|op| matches!(op, Op::WriteCache { .. })));
    assert_eq!(c.dirty_lines(), 1);
    c.check_invariants();
}
