//! Reads served in place: a read that hits the cache in every line, on a
//! cache device whose bytes are memory (a file in tmpfs, mapped), hands
//! those bytes to the caller where they lie instead of copying them into
//! its buffer first; a server then writes its reply to the socket straight
//! from the cache, one copy fewer. The read's tickets are held until the
//! caller is done, so no write or eviction changes the bytes meanwhile.

use super::*;

/// Where a read served in place hands its bytes: the parts, in order, that
/// make up the read, valid only during the call. It returns whether it
/// took them; if not, they are copied into the read's buffer.
pub type InPlace<'a> = &'a mut dyn FnMut(&[&[u8]]) -> bool;

impl Engine {
    /// Reads `buf.len()` bytes at `offset` of `volume` as
    /// [`Engine::read_with`] does, or, when the read hits in every line of
    /// a cache device in memory, hands the bytes where they lie to
    /// `in_place` (valid only during the call; no write changes them
    /// meanwhile), which returns whether it took them: then `buf` is left
    /// alone, else they are copied into it. Returns whether `in_place`
    /// took them.
    pub fn read_in_place_with(
        &self,
        volume: &Volume,
        offset: u64,
        buf: &mut [u8],
        in_place: InPlace<'_>,
    ) -> Result<bool, EngineError> {
        let mut took = false;
        let mut handed = |parts: &[&[u8]]| {
            took = in_place(parts);
            took
        };
        self.request(volume, offset, Buffer::Read(buf), false, true, Some(&mut handed))?;
        Ok(took)
    }
}

impl Inner {
    /// Runs a read's plan with its bytes handed to `in_place` as they lie
    /// on the cache device, when [`Inner::may_read_in_place`] (before and
    /// after waiting for the plan's tickets) and every part can be had in
    /// place and holds no sector of zeroes (the usual path decides whether
    /// such a sector is believable); otherwise as [`Inner::run`] does, into
    /// `buf`. A fault in the device's memory met while the caller held the
    /// bytes fails the read (what the caller had may be zeroes). The time
    /// `in_place` took (not the read's own) goes into `caller_ns`.
    pub(super) fn run_in_place(
        &self,
        plan: &Plan,
        buf: &mut [u8],
        in_place: InPlace<'_>,
        caller_ns: &mut u64,
    ) -> Result<(), EngineError> {
        let copied = |buf: &mut [u8]| self.run(plan, Buffer::Read(buf));
        if !self.may_read_in_place(plan) {
            return copied(buf);
        }
        if !plan.all_served {
            self.wait_for_tickets(&plan.tickets);
        }
        // A write decided before this read may have failed meanwhile and
        // poisoned its sectors (or lost the device): the usual path knows
        // what to do then. It waits for the same tickets, already served.
        if !self.may_read_in_place(plan) {
            return copied(buf);
        }
        let parts = self.parts_in_place(plan, buf.len());
        let ops = plan.segments.iter().map(|s| s.ops.len() as u64).sum();
        let trusted = parts.as_ref().is_some_and(|parts| {
            // Reading each sector's first bytes is reading the parts in
            // place: timed as the cache's reads.
            self.queues
                .cache
                .time_n(&self.clock, queues::cache_class::READ_HIT, ops, || {
                    !parts
                        .iter()
                        .any(|p| p.chunks(SECTOR_BYTES as usize).any(|s| s.iter().all(|&b| b == 0)))
                        && self.slots.dev.in_place_sound()
                })
        });
        let Some(parts) = parts.filter(|_| trusted) else {
            return copied(buf);
        };
        // The tickets are released even if `in_place` panics (a server
        // catches that and answers with an error): a line whose tickets
        // were never released would stop every later request to it.
        let started_ns = self.clock.now_ns();
        let handed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| in_place(&parts)));
        *caller_ns = self.clock.now_ns().saturating_sub(started_ns);
        let taken = match handed {
            Ok(taken) => taken,
            Err(panic) => {
                drop(parts);
                self.release_tickets(&plan.tickets);
                std::panic::resume_unwind(panic);
            }
        };
        if !taken {
            let mut at = 0;
            for part in &parts {
                buf[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
        }
        drop(parts);
        self.release_tickets(&plan.tickets);
        if !self.slots.dev.in_place_sound() {
            self.health.io_errors.fetch_add(1, Ordering::Relaxed);
            return Err(EngineError::Io(
                "the cache device's memory failed while a read used it in place".into(),
            ));
        }
        Ok(())
    }

    /// Whether a plan is one a read in place can serve: cache reads only
    /// (a full hit), on one cache device that has its bytes in memory
    /// (not an array), no line poisoned in its shards, no content lost,
    /// and no load balancer (whose queue model times the cache's reads).
    fn may_read_in_place(&self, plan: &Plan) -> bool {
        self.slots.array.is_none()
            && self.balance.is_none()
            && !self.content_lost()
            && self.slots.dev.in_place_sound()
            && plan.segments.iter().all(|segment| {
                !segment.line_origin
                    && self.shards[segment.shard].poisoned.load(Ordering::Relaxed) == 0
                    && segment.ops.iter().all(|op| matches!(op, Op::ReadCache { .. }))
            })
    }

    /// The plan's cache reads as slices of the cache device, in buffer
    /// order, one per run of reads adjacent on the device; `None` unless
    /// they cover the read's `len` bytes one after the other and the
    /// device has each run in place. The caller holds the plan's tickets
    /// for as long as the slices live.
    fn parts_in_place(&self, plan: &Plan, len: usize) -> Option<SmallVec<[&[u8]; 8]>> {
        // (device offset, length) of each run.
        let mut runs: SmallVec<[(u64, usize); 8]> = SmallVec::new();
        let mut next = 0usize;
        for segment in &plan.segments {
            for op in &segment.ops {
                let read = CacheRead::of(op, segment.buffer_offset)?;
                let range = read.buffer_range();
                if range.start != next {
                    return None;
                }
                let at = self.cache_offset(segment.shard, read.slot, read.line_offset_bytes);
                let length = range.len();
                next += length;
                match runs.last_mut() {
                    Some((start, run)) if *start + *run as u64 == at => *run += length,
                    _ => runs.push((at, length)),
                }
            }
        }
        if next != len {
            return None;
        }
        runs.iter()
            // SAFETY: the plan's tickets, held by the caller while the
            // slices live, keep every write of these lines away.
            .map(|&(at, length)| unsafe { self.slots.dev.in_place(at, length) })
            .collect()
    }
}
