//! ReCA's cache manager (TPDS'18 Algorithm 1) is a
//! replacement policy of its own: each line has a priority accumulated from
//! the classes of the requests that touched it (ACCESS_HISTORY_MANAGER adds
//! PRIORITY_CALC of a request to every line it touched when the request
//! leaves the 64-request history queue), a miss is admitted when a slot is
//! free or when its priority is higher than the least priority of the
//! resident lines it is compared with (CACHE_MANAGER), and the least
//! priority line is the victim. The ReCA controller changes its
//! parameters (priorities, eviction rule, neighbour eviction) while it runs,
//! through `Cache::apply(Setting::Policy(..))`, and [`RecaPolicy`] takes them
//! in place (`ReplacementPolicy::reconfigure`) without losing what it knows.
//!
//! Parameters (`iocache policies`): `reca:evict=priority:over=0:
//! access=1/1/1:read=0/0/0:write=0/0/0:neighbours=0:sets=1:lru_window=16:
//! pages=8:history=64:stride=8192:seq_size=131072:streams=4096:wait=4096`.
//!
//! - `evict`: `lru` (least recently used, every miss admitted), `priority`
//!   (Algorithm 1), `priority_lru` (Algorithm 1 among the `lru_window`
//!   least recently used lines: recency and frequency, §3.3.4);
//! - `over`, `access`, `read`, `write`: PRIORITY_CALC's weights (overlapped;
//!   per access class sequential/strided/random; read and write per access
//!   class, as §4.2 says the implementation does). A weight may be negative
//!   (§6.3 tries negative values too): a line's priority is then below a
//!   new line's 0, so such lines go first;
//! - `neighbours`: also evict up to this many resident lines adjacent to a
//!   victim on each side (large file generators, §3.3.5);
//! - `sets`: priorities are compared within one of `sets` sets of lines
//!   (by hash of the line), as §4.2 does to bound the comparison cost;
//! - `pages`: lines remembered while not resident, in multiples of the
//!   capacity;
//! - `history`, `stride`, `seq_size`, `streams`, `wait`: the classifier's
//!   (`classify.rs`; `wait` is its `max_wait`).
//!
//! How priorities change with the category: a line keeps *how many*
//! requests of each class touched it (7 counters: sequential, strided,
//! random × read, write; overlapped), and its priority is those counts
//! weighted by the current weights. The paper accumulates the weighted sum
//! itself, and on a category change "starts by changing the priorities of
//! data pages based on the new workload type" without saying how; keeping
//! the counts lets a new category recompute every priority as if it had
//! been in force all along (after the aging below).
//!
//! Per process (`Cache::set_process_settings`, ReCA characterizing each
//! process apart): a process may have its own category's weights
//! (`set_process_params`; the eviction rule, neighbours and the rest stay
//! the cache's, one replacement order for all). A request of such a
//! process adds PRIORITY_CALC under its own weights to each line it
//! touched, as the paper accumulates priorities, into a sum the line keeps
//! besides its counts; requests of other processes are counted as above
//! and follow the cache-wide category. A category change halves that sum
//! with the counts; a process's own category change leaves what it added
//! before as it was. The heaps' order is the same sum either way, updated
//! where the counts are, so a request pays one map lookup more, and none
//! while no process has weights of its own.
//!
//! Deviations, and why:
//! - **Aging.** When the weights change (a new category) every count is
//!   halved, rounding down. Without it a category change left the cache
//!   full of the old workload's lines, each touched once, that a new line
//!   (priority 0 until its first request leaves the history queue) could
//!   never displace: on `examples/workloads/reca-phases.toml` the random
//!   phase after a sequential one reached 0.29 byte hit ratio with the
//!   random category's policy against 0.37 on its own (docs/results/
//!   reca.md, "The generated phase workload"). Halving keeps the order of
//!   lines touched many times and forgets single touches.
//! - **Bounded priority table.** The paper's priority table grows to half
//!   of free memory. Here lines not resident are remembered in an LRU of at
//!   most `pages` × capacity entries (default 8×, our choice); a forgotten
//!   line restarts at zero.
//! - **Ties** go to the least recently used line (the paper is silent).
//! - **Sets.** The paper gives no number of sets; the default is 1 (one
//!   heap over the whole cache, O(log n) per change, so sets are not needed
//!   for cost). With `sets` > 1 a miss is compared with the least priority
//!   line of its own set; if that set has no line, with the least of all.
//! - **What it sees.** The classifier sees every request (`on_request`),
//!   but admission is asked only for misses the write policy would insert.
//! - **No asynchronous fills or eviction throttling.** The paper limits
//!   pending fills and concurrent evictions; a simulator and a
//!   sans-I/O core have no such queue, so both happen at once.

use std::hash::{Hash, Hasher};

use super::classify::{Classified, Classifier, ClassifierParams};
use super::table::{feature_of, EvictionRule};
use crate::addr::{split_request_keys, LineKey, LineSize, Request, SlotId};
use crate::error::CoreError;
use crate::fasthash::{FxHashMap, FxHasher};
use crate::policy::history::KeyHistory;
use crate::policy::list::{Links, ListHead, NIL};
use crate::policy::slot_heap::{self, SlotHeap, SlotOrder};
use crate::policy::{AccessInfo, PolicyParams, ReplacementPolicy};

/// Every parameter of the `reca` policy: first the six a category sets,
/// then [`RECA_KEPT_PARAMS`].
pub const RECA_PARAMS: &[&str] = &[
    "evict",
    "over",
    "access",
    "read",
    "write",
    "neighbours",
    "sets",
    "lru_window",
    "pages",
    "history",
    "stride",
    "seq_size",
    "streams",
    "wait",
];

/// The parameters a category does not set (kept when the controller
/// switches categories): those after the first six of [`RECA_PARAMS`].
pub const RECA_KEPT_PARAMS: &[&str] = RECA_PARAMS.split_at(6).1;

/// Priorities are kept as integers in thousandths of the table's units, so
/// comparisons are exact.
const PRIORITY_SCALE: f64 = 1000.0;

/// A signed priority as the unsigned key the slot heaps order by: the sign
/// bit flipped, so the order of the keys is the order of the priorities.
fn key_of(priority: i64) -> u64 {
    (priority as u64) ^ (1 << 63)
}

/// The priority a heap key stands for (the inverse of [`key_of`]).
fn priority_of(key: u64) -> i64 {
    (key ^ (1 << 63)) as i64
}

/// What a line keeps of the requests that touched it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    /// Per feature dimension (`table::FEATURE_NAMES`), the requests of
    /// processes without weights of their own: weighed by the weights in
    /// force.
    classes: [u32; 7],
    /// What the requests of processes with weights of their own added,
    /// each weighed by its process's weights then (thousandths).
    own: i64,
}

impl Counts {
    /// One request of class `feature` (and overlapped or not) touched the
    /// line; `own`: what its process's own weights give it, if it has any.
    #[inline]
    fn add(&mut self, feature: usize, overlapped: bool, own: Option<i64>) {
        match own {
            Some(own) => self.own = self.own.saturating_add(own),
            None => {
                self.classes[feature] = self.classes[feature].saturating_add(1);
                if overlapped {
                    self.classes[6] = self.classes[6].saturating_add(1);
                }
            }
        }
    }

    /// Halves everything (rounding toward zero).
    fn age(&mut self) {
        for c in &mut self.classes {
            *c /= 2;
        }
        self.own /= 2;
    }
}

/// The `reca` policy's parameters, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct RecaParams {
    pub rule: EvictionRule,
    /// Weight of each count, in thousandths (negative: the class lowers
    /// a line's priority).
    pub weights: [i64; 7],
    pub neighbours: u32,
    pub sets: u32,
    pub lru_window: u32,
    pub pages: u64,
    pub classifier: ClassifierParams,
}

fn triple(p: &PolicyParams, name: &str, default: [f64; 3]) -> Result<[f64; 3], CoreError> {
    let Some(text) = p.get(name) else {
        return Ok(default);
    };
    let bad = || CoreError::BadParameter {
        given: format!("{name}={text}"),
        reason: format!(
            "`{name}` must be three numbers from -1000000 to 1000000 as A/B/C (sequential/strided/random)"
        ),
    };
    let parts: Vec<&str> = text.split('/').collect();
    if parts.len() != 3 {
        return Err(bad());
    }
    let mut out = [0.0; 3];
    for (o, part) in out.iter_mut().zip(parts) {
        *o = part
            .parse::<f64>()
            .ok()
            .filter(|v| (-1e6..=1e6).contains(v))
            .ok_or_else(bad)?;
    }
    Ok(out)
}

fn milli(v: f64) -> i64 {
    (v * PRIORITY_SCALE).round() as i64
}

impl RecaParams {
    pub fn from_params(p: &PolicyParams) -> Result<RecaParams, CoreError> {
        let rule = match p.get("evict") {
            None => EvictionRule::Priority,
            Some(text) => EvictionRule::parse(text).ok_or_else(|| CoreError::BadParameter {
                given: format!("evict={text}"),
                reason: format!("`evict` must be one of {}", EvictionRule::NAMES),
            })?,
        };
        let over = p.f64_or("over", 0.0, -1e6..=1e6)?;
        let access = triple(p, "access", [1.0; 3])?;
        let read = triple(p, "read", [0.0; 3])?;
        let write = triple(p, "write", [0.0; 3])?;
        let mut weights = [0; 7];
        for a in 0..3 {
            weights[2 * a] = milli(access[a] + read[a]);
            weights[2 * a + 1] = milli(access[a] + write[a]);
        }
        weights[6] = milli(over);
        Ok(RecaParams {
            rule,
            weights,
            neighbours: p.u64_or("neighbours", 0, 0..=1024)? as u32,
            sets: p.u64_or("sets", 1, 1..=1 << 16)? as u32,
            lru_window: p.u64_or("lru_window", 16, 1..=1 << 20)? as u32,
            pages: p.u64_or("pages", 8, 0..=4096)?,
            classifier: ClassifierParams {
                history: p.u64_or("history", 64, 1..=4096)? as usize,
                stride_bytes: p.u64_or("stride", 8 << 10, 0..=1 << 40)?,
                seq_size_bytes: p.u64_or("seq_size", 128 << 10, 0..=1 << 40)?,
                max_streams: p.u64_or("streams", 4096, 1..=65536)? as usize,
                max_wait: p.u64_or("wait", 4096, 1..=1 << 20)?,
            },
        })
    }
}

/// ReCA's priority-based replacement (see the module doc).
pub struct RecaPolicy {
    capacity: usize,
    params: RecaParams,
    classifier: Classifier,
    classified: Vec<Classified>,
    tick: u64,
    slot_key: Vec<LineKey>,
    slot_counts: Vec<Counts>,
    /// Heap keys of the signed priorities ([`key_of`]).
    slot_priority: Vec<u64>,
    slot_stamp: Vec<u64>,
    slot_set: Vec<u32>,
    /// Position in its set's heap; `NIL` when not resident.
    heap_pos: Vec<u32>,
    /// Per set, a min-heap of resident slots on (priority, stamp).
    heaps: Vec<Vec<SlotId>>,
    lru_links: Links,
    /// Head: most recently used.
    lru: ListHead,
    resident: FxHashMap<LineKey, SlotId>,
    /// The class counts of lines not resident.
    history: KeyHistory<Counts>,
    /// Per process characterized apart, its category's weights (see
    /// "Per process" in this file's documentation); empty unless set.
    process_weights: FxHashMap<u32, [i64; 7]>,
    rejected: u64,
    neighbour_evictions: u64,
    reconfigurations: u64,
    classified_requests: u64,
}

impl RecaPolicy {
    pub fn new(capacity_lines: usize, params: RecaParams) -> RecaPolicy {
        let none = LineKey {
            volume: 0,
            line_index: 0,
        };
        RecaPolicy {
            capacity: capacity_lines,
            classifier: Classifier::new(params.classifier),
            classified: Vec::new(),
            tick: 0,
            slot_key: vec![none; capacity_lines],
            slot_counts: vec![Counts::default(); capacity_lines],
            slot_priority: vec![0; capacity_lines],
            slot_stamp: vec![0; capacity_lines],
            slot_set: vec![0; capacity_lines],
            heap_pos: vec![NIL; capacity_lines],
            heaps: vec![Vec::new(); params.sets as usize],
            lru_links: Links::new(capacity_lines),
            lru: ListHead::default(),
            resident: FxHashMap::default(),
            history: KeyHistory::new(Self::history_bound(capacity_lines, params.pages)),
            process_weights: FxHashMap::default(),
            rejected: 0,
            neighbour_evictions: 0,
            reconfigurations: 0,
            classified_requests: 0,
            params,
        }
    }

    pub fn from_params(p: &PolicyParams, capacity_lines: usize) -> Result<RecaPolicy, CoreError> {
        Ok(RecaPolicy::new(capacity_lines, RecaParams::from_params(p)?))
    }

    fn history_bound(capacity: usize, pages: u64) -> usize {
        (capacity as u64).saturating_mul(pages).min(u32::MAX as u64 - 1) as usize
    }

    pub fn params(&self) -> &RecaParams {
        &self.params
    }

    /// The priority of a resident line, in thousandths.
    pub fn priority(&self, slot: SlotId) -> Option<i64> {
        (self.heap_pos[slot as usize] != NIL).then(|| priority_of(self.slot_priority[slot as usize]))
    }

    /// The priority of a line not resident but remembered, in thousandths.
    pub fn remembered_priority(&self, key: &LineKey) -> Option<i64> {
        self.history
            .get(key)
            .map(|counts| priority_of(self.weigh(counts)))
    }

    pub fn resident_count(&self) -> usize {
        self.resident.len()
    }

    /// The heap key of a line with `counts` (see [`key_of`]).
    fn weigh(&self, counts: &Counts) -> u64 {
        key_of(
            (counts.classes.iter().zip(self.params.weights)).fold(counts.own, |sum, (&c, w)| {
                sum.saturating_add(i64::from(c).saturating_mul(w))
            }),
        )
    }

    fn set_of(&self, key: &LineKey) -> u32 {
        if self.params.sets == 1 {
            return 0;
        }
        let mut h = FxHasher::default();
        key.hash(&mut h);
        (h.finish() % u64::from(self.params.sets)) as u32
    }

    // ---- heaps ----

    fn order(&self) -> SlotOrder<'_> {
        SlotOrder::new(&self.slot_priority, &self.slot_stamp)
    }

    /// The heap of `slot`'s set, by priority then stamp.
    fn heap_of(&mut self, slot: SlotId) -> SlotHeap<'_> {
        let heap = &mut self.heaps[self.slot_set[slot as usize] as usize];
        SlotHeap::new(heap, &mut self.heap_pos, &self.slot_priority, &self.slot_stamp)
    }

    /// Restores the heap order around `slot` after its key changed.
    fn reheap(&mut self, slot: SlotId) {
        self.heap_of(slot).reheap(slot);
    }

    fn heap_push(&mut self, slot: SlotId) {
        self.heap_of(slot).push(slot);
    }

    fn heap_remove(&mut self, slot: SlotId) {
        self.heap_of(slot).remove(slot);
    }

    /// Halves every line's counts, resident or remembered (rounding down):
    /// done when the weights change, i.e. when the workload changed
    /// category, so that lines the old workload touched once stop
    /// outranking the new workload's lines (see "Aging" in this file's
    /// documentation).
    fn age_counts(&mut self) {
        for &slot in self.resident.values() {
            self.slot_counts[slot as usize].age();
        }
        for counts in self.history.values_mut() {
            counts.age();
        }
    }

    /// Rebuilds every heap (after the weights or the number of sets changed).
    fn rebuild_heaps(&mut self) {
        self.heaps = vec![Vec::new(); self.params.sets as usize];
        let slots: Vec<SlotId> = self.resident.values().copied().collect();
        for slot in slots {
            let key = self.slot_key[slot as usize];
            self.slot_set[slot as usize] = self.set_of(&key);
            self.slot_priority[slot as usize] = self.weigh(&self.slot_counts[slot as usize]);
            self.heap_push(slot);
        }
    }

    // ---- the history of lines not resident ----

    fn take_history(&mut self, key: &LineKey) -> Counts {
        self.history.take(key).unwrap_or_default()
    }

    fn remember(&mut self, key: LineKey, counts: Counts) {
        if counts == Counts::default() {
            return;
        }
        if let Some(entry) = self.history.entry(key, Counts::default()) {
            *entry = counts;
        }
    }

    // ---- Algorithm 1 ----

    /// ACCESS_HISTORY_MANAGER, lines 35-37: a request that left the queue
    /// adds its class to every line it touched.
    fn account(&mut self, c: &Classified, line: LineSize) {
        let feature = feature_of(&c.class);
        let overlapped = c.class.overlapped;
        // A process with weights of its own adds PRIORITY_CALC under them.
        let own = match self.process_weights.is_empty() {
            true => None,
            false => (self.process_weights.get(&c.process))
                .map(|w| w[feature].saturating_add(if overlapped { w[6] } else { 0 })),
        };
        let request = Request::read(c.volume, c.offset_bytes, c.length_bytes, 0);
        for key in split_request_keys(&request, line) {
            if let Some(&slot) = self.resident.get(&key) {
                self.slot_counts[slot as usize].add(feature, overlapped, own);
                self.slot_priority[slot as usize] = self.weigh(&self.slot_counts[slot as usize]);
                self.reheap(slot);
            } else if let Some(counts) = self.history.entry(key, Counts::default()) {
                counts.add(feature, overlapped, own);
            }
        }
    }

    /// The line CACHE_MANAGER would replace to make room for `key`.
    fn candidate(&self, key: &LineKey) -> Option<SlotId> {
        match self.params.rule {
            EvictionRule::Lru => (self.lru.tail != NIL).then_some(self.lru.tail),
            EvictionRule::Priority => {
                let set = self.set_of(key) as usize;
                if let Some(&slot) = self.heaps[set].first() {
                    return Some(slot);
                }
                self.heaps
                    .iter()
                    .filter_map(|h| h.first().copied())
                    .reduce(|a, b| if self.order().less(b, a) { b } else { a })
            }
            EvictionRule::PriorityLru => {
                let mut best: Option<SlotId> = None;
                let mut node = self.lru.tail;
                for _ in 0..self.params.lru_window {
                    if node == NIL {
                        break;
                    }
                    if best.is_none_or(|b| self.order().less(node, b)) {
                        best = Some(node);
                    }
                    node = self.lru_links.prev(node);
                }
                best
            }
        }
    }

    /// Forgets a resident slot, keeping its counts in the history.
    fn drop_slot(&mut self, slot: SlotId) {
        if self.heap_pos[slot as usize] == NIL {
            debug_assert!(false, "slot {slot} is not resident in ReCA");
            return;
        }
        self.heap_remove(slot);
        self.lru_links.unlink(&mut self.lru, slot);
        let key = self.slot_key[slot as usize];
        self.resident.remove(&key);
        self.remember(key, self.slot_counts[slot as usize]);
    }
}

impl ReplacementPolicy for RecaPolicy {
    fn name(&self) -> &'static str {
        "reca"
    }

    fn on_request(&mut self, request: &Request, line: LineSize, _info: &AccessInfo) {
        let mut out = std::mem::take(&mut self.classified);
        out.clear();
        self.classifier.push(request, &mut out);
        for c in &out {
            self.classified_requests += 1;
            self.account(c, line);
        }
        self.classified = out;
    }

    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        if self.heap_pos[slot as usize] == NIL {
            debug_assert!(false, "hit on a slot ReCA does not hold");
            return;
        }
        self.tick += 1;
        self.slot_stamp[slot as usize] = self.tick;
        self.lru_links.move_to_head(&mut self.lru, slot);
        self.heap_of(slot).grew(slot);
    }

    fn admit(&mut self, key: LineKey, _info: &AccessInfo) -> Option<bool> {
        if self.params.rule == EvictionRule::Lru || self.resident.len() < self.capacity {
            return Some(true);
        }
        let mine = self.remembered_priority(&key).unwrap_or(0);
        let admit = self
            .candidate(&key)
            .is_none_or(|victim| priority_of(self.slot_priority[victim as usize]) < mine);
        if !admit {
            self.rejected += 1;
        }
        Some(admit)
    }

    fn on_miss(&mut self, key: LineKey, need_victim: bool, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        if !need_victim {
            return;
        }
        let Some(victim) = self.candidate(&key) else {
            return;
        };
        let victim_key = self.slot_key[victim as usize];
        self.drop_slot(victim);
        victims.push(victim);
        for direction in [-1i64, 1] {
            for d in 1..=i64::from(self.params.neighbours) {
                let Some(index) = victim_key.line_index.checked_add_signed(direction * d) else {
                    break;
                };
                let near = LineKey {
                    volume: victim_key.volume,
                    line_index: index,
                };
                let Some(&slot) = self.resident.get(&near) else {
                    break;
                };
                self.drop_slot(slot);
                victims.push(slot);
                self.neighbour_evictions += 1;
            }
        }
    }

    fn on_insert(&mut self, slot: SlotId, key: LineKey, _info: &AccessInfo) {
        if self.heap_pos[slot as usize] != NIL {
            debug_assert!(false, "insert into slot {slot} that ReCA holds");
            self.drop_slot(slot);
        }
        self.tick += 1;
        let counts = self.take_history(&key);
        let s = slot as usize;
        self.slot_key[s] = key;
        self.slot_counts[s] = counts;
        self.slot_priority[s] = self.weigh(&counts);
        self.slot_stamp[s] = self.tick;
        self.slot_set[s] = self.set_of(&key);
        self.resident.insert(key, slot);
        self.lru_links.push_head(&mut self.lru, slot);
        self.heap_push(slot);
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.drop_slot(slot);
    }

    fn reconfigure(&mut self, params: &PolicyParams) -> Result<bool, CoreError> {
        let new = RecaParams::from_params(params)?;
        if new.classifier != self.params.classifier {
            // Requests still queued are dropped unclassified.
            self.classifier = Classifier::new(new.classifier);
        }
        let reweighed = new.weights != self.params.weights;
        let rebuild = reweighed || new.sets != self.params.sets;
        if reweighed {
            self.age_counts();
        }
        self.history
            .set_cap(Self::history_bound(self.capacity, new.pages));
        self.params = new;
        if rebuild {
            self.rebuild_heaps();
        }
        self.reconfigurations += 1;
        Ok(true)
    }

    /// Takes the weights of `params` (`over`, `access`, `read`, `write`;
    /// the other parameters stay the cache's) for the requests of
    /// `process`; what they added before stays.
    fn set_process_params(&mut self, process: u32, params: Option<&PolicyParams>) -> Result<bool, CoreError> {
        match params {
            Some(params) => {
                let weights = RecaParams::from_params(params)?.weights;
                self.process_weights.insert(process, weights);
            }
            None => {
                self.process_weights.remove(&process);
            }
        }
        Ok(true)
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("reca_rejected", self.rejected),
            ("reca_forgotten", self.history.forgotten()),
            ("reca_neighbour_evictions", self.neighbour_evictions),
            ("reca_reconfigurations", self.reconfigurations),
            ("reca_classified_requests", self.classified_requests),
        ]
    }
}

impl RecaPolicy {
    /// Checks the heaps, the LRU list and the history bound (for tests).
    pub fn check(&self) {
        let mut in_heaps = 0;
        for (set, heap) in self.heaps.iter().enumerate() {
            slot_heap::check(heap, &self.heap_pos, self.order());
            for &s in heap {
                assert_eq!(self.slot_set[s as usize] as usize, set);
                assert_eq!(
                    self.slot_priority[s as usize],
                    self.weigh(&self.slot_counts[s as usize])
                );
            }
            in_heaps += heap.len();
        }
        assert_eq!(in_heaps, self.resident.len());
        assert_eq!(self.lru.len as usize, self.resident.len());
        assert!(self.resident.len() <= self.capacity);
        self.history.check();
        for (key, &slot) in &self.resident {
            assert_eq!(self.slot_key[slot as usize], *key);
            assert!(!self.history.contains(key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::IoKind;
    use crate::policy::testing::key;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Step {
        Access(u64, bool),
        Remove(u64),
        Reconfigure(usize),
    }

    const SPECS: [&str; 6] = [
        "evict=priority",
        "evict=lru:neighbours=2",
        "evict=priority_lru:lru_window=3:over=2:read=1/0/3",
        "evict=priority:sets=4:pages=1:write=0/5/0",
        "evict=priority:history=2:stride=0",
        "evict=priority:access=1/-1/2:write=0/0/-3:over=-1",
    ];

    fn params(i: usize) -> PolicyParams {
        let spec: crate::PolicySpec = format!("reca:{}", SPECS[i]).parse().unwrap();
        spec.params().clone()
    }

    proptest! {
        /// Driven the way the cache drives it, with invalidations and live
        /// parameter changes: its heaps, list and history stay consistent,
        /// it never holds more than the capacity, and every victim it names
        /// is a resident line.
        #[test]
        fn the_bare_policy_stays_consistent(
            capacity in 1usize..8,
            first in 0usize..SPECS.len(),
            steps in prop::collection::vec(prop_oneof![
                8 => (0u64..24, any::<bool>()).prop_map(|(l, w)| Step::Access(l, w)),
                1 => (0u64..24).prop_map(Step::Remove),
                1 => (0usize..SPECS.len()).prop_map(Step::Reconfigure),
            ], 1..200),
        ) {
            let line = LineSize::new(4096).unwrap();
            let mut p = RecaPolicy::from_params(&params(first), capacity).unwrap();
            let mut slots: Vec<Option<u64>> = vec![None; capacity];
            for (t, step) in steps.into_iter().enumerate() {
                let t = t as u64;
                match step {
                    Step::Access(l, write) => {
                        let request = if write {
                            Request::write(0, l * 4096, 4096, t)
                        } else {
                            Request::read(0, l * 4096, 4096, t)
                        };
                        let info = AccessInfo { kind: if write { IoKind::Write } else { IoKind::Read }, ..AccessInfo::read_at(t) };
                        p.on_request(&request, line, &info);
                        if let Some(s) = slots.iter().position(|x| *x == Some(l)) {
                            p.on_hit(s as SlotId, &info);
                        } else if p.admit(key(l), &info) != Some(false) {
                            let need = slots.iter().all(Option::is_some);
                            let mut victims = Vec::new();
                            p.on_miss(key(l), need, &info, &mut victims);
                            prop_assert!(need || victims.is_empty());
                            for v in victims {
                                prop_assert!(slots[v as usize].take().is_some(), "victim {v} not resident");
                            }
                            if let Some(s) = slots.iter().position(Option::is_none) {
                                slots[s] = Some(l);
                                p.on_insert(s as SlotId, key(l), &info);
                            }
                        }
                    }
                    Step::Remove(l) => {
                        if let Some(s) = slots.iter().position(|x| *x == Some(l)) {
                            slots[s] = None;
                            p.on_remove(s as SlotId);
                        }
                    }
                    Step::Reconfigure(i) => {
                        prop_assert!(p.reconfigure(&params(i)).unwrap());
                    }
                }
                p.check();
                prop_assert_eq!(p.resident_count(), slots.iter().flatten().count());
            }
        }
    }

    #[test]
    fn priorities_follow_the_weights_of_each_class() {
        // history=1: a request's class reaches its line at the next request.
        let spec: crate::PolicySpec = "reca:history=1:access=1/2/4:read=0/0/0:write=10/10/10:over=100"
            .parse()
            .unwrap();
        let mut p = RecaPolicy::from_params(spec.params(), 4).unwrap();
        let line = LineSize::new(4096).unwrap();
        let info = AccessInfo::read_at(0);
        p.on_insert(0, key(0), &info);
        p.on_insert(1, key(1), &info);
        // Line 0 read, then line 1 read right after it: line 0 sequential (1).
        p.on_request(&Request::read(0, 0, 4096, 0), line, &info);
        p.on_request(&Request::read(0, 4096, 4096, 1), line, &info);
        assert_eq!(p.priority(0), Some(1000));
        // Line 1 read then far away: random (4).
        p.on_request(&Request::write(0, 1 << 30, 4096, 2), line, &info);
        assert_eq!(p.priority(1), Some(4000));
        // The far write then overwritten: random write, overlapped: 4 + 10 + 100,
        // remembered while not resident.
        p.on_request(&Request::read(0, 1 << 30, 4096, 3), line, &info);
        assert_eq!(p.remembered_priority(&key(1 << 18)), Some(114_000));
        p.check();
    }

    #[test]
    fn new_weights_halve_every_count_and_same_weights_keep_them() {
        let spec = |s: &str| -> crate::PolicySpec { format!("reca:history=1:{s}").parse().unwrap() };
        let mut p = RecaPolicy::from_params(spec("access=1/1/1").params(), 4).unwrap();
        let line = LineSize::new(4096).unwrap();
        let info = AccessInfo::read_at(0);
        p.on_insert(0, key(0), &info);
        p.on_insert(1, key(100), &info);
        // Line 0 read three times, line 100 once, line 200 (not resident)
        // twice; each far from the one before (random).
        let offsets = [0u64, 100, 0, 200, 0, 200, 300];
        for (i, l) in offsets.iter().enumerate() {
            p.on_request(&Request::read(0, l * 4096, 4096, i as u64), line, &info);
        }
        assert_eq!(p.priority(0), Some(3000));
        assert_eq!(p.priority(1), Some(1000));
        assert_eq!(p.remembered_priority(&key(200)), Some(2000));
        // The same parameters again (no new category): nothing ages.
        assert!(p.reconfigure(spec("access=1/1/1").params()).unwrap());
        assert_eq!(p.priority(0), Some(3000));
        // New weights: counts halved (3 -> 1, 1 -> 0, 2 -> 1), then weighed.
        assert!(p.reconfigure(spec("access=2/2/2").params()).unwrap());
        assert_eq!(p.priority(0), Some(2000));
        assert_eq!(p.priority(1), Some(0));
        assert_eq!(p.remembered_priority(&key(200)), Some(2000));
        p.check();
    }

    #[test]
    fn a_process_with_its_own_weights_weighs_only_its_own_requests() {
        let spec = |s: &str| -> crate::PolicySpec { format!("reca:history=1:{s}").parse().unwrap() };
        let mut p = RecaPolicy::from_params(spec("access=1/1/1").params(), 4).unwrap();
        assert!(p
            .set_process_params(7, Some(spec("access=5/5/5:read=2/2/2").params()))
            .unwrap());
        let line = LineSize::new(4096).unwrap();
        let info = AccessInfo::read_at(0);
        p.on_insert(0, key(0), &info);
        p.on_insert(1, key(100), &info);
        // Random reads (each process a stream of its own, classified at
        // its next request): line 0 by process 7 (5 + 2), line 100 by
        // process 8 (the cache's 1), line 200 (not resident) by process 7.
        let reads = [(0u64, 7u32), (100, 8), (200, 7), (300, 8), (400, 7), (500, 8)];
        for (i, (l, process)) in reads.into_iter().enumerate() {
            let r = Request::read(0, l * 4096, 4096, i as u64).from_process(process);
            p.on_request(&r, line, &info);
        }
        assert_eq!(p.priority(0), Some(7000));
        assert_eq!(p.priority(1), Some(1000));
        assert_eq!(p.remembered_priority(&key(200)), Some(7000));
        // New cache-wide weights halve what process 7 added too, and
        // weigh the others' counts anew.
        assert!(p.reconfigure(spec("access=4/4/4").params()).unwrap());
        assert_eq!(p.priority(0), Some(3500));
        assert_eq!(p.priority(1), Some(0));
        // Withdrawn: process 7's next request counts as everyone's.
        assert!(p.set_process_params(7, None).unwrap());
        p.on_request(&Request::read(0, 0, 4096, 10).from_process(7), line, &info);
        p.on_request(&Request::read(0, 1 << 30, 4096, 11).from_process(7), line, &info);
        assert_eq!(p.priority(0), Some(7500));
        p.check();
    }

    #[test]
    fn a_negative_weight_puts_a_line_below_a_line_never_seen() {
        let spec: crate::PolicySpec = "reca:history=1:access=1/1/1:write=0/0/-3".parse().unwrap();
        let mut p = RecaPolicy::from_params(spec.params(), 2).unwrap();
        let line = LineSize::new(4096).unwrap();
        let info = AccessInfo::read_at(0);
        p.on_insert(0, key(0), &info);
        p.on_insert(1, key(100), &info);
        // A random write to line 0 (1 - 3), a random read of line 100 (1).
        p.on_request(&Request::write(0, 0, 4096, 0), line, &info);
        p.on_request(&Request::read(0, 100 * 4096, 4096, 1), line, &info);
        p.on_request(&Request::read(0, 300 * 4096, 4096, 2), line, &info);
        assert_eq!(p.priority(0), Some(-2000));
        assert_eq!(p.priority(1), Some(1000));
        // A line never seen (priority 0) now displaces line 0, and only it.
        assert_eq!(p.admit(key(500), &info), Some(true));
        let mut victims = Vec::new();
        p.on_miss(key(500), true, &info, &mut victims);
        assert_eq!(victims, vec![0]);
        assert_eq!(p.remembered_priority(&key(0)), Some(-2000));
        p.check();
    }
}
