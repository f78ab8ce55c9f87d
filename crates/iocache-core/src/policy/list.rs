//! Intrusive doubly linked lists over dense `u32` indices.
//!
//! Replacement policies keep their queues as links in arrays indexed by slot
//! (or ghost-entry) id: O(1) unlink and push with no allocation per access.

pub const NIL: u32 = u32::MAX;

/// Stores `item` at an index `free` holds (one freed earlier), else after
/// the last; returns its index. Structures of nodes over dense `u32`
/// indices reuse freed nodes this way, so their arrays stop growing.
#[inline]
pub fn insert_reusing<T>(items: &mut Vec<T>, free: &mut Vec<u32>, item: T) -> u32 {
    match free.pop() {
        Some(i) => {
            items[i as usize] = item;
            i
        }
        None => {
            items.push(item);
            (items.len() - 1) as u32
        }
    }
}

/// Links for many nodes; each node belongs to at most one [`ListHead`] at a time.
/// `[prev, next]` of each node side by side: one cache line per node touched.
#[derive(Clone, Debug)]
pub struct Links {
    nodes: Vec<[u32; 2]>,
}

const PREV: usize = 0;
const NEXT: usize = 1;

/// One list: `head` is the most recently inserted end, `tail` the oldest.
#[derive(Clone, Copy, Debug)]
pub struct ListHead {
    pub head: u32,
    pub tail: u32,
    pub len: u32,
}

impl Default for ListHead {
    fn default() -> Self {
        ListHead {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl Links {
    pub fn new(nodes: usize) -> Self {
        Links {
            nodes: vec![[NIL, NIL]; nodes],
        }
    }

    /// Number of nodes these links can hold.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Makes room for nodes `0..nodes` (for structures that grow up to a bound
    /// instead of preallocating it); never shrinks.
    pub fn grow_to(&mut self, nodes: usize) {
        if nodes > self.nodes.len() {
            self.nodes.resize(nodes, [NIL, NIL]);
        }
    }

    #[inline]
    pub fn push_head(&mut self, list: &mut ListHead, node: u32) {
        self.link(list, NIL, list.head, node);
    }

    pub fn push_tail(&mut self, list: &mut ListHead, node: u32) {
        self.link(list, list.tail, NIL, node);
    }

    /// Links `node` between `prev` and `next`, neighbours on `list` (`NIL`
    /// past an end, which `node` then becomes).
    #[inline(always)]
    fn link(&mut self, list: &mut ListHead, prev: u32, next: u32, node: u32) {
        self.nodes[node as usize] = [prev, next];
        if prev != NIL {
            self.nodes[prev as usize][NEXT] = node;
        } else {
            list.head = node;
        }
        if next != NIL {
            self.nodes[next as usize][PREV] = node;
        } else {
            list.tail = node;
        }
        list.len += 1;
    }

    /// Removes `node` from `list`. A node that is not in the list (no
    /// neighbours and not the head) is left alone rather than corrupting it.
    #[inline]
    pub fn unlink(&mut self, list: &mut ListHead, node: u32) {
        let [p, x] = self.nodes[node as usize];
        if p == NIL && list.head != node {
            debug_assert!(false, "unlink of node {node} that is not in the list");
            return;
        }
        if p != NIL {
            self.nodes[p as usize][NEXT] = x;
        } else {
            debug_assert_eq!(list.head, node);
            list.head = x;
        }
        if x != NIL {
            self.nodes[x as usize][PREV] = p;
        } else {
            debug_assert_eq!(list.tail, node);
            list.tail = p;
        }
        self.nodes[node as usize] = [NIL, NIL];
        list.len -= 1;
    }

    /// Links `node` just before `old` (toward the head); `old` must be on `list`.
    pub fn insert_before(&mut self, list: &mut ListHead, old: u32, node: u32) {
        let prev = self.nodes[old as usize][PREV];
        debug_assert!(prev != NIL || list.head == old);
        self.link(list, prev, old, node);
    }

    #[inline(always)]
    pub fn move_to_head(&mut self, list: &mut ListHead, node: u32) {
        if list.head == node {
            return;
        }
        let [prev, next] = self.nodes[node as usize];
        if prev == NIL {
            // Not on the list (it is not the head): what unlink and
            // push_head do for such a node.
            self.unlink(list, node);
            self.push_head(list, node);
            return;
        }
        // On the list and not its head: it has a predecessor, and the list
        // has a head other than it. Unlink and push in one go (the length
        // does not change).
        self.nodes[prev as usize][NEXT] = next;
        if next != NIL {
            self.nodes[next as usize][PREV] = prev;
        } else {
            list.tail = prev;
        }
        let head = list.head;
        self.nodes[node as usize] = [NIL, head];
        self.nodes[head as usize][PREV] = node;
        list.head = node;
    }

    #[inline]
    pub fn pop_tail(&mut self, list: &mut ListHead) -> Option<u32> {
        let tail = list.tail;
        if tail == NIL {
            return None;
        }
        self.unlink(list, tail);
        Some(tail)
    }

    /// The node before `node`, toward the head.
    #[inline]
    pub fn prev(&self, node: u32) -> u32 {
        self.nodes[node as usize][PREV]
    }

    /// Hints the CPU to load `node`'s links.
    #[inline]
    pub fn prefetch(&self, node: u32) {
        // An address only (a prefetch of a bad one is harmless): no bounds check.
        crate::prefetch::prefetch_address(self.nodes.as_ptr().wrapping_add(node as usize) as usize);
    }

    /// The node after `node` toward the tail.
    #[inline]
    pub fn next(&self, node: u32) -> u32 {
        self.nodes[node as usize][NEXT]
    }

    /// Iterates from head (newest) to tail (oldest).
    pub fn iter<'a>(&'a self, list: &ListHead) -> impl Iterator<Item = u32> + 'a {
        let mut at = list.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let node = at;
            at = self.nodes[node as usize][NEXT];
            Some(node)
        })
    }
}

/// Nodes walked ahead of evictions from a list's tail (the next victims
/// of a policy that evicts its tail), for prefetching what those evictions
/// will touch. A hint only: no decision reads it. When hits or removals
/// reorder the nodes it walked, an eviction takes a node other than the
/// one it expected, and it starts again from the tail.
///
/// Each eviction takes one step toward the head from the last node walked
/// (whose links the previous step prefetched), so the walk costs no
/// dependent load; after a restart it takes two until it is
/// [`TailLookahead::DEPTH`] nodes ahead.
#[derive(Clone, Debug)]
pub struct TailLookahead {
    /// The nodes walked, by step number modulo `RING`: the newest is the
    /// cursor, the one `lead` steps before it the tail.
    walked: [u32; TailLookahead::RING],
    steps: usize,
    /// Nodes between the tail and the last node walked (`RESTART`: start again).
    lead: usize,
}

impl Default for TailLookahead {
    fn default() -> Self {
        TailLookahead {
            walked: [NIL; TailLookahead::RING],
            steps: 0,
            lead: TailLookahead::RESTART,
        }
    }
}

impl TailLookahead {
    /// How far ahead of the tail the walk goes.
    pub const DEPTH: usize = 8;
    const RING: usize = 16;
    const RESTART: usize = usize::MAX;

    /// The node walked `back` steps before the newest (`back < RING`).
    #[inline(always)]
    fn walked_back(&self, back: usize) -> u32 {
        self.walked[self.steps.wrapping_sub(1).wrapping_sub(back) % Self::RING]
    }

    #[inline(always)]
    fn record(&mut self, node: u32) {
        self.walked[self.steps % Self::RING] = node;
        self.steps = self.steps.wrapping_add(1);
    }

    /// Takes one step toward the head; false at the head.
    #[inline(always)]
    fn step(&mut self, links: &Links) -> bool {
        let prev = links.prev(self.walked_back(0));
        if prev == NIL {
            return false;
        }
        links.prefetch(prev);
        self.record(prev);
        true
    }

    /// Call after `victim`, the tail of `list`, was evicted: walks on (see
    /// [`TailLookahead::upcoming`] for what it then says).
    #[inline(always)]
    pub fn advance(&mut self, links: &Links, list: &ListHead, victim: u32) {
        let lead = self.lead;
        if lead != 0 && lead <= Self::DEPTH && self.walked_back(lead) == victim {
            // As expected: the tail moved one node toward the cursor.
            self.lead = lead - 1 + usize::from(self.step(links));
            if self.lead < Self::DEPTH {
                self.lead += usize::from(self.step(links));
            }
        } else {
            if list.tail == NIL {
                self.lead = Self::RESTART;
                return;
            }
            self.record(list.tail);
            self.lead = usize::from(self.step(links));
            self.lead += usize::from(self.lead == 1 && self.step(links));
        }
    }

    /// What the walk says since the last [`TailLookahead::advance`]: a node
    /// about `DEPTH / 2` evictions away (soon) and the one up to `DEPTH`
    /// away (later); `NIL` for both before the first eviction or once the
    /// list ran empty.
    #[inline(always)]
    pub fn upcoming(&self) -> [u32; 2] {
        if self.lead == Self::RESTART {
            return [NIL, NIL];
        }
        [
            self.walked_back(self.lead - self.lead.min(Self::DEPTH / 2)),
            self.walked_back(0),
        ]
    }

    /// [`TailLookahead::upcoming`] as [`super::ReplacementPolicy::next_victims`] gives it.
    #[inline(always)]
    pub fn next_victims(&self) -> [Option<u32>; 2] {
        self.upcoming().map(|node| (node != NIL).then_some(node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_unlink_pop() {
        let mut links = Links::new(4);
        let mut list = ListHead::default();
        for n in 0..4 {
            links.push_head(&mut list, n);
        }
        assert_eq!(links.iter(&list).collect::<Vec<_>>(), vec![3, 2, 1, 0]);
        links.unlink(&mut list, 2);
        links.move_to_head(&mut list, 0);
        assert_eq!(links.iter(&list).collect::<Vec<_>>(), vec![0, 3, 1]);
        assert_eq!(links.pop_tail(&mut list), Some(1));
        links.push_tail(&mut list, 2);
        assert_eq!(links.iter(&list).collect::<Vec<_>>(), vec![0, 3, 2]);
        assert_eq!(list.len, 3);
        assert_eq!(links.pop_tail(&mut list), Some(2));
        assert_eq!(links.pop_tail(&mut list), Some(3));
        assert_eq!(links.pop_tail(&mut list), Some(0));
        assert_eq!(links.pop_tail(&mut list), None);
        assert_eq!(list.len, 0);
    }

    #[test]
    fn move_to_head_matches_unlink_then_push() {
        // Every node of lists of 1..6 nodes moved to the head, compared
        // with the unlink-then-push it stands for.
        for len in 1..6u32 {
            for node in 0..len {
                let mut a = Links::new(len as usize);
                let mut list_a = ListHead::default();
                for n in 0..len {
                    a.push_head(&mut list_a, n);
                }
                let (mut b, mut list_b) = (a.clone(), list_a);
                a.move_to_head(&mut list_a, node);
                if list_b.head != node {
                    b.unlink(&mut list_b, node);
                    b.push_head(&mut list_b, node);
                }
                assert_eq!(
                    a.iter(&list_a).collect::<Vec<_>>(),
                    b.iter(&list_b).collect::<Vec<_>>()
                );
                assert_eq!(
                    (list_a.head, list_a.tail, list_a.len),
                    (list_b.head, list_b.tail, list_b.len)
                );
                let backwards = |l: &Links, h: &ListHead| {
                    let mut out = Vec::new();
                    let mut at = h.tail;
                    while at != NIL {
                        out.push(at);
                        at = l.prev(at);
                    }
                    out
                };
                assert_eq!(backwards(&a, &list_a), backwards(&b, &list_b));
            }
        }
    }

    #[test]
    fn tail_lookahead_names_the_coming_victims_and_recovers_from_reordering() {
        // The node `d` places from the tail (0: the tail).
        let from_tail = |links: &Links, list: &ListHead, d: usize| {
            let mut at = list.tail;
            for _ in 0..d {
                at = links.prev(at);
            }
            at
        };
        let mut links = Links::new(64);
        let mut list = ListHead::default();
        for n in 0..64 {
            links.push_head(&mut list, n);
        }
        let mut ahead = TailLookahead::default();
        let depth = TailLookahead::DEPTH;
        let evict = |links: &mut Links, list: &mut ListHead, ahead: &mut TailLookahead| {
            let victim = links.pop_tail(list).unwrap();
            ahead.advance(links, list, victim);
            ahead.upcoming()
        };
        // Two steps per eviction (one more than the tail moves) until it is
        // DEPTH ahead, then one.
        for round in 0..20 {
            let [soon, later] = evict(&mut links, &mut list, &mut ahead);
            let lead = (round + 2).min(depth);
            assert_eq!(later, from_tail(&links, &list, lead), "round {round}");
            assert_eq!(
                soon,
                from_tail(&links, &list, lead.min(depth / 2)),
                "round {round}"
            );
        }
        // A hit moves a node it walked to the head: the walk goes wrong,
        // then an eviction takes a node it did not expect and it restarts.
        let moved = from_tail(&links, &list, 3);
        links.move_to_head(&mut list, moved);
        let mut recovered = false;
        for _ in 0..depth + 2 {
            let [soon, later] = evict(&mut links, &mut list, &mut ahead);
            recovered =
                later == from_tail(&links, &list, depth) && soon == from_tail(&links, &list, depth / 2);
        }
        assert!(recovered);
    }

    #[test]
    fn insert_before_head_and_middle() {
        let mut links = Links::new(4);
        let mut list = ListHead::default();
        links.push_tail(&mut list, 0);
        links.push_tail(&mut list, 1);
        links.insert_before(&mut list, 0, 2); // new head
        links.insert_before(&mut list, 1, 3); // between 0 and 1
        assert_eq!(links.iter(&list).collect::<Vec<_>>(), vec![2, 0, 3, 1]);
        assert_eq!(links.prev(1), 3);
        assert_eq!(list.len, 4);
        links.unlink(&mut list, 3);
        assert_eq!(links.iter(&list).collect::<Vec<_>>(), vec![2, 0, 1]);
    }
}
