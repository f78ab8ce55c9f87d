//! Planning, steps 1-2 of a request: a request is validated and cut into
//! per-shard segments (`segments`, [`Segment`]); then, with the shards it
//! touches locked in ascending order, each segment's op list comes from the
//! core and a ticket is taken for every line key and every slot the ops
//! touch (`decide`, `decide_into`), which gives the [`Plan`]: the
//! [`PlannedSegment`]s with their ops and the tickets to wait for. Running
//! a plan (step 3) is `Inner::run` in engine.rs.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use iocache_core::{AccessHints, AccessSummary, IoKind, LineKey, Op, OrderedWait, Request, VolumeId};
use smallvec::SmallVec;

use super::tickets::{Ticket, TicketKey};
use super::{lock, EngineError, Inner, ShardState, SHARD_SPAN_LINES};

/// A contiguous part of a request that falls in one shard.
#[derive(Clone, Copy)]
pub(super) struct Segment {
    pub(super) shard: usize,
    pub(super) request: Request,
    /// Where this segment starts in the request's buffer.
    pub(super) buffer_offset: usize,
    /// Its last line runs past the volume's end: a read fills only what
    /// it asks for ([`AccessHints::request_fill`]).
    pub(super) request_fill: bool,
}

/// A request's segments: inline for the usual one or two, so the hit path
/// does not allocate.
pub(super) type Segments = SmallVec<[Segment; 2]>;

pub(super) struct PlannedSegment {
    pub(super) shard: usize,
    /// The volume of the request.
    pub(super) volume: VolumeId,
    pub(super) buffer_offset: usize,
    /// For each `WriteCache` op (in order), its slot's generation right
    /// after the decision: a failure handler forgets what the op was to
    /// write only if no later decision changed the slot.
    pub(super) generations: SmallVec<[u64; 2]>,
    /// The segment's first byte in the volume (under a line fill, the
    /// start of its first line: where its ops' buffer offsets count from).
    pub(super) request_offset: u64,
    /// The ops' buffer offsets count from the start of the segment's first
    /// line ([`iocache_core::AccessSummary::line_origin`]).
    pub(super) line_origin: bool,
    pub(super) ops: SmallVec<[Op; 4]>,
}

/// The decisions for one request and the tickets it must wait for.
pub(super) struct Plan {
    pub(super) segments: SmallVec<[PlannedSegment; 1]>,
    pub(super) tickets: SmallVec<[Ticket; 4]>,
    /// Whether every ticket was served when taken (nothing to wait for).
    pub(super) all_served: bool,
    /// The core's verdicts on the request's lines (per-volume statistics).
    pub(super) summary: AccessSummary,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            segments: SmallVec::new(),
            tickets: SmallVec::new(),
            all_served: true,
            summary: AccessSummary::default(),
        }
    }
}

impl Inner {
    /// Validates a request to `volume` (of `size` bytes) and cuts it into
    /// per-shard segments.
    pub(super) fn segments(
        &self,
        volume: VolumeId,
        size: u64,
        kind: IoKind,
        offset: u64,
        length: u64,
        now_ns: u64,
    ) -> Result<Segments, EngineError> {
        self.check_request(size, offset, length)?;
        let span_bytes = SHARD_SPAN_LINES * self.line_bytes;
        let mut segments = Segments::new();
        let mut at = offset;
        let end = offset + length;
        while at < end {
            let span_end = (at / span_bytes + 1) * span_bytes;
            let seg_end = span_end.min(end);
            let request = Request {
                volume,
                offset_bytes: at,
                length_bytes: seg_end - at,
                kind,
                now_ns,
                process: 0,
            };
            let key = self.key_of(volume, at);
            let shard = self.shard_of(key);
            if at != offset {
                // The first was prefetched by `Engine::request`.
                self.index_prefetchers[shard].prefetch(&key);
            }
            segments.push(Segment {
                shard,
                request,
                buffer_offset: (at - offset) as usize,
                request_fill: seg_end.div_ceil(self.line_bytes) * self.line_bytes > size,
            });
            at = seg_end;
        }
        Ok(segments)
    }

    /// Steps 1-2 of the protocol: decisions and tickets under the shard locks.
    ///
    /// A segment takes the line tickets of its own lines only when its ops
    /// touch the backend: a segment served wholly by the cache (a hit, or a
    /// write kept in the cache) is ordered by its slot tickets, since every op
    /// that changes what a slot holds or what its line's cached sectors
    /// contain takes that slot's ticket, and an op that moves the line to or
    /// from the backend takes the line's.
    pub(super) fn decide(&self, segments: &[Segment]) -> Result<Plan, EngineError> {
        let mut plan = Plan::default();
        self.decide_into(segments, &mut plan)?;
        Ok(plan)
    }

    /// [`Inner::decide`] into a plan the caller owns (no large moves on the
    /// hit path).
    pub(super) fn decide_into(&self, segments: &[Segment], plan: &mut Plan) -> Result<(), EngineError> {
        // A load balancer's answer for the request, before the locks (it
        // reads only atomics).
        self.decide_into_with(segments, plan, self.balance_hints())
    }

    /// [`Inner::decide_into`] with the request's hints given.
    pub(super) fn decide_into_with(
        &self,
        segments: &[Segment],
        plan: &mut Plan,
        hints: AccessHints,
    ) -> Result<(), EngineError> {
        // Loops and pushes rather than iterator `collect`s: these small
        // vectors are built on every hit, and the collects were calls.
        let mut order: SmallVec<[usize; 2]> = SmallVec::new();
        for segment in segments {
            order.push(segment.shard);
        }
        if order.len() > 1 {
            order.sort_unstable();
            order.dedup();
        }
        let mut guards: SmallVec<[(usize, MutexGuard<'_, ShardState>); 2]> = SmallVec::new();
        for &i in &order {
            guards.push((i, lock(&self.shards[i].state)));
        }
        if self.ordered() {
            // Ordered write-back: the epoch is read with the shards locked
            // (so it never goes back for a shard), and a write that would
            // break the order waits, holding no ticket, then is decided
            // again.
            // The epoch of the first attempt: a write that must reach the
            // backend may once every epoch before it is there.
            let mut first = None;
            while let Some((wait, epoch)) = self.ordered_wait(segments, &mut guards, &mut first) {
                drop(guards);
                self.wait_ordered(wait, epoch)?;
                guards = SmallVec::new();
                for &i in &order {
                    guards.push((i, lock(&self.shards[i].state)));
                }
            }
        }
        debug_assert!(plan.segments.is_empty() && plan.tickets.is_empty() && plan.all_served);
        // A 64 KiB request's keys (4 KiB lines) on the stack.
        let mut keys: SmallVec<[(usize, TicketKey); 32]> = SmallVec::new();
        for segment in segments {
            let Some((_, state)) = guards.iter_mut().find(|(i, _)| *i == segment.shard) else {
                unreachable!("every segment's shard is locked");
            };
            let ShardState { cache, ops, .. } = &mut **state;
            let hints = AccessHints {
                request_fill: segment.request_fill,
                ..hints
            };
            let summary = cache.access_with(&segment.request, hints, ops)?;
            plan.summary.lines += summary.lines;
            plan.summary.full_hits += summary.full_hits;
            plan.summary.partial_hits += summary.partial_hits;
            plan.summary.misses += summary.misses;
            if summary.dirty_victims_kept > 0 {
                self.shards[segment.shard]
                    .wants_cleaning
                    .store(true, Ordering::Relaxed);
                self.wake_cleaner();
            }
            let request = &segment.request;
            let mut touches_backend = false;
            for op in ops.ops() {
                match *op {
                    Op::WriteBack {
                        slot,
                        volume,
                        offset_bytes,
                        ..
                    } => {
                        keys.push((segment.shard, TicketKey::Line(self.key_of(volume, offset_bytes))));
                        keys.push((segment.shard, TicketKey::Slot(slot)));
                    }
                    Op::Invalidate { slot, key } => {
                        keys.push((segment.shard, TicketKey::Line(key)));
                        keys.push((segment.shard, TicketKey::Slot(slot)));
                    }
                    Op::ReadCache { slot, .. } | Op::WriteCache { slot, .. } => {
                        keys.push((segment.shard, TicketKey::Slot(slot)))
                    }
                    Op::ReadBackend { .. } | Op::WriteBackend { .. } => touches_backend = true,
                }
            }
            if touches_backend {
                let first = request.offset_bytes >> self.line_shift;
                let last = (request.offset_bytes + request.length_bytes - 1) >> self.line_shift;
                for line_index in first..=last {
                    keys.push((
                        segment.shard,
                        TicketKey::Line(LineKey {
                            volume: request.volume,
                            line_index,
                        }),
                    ));
                }
            }
            // Sized once: a 64 KiB write has 16 (growing from the inline
            // two by doubling reallocated three times).
            let writes = ops
                .ops()
                .iter()
                .filter(|op| matches!(op, Op::WriteCache { .. }))
                .count();
            let mut generations = SmallVec::with_capacity(writes);
            for op in ops.ops() {
                if let Op::WriteCache { slot, .. } = *op {
                    generations.push(cache.slot_generation(slot));
                }
            }
            plan.segments.push(PlannedSegment {
                shard: segment.shard,
                volume: segment.request.volume,
                buffer_offset: segment.buffer_offset,
                generations,
                request_offset: segment.request.offset_bytes,
                line_origin: summary.line_origin,
                ops: SmallVec::from_slice(ops.ops()),
            });
        }
        if keys.len() > 1 {
            keys.sort_unstable();
            keys.dedup();
        }
        plan.tickets.reserve_exact(keys.len());
        for &(shard, key) in &keys {
            let state = if guards.len() == 1 {
                &mut guards[0].1
            } else {
                let Some((_, state)) = guards.iter_mut().find(|(i, _)| *i == shard) else {
                    unreachable!("every ticket's shard is locked");
                };
                state
            };
            let (ticket, served) = state.take_ticket(key);
            plan.all_served &= served;
            plan.tickets.push((shard, key, ticket));
        }
        drop(guards);
        Ok(())
    }

    /// Sets the current epoch on the locked shards and says what a write
    /// among `segments` must wait for, if anything, and its epoch.
    fn ordered_wait(
        &self,
        segments: &[Segment],
        guards: &mut [(usize, MutexGuard<'_, ShardState>)],
        first: &mut Option<u64>,
    ) -> Option<(OrderedWait, u64)> {
        let epoch = self.epochs.as_ref()?.current();
        let first = *first.get_or_insert(epoch);
        for (_, state) in guards.iter_mut() {
            state.cache.set_epoch(epoch);
        }
        segments.iter().find_map(|segment| {
            let (_, state) = guards.iter().find(|(i, _)| *i == segment.shard)?;
            let wait = state.cache.ordered_write_waits(&segment.request)?;
            (!self.ordered_may_go(wait, first)).then_some((wait, first))
        })
    }
}
