//! Binary min-heaps of slots that know where each slot stands, so a slot
//! can be moved or removed in O(log n): the Access policy keeps one, ReCA
//! one per set. The order is a slot's value, then its stamp (older first).

use super::list::NIL;
use crate::addr::SlotId;

/// The order of the slots: by `value`, ties by `stamp`.
#[derive(Clone, Copy)]
pub(crate) struct SlotOrder<'a> {
    value: &'a [u64],
    stamp: &'a [u64],
}

impl<'a> SlotOrder<'a> {
    pub fn new(value: &'a [u64], stamp: &'a [u64]) -> Self {
        SlotOrder { value, stamp }
    }

    #[inline]
    pub fn less(&self, a: SlotId, b: SlotId) -> bool {
        let (a, b) = (a as usize, b as usize);
        (self.value[a], self.stamp[a]) < (self.value[b], self.stamp[b])
    }
}

/// One heap, with the positions of its slots (`pos[slot]`: the slot's
/// index in `heap`, `NIL` when in no heap; several heaps may share
/// `pos`).
pub(crate) struct SlotHeap<'a> {
    heap: &'a mut Vec<SlotId>,
    pos: &'a mut [u32],
    order: SlotOrder<'a>,
}

impl<'a> SlotHeap<'a> {
    pub fn new(heap: &'a mut Vec<SlotId>, pos: &'a mut [u32], value: &'a [u64], stamp: &'a [u64]) -> Self {
        SlotHeap {
            heap,
            pos,
            order: SlotOrder::new(value, stamp),
        }
    }

    fn place(&mut self, i: usize, slot: SlotId) {
        self.heap[i] = slot;
        self.pos[slot as usize] = i as u32;
    }

    fn sift_up(&mut self, mut i: usize) {
        let slot = self.heap[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            let p = self.heap[parent];
            if !self.order.less(slot, p) {
                break;
            }
            self.place(i, p);
            i = parent;
        }
        self.place(i, slot);
    }

    fn sift_down(&mut self, mut i: usize) {
        let slot = self.heap[i];
        let n = self.heap.len();
        loop {
            let left = 2 * i + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && self.order.less(self.heap[right], self.heap[left]) {
                right
            } else {
                left
            };
            let c = self.heap[child];
            if !self.order.less(c, slot) {
                break;
            }
            self.place(i, c);
            i = child;
        }
        self.place(i, slot);
    }

    /// Adds `slot`.
    pub fn push(&mut self, slot: SlotId) {
        self.heap.push(slot);
        let i = self.heap.len() - 1;
        self.pos[slot as usize] = i as u32;
        self.sift_up(i);
    }

    /// Moves `slot` down after its value or stamp grew.
    pub fn grew(&mut self, slot: SlotId) {
        self.sift_down(self.pos[slot as usize] as usize);
    }

    /// Restores the order around `slot` after its value or stamp changed.
    pub fn reheap(&mut self, slot: SlotId) {
        self.sift_down(self.pos[slot as usize] as usize);
        self.sift_up(self.pos[slot as usize] as usize);
    }

    /// Removes `slot`; returns whether it was in a heap.
    pub fn remove(&mut self, slot: SlotId) -> bool {
        let i = self.pos[slot as usize];
        if i == NIL {
            return false;
        }
        self.pos[slot as usize] = NIL;
        let last = self.heap.pop().expect("a slot with a position is in its heap");
        if last != slot {
            self.place(i as usize, last);
            self.reheap(last);
        }
        true
    }
}

/// Checks the positions and the order of `heap` (for tests).
pub(crate) fn check(heap: &[SlotId], pos: &[u32], order: SlotOrder<'_>) {
    for (i, &s) in heap.iter().enumerate() {
        assert_eq!(pos[s as usize], i as u32);
        if i > 0 {
            assert!(!order.less(s, heap[(i - 1) / 2]), "heap order");
        }
    }
}
