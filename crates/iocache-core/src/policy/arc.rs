//! Adaptive Replacement Cache, as in Megiddo & Modha, "ARC: A Self-Tuning, Low
//! Overhead Replacement Cache", FAST'03 (Fig. 1 of the paper).
//!
//! T1 holds lines seen once recently, T2 lines seen at least twice; B1 and B2
//! are ghost lists (keys only) of lines recently evicted from T1 and T2. A hit
//! in B1 grows the target size `p` of T1, a hit in B2 shrinks it.
//!
//! Deviations, both forced by a cache that can also drop lines (invalidation
//! by writes) rather than only replace them:
//! - REPLACE runs only when the cache has no free slot (`need_victim`); in the
//!   paper's model the cache is always full once ghosts exist, so the two agree.
//! - An invalidated line leaves T1/T2 without becoming a ghost.
//!
//! `p` is real-valued as in the paper (δ1 = |B2|/|B1| when B1 is the smaller list, else 1);
//! integer steps, as many implementations use, give 27.22 % instead of the
//! paper's 27.38 % on trace P2 at 32,768 lines.

use super::list::{Links, ListHead, TailLookahead, NIL};
use super::{AccessInfo, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};
use crate::index::LineIndex;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Resident {
    None,
    T1,
    T2,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ghost {
    B1,
    B2,
}

pub struct Arc {
    capacity: u64,
    /// Target size of T1, in lines.
    p: f64,
    slot_links: Links,
    slot_list: Vec<Resident>,
    slot_key: Vec<LineKey>,
    t1: ListHead,
    t2: ListHead,
    ghost_links: Links,
    ghost_key: Vec<LineKey>,
    ghost_list: Vec<Ghost>,
    ghost_free: Vec<u32>,
    ghost_index: LineIndex,
    b1: ListHead,
    b2: ListHead,
    /// Set by `on_miss` when the incoming line was a ghost: it enters T2.
    incoming_to_t2: bool,
    /// Whether the miss in progress was a B2 ghost (REPLACE's tie rule,
    /// for `on_miss_again`).
    miss_in_b2: bool,
    /// The next victims of T1 and T2 and the next ghosts B1 and B2 drop,
    /// walked ahead for prefetching (hints only: no decision reads them).
    ahead: [TailLookahead; 2],
    ghost_ahead: [TailLookahead; 2],
}

/// Index of T1 / B1 and T2 / B2 in the lookahead arrays.
const ONE: usize = 0;
const TWO: usize = 1;

impl Arc {
    pub fn new(capacity_lines: usize) -> Self {
        // |T1|+|T2|+|B1|+|B2| <= 2c, so at most 2c ghosts exist (when invalidation
        // has emptied the cache); one spare covers the ghost added before one is dropped.
        let ghosts = 2 * capacity_lines + 1;
        let none = LineKey {
            volume: 0,
            line_index: 0,
        };
        Arc {
            capacity: capacity_lines as u64,
            p: 0.0,
            slot_links: Links::new(capacity_lines),
            slot_list: vec![Resident::None; capacity_lines],
            slot_key: vec![none; capacity_lines],
            t1: ListHead::default(),
            t2: ListHead::default(),
            ghost_links: Links::new(ghosts),
            ghost_key: vec![none; ghosts],
            ghost_list: vec![Ghost::B1; ghosts],
            ghost_free: (0..ghosts as u32).rev().collect(),
            ghost_index: LineIndex::new(ghosts),
            b1: ListHead::default(),
            b2: ListHead::default(),
            incoming_to_t2: false,
            miss_in_b2: false,
            ahead: Default::default(),
            ghost_ahead: Default::default(),
        }
    }

    /// Current target size of T1 (for tests and inspection).
    pub fn target_t1(&self) -> f64 {
        self.p
    }

    /// Sizes of (T1, T2, B1, B2).
    pub fn list_sizes(&self) -> (u32, u32, u32, u32) {
        (self.t1.len, self.t2.len, self.b1.len, self.b2.len)
    }

    fn add_ghost(&mut self, key: LineKey, list: Ghost) {
        if self.ghost_free.is_empty() {
            // Only reachable when invalidations shrank T1+T2 while ghosts stayed:
            // keep the directory bounded by forgetting the oldest ghost.
            let longer = if self.b1.len >= self.b2.len {
                Ghost::B1
            } else {
                Ghost::B2
            };
            self.drop_lru_ghost(longer);
        }
        let Some(g) = self.ghost_free.pop() else {
            unreachable!("a ghost was just freed");
        };
        self.ghost_key[g as usize] = key;
        self.ghost_list[g as usize] = list;
        let head = match list {
            Ghost::B1 => &mut self.b1,
            Ghost::B2 => &mut self.b2,
        };
        self.ghost_links.push_head(head, g);
        self.ghost_index.insert(&key, g);
    }

    /// The ghost entry holding `key`, if B1 or B2 remembers it.
    fn ghost_of(&self, key: &LineKey) -> Option<u32> {
        let ghost_keys = &self.ghost_key;
        self.ghost_index.get(key, |g| ghost_keys[g as usize])
    }

    fn remove_ghost(&mut self, g: u32) {
        let head = match self.ghost_list[g as usize] {
            Ghost::B1 => &mut self.b1,
            Ghost::B2 => &mut self.b2,
        };
        self.ghost_links.unlink(head, g);
        let key = self.ghost_key[g as usize];
        self.ghost_index.remove(&key, g);
        self.ghost_free.push(g);
    }

    fn drop_lru_ghost(&mut self, list: Ghost) {
        let (tail, which) = match list {
            Ghost::B1 => (self.b1.tail, ONE),
            Ghost::B2 => (self.b2.tail, TWO),
        };
        if tail != NIL {
            self.remove_ghost(tail);
            let head = if which == ONE { &self.b1 } else { &self.b2 };
            self.ghost_ahead[which].advance(&self.ghost_links, head, tail);
        }
    }

    /// Evicts the LRU line of T1 or T2 into the matching ghost list (REPLACE in the paper).
    fn replace(&mut self, incoming_in_b2: bool) -> Option<SlotId> {
        let t1_len = self.t1.len as f64;
        let from_t1 = t1_len >= 1.0 && (t1_len > self.p || (incoming_in_b2 && t1_len == self.p));
        let (from_t1, slot) = if from_t1 || self.t2.len == 0 {
            (true, self.pop_resident_tail(ONE)?)
        } else {
            (false, self.pop_resident_tail(TWO)?)
        };
        self.slot_list[slot as usize] = Resident::None;
        let key = self.slot_key[slot as usize];
        self.add_ghost(key, if from_t1 { Ghost::B1 } else { Ghost::B2 });
        Some(slot)
    }
}

impl ReplacementPolicy for Arc {
    fn name(&self) -> &'static str {
        "arc"
    }

    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        match self.slot_list[slot as usize] {
            Resident::T1 => {
                self.slot_links.unlink(&mut self.t1, slot);
                self.slot_links.push_head(&mut self.t2, slot);
                self.slot_list[slot as usize] = Resident::T2;
            }
            Resident::T2 => self.slot_links.move_to_head(&mut self.t2, slot),
            Resident::None => debug_assert!(false, "hit on a slot ARC does not hold"),
        }
    }

    fn on_miss(&mut self, key: LineKey, need_victim: bool, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        victims.extend(self.choose_victim(key, need_victim));
    }

    fn on_insert(&mut self, slot: SlotId, key: LineKey, _info: &AccessInfo) {
        self.insert(slot, key);
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.remove(slot);
    }

    /// `c` follows, and the oldest ghosts go until the lists hold what
    /// they may with `c` (FAST'03: |T1| + |B1| <= c, all four <= 2c; the
    /// misses that keep those bounds drop one ghost each, not a surplus).
    fn set_lines_in_service(&mut self, lines: usize) {
        let c = lines as u32;
        self.capacity = u64::from(c);
        self.p = self.p.min(f64::from(c));
        while self.t1.len + self.b1.len > c && self.b1.len > 0 {
            self.drop_lru_ghost(Ghost::B1);
        }
        let all = |a: &Self| a.t1.len + a.t2.len + a.b1.len + a.b2.len;
        while all(self) > 2 * c && self.b2.len > 0 {
            self.drop_lru_ghost(Ghost::B2);
        }
    }

    /// Back to the head of the list it left (REPLACE made a ghost of its
    /// key in B1 or B2: that ghost goes; a T1 line evicted without a ghost
    /// goes back to T1).
    fn on_victim_kept(&mut self, slot: SlotId, key: LineKey, _info: &AccessInfo) {
        let to_t2 = match self.ghost_of(&key) {
            Some(g) => {
                let in_b2 = self.ghost_list[g as usize] == Ghost::B2;
                self.remove_ghost(g);
                in_b2
            }
            None => false,
        };
        self.slot_key[slot as usize] = key;
        if to_t2 {
            self.slot_links.push_head(&mut self.t2, slot);
            self.slot_list[slot as usize] = Resident::T2;
        } else {
            self.slot_links.push_head(&mut self.t1, slot);
            self.slot_list[slot as usize] = Resident::T1;
        }
    }

    /// The miss's victim choice again, without its adaptation of `p` and
    /// its ghost trimming (done once, by `on_miss`): when T1 alone fills
    /// the cache on a miss that found no ghost, T1's oldest leaves without
    /// a ghost, as `on_miss` does; otherwise REPLACE.
    fn on_miss_again(&mut self, _key: LineKey, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        if !self.incoming_to_t2 && u64::from(self.t1.len) >= self.capacity {
            if let Some(slot) = self.pop_resident_tail(ONE) {
                self.slot_list[slot as usize] = Resident::None;
                victims.push(slot);
            }
            return;
        }
        victims.extend(self.replace(self.miss_in_b2));
    }

    fn next_victims(&self) -> [Option<SlotId>; 2] {
        self.prefetch_ghost_tails();
        self.likely_victims()
    }

    #[inline]
    fn prefetch_hit(&self, slot: SlotId) {
        self.slot_links.prefetch(slot);
        crate::prefetch::prefetch_address(self.slot_list.as_ptr().wrapping_add(slot as usize) as usize);
    }

    /// The ghost index entry a miss on the key looks up, or an eviction of
    /// it fills.
    #[inline]
    fn prefetch_key(&self, hash: u32) {
        self.ghost_index.prefetch_hashed(hash);
    }

    /// The ghost a miss on the key will probably find (same hash bits):
    /// its key, compared by the lookup, and its list.
    #[inline]
    fn prefetch_miss(&self, hash: u32) {
        if let Some(g) = self.ghost_index.peek_hashed(hash) {
            crate::prefetch::prefetch_address(self.ghost_key.as_ptr().wrapping_add(g as usize) as usize);
            crate::prefetch::prefetch_address(self.ghost_list.as_ptr().wrapping_add(g as usize) as usize);
        }
    }
}

impl Arc {
    /// The FAST'03 miss cases II-IV: adapt `p`, trim ghosts, REPLACE when full.
    fn choose_victim(&mut self, key: LineKey, need_victim: bool) -> Option<SlotId> {
        let c = self.capacity;
        match self.ghost_of(&key) {
            Some(g) => {
                let (b1, b2) = (self.b1.len as f64, self.b2.len as f64);
                let in_b2 = self.ghost_list[g as usize] == Ghost::B2;
                self.miss_in_b2 = in_b2;
                if in_b2 {
                    let delta = if b2 >= b1 { 1.0 } else { b1 / b2 };
                    self.p = (self.p - delta).max(0.0);
                } else {
                    let delta = if b1 >= b2 { 1.0 } else { b2 / b1 };
                    self.p = (self.p + delta).min(c as f64);
                }
                let victim = if need_victim { self.replace(in_b2) } else { None };
                self.remove_ghost(g);
                self.incoming_to_t2 = true;
                victim
            }
            None => {
                self.incoming_to_t2 = false;
                self.miss_in_b2 = false;
                let (t1, t2) = (self.t1.len as u64, self.t2.len as u64);
                let (b1, b2) = (self.b1.len as u64, self.b2.len as u64);
                if t1 + b1 >= c {
                    if t1 < c {
                        self.drop_lru_ghost(Ghost::B1);
                        if need_victim {
                            self.replace(false)
                        } else {
                            None
                        }
                    } else {
                        // T1 alone fills the cache: its LRU leaves without a ghost.
                        // (|T1| = c means no slot is free, so a victim is wanted.)
                        debug_assert!(need_victim);
                        if !need_victim {
                            return None;
                        }
                        let slot = self.pop_resident_tail(ONE)?;
                        self.slot_list[slot as usize] = Resident::None;
                        Some(slot)
                    }
                } else {
                    if t1 + t2 + b1 + b2 >= 2 * c {
                        self.drop_lru_ghost(Ghost::B2);
                    }
                    if need_victim {
                        self.replace(false)
                    } else {
                        None
                    }
                }
            }
        }
    }

    /// Takes the oldest line of T1 (`ONE`) or T2 (`TWO`) off its list and
    /// walks that list's lookahead on.
    fn pop_resident_tail(&mut self, which: usize) -> Option<SlotId> {
        let list = if which == ONE { &mut self.t1 } else { &mut self.t2 };
        let slot = self.slot_links.pop_tail(list)?;
        self.ahead[which].advance(&self.slot_links, list, slot);
        Some(slot)
    }

    fn insert(&mut self, slot: SlotId, key: LineKey) {
        self.slot_key[slot as usize] = key;
        if std::mem::take(&mut self.incoming_to_t2) {
            self.slot_links.push_head(&mut self.t2, slot);
            self.slot_list[slot as usize] = Resident::T2;
        } else {
            self.slot_links.push_head(&mut self.t1, slot);
            self.slot_list[slot as usize] = Resident::T1;
        }
    }

    /// Loads what dropping the oldest ghosts of B1 and B2 will touch: the
    /// index entry of one a few drops away (its key was loaded when it was
    /// the later one), and the key and list of one further on (its links
    /// were loaded by the walk).
    #[inline]
    fn prefetch_ghost_tails(&self) {
        for ahead in &self.ghost_ahead {
            let [soon, later] = ahead.upcoming();
            if later != NIL {
                crate::prefetch::prefetch_address(
                    self.ghost_key.as_ptr().wrapping_add(later as usize) as usize
                );
                crate::prefetch::prefetch_address(
                    self.ghost_list.as_ptr().wrapping_add(later as usize) as usize
                );
            }
            if let Some(key) = self.ghost_key.get(soon as usize) {
                self.ghost_index.prefetch(key);
            }
        }
    }

    fn likely_victims(&self) -> [Option<SlotId>; 2] {
        // REPLACE's usual choice (ignoring the B2-hit tie case), asked
        // between a miss and its insertion: the incoming line is counted
        // in the list it is about to join.
        let (t1, t2) = if self.incoming_to_t2 {
            (self.t1.len, self.t2.len + 1)
        } else {
            (self.t1.len + 1, self.t2.len)
        };
        let which = if t1 > 0 && (t1 as f64 > self.p || t2 == 0) {
            ONE
        } else {
            TWO
        };
        let ahead = &self.ahead[which];
        let [soon, later] = ahead.upcoming();
        // The ghost index position the soon victim's key will take (its
        // key was loaded when it was the later one).
        if let Some(key) = self.slot_key.get(soon as usize) {
            self.ghost_index.prefetch(key);
        }
        if later != NIL {
            // REPLACE reads the victim's key (to make it a ghost) and its list.
            crate::prefetch::prefetch_address(self.slot_key.as_ptr().wrapping_add(later as usize) as usize);
            crate::prefetch::prefetch_address(self.slot_list.as_ptr().wrapping_add(later as usize) as usize);
        }
        ahead.next_victims()
    }

    fn remove(&mut self, slot: SlotId) {
        match self.slot_list[slot as usize] {
            Resident::T1 => self.slot_links.unlink(&mut self.t1, slot),
            Resident::T2 => self.slot_links.unlink(&mut self.t2, slot),
            Resident::None => return,
        }
        self.slot_list[slot as usize] = Resident::None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{key, Driver};

    fn is_ghost(arc: &Arc, line: u64) -> bool {
        arc.ghost_of(&key(line)).is_some()
    }

    #[test]
    fn a_kept_dirty_victim_goes_back_to_its_list_and_a_ghost_hit_still_enters_t2() {
        let mut d = Driver::new(Arc::new(3), 3);
        // 1 reaches T2; 2, 3, 4 go through T1, and 4's miss sends 2 to B1.
        d.run(&[1, 1, 2, 3, 4]);
        assert_eq!(d.policy.list_sizes(), (2, 1, 1, 0));
        assert!(is_ghost(&d.policy, 2));
        // 2 again: a B1 ghost hit (p grows to 1). REPLACE names 3, T1's
        // oldest, which is dirty and kept; asked again it names 4.
        d.miss_keeping(2, &[3]);
        assert_eq!(d.evicted, vec![2, 4]);
        assert_eq!(d.resident(), vec![1, 2, 3]);
        let list_of = |line| d.policy.slot_list[d.slot_of(line).unwrap() as usize];
        assert_eq!(list_of(2), Resident::T2, "a ghost hit enters T2");
        assert_eq!(list_of(3), Resident::T1, "the kept line is back in T1");
        assert_eq!(list_of(1), Resident::T2);
        assert!(!is_ghost(&d.policy, 3), "a resident line is no ghost");
        assert!(is_ghost(&d.policy, 4));
        assert_eq!(d.policy.list_sizes(), (1, 2, 1, 0));
        assert_eq!(d.policy.target_t1(), 1.0, "p adapted once");
        check_sizes(&d.policy);
    }

    /// |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c (FAST'03).
    fn check_sizes(arc: &Arc) {
        let (t1, t2, b1, b2) = arc.list_sizes();
        let c = arc.capacity as u32;
        assert!(t1 + b1 <= c, "|T1| + |B1| = {} > c = {c}", t1 + b1);
        assert!(
            t1 + t2 + b1 + b2 <= 2 * c,
            "directory of {} > 2c",
            t1 + t2 + b1 + b2
        );
    }

    #[test]
    fn a_kept_victim_of_a_full_t1_leaves_no_ghost_on_the_retry() {
        // c = 2. After these, T1 holds 4 and 5 and fills the cache alone.
        let mut d = Driver::new(Arc::new(2), 2);
        d.run(&[1, 1, 2, 3, 4, 3, 5]);
        check_sizes(&d.policy);
        let (t1, ..) = d.policy.list_sizes();
        assert_eq!(t1, 2, "T1 fills the cache");
        // 6 misses (no ghost): T1's oldest leaves without a ghost; it is
        // dirty and kept, and the retry takes the other, again without one.
        let ghosts_before = d.policy.list_sizes().2;
        d.miss_keeping(6, &[4]);
        check_sizes(&d.policy);
        assert_eq!(d.policy.list_sizes().2, ghosts_before, "no B1 ghost made");
        assert!(d.slot_of(4).is_some() && d.slot_of(6).is_some());
        assert!(!is_ghost(&d.policy, 4));
    }

    #[test]
    fn a_kept_victim_from_t2_goes_back_to_t2() {
        // c = 2: 1 and 2 reach T2, then 3 misses and REPLACE takes T2's
        // oldest, 1 (T1 is empty), dirty and kept; the retry takes 2.
        let mut d = Driver::new(Arc::new(2), 2);
        d.run(&[1, 1, 2, 2]);
        assert_eq!(d.policy.list_sizes(), (0, 2, 0, 0));
        d.miss_keeping(3, &[1]);
        check_sizes(&d.policy);
        assert_eq!(d.policy.slot_list[d.slot_of(1).unwrap() as usize], Resident::T2);
        assert!(!is_ghost(&d.policy, 1));
        assert!(is_ghost(&d.policy, 2));
    }
}
