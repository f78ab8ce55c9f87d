//! The resident queues 2Q and S3-FIFO share: a probation FIFO that new lines
//! enter, a main queue, and a ghost FIFO of keys evicted from probation whose
//! return sends the line straight to the main queue.
//!
//! 2Q calls them A1in, Am and A1out; S3-FIFO S, M and G. What differs (when
//! a line leaves probation, how the main queue orders itself) stays with each
//! policy.

use super::ghost::GhostFifo;
use super::list::{Links, ListHead, TailLookahead, NIL};
use crate::addr::{LineKey, SlotId};

/// The queue a slot is on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Queue {
    None,
    Probation,
    Main,
}

pub(super) struct ProbationQueues {
    pub links: Links,
    pub queue_of: Vec<Queue>,
    pub key_of: Vec<LineKey>,
    pub probation: ListHead,
    pub main: ListHead,
    pub ghost: GhostFifo,
    /// Set by [`ProbationQueues::look_up_ghost`] when the incoming key was
    /// a ghost: it enters the main queue.
    pub incoming_to_main: bool,
    pub ghost_hits: u64,
    /// The last victim evicted and the queue it left (for
    /// [`ProbationQueues::keep_victim`]: the ghost FIFO may be too small to
    /// tell).
    last_victim: (SlotId, Queue),
    /// Each queue's oldest lines, walked ahead of their evictions for
    /// prefetching (hints only).
    probation_ahead: TailLookahead,
    main_ahead: TailLookahead,
}

impl ProbationQueues {
    /// Empty queues for `capacity_lines` slots and a ghost FIFO of `ghost_lines` keys.
    pub fn new(capacity_lines: usize, ghost_lines: usize) -> Self {
        let none = LineKey {
            volume: 0,
            line_index: 0,
        };
        ProbationQueues {
            links: Links::new(capacity_lines),
            queue_of: vec![Queue::None; capacity_lines],
            key_of: vec![none; capacity_lines],
            probation: ListHead::default(),
            main: ListHead::default(),
            ghost: GhostFifo::new(ghost_lines),
            incoming_to_main: false,
            ghost_hits: 0,
            last_victim: (NIL, Queue::None),
            probation_ahead: TailLookahead::default(),
            main_ahead: TailLookahead::default(),
        }
    }

    /// Sizes of (probation, main, ghost).
    pub fn sizes(&self) -> (usize, usize, usize) {
        (
            self.probation.len as usize,
            self.main.len as usize,
            self.ghost.len(),
        )
    }

    /// A miss on `key`: a ghost of it sends the incoming line to the main
    /// queue (and leaves the ghost FIFO).
    #[inline]
    pub fn look_up_ghost(&mut self, key: &LineKey) {
        self.incoming_to_main = self.ghost.take(key);
        self.ghost_hits += self.incoming_to_main as u64;
    }

    /// Puts `slot` at the head of `queue` (`Probation` or `Main`).
    #[inline]
    pub fn push_head(&mut self, queue: Queue, slot: SlotId) {
        let list = match queue {
            Queue::Probation => &mut self.probation,
            Queue::Main => &mut self.main,
            Queue::None => unreachable!("a slot is pushed onto a queue"),
        };
        self.links.push_head(list, slot);
        self.queue_of[slot as usize] = queue;
    }

    /// Takes the oldest line of `queue` (`Probation` or `Main`) off it.
    #[inline]
    pub fn pop_tail(&mut self, queue: Queue) -> Option<SlotId> {
        let (list, ahead) = match queue {
            Queue::Probation => (&mut self.probation, &mut self.probation_ahead),
            Queue::Main => (&mut self.main, &mut self.main_ahead),
            Queue::None => return None,
        };
        let slot = self.links.pop_tail(list)?;
        ahead.advance(&self.links, list, slot);
        Some(slot)
    }

    /// `slot`, just popped from `queue`, is the victim: a probation line
    /// leaves its key in the ghost FIFO.
    #[inline]
    pub fn evicted(&mut self, slot: SlotId, queue: Queue) -> SlotId {
        self.queue_of[slot as usize] = Queue::None;
        if queue == Queue::Probation {
            self.ghost.push(self.key_of[slot as usize]);
        }
        self.last_victim = (slot, queue);
        slot
    }

    /// The victim just evicted comes back to the head of the queue it left
    /// (its key, if the eviction made a ghost of it, leaves the ghost FIFO).
    pub fn keep_victim(&mut self, slot: SlotId, key: LineKey) {
        self.key_of[slot as usize] = key;
        let (victim, queue) = self.last_victim;
        debug_assert_eq!(
            victim, slot,
            "one victim per eviction, handed back before the next"
        );
        self.ghost.take(&key);
        self.push_head(queue, slot);
    }

    /// `key` now lives in `slot`: at the head of the queue the miss chose.
    #[inline]
    pub fn insert(&mut self, slot: SlotId, key: LineKey) {
        self.key_of[slot as usize] = key;
        let queue = if std::mem::take(&mut self.incoming_to_main) {
            Queue::Main
        } else {
            Queue::Probation
        };
        self.push_head(queue, slot);
    }

    /// Invalidation: the line leaves its queue without a ghost.
    pub fn remove(&mut self, slot: SlotId) {
        match self.queue_of[slot as usize] {
            Queue::Probation => self.links.unlink(&mut self.probation, slot),
            Queue::Main => self.links.unlink(&mut self.main, slot),
            Queue::None => return,
        }
        self.queue_of[slot as usize] = Queue::None;
    }

    /// The next victims of probation (`from_probation`) or of the main
    /// queue, with prefetches: the later one's key (and what `prefetch_later`
    /// loads for it), and for probation where the soon one's key will go in
    /// the ghost FIFO.
    #[inline]
    pub fn next_victims(
        &self,
        from_probation: bool,
        prefetch_later: impl FnOnce(u32),
    ) -> [Option<SlotId>; 2] {
        let ahead = if from_probation {
            &self.probation_ahead
        } else {
            &self.main_ahead
        };
        let [soon, later] = ahead.upcoming();
        if later != NIL {
            prefetch_later(later);
            crate::prefetch::prefetch_address(self.key_of.as_ptr().wrapping_add(later as usize) as usize);
        }
        self.ghost.prefetch_push(if from_probation {
            self.key_of.get(soon as usize)
        } else {
            None
        });
        ahead.next_victims()
    }
}

/// A policy on [`ProbationQueues`]: where they are and how it makes room.
pub(super) trait OnProbationQueues {
    fn queues(&mut self) -> &mut ProbationQueues;

    /// Evicts one line: the policy's choice of queue and victim.
    fn make_room(&mut self) -> Option<SlotId>;

    /// A miss on `key`: a ghost of it sends the incoming line to the main
    /// queue; one victim when one is needed.
    #[inline]
    fn victim_for(&mut self, key: LineKey, need_victim: bool) -> Option<SlotId> {
        self.queues().look_up_ghost(&key);
        if need_victim {
            self.make_room()
        } else {
            None
        }
    }
}

/// The [`super::ReplacementPolicy`] methods that a policy on
/// [`ProbationQueues`] (its field `q`, and [`OnProbationQueues`])
/// hands to them as they are: misses, kept victims, ghost prefetches and
/// invalidation.
macro_rules! probation_queue_methods {
    () => {
        super::one_victim_per_miss!();

        /// Back to the head of the queue it left (probation: its key, made a
        /// ghost by the eviction, leaves the ghost FIFO again).
        fn on_victim_kept(&mut self, slot: SlotId, key: LineKey, _info: &AccessInfo) {
            self.q.keep_victim(slot, key);
        }

        /// Make room again (the ghosts were looked up once, by `on_miss`).
        fn on_miss_again(&mut self, _key: LineKey, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
            victims.extend(self.make_room());
        }

        /// The ghost index position a miss on the key looks up.
        #[inline]
        fn prefetch_key(&self, hash: u32) {
            self.q.ghost.prefetch_key(hash);
        }

        /// The key of the ghost a miss will probably compare.
        #[inline]
        fn prefetch_miss(&self, hash: u32) {
            self.q.ghost.prefetch_found(hash);
        }

        fn on_remove(&mut self, slot: SlotId) {
            self.q.remove(slot);
        }
    };
}
pub(super) use probation_queue_methods;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{key, Driver};
    use crate::policy::{ReplacementPolicy, S3Fifo, TwoQ};

    /// Capacity 4 with one line of probation: 1-4 fill probation; 5 sends
    /// 1 to the ghosts. 1 again is a ghost hit; probation's oldest, 2, is
    /// dirty and kept; asked again the eviction takes 3.
    fn kept_victim_goes_back<P: ReplacementPolicy + OnProbationQueues>(name: &str, policy: P) {
        let mut d = Driver::new(policy, 4);
        d.run(&[1, 2, 3, 4, 5]);
        assert!(d.policy.queues().ghost.contains(&key(1)), "{name}");
        d.miss_keeping(1, &[2]);
        assert_eq!(d.evicted, vec![1, 3], "{name}");
        assert_eq!(d.resident(), vec![1, 2, 4, 5], "{name}");
        let (one, two) = (d.slot_of(1).unwrap(), d.slot_of(2).unwrap());
        let q = d.policy.queues();
        assert_eq!(
            q.queue_of[one as usize],
            Queue::Main,
            "{name}: a ghost hit enters main"
        );
        assert_eq!(
            q.queue_of[two as usize],
            Queue::Probation,
            "{name}: the kept line is back in probation"
        );
        assert!(!q.ghost.contains(&key(2)), "{name}: a resident line is no ghost");
        assert!(q.ghost.contains(&key(3)), "{name}");
        assert_eq!(q.sizes(), (3, 1, 1), "{name}");
    }

    #[test]
    fn a_kept_dirty_victim_goes_back_to_probation_and_a_ghost_hit_still_enters_main() {
        kept_victim_goes_back("2q", TwoQ::new(4, 0.25, 0.5));
        kept_victim_goes_back("s3fifo", S3Fifo::new(4, 0.25, 1, None));
    }
}
