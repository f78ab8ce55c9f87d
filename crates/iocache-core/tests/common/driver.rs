//! A bare replacement policy driven the way `Cache::try_admit` drives it
//! (`admit`, then `on_miss` for victims and `on_insert`; `on_hit`;
//! `on_remove`), with its own slot table, for the tests that check a
//! policy's own queues rather than the cache's data.

use iocache_core::policy::{AccessInfo, ReplacementPolicy};
use iocache_core::{IoKind, LineKey};

pub fn key(line: u64) -> LineKey {
    LineKey {
        volume: 0,
        line_index: line,
    }
}

/// What one access did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Hit,
    Admitted,
    /// `admit` said no.
    Refused,
    /// Admitted, but the policy named no victim in a full cache.
    Bypassed,
}

/// One request per access, of one line; its clock is the request number.
/// A miss takes the lowest free slot.
pub struct Driver<P: ReplacementPolicy> {
    pub policy: P,
    /// The line each slot holds.
    pub slots: Vec<Option<u64>>,
    seq: u64,
    pub hits: u64,
    /// Lines the policy named as victims of misses, in order.
    pub evicted: Vec<u64>,
}

impl<P: ReplacementPolicy> Driver<P> {
    pub fn new(policy: P, capacity: usize) -> Self {
        Driver {
            policy,
            slots: vec![None; capacity],
            seq: 0,
            hits: 0,
            evicted: Vec::new(),
        }
    }

    fn info(&self, kind: IoKind, dirty: bool) -> AccessInfo {
        AccessInfo {
            now_ns: self.seq,
            kind,
            request_seq: self.seq,
            request_lines: 1,
            dirty,
        }
    }

    pub fn slot_of(&self, line: u64) -> Option<u32> {
        self.slots.iter().position(|s| *s == Some(line)).map(|s| s as u32)
    }

    pub fn read(&mut self, line: u64) -> Outcome {
        self.access(line, IoKind::Read, false)
    }

    /// One access; `dirty` is whether the line is dirty afterwards.
    pub fn access(&mut self, line: u64, kind: IoKind, dirty: bool) -> Outcome {
        self.seq += 1;
        let info = self.info(kind, dirty);
        if let Some(slot) = self.slot_of(line) {
            self.hits += 1;
            self.policy.on_hit(slot, &info);
            return Outcome::Hit;
        }
        if self.policy.admit(key(line), &info) == Some(false) {
            return Outcome::Refused;
        }
        self.insert(line, dirty)
    }

    /// `on_miss` + `on_insert` without asking `admit` (replacement alone).
    pub fn insert(&mut self, line: u64, dirty: bool) -> Outcome {
        let info = self.info(IoKind::Read, dirty);
        let need_victim = self.slots.iter().all(Option::is_some);
        let mut victims = Vec::new();
        self.policy.on_miss(
            key(line),
            need_victim,
            &AccessInfo { dirty: false, ..info },
            &mut victims,
        );
        assert!(need_victim || victims.is_empty(), "victims named with free slots");
        for &v in &victims {
            let Some(old) = self.slots[v as usize].take() else {
                panic!("victim {v} was not resident");
            };
            self.evicted.push(old);
        }
        let Some(slot) = self.slots.iter().position(Option::is_none) else {
            return Outcome::Bypassed;
        };
        self.slots[slot] = Some(line);
        self.policy.on_insert(slot as u32, key(line), &info);
        Outcome::Admitted
    }

    /// Asks for one victim as a full cache would; returns its line.
    pub fn victim(&mut self) -> Option<u64> {
        let info = self.info(IoKind::Read, false);
        let mut victims = Vec::new();
        self.policy.on_miss(key(u64::MAX), true, &info, &mut victims);
        assert!(victims.len() <= 1);
        victims
            .first()
            .map(|&v| self.slots[v as usize].take().expect("resident victim"))
    }

    /// Invalidates a resident line (as a write-invalidate would).
    pub fn remove(&mut self, line: u64) {
        let slot = self.slot_of(line).expect("resident");
        self.slots[slot as usize] = None;
        self.policy.on_remove(slot);
    }

    /// The resident lines, in order.
    pub fn resident(&self) -> Vec<u64> {
        let mut r: Vec<u64> = self.slots.iter().flatten().copied().collect();
        r.sort();
        r
    }

    /// Runs `ops` (line, invalidate?) and calls `check` with the policy and
    /// the number of resident lines after each. An invalidation of a line
    /// not resident does nothing; every other access hits, is refused, or
    /// is admitted (a full cache always names a victim).
    pub fn run(&mut self, ops: &[(u64, bool)], check: impl Fn(&P, usize)) {
        for &(line, invalidate) in ops {
            if invalidate {
                if self.slot_of(line).is_some() {
                    self.remove(line);
                }
            } else {
                assert_ne!(self.read(line), Outcome::Bypassed, "a needed victim was named");
            }
            check(&self.policy, self.slots.iter().flatten().count());
        }
    }
}
