//! Least frequently used among the resident lines, ties broken by least
//! recently used, in O(1) per access.
//!
//! Structure: K. Shah, A. Mitra, D. Matani, "An O(1) algorithm for
//! implementing the LFU cache eviction scheme" (2010): a doubly linked list of
//! frequency nodes in increasing order of access count, each holding the list
//! of lines with that count. A hit moves a line from the node of count `f` to
//! the node of `f + 1`, creating it right after the current node if it does
//! not exist and freeing the old node if it became empty; the victim is taken
//! from the lowest node. No parameters.
//!
//! - A line's count starts at 1 when admitted and is forgotten when it leaves
//!   the cache (evicted or invalidated): this is in-cache LFU, with no history
//!   of non-resident lines (the paper's scheme; compare the `access` policy,
//!   which keeps counts of lines that left).
//! - Ties: inside a frequency node lines are kept in the order they reached
//!   that count, newest at the head. A line reaches count `f` by an access, so
//!   the tail of the lowest node is the least recently used line among those
//!   with the lowest count. (The paper leaves the order inside a node open.)
//! - Counts are 64-bit and never decay (plain LFU; no aging).
//!
//! Memory: one frequency node per distinct count among resident lines, so at
//! most capacity + 1 nodes (one more while a hit moves a line).

use super::list::{insert_reusing, Links, ListHead, NIL};
use super::{AccessInfo, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};

#[derive(Clone, Copy, Debug)]
struct FreqNode {
    count: u64,
    lines: ListHead,
    /// Neighbour nodes in increasing order of count.
    lower: u32,
    higher: u32,
}

pub struct Lfu {
    line_links: Links,
    /// Frequency node of each slot; `NIL` when the slot is not resident.
    node_of: Vec<u32>,
    nodes: Vec<FreqNode>,
    free_nodes: Vec<u32>,
    /// The node with the lowest count.
    lowest: u32,
}

impl Lfu {
    pub fn new(capacity_lines: usize) -> Self {
        Lfu {
            line_links: Links::new(capacity_lines),
            node_of: vec![NIL; capacity_lines],
            nodes: Vec::with_capacity(capacity_lines.min(1 << 16) + 1),
            free_nodes: Vec::new(),
            lowest: NIL,
        }
    }

    /// The access count of the line in `slot`, if resident.
    pub fn count(&self, slot: SlotId) -> Option<u64> {
        let n = *self.node_of.get(slot as usize)?;
        (n != NIL).then(|| self.nodes[n as usize].count)
    }

    /// (count, slots from newest to oldest) for each frequency node, lowest
    /// count first (for tests and inspection).
    pub fn buckets(&self) -> Vec<(u64, Vec<SlotId>)> {
        let mut out = Vec::new();
        let mut n = self.lowest;
        while n != NIL {
            let node = &self.nodes[n as usize];
            out.push((node.count, self.line_links.iter(&node.lines).collect()));
            n = node.higher;
        }
        out
    }

    /// Number of frequency nodes in use.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - self.free_nodes.len()
    }

    /// A new empty node of `count`, linked between `lower` and `higher`.
    fn new_node(&mut self, count: u64, lower: u32, higher: u32) -> u32 {
        let node = FreqNode {
            count,
            lines: ListHead::default(),
            lower,
            higher,
        };
        let id = insert_reusing(&mut self.nodes, &mut self.free_nodes, node);
        self.join(lower, id);
        self.join(id, higher);
        id
    }

    /// Makes `higher` follow `lower` in the count order (`NIL` for none:
    /// `higher` becomes the lowest, or `lower` the highest).
    fn join(&mut self, lower: u32, higher: u32) {
        if lower != NIL {
            self.nodes[lower as usize].higher = higher;
        } else {
            self.lowest = higher;
        }
        if higher != NIL {
            self.nodes[higher as usize].lower = lower;
        }
    }

    /// Unlinks `slot` from its node, freeing the node if it became empty.
    fn detach(&mut self, slot: SlotId) {
        let n = self.node_of[slot as usize];
        if n == NIL {
            return;
        }
        self.node_of[slot as usize] = NIL;
        self.line_links.unlink(&mut self.nodes[n as usize].lines, slot);
        if self.nodes[n as usize].lines.len == 0 {
            let FreqNode { lower, higher, .. } = self.nodes[n as usize];
            self.join(lower, higher);
            self.free_nodes.push(n);
        }
    }

    fn attach(&mut self, slot: SlotId, n: u32) {
        self.line_links.push_head(&mut self.nodes[n as usize].lines, slot);
        self.node_of[slot as usize] = n;
    }
}

impl ReplacementPolicy for Lfu {
    fn name(&self) -> &'static str {
        "lfu"
    }

    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        let n = self.node_of[slot as usize];
        if n == NIL {
            debug_assert!(false, "hit on a slot LFU does not hold");
            return;
        }
        let FreqNode { count, higher, .. } = self.nodes[n as usize];
        let target = if higher != NIL && self.nodes[higher as usize].count == count + 1 {
            higher
        } else {
            self.new_node(count + 1, n, higher)
        };
        // Detaching may free `n`; the target is already linked after it.
        self.detach(slot);
        self.attach(slot, target);
    }

    fn on_miss(&mut self, _key: LineKey, need_victim: bool, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        if !need_victim || self.lowest == NIL {
            return;
        }
        let victim = self.nodes[self.lowest as usize].lines.tail;
        self.detach(victim);
        victims.push(victim);
    }

    fn on_insert(&mut self, slot: SlotId, _key: LineKey, _info: &AccessInfo) {
        let lowest = self.lowest;
        let n = if lowest != NIL && self.nodes[lowest as usize].count == 1 {
            lowest
        } else {
            self.new_node(1, NIL, lowest)
        };
        self.attach(slot, n);
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.detach(slot);
    }

    fn next_victims(&self) -> [Option<SlotId>; 2] {
        if self.lowest == NIL {
            return [None, None];
        }
        let node = &self.nodes[self.lowest as usize];
        let first = node.lines.tail;
        let mut second = self.line_links.prev(first);
        if second == NIL && node.higher != NIL {
            second = self.nodes[node.higher as usize].lines.tail;
        }
        [Some(first), (second != NIL).then_some(second)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{churn, Driver};
    use crate::policy::Lru;

    #[test]
    fn keeps_the_frequent_line_where_lru_drops_it() {
        // Capacity 3: 1 is accessed 3 times, 2 and 3 once, then 4 and 5.
        //   counts after "1 1 1 2 3": 1->3, 2->1, 3->1.
        //   4: lowest count 1 holds {2, 3}; 2 reached it first (LRU) -> evicted.
        //   5: count 1 holds {3, 4}; 3 is older -> evicted.
        //   1: hit (LRU evicted 1 at 5: its order was 4 3 1 after "4").
        let seq = [1, 1, 1, 2, 3, 4, 5, 1];
        let mut d = Driver::new(Lfu::new(3), 3);
        assert_eq!(d.run(&seq), 3);
        assert_eq!(d.evicted, vec![2, 3]);
        assert_eq!(d.resident(), vec![1, 4, 5]);
        assert_eq!(d.policy.count(d.slot_of(1).unwrap()), Some(4));
        let mut lru = Driver::new(Lru::new(3), 3);
        assert_eq!(lru.run(&seq), 2);
        assert_eq!(lru.evicted, vec![1, 2, 3]);
    }

    #[test]
    fn ties_go_to_the_least_recently_used() {
        // 1 2 3, then 3 2 1 each hit once: all at count 2, reached in the
        // order 3, 2, 1, so 3 is the least recently used -> evicted by 4.
        let mut d = Driver::new(Lfu::new(3), 3);
        d.run(&[1, 2, 3, 3, 2, 1, 4]);
        assert_eq!(d.evicted, vec![3]);
        // 5: count 1 = {4} -> evicted though it is the most recent line.
        d.run(&[5]);
        assert_eq!(d.evicted, vec![3, 4]);
    }

    #[test]
    fn counts_restart_after_eviction() {
        // Capacity 2. 1 reaches count 3, is invalidated; readmitted at count 1.
        let mut d = Driver::new(Lfu::new(2), 2);
        d.run(&[1, 1, 1, 2, 2]);
        assert!(d.remove(1));
        d.run(&[1]);
        assert_eq!(d.policy.count(d.slot_of(1).unwrap()), Some(1));
        d.run(&[3]); // 1 (count 1) goes before 2 (count 2)
        assert_eq!(d.evicted, vec![1]);
        assert_eq!(d.policy.buckets().len(), 2); // counts 1 (line 3) and 2 (line 2)
    }

    #[test]
    fn buckets_are_created_after_and_freed_when_empty() {
        let mut d = Driver::new(Lfu::new(4), 4);
        d.run(&[1, 2, 1, 1, 3]); // 1 -> 3, 2 -> 1, 3 -> 1
        let s = |l| d.slot_of(l).unwrap();
        assert_eq!(d.policy.buckets(), vec![(1, vec![s(3), s(2)]), (3, vec![s(1)])]);
        d.run(&[2]); // 2 -> 2: a node created between 1 and 3
        let s = |l| d.slot_of(l).unwrap();
        assert_eq!(
            d.policy.buckets(),
            vec![(1, vec![s(3)]), (2, vec![s(2)]), (3, vec![s(1)])]
        );
        d.run(&[2, 2]); // 2 -> 4: node 2 freed, 3 joined... then 4 created
        let s = |l| d.slot_of(l).unwrap();
        assert_eq!(
            d.policy.buckets(),
            vec![(1, vec![s(3)]), (3, vec![s(1)]), (4, vec![s(2)])]
        );
        assert_eq!(d.policy.node_count(), 3);
    }

    #[test]
    fn one_line_cache() {
        let mut d = Driver::new(Lfu::new(1), 1);
        assert_eq!(d.run(&[7, 7, 7, 8, 7]), 2);
        assert_eq!(d.evicted, vec![7, 8]);
        assert_eq!(d.policy.count(d.slot_of(7).unwrap()), Some(1));
    }

    #[test]
    fn invalidating_head_tail_and_middle() {
        let mut d = Driver::new(Lfu::new(5), 5);
        d.run(&[1, 2, 3, 4, 5, 5]); // count 1: 4 3 2 1 (new..old), count 2: 5
        assert!(d.remove(1)); // tail of the lowest node
        assert!(d.remove(4)); // head of the lowest node
        assert!(d.remove(5)); // the whole count-2 node
        assert_eq!(d.policy.node_count(), 1);
        assert!(d.remove(3)); // middle... now only 2 remains
        d.run(&[6, 7, 8, 9, 10]); // four free slots, then 10 evicts 2 (oldest at count 1)
        assert_eq!(d.evicted, vec![2]);
    }

    #[test]
    fn structure_stays_consistent_and_bounded() {
        churn(0xfeed_f00d, 3_000, Lfu::new, |d, capacity| {
            let buckets = d.policy.buckets();
            let held: usize = buckets.iter().map(|(_, s)| s.len()).sum();
            assert_eq!(held, d.resident_count());
            assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0));
            assert!(buckets.iter().all(|(_, s)| !s.is_empty()));
            assert_eq!(d.policy.node_count(), buckets.len());
            assert!(d.policy.nodes.len() <= capacity + 1);
        });
    }
}
