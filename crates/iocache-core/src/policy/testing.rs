//! A driver for unit tests: runs a bare policy the way `Cache` calls it
//! (`admit`, then `on_miss` with or without a needed victim, then `on_insert`;
//! `on_remove` for invalidation), with its own slot table.

use super::{AccessInfo, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};

pub fn key(line: u64) -> LineKey {
    LineKey {
        volume: 0,
        line_index: line,
    }
}

pub struct Driver<P: ReplacementPolicy> {
    pub policy: P,
    slots: Vec<Option<u64>>,
    free: Vec<SlotId>,
    pub hits: u64,
    pub misses: u64,
    /// Misses the policy refused to admit.
    pub bypassed: u64,
    /// Lines named as victims, in order.
    pub evicted: Vec<u64>,
    now: u64,
}

impl<P: ReplacementPolicy> Driver<P> {
    pub fn new(policy: P, capacity: usize) -> Self {
        Driver {
            policy,
            slots: vec![None; capacity],
            // Slot 0 is handed out first.
            free: (0..capacity as SlotId).rev().collect(),
            hits: 0,
            misses: 0,
            bypassed: 0,
            evicted: Vec::new(),
            now: 0,
        }
    }

    fn info(&mut self) -> AccessInfo {
        self.now += 1;
        AccessInfo::read_at(self.now)
    }

    pub fn slot_of(&self, line: u64) -> Option<SlotId> {
        self.slots
            .iter()
            .position(|s| *s == Some(line))
            .map(|s| s as SlotId)
    }

    /// One access; returns whether it hit.
    pub fn access(&mut self, line: u64) -> bool {
        let info = self.info();
        if let Some(slot) = self.slot_of(line) {
            self.hits += 1;
            self.policy.on_hit(slot, &info);
            return true;
        }
        self.miss(line, &info, &[]);
        false
    }

    /// A miss on `line` as the cache makes it when dirty victims are kept
    /// (`Cache::keep_dirty_victims`, `inline_dirty_eviction = false`):
    /// victims holding a line of `dirty` are handed back
    /// (`on_victim_kept`) and the miss asks again (`on_miss_again`), for
    /// up to four rounds; then the victims left are evicted and `line`
    /// inserted, or bypasses the cache when none was found. `line` must
    /// not be resident, and the cache full.
    pub fn miss_keeping(&mut self, line: u64, dirty: &[u64]) {
        assert!(self.slot_of(line).is_none() && self.free.is_empty());
        let info = self.info();
        self.miss(line, &info, dirty);
    }

    /// A miss on `line` (not resident), keeping victims that hold a line
    /// of `dirty` (none: the plain miss of [`Driver::access`]).
    fn miss(&mut self, line: u64, info: &AccessInfo, dirty: &[u64]) {
        self.misses += 1;
        if self.policy.admit(key(line), info) == Some(false) {
            self.bypassed += 1;
            return;
        }
        let need_victim = self.free.is_empty();
        let mut victims = Vec::new();
        self.policy.on_miss(key(line), need_victim, info, &mut victims);
        assert!(need_victim || victims.is_empty(), "victims named with free slots");
        for round in 0..4 {
            let before = victims.len();
            let mut i = 0;
            while i < victims.len() {
                let held = self.slots[victims[i] as usize].expect("victim slot is resident");
                if dirty.contains(&held) {
                    let v = victims.swap_remove(i);
                    self.policy
                        .on_victim_kept(v, key(held), &AccessInfo { dirty: true, ..*info });
                } else {
                    i += 1;
                }
            }
            if victims.len() == before || !victims.is_empty() || round == 3 {
                break;
            }
            self.policy.on_miss_again(key(line), info, &mut victims);
        }
        for &v in &victims {
            let old = self.slots[v as usize].take().expect("victim slot is resident");
            self.evicted.push(old);
            self.free.push(v);
        }
        let Some(slot) = self.free.pop() else {
            self.bypassed += 1;
            return;
        };
        self.slots[slot as usize] = Some(line);
        self.policy.on_insert(slot, key(line), info);
    }

    pub fn run(&mut self, lines: &[u64]) -> u64 {
        let before = self.hits;
        for &l in lines {
            self.access(l);
        }
        self.hits - before
    }

    /// Invalidates `line` if resident (as a write-invalidate would).
    pub fn remove(&mut self, line: u64) -> bool {
        let Some(slot) = self.slot_of(line) else {
            return false;
        };
        self.policy.on_remove(slot);
        self.slots[slot as usize] = None;
        self.free.push(slot);
        true
    }

    pub fn resident(&self) -> Vec<u64> {
        let mut r: Vec<u64> = self.slots.iter().flatten().copied().collect();
        r.sort_unstable();
        r
    }

    /// The line held in `slot` (which must be resident).
    pub fn slots_line(&self, slot: SlotId) -> u64 {
        self.slots[slot as usize].expect("slot is resident")
    }

    pub fn resident_count(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// One random step over lines `0..lines`: one in `remove_one_in`
    /// removes the line (if resident), the others access it.
    pub fn random_step(&mut self, rng: &mut XorShift, lines: u64, remove_one_in: u64) {
        let line = rng.below(lines);
        if rng.below(remove_one_in) == 0 {
            self.remove(line);
        } else {
            self.access(line);
        }
    }
}

/// Drives a policy of each capacity from 1 to 7 lines (made by `make`)
/// through `steps` random steps over lines in three times its capacity:
/// one in eight removes the line (if resident), the others access it.
/// `check` looks at the driver after every step.
pub fn churn<P: ReplacementPolicy>(
    seed: u64,
    steps: usize,
    make: impl Fn(usize) -> P,
    check: impl Fn(&Driver<P>, usize),
) {
    let mut rng = XorShift(seed);
    for capacity in 1..8usize {
        let mut d = Driver::new(make(capacity), capacity);
        for _ in 0..steps {
            d.random_step(&mut rng, 3 * capacity as u64, 8);
            check(&d, capacity);
        }
    }
}

/// A small deterministic generator for randomized unit tests.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
