//! Shared test helpers: a data-level executor for ops, so tests can check what
//! a client would read back, not only which ops were emitted.

#![allow(dead_code)]

pub mod driver;

use std::collections::HashMap;

use iocache_core::{
    AccessHints, Cache, CacheConfig, FlushOrder, FlushToken, IoKind, LineSize, Op, OpList, PolicySpec,
    Promotion, Request, WritePolicy, SECTOR_BYTES,
};
use proptest::prelude::*;

pub fn cache(lines: u64, line_bytes: u64, config: impl FnOnce(&mut CacheConfig)) -> Cache {
    let mut c = CacheConfig::new(lines, LineSize::new(line_bytes).unwrap(), PolicySpec::lru());
    config(&mut c);
    Cache::new(c).unwrap()
}

/// A cache for the data-model tests: `capacity` lines of
/// `512 << line_shift` bytes under `policy`, starting in `start`, with
/// N-hit promotion (on the second hit) when `nhit`.
pub fn model_cache(
    capacity: u64,
    line_shift: u32,
    policy: PolicySpec,
    start: WritePolicy,
    nhit: bool,
) -> Cache {
    cache(capacity, 512 << line_shift, |c| {
        c.write_policy = start;
        c.policy = policy;
        if nhit {
            c.promotion = Promotion::NHit {
                threshold: 2,
                trigger_percent: 0,
            };
        }
    })
}

pub fn ops_of(cache: &mut Cache, request: Request) -> Vec<Op> {
    let mut ops = OpList::new();
    cache.access(&request, &mut ops).unwrap();
    let out = ops.ops().to_vec();
    cache.check_invariants();
    out
}

/// `Op::ReadCache`: `len` bytes of `slot` from `line_offset` into the
/// request buffer at `buf`.
pub fn read_cache(slot: u32, line_offset: u32, len: u32, buf: u64) -> Op {
    Op::ReadCache {
        slot,
        line_offset_bytes: line_offset,
        length_bytes: len,
        buffer_offset_bytes: buf,
    }
}

/// `Op::ReadBackend`: `len` bytes of `volume` from `offset` into the
/// request buffer at `buf`.
pub fn read_backend(volume: u32, offset: u64, len: u64, buf: u64) -> Op {
    Op::ReadBackend {
        volume,
        offset_bytes: offset,
        length_bytes: len,
        buffer_offset_bytes: buf,
    }
}

/// `Op::WriteBackend`: `len` bytes of the request buffer at `buf` to
/// `volume` at `offset`.
pub fn write_backend(volume: u32, offset: u64, len: u64, buf: u64) -> Op {
    Op::WriteBackend {
        volume,
        offset_bytes: offset,
        length_bytes: len,
        buffer_offset_bytes: buf,
    }
}

/// `Op::WriteCache`: `len` bytes of the request buffer at `buf` to `slot`
/// at `line_offset`, `dirty` or clean afterwards, `fresh` or not.
pub fn write_cache(slot: u32, line_offset: u32, len: u32, buf: u64, dirty: bool, fresh: bool) -> Op {
    Op::WriteCache {
        slot,
        line_offset_bytes: line_offset,
        length_bytes: len,
        buffer_offset_bytes: buf,
        dirty,
        fresh,
    }
}

/// `Op::WriteBack`: `len` bytes of `slot` from `line_offset` to `volume`
/// at `offset`.
pub fn write_back(slot: u32, line_offset: u32, len: u32, volume: u32, offset: u64) -> Op {
    Op::WriteBack {
        slot,
        line_offset_bytes: line_offset,
        length_bytes: len,
        volume,
        offset_bytes: offset,
    }
}

/// Sector-granular contents of the backend volumes and the cache device, where
/// each sector holds a number naming the write that produced it (0 = never written).
#[derive(Default)]
pub struct World {
    pub backend: HashMap<(u32, u64), u64>,
    pub cache_device: HashMap<(u32, u64), u64>,
}

impl World {
    /// Executes `ops` in order for `request`, whose buffer holds one number per sector.
    pub fn execute(&mut self, request: &Request, ops: &[Op], buffer: &mut [u64]) {
        for op in ops {
            let Some((from, to, sectors)) = copy_of(op) else {
                continue;
            };
            for i in 0..sectors {
                let value = self.get(from, i, buffer);
                self.set(to, i, value, buffer);
            }
        }
        let _ = request;
    }

    /// The number in sector `i` from `place` (0: never written).
    fn get(&self, place: Place, i: u64, buffer: &[u64]) -> u64 {
        let stored = match place {
            Place::Slot(slot, first) => self.cache_device.get(&(slot, first + i)),
            Place::Volume(volume, first) => self.backend.get(&(volume, first + i)),
            Place::Buffer(first) => return buffer[(first + i) as usize],
        };
        stored.copied().unwrap_or(0)
    }

    /// Stores `value` in sector `i` from `place`.
    fn set(&mut self, place: Place, i: u64, value: u64, buffer: &mut [u64]) {
        match place {
            Place::Slot(slot, first) => {
                self.cache_device.insert((slot, first + i), value);
            }
            Place::Volume(volume, first) => {
                self.backend.insert((volume, first + i), value);
            }
            Place::Buffer(first) => buffer[(first + i) as usize] = value,
        }
    }
}

/// Where sectors are, counted from the first one an op touches: a slot
/// of the cache device (from a sector of its line), a backend volume, or
/// the request buffer.
#[derive(Clone, Copy)]
enum Place {
    Slot(u32, u64),
    Volume(u32, u64),
    Buffer(u64),
}

/// What `op` copies, as every data op is a copy: from where, to where,
/// and how many sectors; `None` for an invalidation, which moves no data.
fn copy_of(op: &Op) -> Option<(Place, Place, u64)> {
    let s = SECTOR_BYTES;
    let slot = |slot: u32, line_offset: u32| Place::Slot(slot, line_offset as u64 / s);
    let volume = |volume: u32, offset: u64| Place::Volume(volume, offset / s);
    let buffer = |offset: u64| Place::Buffer(offset / s);
    Some(match *op {
        Op::ReadCache {
            slot: id,
            line_offset_bytes: at,
            length_bytes: n,
            buffer_offset_bytes: b,
        } => (slot(id, at), buffer(b), n as u64 / s),
        Op::WriteCache {
            slot: id,
            line_offset_bytes: at,
            length_bytes: n,
            buffer_offset_bytes: b,
            ..
        } => (buffer(b), slot(id, at), n as u64 / s),
        Op::ReadBackend {
            volume: v,
            offset_bytes: at,
            length_bytes: n,
            buffer_offset_bytes: b,
        } => (volume(v, at), buffer(b), n / s),
        Op::WriteBackend {
            volume: v,
            offset_bytes: at,
            length_bytes: n,
            buffer_offset_bytes: b,
        } => (buffer(b), volume(v, at), n / s),
        Op::WriteBack {
            slot: id,
            line_offset_bytes: from,
            length_bytes: n,
            volume: v,
            offset_bytes: to,
        } => (slot(id, from), volume(v, to), n as u64 / s),
        Op::Invalidate { .. } => return None,
    })
}

/// A cache driven together with a data world and a reference of what each sector must hold.
pub struct Harness {
    pub cache: Cache,
    pub world: World,
    pub reference: HashMap<(u32, u64), u64>,
    pub next_write: u64,
    ops: OpList,
}

impl Harness {
    pub fn new(cache: Cache) -> Self {
        Harness {
            cache,
            world: World::default(),
            reference: HashMap::new(),
            next_write: 1,
            ops: OpList::new(),
        }
    }

    /// Runs one request; for reads, asserts the data returned is the latest written.
    pub fn run(&mut self, request: Request) {
        self.run_with(request, AccessHints::default());
    }

    /// [`Harness::run`] through `Cache::access_with`.
    pub fn run_with(&mut self, request: Request, hints: AccessHints) {
        let sectors = (request.length_bytes / SECTOR_BYTES) as usize;
        let first = request.offset_bytes / SECTOR_BYTES;
        let mut buffer = vec![0u64; sectors];
        if request.kind == IoKind::Write {
            for (i, value) in buffer.iter_mut().enumerate() {
                *value = self.next_write;
                self.next_write += 1;
                self.reference.insert((request.volume, first + i as u64), *value);
            }
        }
        self.cache.access_with(&request, hints, &mut self.ops).unwrap();
        self.world.execute(&request, self.ops.ops(), &mut buffer);
        self.cache.check_invariants();
        if request.kind == IoKind::Read {
            for (i, value) in buffer.iter().enumerate() {
                let sector = first + i as u64;
                let expected = self
                    .reference
                    .get(&(request.volume, sector))
                    .copied()
                    .unwrap_or(0);
                assert_eq!(
                    *value,
                    expected,
                    "stale read of volume {} sector {sector} under {:?}",
                    request.volume,
                    self.cache.write_policy()
                );
            }
        }
    }

    /// Applies `actions` in order, the `t`-th at `t × tick_ns`, with
    /// `after_each` looking at the harness after each; then
    /// [`Harness::flush_all_and_check_backend`].
    pub fn apply_all_and_flush(
        &mut self,
        actions: Vec<Action>,
        tick_ns: u64,
        mut after_each: impl FnMut(&Harness) -> Result<(), TestCaseError>,
    ) -> Result<(), TestCaseError> {
        for (t, a) in actions.into_iter().enumerate() {
            self.apply(a, t as u64 * tick_ns);
            after_each(self)?;
        }
        self.flush_all_and_check_backend();
        Ok(())
    }

    /// Flushes every dirty line, then checks the backend holds every write.
    pub fn flush_all_and_check_backend(&mut self) {
        let mut tokens = Vec::new();
        let dummy = Request::read(0, 0, 512, 0);
        while self.cache.dirty_lines() > 0 {
            self.cache
                .begin_flush(iocache_core::FlushOrder::Address, 3, &mut self.ops, &mut tokens);
            assert!(!tokens.is_empty(), "dirty lines but nothing to flush");
            self.world.execute(&dummy, self.ops.ops(), &mut []);
            for t in &tokens {
                assert!(self.cache.complete_flush(t, true));
            }
            self.cache.check_invariants();
        }
        for (&(volume, sector), &value) in &self.reference {
            assert_eq!(
                self.world.backend.get(&(volume, sector)).copied().unwrap_or(0),
                value,
                "backend lost the write to volume {volume} sector {sector}"
            );
        }
    }
}

/// One step of a random workload for the data-model property tests.
#[derive(Debug, Clone)]
pub enum Action {
    /// Read `(volume, first sector, sectors)`.
    Read(u32, u64, u64),
    /// Write `(volume, first sector, sectors)`.
    Write(u32, u64, u64),
    /// Change the write policy at run time.
    SetPolicy(WritePolicy),
    /// Flush up to this many of the oldest dirty lines.
    Flush(usize),
    /// Flush up to this many dirty lines of one volume (`FlushOrder::Volume`).
    FlushVolume(u32, usize),
    /// Drop every clean line of one volume (`Cache::drop_clean_lines`).
    DropClean(u32),
    /// Discard `(volume, first line, lines)`, dirty lines included
    /// (`Cache::discard_lines`), the range then zeroed on the backend as a
    /// driver passing the discard down does.
    Discard(u32, u64, u64),
    /// Resize the cache to this many lines in service (`Cache::resize`),
    /// writing back the dirty lines that leave until it is done.
    Resize(u64),
}

/// A write policy the data-model tests start a cache in: one that inserts
/// written lines (write-back, write-through, write-only).
pub fn any_inserting_write_policy() -> impl Strategy<Value = WritePolicy> {
    prop_oneof![
        Just(WritePolicy::WriteBack),
        Just(WritePolicy::WriteThrough),
        Just(WritePolicy::WriteOnly)
    ]
}

pub fn any_write_policy() -> impl Strategy<Value = WritePolicy> {
    prop::sample::select(&WritePolicy::ALL[..])
}

/// Reads and writes over two volumes of `space_sectors` sectors, each up to
/// `max_sectors` long, with occasional flushes and (if `switch`) write-policy changes.
pub fn actions(space_sectors: u64, max_sectors: u64, switch: bool) -> BoxedStrategy<Action> {
    let io = prop_oneof![
        4 => (0u32..2, 0..space_sectors, 1..max_sectors).prop_map(|(v, s, n)| Action::Read(v, s, n)),
        4 => (0u32..2, 0..space_sectors, 1..max_sectors).prop_map(|(v, s, n)| Action::Write(v, s, n)),
        1 => (1usize..4).prop_map(Action::Flush),
    ];
    if switch {
        prop_oneof![9 => io, 1 => any_write_policy().prop_map(Action::SetPolicy)].boxed()
    } else {
        io.boxed()
    }
}

/// The default mix: 64 sectors per volume, requests of up to 19 sectors, policy changes.
pub fn action() -> BoxedStrategy<Action> {
    actions(64, 20, true)
}

impl Harness {
    /// Performs one workload step at `now_ns`, checking data and invariants.
    pub fn apply(&mut self, action: Action, now_ns: u64) {
        match action {
            Action::Read(v, s, n) => self.run(Request::read(v, s * 512, n * 512, now_ns)),
            Action::Write(v, s, n) => self.run(Request::write(v, s * 512, n * 512, now_ns)),
            Action::SetPolicy(p) => self.cache.set_write_policy(p),
            Action::DropClean(v) => {
                self.cache.drop_clean_lines(v, &mut self.ops);
                assert!(self
                    .ops
                    .ops()
                    .iter()
                    .all(|op| matches!(op, Op::Invalidate { key, .. } if key.volume == v)));
                assert_eq!(
                    self.cache.volume_lines(v).resident,
                    self.cache.volume_lines(v).dirty
                );
                self.cache.check_invariants();
            }
            Action::Discard(v, first, lines) => {
                let end = first + lines;
                self.cache.discard_lines(v, first, end, &mut self.ops);
                assert!(self.ops.ops().iter().all(|op| matches!(
                    op,
                    Op::Invalidate { key, .. } if key.volume == v && (first..end).contains(&key.line_index)
                )));
                let sectors = self.cache.line_size().bytes() / SECTOR_BYTES;
                for sector in first * sectors..end * sectors {
                    self.world.backend.remove(&(v, sector));
                    self.reference.remove(&(v, sector));
                }
                self.cache.check_invariants();
            }
            Action::Resize(lines) => {
                let dummy = Request::read(0, 0, 512, now_ns);
                let mut tokens: Vec<FlushToken> = Vec::new();
                let mut rounds = 0;
                let mut in_service = self.cache.lines_in_service();
                loop {
                    let progress = self.cache.resize(lines, now_ns, &mut self.ops).unwrap();
                    let ops = self.ops.ops().to_vec();
                    self.world.execute(&dummy, &ops, &mut []);
                    self.cache.check_invariants();
                    if progress.done() {
                        break;
                    }
                    let moved =
                        std::mem::replace(&mut in_service, progress.in_service) != progress.in_service;
                    if progress.dirty_leaving == 0 {
                        // A bounded step: it must have taken some out.
                        assert!(
                            moved,
                            "a resize short of its target with nothing to wait for: {progress:?}"
                        );
                        continue;
                    }
                    self.cache
                        .begin_flush(FlushOrder::Retiring, 2, &mut self.ops, &mut tokens);
                    assert!(!tokens.is_empty(), "dirty lines leaving, none to flush");
                    let ops = self.ops.ops().to_vec();
                    self.world.execute(&dummy, &ops, &mut []);
                    for token in &tokens {
                        self.cache.complete_flush(token, true);
                    }
                    rounds += 1;
                    assert!(rounds < 1000, "a resize that never ends");
                }
                assert_eq!(self.cache.lines_in_service(), lines);
                assert!(self.cache.resident_lines() <= lines);
            }
            Action::Flush(_) | Action::FlushVolume(..) => {
                let (order, n) = match action {
                    Action::FlushVolume(v, n) => (FlushOrder::Volume(v), n),
                    Action::Flush(n) => (FlushOrder::Oldest, n),
                    _ => unreachable!(),
                };
                let mut tokens: Vec<FlushToken> = Vec::new();
                self.cache.begin_flush(order, n, &mut self.ops, &mut tokens);
                if let FlushOrder::Volume(v) = order {
                    assert!(tokens.iter().all(|t| t.key.volume == v));
                    assert!(self
                        .ops
                        .ops()
                        .iter()
                        .all(|op| matches!(op, Op::WriteBack { volume, .. } if *volume == v)));
                }
                let ops = self.ops.ops().to_vec();
                self.world
                    .execute(&Request::read(0, 0, 512, now_ns), &ops, &mut []);
                for token in &tokens {
                    self.cache.complete_flush(token, true);
                }
                self.cache.check_invariants();
            }
        }
    }
}

/// One step of the xorshift generator the randomized tests draw from:
/// advances `state` and returns it.
pub fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
