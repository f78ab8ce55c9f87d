//! The SSD write-buffer policies (CFLRU, BPLRU, VBBMS, Req-block): hand-computed
//! sequences on a bare policy, bounds under random sequences, and runs through
//! the full `Cache` checked against the data model.

mod common;

use std::collections::HashMap;

use common::{actions, cache, model_cache, Action, Harness};
use iocache_core::policy::{AccessInfo, Bplru, Cflru, Region, ReplacementPolicy, ReqBlock, ReqList, Vbbms};
use iocache_core::{IoKind, LineKey, Request, WritePolicy};
use proptest::prelude::*;

fn key(line: u64) -> LineKey {
    LineKey {
        volume: 0,
        line_index: line,
    }
}

/// Drives a bare policy the way the cache does: requests of whole lines,
/// processed line by line; a hit calls `on_hit`, an admitted miss `on_miss`
/// then `on_insert`. Writes are always admitted; reads only with `reads_insert`
/// (write policy `wb`), otherwise as under `wo`.
struct Driver<P: ReplacementPolicy> {
    policy: P,
    capacity: usize,
    reads_insert: bool,
    slot_line: Vec<Option<u64>>,
    dirty: Vec<bool>,
    line_slot: HashMap<u64, u32>,
    free: Vec<u32>,
    seq: u64,
    hits: u64,
    /// Lines evicted by each batch, in the order the policy named them.
    batches: Vec<Vec<u64>>,
}

impl<P: ReplacementPolicy> Driver<P> {
    fn new(policy: P, capacity: usize) -> Self {
        Driver {
            policy,
            capacity,
            reads_insert: false,
            slot_line: vec![None; capacity],
            dirty: vec![false; capacity],
            line_slot: HashMap::new(),
            free: (0..capacity as u32).rev().collect(),
            seq: 0,
            hits: 0,
            batches: Vec::new(),
        }
    }

    fn request(&mut self, kind: IoKind, first: u64, lines: u32, now_ns: u64) {
        self.seq += 1;
        for line in first..first + lines as u64 {
            let mut info = AccessInfo {
                now_ns,
                kind,
                request_seq: self.seq,
                request_lines: lines,
                dirty: false,
            };
            if let Some(&slot) = self.line_slot.get(&line) {
                self.hits += 1;
                if kind == IoKind::Write {
                    self.dirty[slot as usize] = true;
                }
                info.dirty = self.dirty[slot as usize];
                self.policy.on_hit(slot, &info);
                continue;
            }
            if kind == IoKind::Read && !self.reads_insert {
                continue;
            }
            let need_victim = self.free.is_empty();
            let mut victims = Vec::new();
            self.policy.on_miss(key(line), need_victim, &info, &mut victims);
            assert!(need_victim || victims.is_empty(), "victims with free slots");
            if need_victim {
                assert!(!victims.is_empty(), "no victim from a full cache");
            }
            let mut batch = Vec::new();
            for &v in &victims {
                let l = self.slot_line[v as usize]
                    .take()
                    .expect("victim is a resident slot");
                self.line_slot.remove(&l);
                self.dirty[v as usize] = false;
                self.free.push(v);
                batch.push(l);
            }
            if !batch.is_empty() {
                self.batches.push(batch);
            }
            let slot = self.free.pop().expect("a slot is free");
            self.slot_line[slot as usize] = Some(line);
            self.line_slot.insert(line, slot);
            info.dirty = kind == IoKind::Write;
            self.dirty[slot as usize] = info.dirty;
            self.policy.on_insert(slot, key(line), &info);
        }
    }

    fn write(&mut self, first: u64, lines: u32, now_ns: u64) {
        self.request(IoKind::Write, first, lines, now_ns);
    }

    fn read(&mut self, first: u64, lines: u32, now_ns: u64) {
        self.request(IoKind::Read, first, lines, now_ns);
    }

    /// Invalidates a resident line (as the cache does for `wi`).
    fn remove(&mut self, line: u64) {
        let slot = self.line_slot.remove(&line).expect("resident");
        self.slot_line[slot as usize] = None;
        self.dirty[slot as usize] = false;
        self.policy.on_remove(slot);
        self.free.push(slot);
    }

    /// Marks a resident line clean (as a flush does).
    fn clean(&mut self, line: u64) {
        let slot = self.line_slot[&line];
        self.dirty[slot as usize] = false;
        self.policy.on_clean(slot);
    }

    fn resident(&self) -> Vec<u64> {
        let mut r: Vec<u64> = self.line_slot.keys().copied().collect();
        r.sort();
        r
    }

    fn lines(&self, slots: &[u32]) -> Vec<u64> {
        slots
            .iter()
            .map(|&s| self.slot_line[s as usize].unwrap())
            .collect()
    }

    fn last_batch(&self) -> Vec<u64> {
        self.batches.last().cloned().unwrap_or_default()
    }
}

// ---------------------------------------------------------------- Req-block

fn reqblock_lists(d: &Driver<ReqBlock>, list: ReqList) -> Vec<(Vec<u64>, u64, bool)> {
    d.policy
        .blocks(list)
        .into_iter()
        .map(|b| (d.lines(&b.slots), b.access_cnt, b.split))
        .collect()
}

#[test]
fn reqblock_splits_hits_on_large_blocks_and_moves_small_blocks() {
    // δ = 2, as in the paper's Figure 5.
    let mut d = Driver::new(ReqBlock::new(10, 2), 10);
    d.write(0, 4, 1); // request A: one block {0,1,2,3} at the head of IRL
    assert_eq!(
        reqblock_lists(&d, ReqList::Irl),
        vec![(vec![0, 1, 2, 3], 1, false)]
    );
    // Request B rewrites line 2: A has 4 > δ pages, so page 2 is split off into a
    // new block at the head of DRL; A stays in IRL with {0,1,3}.
    d.write(2, 1, 2);
    assert_eq!(reqblock_lists(&d, ReqList::Irl), vec![(vec![0, 1, 3], 1, false)]);
    assert_eq!(reqblock_lists(&d, ReqList::Drl), vec![(vec![2], 1, true)]);
    // Request C reads line 2: its block has 1 ≤ δ page, so the block moves to SRL
    // and its access count becomes 2.
    d.read(2, 1, 3);
    assert_eq!(reqblock_lists(&d, ReqList::Drl), vec![]);
    assert_eq!(reqblock_lists(&d, ReqList::Srl), vec![(vec![2], 2, true)]);
    // Request D writes lines 1..=3, page by page:
    //   line 1 hits A {0,1,3} (3 > δ): split into D's new DRL block {1}; A = {0,3};
    //   line 2 hits the SRL block {2} (small): access 3, stays at SRL's head;
    //   line 3 hits A {0,3} (2 ≤ δ, now small): A moves to SRL's head, access 2.
    d.write(1, 3, 4);
    assert_eq!(reqblock_lists(&d, ReqList::Irl), vec![]);
    assert_eq!(reqblock_lists(&d, ReqList::Drl), vec![(vec![1], 1, true)]);
    assert_eq!(
        reqblock_lists(&d, ReqList::Srl),
        vec![(vec![0, 3], 2, false), (vec![2], 3, true)]
    );
    assert_eq!(d.policy.list_pages(), [0, 3, 1]);
    let counters: HashMap<_, _> = d.policy.counters().into_iter().collect();
    assert_eq!(counters["splits"], 2);
    assert_eq!(counters["small_block_hits"], 3);
}

#[test]
fn reqblock_gathers_one_requests_split_pages_into_one_drl_block() {
    let mut d = Driver::new(ReqBlock::new(10, 2), 10);
    d.write(0, 8, 1); // X = {0..7}
    d.write(0, 5, 2); // every page hits X while it is large (8, 7, 6, 5, 4 > 2 pages)
    assert_eq!(reqblock_lists(&d, ReqList::Irl), vec![(vec![5, 6, 7], 1, false)]);
    assert_eq!(
        reqblock_lists(&d, ReqList::Drl),
        vec![(vec![0, 1, 2, 3, 4], 1, true)]
    );
}

#[test]
fn reqblock_victim_is_the_tail_block_with_the_lowest_freq() {
    // Capacity 6, δ = 2, times in ns.
    let mut d = Driver::new(ReqBlock::new(6, 2), 6);
    d.write(0, 3, 100); // X = {0,1,2}, IRL, inserted at 100
    d.write(10, 1, 200); // Y = {10}, IRL, inserted at 200
    d.write(10, 1, 300); // hit on small Y: to SRL, Access_cnt 2
    d.write(20, 2, 400); // Z = {20,21}, IRL head; the cache is full
                         // At t = 1000 the tails are X (IRL) and Y (SRL):
                         //   Freq(X) = 1 / (3 × 900) = 0.00037,  Freq(Y) = 2 / (1 × 800) = 0.0025.
    d.write(30, 1, 1000);
    assert_eq!(d.batches, vec![vec![0, 1, 2]]);
    assert_eq!(d.resident(), vec![10, 20, 21, 30]);

    // The formula, not the list, decides: an old SRL block loses to a young large block.
    let mut d = Driver::new(ReqBlock::new(4, 2), 4);
    d.write(10, 1, 0); // Y, inserted at 0
    d.write(10, 1, 10); // to SRL, Access_cnt 2
    d.write(0, 3, 990); // X = {0,1,2}, inserted at 990; full
                        // At 1000: Freq(X) = 1 / (3 × 10) = 0.033, Freq(Y) = 2 / (1 × 1000) = 0.002.
    d.write(30, 1, 1000);
    assert_eq!(d.batches, vec![vec![10]]);
}

#[test]
fn reqblock_counts_age_in_requests_without_a_clock() {
    // All at now_ns = 0: ages are counted in requests.
    let mut d = Driver::new(ReqBlock::new(2, 5), 2);
    d.write(0, 1, 0); // request 1: A = {0}
    d.write(1, 1, 0); // request 2: B = {1}
    d.write(1, 1, 0); // request 3: hit, B to SRL, Access_cnt 2
                      // Request 4: Freq(A) = 1 / (1 × (4 − 1)) = 0.33, Freq(B) = 2 / (1 × (4 − 2)) = 1.
    d.write(5, 1, 0);
    assert_eq!(d.batches, vec![vec![0]]);
    // Request 5: tails A' = {5} (IRL, age 1: Freq 1) and B (SRL, age 3: 0.67).
    d.write(6, 1, 0);
    assert_eq!(d.batches, vec![vec![0], vec![1]]);
}

#[test]
fn reqblock_merges_a_split_victim_with_the_rest_of_its_request_block() {
    let mut d = Driver::new(ReqBlock::new(9, 2), 9);
    d.write(0, 8, 1); // X = {0..7} in IRL at t = 1
    d.write(0, 5, 2); // D = {0..4} split off into DRL at t = 2; X = {5,6,7}
    d.write(20, 1, 3); // Z = {20} at IRL's head; 9 pages: full
                       // At t = 1000 the tails are X (IRL) and D (DRL):
                       //   Freq(X) = 1 / (3 × 999) = 3.3e-4,  Freq(D) = 1 / (5 × 998) = 2.0e-4.
                       // D is the victim; its origin X is still in IRL, so both go in one batch.
    d.write(30, 1, 1000);
    assert_eq!(d.batches, vec![vec![0, 1, 2, 3, 4, 5, 6, 7]]);
    assert_eq!(d.resident(), vec![20, 30]);
    let counters: HashMap<_, _> = d.policy.counters().into_iter().collect();
    assert_eq!(counters["merges"], 1);
}

#[test]
fn reqblock_does_not_merge_with_an_origin_that_left_irl() {
    let mut d = Driver::new(ReqBlock::new(9, 2), 9);
    d.write(0, 8, 1); // X = {0..7}
    d.write(0, 6, 2); // D = {0..5}; X = {6,7} is now small
    d.write(7, 1, 3); // hit on small X: X moves to SRL (Access_cnt 2)
    d.write(20, 1, 4); // Z = {20}; 9 pages
                       // At t = 1000: Freq(D) = 1 / (6 × 998) = 1.7e-4 (DRL tail),
                       // Freq(X) = 2 / (2 × 999) = 1.0e-3 (SRL tail), Freq(Z) = 1 / 996 (IRL tail).
    d.write(30, 1, 1000);
    assert_eq!(d.batches, vec![vec![0, 1, 2, 3, 4, 5]]);
    assert_eq!(d.resident(), vec![6, 7, 20, 30]);
}

#[test]
fn reqblock_evicts_the_block_being_written_when_a_request_outgrows_the_cache() {
    let mut d = Driver::new(ReqBlock::new(3, 5), 3);
    d.write(0, 8, 5);
    // The only candidate is the request's own block: every resident line goes.
    assert_eq!(d.batches, vec![vec![0, 1, 2], vec![3, 4, 5]]);
    assert_eq!(d.resident(), vec![6, 7]);
}

#[test]
fn reqblock_on_remove_shrinks_and_drops_blocks() {
    let mut d = Driver::new(ReqBlock::new(4, 2), 4);
    d.write(0, 3, 1);
    d.write(10, 1, 2);
    d.remove(1);
    assert_eq!(
        reqblock_lists(&d, ReqList::Irl),
        vec![(vec![10], 1, false), (vec![0, 2], 1, false)]
    );
    d.remove(10);
    assert_eq!(d.policy.list_blocks(), [1, 0, 0]);
    d.write(20, 2, 3);
    d.write(30, 1, 100); // full: the only tail is IRL's, {0,2}
    assert_eq!(d.batches, vec![vec![0, 2]]);
}

#[test]
fn reqblock_on_a_one_line_cache() {
    let mut d = Driver::new(ReqBlock::new(1, 5), 1);
    d.write(0, 1, 1);
    d.write(0, 1, 2);
    d.write(1, 1, 3);
    d.read(1, 1, 4);
    d.write(2, 2, 5);
    assert_eq!(d.hits, 2);
    assert_eq!(d.batches, vec![vec![0], vec![1], vec![2]]);
    assert_eq!(d.resident(), vec![3]);
}

// ---------------------------------------------------------------- BPLRU

fn bplru_blocks(d: &Driver<Bplru>) -> Vec<(u64, Vec<u64>)> {
    d.policy
        .blocks()
        .into_iter()
        .map(|(_, b, slots)| (b, d.lines(&slots)))
        .collect()
}

#[test]
fn bplru_evicts_whole_lru_blocks_and_counts_padding() {
    // Blocks of 4 pages; 4 lines of cache.
    let mut d = Driver::new(Bplru::new(4, 4), 4);
    d.write(0, 1, 0); // block 0
    d.write(5, 1, 0); // block 1
    d.write(1, 1, 0); // block 0 again: to the MRU end
    d.write(9, 1, 0); // block 2
    assert_eq!(
        bplru_blocks(&d),
        vec![(2, vec![9]), (0, vec![0, 1]), (1, vec![5])]
    );
    d.write(13, 1, 0); // full: the LRU block 1 goes; 3 of its pages are padded
    assert_eq!(d.last_batch(), vec![5]);
    assert_eq!(d.policy.padding_pages(), 3);
    d.read(0, 1, 0); // a read hit moves block 0 to the MRU end too
    assert_eq!(
        bplru_blocks(&d),
        vec![(0, vec![0, 1]), (3, vec![13]), (2, vec![9])]
    );
    d.write(2, 1, 0); // a new page of block 0: block 0 is MRU, block 2 is evicted
    assert_eq!(d.last_batch(), vec![9]);
    assert_eq!(d.policy.padding_pages(), 6);
    assert_eq!(bplru_blocks(&d), vec![(0, vec![0, 1, 2]), (3, vec![13])]);
    d.write(20, 1, 0); // block 3 goes
    d.write(24, 1, 0); // block 0 (3 pages, one padded) goes
    assert_eq!(d.batches, vec![vec![5], vec![9], vec![13], vec![0, 1, 2]]);
    assert_eq!(d.policy.padding_pages(), 3 + 3 + 3 + 1);
}

#[test]
fn bplru_compensates_a_sequentially_written_block() {
    let mut d = Driver::new(Bplru::new(8, 4), 8);
    d.write(100, 1, 0); // block 25
    d.write(0, 4, 0); // block 0 written 0,1,2,3 in order: moved to the LRU end
    assert_eq!(d.policy.compensations(), 1);
    assert_eq!(bplru_blocks(&d), vec![(25, vec![100]), (0, vec![0, 1, 2, 3])]);
    d.write(200, 1, 0);
    d.write(300, 1, 0);
    d.write(400, 1, 0); // 8 pages
    d.write(500, 1, 0); // the compensated block goes first, with no padding
    assert_eq!(d.batches, vec![vec![0, 1, 2, 3]]);
    assert_eq!(d.policy.padding_pages(), 0);

    // Out of order, or with a gap in the pass: no compensation.
    let mut d = Driver::new(Bplru::new(8, 4), 8);
    for line in [3, 2, 1, 0] {
        d.write(line, 1, 0);
    }
    d.write(4, 1, 0);
    d.write(5, 1, 0);
    d.write(7, 1, 0);
    d.write(6, 1, 0);
    assert_eq!(d.policy.compensations(), 0);
    // A pass may span requests, and restarts at the block's first page.
    let mut d = Driver::new(Bplru::new(8, 4), 8);
    d.write(0, 2, 0);
    d.write(0, 1, 0);
    d.write(1, 2, 0);
    d.read(2, 1, 0); // reads neither break nor advance the pass
    d.write(3, 1, 0);
    assert_eq!(d.policy.compensations(), 1);
}

#[test]
fn bplru_on_remove_and_a_one_line_cache() {
    let mut d = Driver::new(Bplru::new(4, 4), 4);
    d.write(0, 3, 0);
    d.remove(1);
    d.remove(0);
    assert_eq!(bplru_blocks(&d), vec![(0, vec![2])]);
    d.remove(2);
    assert!(d.policy.blocks().is_empty());

    let mut d = Driver::new(Bplru::new(1, 64), 1);
    d.write(0, 1, 0);
    d.write(1, 1, 0);
    d.write(1, 1, 0);
    d.write(64, 1, 0);
    assert_eq!(d.batches, vec![vec![0], vec![1]]);
    assert_eq!(d.policy.padding_pages(), 126);
}

#[test]
fn bplru_batch_of_a_whole_cache() {
    // One flash block holds the whole cache: a miss in another block empties it.
    let mut d = Driver::new(Bplru::new(3, 64), 3);
    d.write(10, 3, 0);
    d.write(100, 1, 0);
    assert_eq!(d.batches, vec![vec![10, 11, 12]]);
    assert_eq!(d.policy.padding_pages(), 61);
}

// ---------------------------------------------------------------- CFLRU

#[test]
fn cflru_evicts_clean_pages_first_inside_the_window_only() {
    // 4 lines, window 0.5 = the 2 least recently used pages. Reads insert clean pages.
    let mut d = Driver::new(Cflru::new(4, 0.5), 4);
    d.reads_insert = true;
    d.write(2, 1, 0);
    d.read(1, 1, 0); // clean
    d.write(3, 1, 0);
    d.write(4, 1, 0); // LRU order (MRU first): 4 3 1 2; window {1, 2}
    assert_eq!(d.lines(&d.policy.window()), vec![1, 2]);
    d.read(5, 1, 0); // the clean 1 is in the window: it goes, not the LRU dirty 2
    assert_eq!(d.last_batch(), vec![1]);
    // Order 5(clean) 4 3 2; window {3, 2}, all dirty: the clean 5 is outside it.
    d.read(6, 1, 0);
    assert_eq!(d.last_batch(), vec![2]);
    // Order 6(c) 5(c) 4 3; window {4, 3}: dirty. Hit 4 with a read (stays dirty):
    d.read(4, 1, 0); // order 4 6 5 3; window {5(c), 3}
    d.write(7, 1, 0); // the clean 5 goes although 3 is less recently used
    assert_eq!(d.last_batch(), vec![5]);
    // Order 7 4 6(c) 3; window {6(c), 3}.
    d.write(6, 1, 0); // a write hit dirties 6 and moves it: order 6 7 4 3; window {4, 3}
    d.write(8, 1, 0);
    assert_eq!(d.last_batch(), vec![3]);
    // Order 8 6 7 4; window {7, 4}, dirty. A flush cleans 7:
    d.clean(7);
    d.write(9, 1, 0);
    assert_eq!(d.last_batch(), vec![7]);
    let counters: HashMap<_, _> = d.policy.counters().into_iter().collect();
    assert_eq!(counters["clean_first_evictions"], 3);
    assert_eq!(d.batches.len(), 5);
}

#[test]
fn cflru_with_all_pages_dirty_is_lru_and_survives_one_line() {
    let mut d = Driver::new(Cflru::new(3, 0.25), 3);
    for line in [1, 2, 3, 1, 4, 5] {
        d.write(line, 1, 0);
    }
    assert_eq!(d.batches, vec![vec![2], vec![3]]);
    assert_eq!(d.resident(), vec![1, 4, 5]);
    let mut d = Driver::new(Cflru::new(1, 0.25), 1);
    d.reads_insert = true;
    for line in [7, 7, 8, 7, 7] {
        d.read(line, 1, 0);
    }
    assert_eq!(d.hits, 2);
    assert_eq!(d.resident(), vec![7]);
    d.remove(7);
    d.write(9, 1, 0);
    assert_eq!(d.resident(), vec![9]);
    // A quarter of one line rounds to an empty window: plain LRU.
    assert_eq!(d.policy.window_target(), 0);
    assert!(d.policy.window().is_empty());
}

// ---------------------------------------------------------------- VBBMS

#[test]
fn vbbms_classifies_requests_by_size_into_regions_of_virtual_blocks() {
    // 10 lines: random region 6, sequential region 4; virtual blocks of 3 and 4 lines.
    let mut d = Driver::new(Vbbms::new(10, 0.6, 3, 4, 4), 10);
    d.write(0, 1, 0); // 1 line: random, virtual block 0 (lines 0-2)
    d.write(1, 1, 0); // random, same virtual block
    d.write(100, 4, 0); // 4 lines: sequential, virtual block 25 (lines 100-103)
    d.write(6, 3, 0); // 3 lines: random, virtual block 2
    assert_eq!(d.policy.region_pages(), [5, 4]);
    let random: Vec<_> = d
        .policy
        .virtual_blocks(Region::Random)
        .into_iter()
        .map(|(_, vb, s)| (vb, d.lines(&s)))
        .collect();
    assert_eq!(random, vec![(2, vec![6, 7, 8]), (0, vec![0, 1])]);
    let seq: Vec<_> = d
        .policy
        .virtual_blocks(Region::Sequential)
        .into_iter()
        .map(|(_, vb, s)| (vb, d.lines(&s)))
        .collect();
    assert_eq!(seq, vec![(25, vec![100, 101, 102, 103])]);
    let counters: HashMap<_, _> = d.policy.counters().into_iter().collect();
    assert_eq!(
        (counters["random_inserts"], counters["sequential_inserts"]),
        (5, 4)
    );
}

#[test]
fn vbbms_evicts_lru_random_and_fifo_sequential_virtual_blocks() {
    let mut d = Driver::new(Vbbms::new(10, 0.6, 3, 4, 4), 10);
    d.write(0, 1, 0); // random vb 0
    d.write(10, 1, 0); // random vb 3
    d.write(20, 1, 0); // random vb 6
    d.write(100, 4, 0); // sequential vb 25
    d.write(30, 1, 0); // random vb 10
    d.write(1, 1, 0); // random vb 0 again (5 random pages, 4 sequential)
    d.write(0, 1, 0); // hit: vb 0 is the MRU random virtual block
    d.write(40, 1, 0); // random vb 13: 6 random pages, full
                       // A random page with the random region at its share: the LRU random vb (3) goes.
    d.write(50, 1, 0);
    assert_eq!(d.last_batch(), vec![10]);
    // A random page again: the region holds 6 = its share: vb 6.
    d.write(60, 1, 0);
    assert_eq!(d.last_batch(), vec![20]);
    // A hit in the sequential region changes nothing (FIFO); a sequential request
    // with that region at its share evicts its oldest virtual block.
    d.write(101, 1, 0);
    d.write(200, 4, 0);
    assert_eq!(d.last_batch(), vec![100, 101, 102, 103]);
    assert_eq!(d.policy.region_pages(), [6, 4]);
    // A sequential request now (its region at share) evicts sequential: its own
    // oldest vb 50 {200..203}, then the random region stays untouched.
    d.write(300, 4, 0);
    assert_eq!(d.last_batch(), vec![200, 201, 202, 203]);
    assert_eq!(d.policy.region_pages(), [6, 4]);
}

#[test]
fn vbbms_random_pages_take_back_room_from_the_sequential_region() {
    let mut d = Driver::new(Vbbms::new(5, 0.6, 3, 4, 4), 5);
    d.write(100, 5, 0); // 5 sequential lines: vbs 25 {100-103} and 26 {104}; full
    d.write(0, 1, 0); // random region below its share of 3: the oldest sequential vb goes
    assert_eq!(d.last_batch(), vec![100, 101, 102, 103]);
    d.write(10, 1, 0);
    d.write(20, 1, 0); // random at its share (3), sequential below (1 of 2): one slot free
    d.write(30, 1, 0); // fills it: 4 random pages
    d.write(40, 1, 0); // random above its share: the LRU random virtual block goes
    assert_eq!(d.batches.len(), 2);
    assert_eq!(d.last_batch(), vec![0]);
    assert_eq!(d.policy.region_pages(), [4, 1]);
    d.remove(10);
    assert_eq!(d.policy.region_pages(), [3, 1]);
}

// ---------------------------------------------------------------- properties

#[derive(Debug, Clone)]
enum Step {
    Read(u64, u32),
    Write(u64, u32),
    Remove(usize),
    Clean(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..48, 1u32..10).prop_map(|(l, n)| Step::Read(l, n)),
        5 => (0u64..48, 1u32..10).prop_map(|(l, n)| Step::Write(l, n)),
        1 => any::<usize>().prop_map(Step::Remove),
        1 => any::<usize>().prop_map(Step::Clean),
    ]
}

fn run_steps<P: ReplacementPolicy>(
    d: &mut Driver<P>,
    steps: &[Step],
    mut check: impl FnMut(&Driver<P>) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    for (t, s) in steps.iter().enumerate() {
        let now = t as u64 / 3; // repeated timestamps on purpose
        match *s {
            Step::Read(l, n) => d.read(l, n, now),
            Step::Write(l, n) => d.write(l, n, now),
            Step::Remove(i) => {
                let r = d.resident();
                if !r.is_empty() {
                    d.remove(r[i % r.len()]);
                }
            }
            Step::Clean(i) => {
                let r = d.resident();
                if !r.is_empty() {
                    d.clean(r[i % r.len()]);
                }
            }
        }
        prop_assert!(d.line_slot.len() <= d.capacity);
        check(d)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(250))]

    #[test]
    fn reqblock_lists_account_for_every_page(
        capacity in 1usize..12, delta in 1u32..6, reads in any::<bool>(),
        steps in prop::collection::vec(step(), 0..150),
    ) {
        let mut d = Driver::new(ReqBlock::new(capacity, delta), capacity);
        d.reads_insert = reads;
        run_steps(&mut d, &steps, |d| {
            let pages = d.policy.list_pages();
            prop_assert_eq!(pages.iter().sum::<u64>() as usize, d.line_slot.len());
            let mut seen = Vec::new();
            for list in [ReqList::Irl, ReqList::Srl, ReqList::Drl] {
                let blocks = d.policy.blocks(list);
                prop_assert_eq!(
                    blocks.iter().map(|b| b.slots.len() as u64).sum::<u64>(),
                    pages[list as usize]
                );
                for b in blocks {
                    prop_assert!(!b.slots.is_empty(), "empty block kept");
                    prop_assert!(b.access_cnt >= 1);
                    if list == ReqList::Srl {
                        prop_assert!(b.slots.len() as u32 <= delta, "large block in SRL");
                    }
                    seen.extend(b.slots);
                }
            }
            seen.sort();
            let mut resident: Vec<u32> = d.line_slot.values().copied().collect();
            resident.sort();
            prop_assert_eq!(seen, resident);
            Ok(())
        })?;
    }

    #[test]
    fn bplru_blocks_hold_only_their_own_pages(
        capacity in 1usize..12, block_pages in 1u64..6, reads in any::<bool>(),
        steps in prop::collection::vec(step(), 0..150),
    ) {
        let mut d = Driver::new(Bplru::new(capacity, block_pages), capacity);
        d.reads_insert = reads;
        run_steps(&mut d, &steps, |d| {
            let mut pages = 0;
            let mut blocks_seen = Vec::new();
            for (_, block, slots) in d.policy.blocks() {
                prop_assert!(!slots.is_empty());
                prop_assert!(slots.len() as u64 <= block_pages);
                prop_assert!(!blocks_seen.contains(&block), "block listed twice");
                blocks_seen.push(block);
                for l in d.lines(&slots) {
                    prop_assert_eq!(l / block_pages, block);
                }
                pages += slots.len();
            }
            prop_assert_eq!(pages, d.line_slot.len());
            Ok(())
        })?;
        // Every evicted batch is one block, padded to a full block.
        let mut padding = 0;
        for b in &d.batches {
            prop_assert!(b.iter().all(|l| l / block_pages == b[0] / block_pages));
            padding += block_pages - b.len() as u64;
        }
        prop_assert_eq!(d.policy.padding_pages(), padding);
    }

    #[test]
    fn vbbms_regions_and_virtual_blocks_stay_consistent(
        capacity in 1usize..12, random_vb in 1u64..5, seq_vb in 1u64..6, threshold in 1u32..6,
        reads in any::<bool>(),
        steps in prop::collection::vec(step(), 0..150),
    ) {
        let mut d = Driver::new(Vbbms::new(capacity, 0.6, random_vb, seq_vb, threshold), capacity);
        d.reads_insert = reads;
        run_steps(&mut d, &steps, |d| {
            let pages = d.policy.region_pages();
            prop_assert_eq!((pages[0] + pages[1]) as usize, d.line_slot.len());
            for (region, size) in [(Region::Random, random_vb), (Region::Sequential, seq_vb)] {
                let mut n = 0;
                for (_, vb, slots) in d.policy.virtual_blocks(region) {
                    prop_assert!(!slots.is_empty() && slots.len() as u64 <= size);
                    for l in d.lines(&slots) {
                        prop_assert_eq!(l / size, vb);
                    }
                    n += slots.len() as u64;
                }
                prop_assert_eq!(n, pages[region as usize]);
            }
            Ok(())
        })?;
    }

    #[test]
    fn cflru_window_is_the_lru_suffix(
        capacity in 1usize..12, window in 0.0f64..=1.0, reads in any::<bool>(),
        steps in prop::collection::vec(step(), 0..150),
    ) {
        let mut d = Driver::new(Cflru::new(capacity, window), capacity);
        d.reads_insert = reads;
        run_steps(&mut d, &steps, |d| {
            let order = d.policy.order();
            prop_assert_eq!(order.len(), d.line_slot.len());
            let w = d.policy.window();
            let expected = (d.policy.window_target() as usize).min(order.len());
            prop_assert_eq!(&w[..], &order[order.len() - expected..]);
            let clean = d.line_slot.values().filter(|&&s| !d.dirty[s as usize]).count();
            prop_assert_eq!(d.policy.clean_pages(), clean);
            Ok(())
        })?;
    }
}

/// A CFLRU victim is the LRU clean page of the window if there is one, else the LRU page.
#[test]
fn cflru_matches_a_naive_model() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        common::xorshift(&mut rng);
        rng % n
    };
    for capacity in [1usize, 2, 3, 5, 8] {
        let mut d = Driver::new(Cflru::new(capacity, 0.4), capacity);
        d.reads_insert = true;
        let w = (capacity as f64 * 0.4).round() as usize;
        // Naive model: (line, dirty) from MRU to LRU.
        let mut model: Vec<(u64, bool)> = Vec::new();
        for _ in 0..2000 {
            let line = next(12);
            let write = next(2) == 0;
            if let Some(at) = model.iter().position(|e| e.0 == line) {
                let (_, dirty) = model.remove(at);
                model.insert(0, (line, dirty || write));
            } else {
                if model.len() == capacity {
                    let start = model.len() - w.min(model.len());
                    let victim = (start..model.len())
                        .rev()
                        .find(|&i| !model[i].1)
                        .unwrap_or(model.len() - 1);
                    model.remove(victim);
                }
                model.insert(0, (line, write));
            }
            if write {
                d.write(line, 1, 0);
            } else {
                d.read(line, 1, 0);
            }
            let mut expect: Vec<u64> = model.iter().map(|e| e.0).collect();
            expect.sort();
            assert_eq!(d.resident(), expect);
        }
    }
}

// ---------------------------------------------------------------- full cache

const SPECS: [&str; 6] = [
    "cflru",
    "cflru:window=0.6",
    "bplru:block_pages=4",
    "vbbms",
    "reqblock:delta=2",
    "reqblock",
];

fn run_harness(spec: &str, capacity: u64, line_shift: u32, start: WritePolicy, actions: Vec<Action>) {
    let mut h = Harness::new(model_cache(
        capacity,
        line_shift,
        spec.parse().unwrap(),
        start,
        false,
    ));
    h.apply_all_and_flush(actions, 1000, |h| {
        let s = h.cache.stats();
        assert!(s.eviction_batches <= s.evictions);
        Ok(())
    })
    .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Under `wo` and `wb` (the write-buffer settings), reads are never stale and
    /// a final flush loses nothing.
    #[test]
    fn flash_policies_never_serve_stale_data_in_write_buffer_mode(
        spec in 0usize..SPECS.len(),
        capacity in 1u64..10,
        line_shift in 0u32..4,
        wb in any::<bool>(),
        actions in prop::collection::vec(actions(96, 40, false), 1..100),
    ) {
        let start = if wb { WritePolicy::WriteBack } else { WritePolicy::WriteOnly };
        run_harness(SPECS[spec], capacity, line_shift, start, actions);
    }

    /// Switching write policies exercises invalidation (`on_remove`) and `on_clean`.
    #[test]
    fn flash_policies_survive_write_policy_changes(
        spec in 0usize..SPECS.len(),
        capacity in 1u64..10,
        line_shift in 0u32..4,
        actions in prop::collection::vec(actions(96, 40, true), 1..100),
    ) {
        run_harness(SPECS[spec], capacity, line_shift, WritePolicy::WriteOnly, actions);
    }
}

#[test]
fn block_policies_evict_in_batches_through_the_cache() {
    // 4 KiB lines; one 64-page flash block holds the whole 16-line cache.
    // Req-block: the read hit on line 0 split it off the 16-line request block,
    // so the victim (the IRL tail) has 15 lines.
    for (spec, batch) in [("bplru", 16.0), ("reqblock", 15.0), ("lru", 1.0)] {
        let c = cache(16, 4096, |c| {
            c.write_policy = WritePolicy::WriteOnly;
            c.policy = spec.parse().unwrap();
        });
        let mut h = Harness::new(c);
        h.run(Request::write(0, 0, 16 * 4096, 1)); // one request fills the cache
        h.run(Request::read(0, 0, 4096, 2)); // a hit
        h.run(Request::read(0, 1 << 20, 4096, 3)); // a read miss: not inserted under wo
        h.run(Request::write(0, 1 << 20, 4096, 4)); // a write miss in another block
        let s = *h.cache.stats();
        assert_eq!(s.full_hits, 1, "{spec}");
        assert_eq!(s.lines_per_eviction_batch(), batch, "{spec}");
        assert_eq!(s.dirty_writebacks, s.evictions, "{spec}");
        h.flush_all_and_check_backend();
    }
}
