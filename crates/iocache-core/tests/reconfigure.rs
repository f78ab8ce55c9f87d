//! Every knob changed while the cache serves: the write
//! policy, a controller's policy, a failed cache device, the replacement
//! policy, promotion, the sequential cutoff, write-miss bypass, cleaning
//! and the dirty cap, switched at random between reads, writes and flushes.
//! Checked against the data model of `common` (every read returns the
//! latest write, the backend holds every write once flushed) and the
//! cache's own invariants; a replacement-policy switch keeps every cached
//! line.

mod common;

use common::{actions, Action, Harness};
use iocache_core::{
    Cache, CacheConfig, CleaningPolicy, LineKey, LineSize, PolicySpec, Promotion, SeqCutoff, WritePolicy,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Knob {
    Controller(Option<WritePolicy>),
    DeviceFailed(bool),
    Replacement(&'static str),
    Promotion(&'static str),
    SeqCutoff(&'static str),
    WriteMissBypass(bool),
    Cleaning(&'static str),
    DirtyCap(Option<u64>),
}

fn knob() -> impl Strategy<Value = Knob> {
    prop_oneof![
        proptest::option::of(common::any_write_policy()).prop_map(Knob::Controller),
        any::<bool>().prop_map(Knob::DeviceFailed),
        prop::sample::select(vec![
            "lru",
            "arc",
            "fifo",
            "clock",
            "2q",
            "s3fifo",
            "sieve",
            "lfu",
            "smq",
            "larc",
            "reca",
            "reca:evict=lru:neighbours=2"
        ])
        .prop_map(Knob::Replacement),
        prop::sample::select(vec!["always", "nhit:2", "nhit:3"]).prop_map(Knob::Promotion),
        prop::sample::select(vec!["off", "4KiB:streams=2", "16KiB"]).prop_map(Knob::SeqCutoff),
        any::<bool>().prop_map(Knob::WriteMissBypass),
        prop::sample::select(vec!["nop", "aggressive"]).prop_map(Knob::Cleaning),
        proptest::option::of(0u64..6).prop_map(Knob::DirtyCap),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    Io(Action),
    Set(Knob),
}

fn resident_keys(cache: &Cache, volumes: u32, lines: u64) -> Vec<LineKey> {
    let mut keys = Vec::new();
    for volume in 0..volumes {
        for line_index in 0..lines {
            let key = LineKey { volume, line_index };
            if cache.line_state(key).is_some() {
                keys.push(key);
            }
        }
    }
    keys
}

fn apply_knob(h: &mut Harness, knob: &Knob, now_ns: u64) {
    let c = &mut h.cache;
    match knob {
        Knob::Controller(p) => c.set_controller_policy(*p),
        Knob::DeviceFailed(f) => c.set_cache_device_failed(*f),
        Knob::Replacement(name) => {
            // 64 sectors per volume in lines of 4 sectors: 16 lines each.
            let before = resident_keys(c, 2, 16);
            c.set_replacement_policy(name.parse::<PolicySpec>().unwrap(), now_ns)
                .unwrap();
            assert_eq!(
                resident_keys(c, 2, 16),
                before,
                "switching to {name} lost cached lines"
            );
            assert_eq!(
                c.config().policy.to_string(),
                name.parse::<PolicySpec>().unwrap().to_string()
            );
        }
        Knob::Promotion(p) => c.set_promotion(p.parse::<Promotion>().unwrap()),
        Knob::SeqCutoff(s) => c.set_seq_cutoff(s.parse::<SeqCutoff>().unwrap()),
        Knob::WriteMissBypass(b) => c.set_write_miss_bypass(*b),
        Knob::Cleaning(s) => c.set_cleaning(s.parse::<CleaningPolicy>().unwrap()),
        Knob::DirtyCap(cap) => c.set_max_dirty_lines(*cap),
    }
    c.check_invariants();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_knob_switched_under_load_keeps_every_write(
        steps in prop::collection::vec(
            prop_oneof![6 => actions(64, 12, true).prop_map(Step::Io), 1 => knob().prop_map(Step::Set)],
            1..160,
        ),
        lines in 4u64..12,
    ) {
        let config = CacheConfig::new(lines, LineSize::new(2048).unwrap(), PolicySpec::lru());
        let mut h = Harness::new(Cache::new(config).unwrap());
        for (t, step) in steps.iter().enumerate() {
            let now_ns = t as u64 * 1_000_000;
            match step {
                Step::Io(action) => h.apply(action.clone(), now_ns),
                Step::Set(knob) => apply_knob(&mut h, knob, now_ns),
            }
        }
        h.cache.set_cache_device_failed(false);
        h.flush_all_and_check_backend();
    }
}

/// The effective mode says what is in force and why, as knobs change.
#[test]
fn the_effective_mode_follows_the_knobs() {
    use iocache_core::ModeCause;
    let config = CacheConfig::new(8, LineSize::new(4096).unwrap(), PolicySpec::lru());
    let mut c = Cache::new(config).unwrap();
    let m = c.effective_mode();
    assert_eq!(
        (m.policy, m.cause),
        (WritePolicy::WriteBack, ModeCause::Configured)
    );
    c.set_controller_policy(Some(WritePolicy::WriteOnly));
    let m = c.effective_mode();
    assert_eq!(
        (m.policy, m.cause),
        (WritePolicy::WriteOnly, ModeCause::Controller)
    );
    c.set_cache_device_failed(true);
    let m = c.effective_mode();
    assert_eq!(
        (m.policy, m.cause),
        (WritePolicy::PassThrough, ModeCause::CacheDeviceFailed)
    );
    c.set_cache_device_failed(false);
    c.set_controller_policy(None);
    c.set_write_policy(WritePolicy::WriteAround);
    let m = c.effective_mode();
    assert_eq!(
        (m.policy, m.cause),
        (WritePolicy::WriteAround, ModeCause::Configured)
    );
    assert_eq!(c.write_policy(), WritePolicy::WriteAround);
}
