//! Request ordering: per-shard FIFO ticket queues, one per line key and
//! one per slot. Tickets are taken while the shards involved are locked, so
//! every queue follows one global order of decisions: waiting cannot
//! deadlock, and I/O on a line or a slot happens in decision order. Here are
//! the queues ([`LineQueues`], a map, and [`SlotQueue`], packed in the
//! core's driver word of the slot), taking a ticket (`ShardState::
//! take_ticket`), waiting until tickets are served (`Inner::
//! wait_for_tickets`) and releasing them (`Inner::release_tickets`).

use iocache_core::fasthash::FxHashMap;
use iocache_core::{LineKey, SlotId, VolumeId};

use super::{lock, Inner, ShardState};

/// What a ticket orders: a line of a volume (its backend range and its
/// metadata) or a slot of the shard's region of the cache device (whatever
/// line it holds: a clean victim leaves no trace in the op list but its slot
/// is refilled).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum TicketKey {
    Line(LineKey),
    Slot(u32),
}

/// One line key's FIFO: tickets `serving..next` are waiting or running.
#[derive(Default, Clone, Copy)]
struct KeyQueue {
    next: u64,
    serving: u64,
}

/// A shard's ticket queues of line keys (sparse: a map). A slot's queue is
/// kept in the core's per-slot driver word instead (see [`SlotQueue`]).
#[derive(Default)]
pub(super) struct LineQueues {
    lines: FxHashMap<LineKey, KeyQueue>,
}

impl LineQueues {
    /// A new ticket for `line`, and whether it is served at once.
    pub(super) fn take(&mut self, line: LineKey) -> (u64, bool) {
        let queue = self.lines.entry(line).or_default();
        let ticket = queue.next;
        queue.next += 1;
        (ticket, queue.serving == ticket)
    }

    /// The lines of `volume` that have a queue (tickets taken, not all
    /// released).
    pub(super) fn queued_lines(&self, volume: VolumeId) -> impl Iterator<Item = LineKey> + '_ {
        self.lines.keys().filter(move |k| k.volume == volume).copied()
    }

    /// Whether someone holds or waits for a ticket of `line` (an op that
    /// moves it to or from the backend is under way or queued).
    pub(super) fn is_queued(&self, line: LineKey) -> bool {
        self.lines.contains_key(&line)
    }

    /// Whether no line has a queue.
    pub(super) fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    fn serving(&self, line: LineKey, default: u64) -> u64 {
        self.lines.get(&line).map_or(default, |q| q.serving)
    }

    fn release(&mut self, line: LineKey) {
        if let Some(queue) = self.lines.get_mut(&line) {
            queue.serving += 1;
            if queue.serving == queue.next {
                self.lines.remove(&line);
            }
        }
    }
}

/// A slot's FIFO packed in the slot's driver word, which shares the cache
/// line of the slot's metadata (a hit then loads no other line for its
/// ticket): the next ticket in the low 32 bits, the one served in the high
/// 32. Both wrap; fewer than 2^32 tickets are ever outstanding on a slot.
struct SlotQueue;

impl SlotQueue {
    fn take(word: &mut u64) -> (u64, bool) {
        let next = *word as u32;
        let serving = (*word >> 32) as u32;
        *word = (u64::from(serving) << 32) | u64::from(next.wrapping_add(1));
        (u64::from(next), serving == next)
    }

    fn serving(word: u64) -> u64 {
        word >> 32
    }

    /// Whether no ticket is outstanding (taken and not released).
    fn idle(word: u64) -> bool {
        word as u32 == (word >> 32) as u32
    }

    fn release(word: &mut u64) {
        let serving = ((*word >> 32) as u32).wrapping_add(1);
        *word = (u64::from(serving) << 32) | (*word & u64::from(u32::MAX));
    }
}

/// A ticket taken: shard, key, number.
pub(super) type Ticket = (usize, TicketKey, u64);

impl ShardState {
    /// A new ticket for `key`, and whether it is served at once.
    pub(super) fn take_ticket(&mut self, key: TicketKey) -> (u64, bool) {
        match key {
            TicketKey::Line(line) => self.queues.take(line),
            TicketKey::Slot(slot) => SlotQueue::take(self.cache.slot_driver_word_mut(slot)),
        }
    }

    /// Takes the tickets of the line `key` (if any) and of `slot`, which
    /// holds it, in that order, as a request does; pushes them on `tickets`
    /// as `shard`'s.
    pub(super) fn take_slot_tickets(
        &mut self,
        shard: usize,
        slot: SlotId,
        key: Option<LineKey>,
        tickets: &mut Vec<Ticket>,
    ) {
        for ticket_key in key
            .map(TicketKey::Line)
            .into_iter()
            .chain([TicketKey::Slot(slot)])
        {
            let (ticket, _) = self.take_ticket(ticket_key);
            tickets.push((shard, ticket_key, ticket));
        }
    }

    /// Whether no op on `slot` is under way or queued, nor one that moves
    /// `key` (its line) to or from the backend.
    pub(super) fn slot_idle(&self, slot: SlotId, key: LineKey) -> bool {
        SlotQueue::idle(self.cache.slot_driver_word(slot)) && !self.queues.is_queued(key)
    }

    /// The ticket `key` serves now (`default` for a line nobody queues on).
    pub(super) fn serving(&self, key: TicketKey, default: u64) -> u64 {
        match key {
            TicketKey::Line(line) => self.queues.serving(line, default),
            TicketKey::Slot(slot) => SlotQueue::serving(self.cache.slot_driver_word(slot)),
        }
    }

    pub(super) fn release_ticket(&mut self, key: TicketKey) {
        match key {
            TicketKey::Line(line) => self.queues.release(line),
            TicketKey::Slot(slot) => SlotQueue::release(self.cache.slot_driver_word_mut(slot)),
        }
    }
}

/// Slots a decision outside any request emptied (a resize, a failed
/// array member's evacuation), with the tickets that order them after the
/// requests decided before: one of those may still read or fill a slot,
/// and a fill notes its line in the shadow when its write is done.
#[derive(Default)]
pub(super) struct DroppedSlots {
    tickets: Vec<Ticket>,
    slots: Vec<(usize, SlotId)>,
}

impl DroppedSlots {
    /// Notes that `shard`'s decision just emptied `slot`, which held `key`:
    /// takes its tickets under the shard's lock (`state`), as requests do.
    pub(super) fn add(&mut self, state: &mut ShardState, shard: usize, slot: SlotId, key: LineKey) {
        state.take_slot_tickets(shard, slot, Some(key), &mut self.tickets);
        self.slots.push((shard, slot));
    }
}

impl Inner {
    /// Waits until the requests decided before are done with `dropped`'s
    /// slots, then notes each slot empty in its shard's shadow and runs
    /// `then` on it under the shard's lock; releases the tickets last, so
    /// that no new line of a slot (one put back on the free list) has been
    /// noted before. Call with no shard lock held.
    pub(super) fn empty_dropped_slots(
        &self,
        dropped: DroppedSlots,
        then: impl Fn(&ShardState, usize, SlotId),
    ) {
        self.wait_for_tickets(&dropped.tickets);
        for (i, shard) in self.shards.iter().enumerate() {
            if !dropped.slots.iter().any(|&(s, _)| s == i) {
                continue;
            }
            let mut state = lock(&shard.state);
            for &(_, slot) in dropped.slots.iter().filter(|&&(s, _)| s == i) {
                state.shadow.note_empty(slot);
                then(&state, i, slot);
            }
        }
        self.release_tickets(&dropped.tickets);
    }

    pub(super) fn wait_for_tickets(&self, tickets: &[Ticket]) {
        for &(shard, key, ticket) in tickets {
            let shard = &self.shards[shard];
            let mut state = lock(&shard.state);
            while state.serving(key, ticket) != ticket {
                state.waiters += 1;
                state = shard.served.wait(state).unwrap_or_else(|p| p.into_inner());
                state.waiters -= 1;
            }
        }
    }

    pub(super) fn release_tickets(&self, tickets: &[Ticket]) {
        let mut i = 0;
        while i < tickets.len() {
            let shard_index = tickets[i].0;
            let shard = &self.shards[shard_index];
            let mut state = lock(&shard.state);
            while i < tickets.len() && tickets[i].0 == shard_index {
                state.release_ticket(tickets[i].1);
                i += 1;
            }
            let waiters = state.waiters;
            drop(state);
            if waiters > 0 {
                shard.served.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SlotQueue;

    /// A slot's packed FIFO serves tickets in the order taken, also where
    /// its 32-bit counters wrap.
    #[test]
    fn a_slot_queue_serves_in_order_across_the_wrap() {
        for start in [0u32, u32::MAX - 2] {
            let mut word = (u64::from(start) << 32) | u64::from(start);
            let (first, served) = SlotQueue::take(&mut word);
            assert!(served, "an idle queue serves the first ticket at once");
            let taken: Vec<u64> = (0..4)
                .map(|_| SlotQueue::take(&mut word))
                .map(|(t, s)| {
                    assert!(!s, "a busy queue makes later tickets wait");
                    t
                })
                .collect();
            let mut expected = first;
            for ticket in std::iter::once(first).chain(taken) {
                assert_eq!(ticket, expected);
                assert_eq!(
                    SlotQueue::serving(word),
                    ticket,
                    "ticket {ticket} is served in turn"
                );
                SlotQueue::release(&mut word);
                expected = u64::from((expected as u32).wrapping_add(1));
            }
            let (next, served) = SlotQueue::take(&mut word);
            assert!(served, "all released: the next ticket is served at once");
            assert_eq!(next, u64::from(start.wrapping_add(5)));
        }
    }
}
