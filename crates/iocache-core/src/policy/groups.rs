//! Groups of slots evicted together: the flash blocks of BPLRU, the virtual
//! blocks of VBBMS and the request blocks of Req-block.
//!
//! Each group keeps its member slots on an intrusive list (in the order they
//! joined), so adding, removing and draining a member is O(1) with no
//! allocation per access. Group ids are dense and recycled; a generation
//! number per id tells a live group from a later one that reuses its id.
//! A group that loses its last member must be released by its owner.

use super::list::{Links, ListHead, NIL};
use crate::addr::SlotId;

pub(crate) struct Groups {
    /// Links between the members of one group, indexed by slot.
    members: Links,
    slot_group: Vec<u32>,
    heads: Vec<ListHead>,
    generation: Vec<u32>,
    free: Vec<u32>,
}

impl Groups {
    /// Room for `slots` slots in at most `groups` groups at once.
    pub(crate) fn new(slots: usize, groups: usize) -> Self {
        Groups {
            members: Links::new(slots),
            slot_group: vec![NIL; slots],
            heads: vec![ListHead::default(); groups],
            generation: vec![0; groups],
            free: (0..groups as u32).rev().collect(),
        }
    }

    /// A new empty group. Owners size the pool so that one is always free:
    /// non-empty groups never outnumber resident slots.
    pub(crate) fn alloc(&mut self) -> u32 {
        let Some(g) = self.free.pop() else {
            unreachable!("more groups than slots: an empty group was not released");
        };
        g
    }

    /// Returns an empty group to the pool; its id's generation changes.
    pub(crate) fn release(&mut self, g: u32) {
        debug_assert_eq!(self.heads[g as usize].len, 0, "released a non-empty group");
        self.generation[g as usize] = self.generation[g as usize].wrapping_add(1);
        self.free.push(g);
    }

    pub(crate) fn add(&mut self, g: u32, slot: SlotId) {
        debug_assert_eq!(self.slot_group[slot as usize], NIL, "slot already in a group");
        self.members.push_tail(&mut self.heads[g as usize], slot);
        self.slot_group[slot as usize] = g;
    }

    /// Takes `slot` out of its group and returns that group (`NIL` if it had none).
    pub(crate) fn remove(&mut self, slot: SlotId) -> u32 {
        let g = self.slot_group[slot as usize];
        if g != NIL {
            self.members.unlink(&mut self.heads[g as usize], slot);
            self.slot_group[slot as usize] = NIL;
        }
        g
    }

    /// Empties group `g`, pushing its members (in joining order) into `out`.
    pub(crate) fn drain_into(&mut self, g: u32, out: &mut Vec<SlotId>) {
        let start = out.len();
        out.extend(self.members.iter(&self.heads[g as usize]));
        for &slot in &out[start..] {
            self.members.unlink(&mut self.heads[g as usize], slot);
            self.slot_group[slot as usize] = NIL;
        }
    }

    pub(crate) fn group_of(&self, slot: SlotId) -> u32 {
        self.slot_group[slot as usize]
    }

    pub(crate) fn len(&self, g: u32) -> u32 {
        self.heads[g as usize].len
    }

    pub(crate) fn generation(&self, g: u32) -> u32 {
        self.generation[g as usize]
    }

    /// Members of `g` in joining order.
    pub(crate) fn members(&self, g: u32) -> impl Iterator<Item = SlotId> + '_ {
        self.members.iter(&self.heads[g as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_join_leave_and_drain_in_order() {
        let mut g = Groups::new(6, 3);
        let a = g.alloc();
        let b = g.alloc();
        for slot in [4, 0, 2] {
            g.add(a, slot);
        }
        g.add(b, 5);
        assert_eq!(g.members(a).collect::<Vec<_>>(), vec![4, 0, 2]);
        assert_eq!((g.group_of(0), g.group_of(5), g.group_of(1)), (a, b, NIL));
        assert_eq!(g.remove(0), a);
        assert_eq!(g.remove(1), NIL);
        let mut out = vec![9];
        g.drain_into(a, &mut out);
        assert_eq!(out, vec![9, 4, 2]);
        assert_eq!((g.len(a), g.group_of(4)), (0, NIL));
        let gen = g.generation(a);
        g.release(a);
        assert_ne!(g.generation(a), gen, "a released id changes generation");
        assert_eq!(g.alloc(), a, "ids are recycled");
        g.add(a, 4);
        assert_eq!(g.len(a), 1);
    }
}
