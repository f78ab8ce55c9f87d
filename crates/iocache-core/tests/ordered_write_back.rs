//! Ordered write-back against a reference model: after every step of a
//! random run of writes, FLUSHes, evictions and cleaner batches, the
//! backend must hold what the client saw at some FLUSH k plus part of
//! epoch k's writes (every sector either its value at FLUSH k or one of the
//! values epoch k wrote to it), and a restore keeps each line's epoch.

use std::collections::HashMap;

use iocache_core::{
    Cache, CacheConfig, FlushOrder, FlushToken, LineSize, Op, OpList, OrderedWait, PolicySpec, Request,
    RestoredLine, SlotId, WritePolicy,
};
use proptest::prelude::*;

const SECTORS_PER_LINE: u64 = 4;
const VOLUME_SECTORS: u64 = 64;
const SLOTS: u64 = 6;

fn config(inline_dirty_eviction: bool) -> CacheConfig {
    config_with(inline_dirty_eviction, PolicySpec::lru())
}

fn config_with(inline_dirty_eviction: bool, policy: PolicySpec) -> CacheConfig {
    let mut c = CacheConfig::new(SLOTS, LineSize::new(SECTORS_PER_LINE * 512).unwrap(), policy);
    c.write_policy = WritePolicy::WriteBack;
    c.inline_dirty_eviction = inline_dirty_eviction;
    c.ordered_write_back = true;
    c
}

/// A slot's line as a restart finds it: slot, key, valid, dirty, epoch.
type Snap = (SlotId, iocache_core::LineKey, Vec<u64>, Vec<u64>, u64);

#[derive(Clone, Debug)]
enum Step {
    Write { sector: u64, sectors: u64 },
    Flush,
    Clean { lines: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..VOLUME_SECTORS, 1..6u64).prop_map(|(sector, sectors)| Step::Write { sector, sectors }),
        1 => (0..VOLUME_SECTORS, 6..40u64).prop_map(|(sector, sectors)| Step::Write { sector, sectors }),
        2 => Just(Step::Flush),
        2 => (1..4usize).prop_map(|lines| Step::Clean { lines }),
    ]
}

/// Sector versions: the client's view, the cache slots', the backend's.
#[derive(Default)]
struct Model {
    client: Vec<u64>,
    backend: Vec<u64>,
    slots: HashMap<SlotId, Vec<u64>>,
    /// The client's view at each FLUSH (index k: before epoch k's writes).
    snapshots: Vec<Vec<u64>>,
    /// Per epoch, per sector, the versions written.
    written: Vec<HashMap<u64, Vec<u64>>>,
}

impl Model {
    fn new() -> Model {
        let zero = vec![0; VOLUME_SECTORS as usize];
        Model {
            client: zero.clone(),
            backend: zero.clone(),
            snapshots: vec![zero],
            written: vec![HashMap::new()],
            ..Model::default()
        }
    }

    fn run(&mut self, ops: &[Op], version: u64) {
        for op in ops {
            match *op {
                Op::WriteCache {
                    slot,
                    line_offset_bytes,
                    length_bytes,
                    ..
                } => {
                    // A write's buffer holds one version in all its sectors.
                    let data = self
                        .slots
                        .entry(slot)
                        .or_insert_with(|| vec![0; SECTORS_PER_LINE as usize]);
                    for i in 0..u64::from(length_bytes) / 512 {
                        data[(u64::from(line_offset_bytes) / 512 + i) as usize] = version;
                    }
                }
                Op::WriteBack {
                    slot,
                    line_offset_bytes,
                    length_bytes,
                    offset_bytes,
                    ..
                } => {
                    let data = &self.slots[&slot];
                    for i in 0..u64::from(length_bytes) / 512 {
                        self.backend[(offset_bytes / 512 + i) as usize] =
                            data[(u64::from(line_offset_bytes) / 512 + i) as usize];
                    }
                }
                Op::WriteBackend {
                    offset_bytes,
                    length_bytes,
                    ..
                } => {
                    for i in 0..length_bytes / 512 {
                        self.backend[(offset_bytes / 512 + i) as usize] = version;
                    }
                }
                Op::ReadCache { .. } | Op::ReadBackend { .. } | Op::Invalidate { .. } => {}
            }
        }
    }

    /// The client wrote `version` into `sectors` sectors from `first`, in `epoch`.
    fn wrote(&mut self, epoch: u64, version: u64, first: u64, sectors: u64) {
        for s in first..first + sectors {
            self.client[s as usize] = version;
            self.written[epoch as usize].entry(s).or_default().push(version);
        }
    }

    /// A client FLUSH: its view is kept, and the cache starts the next epoch.
    fn flushed(&mut self, cache: &mut Cache) {
        self.snapshots.push(self.client.clone());
        self.written.push(HashMap::new());
        cache.set_epoch(cache.epoch() + 1);
    }

    /// The backend is FLUSH k's view plus some of epoch k's writes, for some k.
    fn consistent(&self) -> bool {
        (0..self.snapshots.len()).any(|k| {
            (0..VOLUME_SECTORS).all(|s| {
                let have = self.backend[s as usize];
                have == self.snapshots[k][s as usize]
                    || self.written[k]
                        .get(&s)
                        .is_some_and(|versions| versions.contains(&have))
            })
        })
    }
}

fn clean(cache: &mut Cache, model: &mut Model, lines: usize) {
    let Some(through) = cache.oldest_dirty_epoch() else {
        return;
    };
    let mut ops = OpList::new();
    let mut tokens: Vec<FlushToken> = Vec::new();
    cache.begin_flush(FlushOrder::Epochs { through }, lines, &mut ops, &mut tokens);
    model.run(ops.ops(), 0);
    for token in &tokens {
        cache.complete_flush(token, true);
    }
}

/// Writes back every epoch older than the current one, as the runtime
/// does before a write goes to the backend.
fn clean_older_epochs(cache: &mut Cache, model: &mut Model) {
    while cache.oldest_dirty_epoch().is_some_and(|e| e < cache.epoch()) {
        clean(cache, model, 8);
    }
}

fn run_steps(steps: &[Step], inline_dirty_eviction: bool) -> Result<(Cache, Model), TestCaseError> {
    let mut cache = Cache::new(config(inline_dirty_eviction)).unwrap();
    let mut model = Model::new();
    let mut ops = OpList::new();
    let mut version = 0;
    for step in steps {
        match *step {
            Step::Write { sector, sectors } => {
                let sectors = sectors.min(VOLUME_SECTORS - sector);
                version += 1;
                let request = Request::write(0, sector * 512, sectors * 512, version);
                cache.access(&request, &mut ops).unwrap();
                // Without inline eviction, the runtime orders a write to
                // the backend: every older epoch is written back first.
                if ops.ops().iter().any(|op| matches!(op, Op::WriteBackend { .. })) {
                    clean_older_epochs(&mut cache, &mut model);
                }
                model.run(ops.ops(), version);
                model.wrote(cache.epoch(), version, sector, sectors);
            }
            Step::Flush => model.flushed(&mut cache),
            Step::Clean { lines } => clean(&mut cache, &mut model, lines),
        }
        prop_assert!(model.consistent(), "backend {:?} after {:?}", model.backend, step);
    }
    Ok((cache, model))
}

proptest! {
    /// The engine's protocol: a write waits (the cleaner runs) while
    /// `ordered_write_waits` says so, then its plan never touches the
    /// backend, under every policy, and the order holds.
    #[test]
    fn a_write_that_waited_never_reaches_the_backend(
        steps in proptest::collection::vec(step(), 1..150),
        policy in prop::sample::select(vec!["lru", "arc", "clock", "2q", "sieve", "s3fifo", "smq", "lfu"]),
        cap in prop::option::of(2..5u64),
    ) {
        let mut c = config_with(false, policy.parse().unwrap());
        c.max_dirty_lines = cap;
        let mut cache = Cache::new(c).unwrap();
        let mut model = Model::new();
        let mut ops = OpList::new();
        let mut version = 0;
        for step in &steps {
            match *step {
                Step::Write { sector, sectors } => {
                    let sectors = sectors.min(VOLUME_SECTORS - sector);
                    version += 1;
                    let request = Request::write(0, sector * 512, sectors * 512, version);
                    let mut rounds = 0;
                    let mut to_backend = false;
                    while let Some(wait) = cache.ordered_write_waits(&request) {
                        rounds += 1;
                        prop_assert!(rounds < 100, "{wait:?} never ends");
                        if wait == OrderedWait::ToBackend {
                            // Every older epoch to the backend first.
                            clean_older_epochs(&mut cache, &mut model);
                            to_backend = true;
                            break;
                        }
                        clean(&mut cache, &mut model, 1);
                    }
                    cache.access(&request, &mut ops).unwrap();
                    prop_assert!(
                        !ops.ops().iter().any(|op| matches!(op, Op::WriteBack { .. })),
                        "{:?}", ops.ops()
                    );
                    prop_assert!(
                        to_backend || !ops.ops().iter().any(|op| matches!(op, Op::WriteBackend { .. })),
                        "{:?}", ops.ops()
                    );
                    model.run(ops.ops(), version);
                    model.wrote(cache.epoch(), version, sector, sectors);
                }
                Step::Flush => model.flushed(&mut cache),
                Step::Clean { lines } => clean(&mut cache, &mut model, lines),
            }
            prop_assert!(model.consistent(), "backend {:?} after {:?}", model.backend, step);
        }
    }

    #[test]
    fn the_backend_is_always_a_flush_state_plus_part_of_the_next(
        steps in proptest::collection::vec(step(), 1..120),
        inline in any::<bool>(),
    ) {
        let (mut cache, mut model) = run_steps(&steps, inline)?;
        // Everything written back: the backend is the client's last view.
        while cache.dirty_lines() > 0 {
            clean(&mut cache, &mut model, 8);
        }
        prop_assert_eq!(&model.backend, &model.client);
    }

    #[test]
    fn a_restore_keeps_epochs_and_their_order(
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let (cache, _) = run_steps(&steps, false)?;
        let mut snaps: Vec<Snap> = (0..SLOTS as SlotId)
            .filter_map(|slot| cache.slot_snapshot(slot).map(|s| (slot, s.key, s.valid.to_vec(), s.dirty.to_vec(), s.epoch)))
            .collect();
        // Handed over in slot order reversed: the restore sorts by epoch.
        snaps.reverse();
        let lines: Vec<RestoredLine<'_>> = snaps
            .iter()
            .map(|(slot, key, valid, dirty, epoch)| RestoredLine { slot: *slot, key: *key, valid, dirty, epoch: *epoch })
            .collect();
        let mut restored = Cache::new(config(false)).unwrap();
        restored.restore(&lines, 1).unwrap();
        prop_assert_eq!(restored.oldest_dirty_epoch(), cache.oldest_dirty_epoch());
        let newest = snaps.iter().filter(|s| s.3.iter().any(|&w| w != 0)).map(|s| s.4).max();
        if let Some(newest) = newest {
            prop_assert!(restored.epoch() > newest);
        }
        // Batches through the oldest epoch take exactly that epoch's lines.
        let mut ops = OpList::new();
        let mut tokens = Vec::new();
        if let Some(oldest) = restored.oldest_dirty_epoch() {
            restored.begin_flush(FlushOrder::Epochs { through: oldest }, 64, &mut ops, &mut tokens);
            let expected = snaps.iter().filter(|s| s.3.iter().any(|&w| w != 0) && s.4 == oldest).count();
            prop_assert_eq!(tokens.len(), expected);
        }
    }
}

#[test]
fn an_overwrite_of_an_older_epoch_writes_the_older_epochs_back_first() {
    let mut cache = Cache::new(config(false)).unwrap();
    let mut ops = OpList::new();
    let write = |cache: &mut Cache, ops: &mut OpList, line: u64| {
        let request = Request::write(0, line * SECTORS_PER_LINE * 512, 512, 1);
        cache.access(&request, ops).unwrap();
    };
    write(&mut cache, &mut ops, 0);
    cache.set_epoch(1);
    write(&mut cache, &mut ops, 1);
    assert_eq!(
        cache.ordered_write_waits(&Request::write(0, SECTORS_PER_LINE * 512, 512, 1)),
        None,
        "a line of the current epoch is written over in place"
    );
    cache.set_epoch(2);
    let line_one = Request::write(0, SECTORS_PER_LINE * 512, 512, 1);
    assert_eq!(cache.ordered_write_waits(&line_one), Some(OrderedWait::Epoch(1)));
    write(&mut cache, &mut ops, 1);
    let backs: Vec<u64> = ops
        .ops()
        .iter()
        .filter_map(|op| match op {
            Op::WriteBack { offset_bytes, .. } => Some(offset_bytes / (SECTORS_PER_LINE * 512)),
            _ => None,
        })
        .collect();
    assert_eq!(backs, vec![0, 1], "line 0 (epoch 0) before line 1 (epoch 1)");
    assert_eq!(cache.stats().ordered_drains, 2);
    assert_eq!(cache.oldest_dirty_epoch(), Some(2));
}
