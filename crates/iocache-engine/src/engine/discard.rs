//! Range commands: a discard or a zeroing drops a byte range's lines from
//! the cache, dirty ones included (their data is discarded, never written
//! back), then passes the range down to the backend as a discard or as
//! zeroes; each chunk runs as a plan with a ticket on every line it touches,
//! so the backend sees the range only after every write-back of those lines
//! under way. A warm-up reads a range through the cache, sending it nowhere.

use std::sync::atomic::{AtomicU64, Ordering};

use iocache_core::{LineKey, Op, OpList, VolumeId, SECTOR_BYTES};
use smallvec::SmallVec;

use super::planning::{Plan, PlannedSegment};
use super::tickets::TicketKey;
use super::volumes::Volume;
use super::{lock, queues, Buffer, Engine, EngineError, Inner, ShardState, SHARD_SPAN_LINES};

/// Lines one plan of a discard takes tickets for: as many as a 32 MiB
/// write of 4 KiB lines, so a huge range never holds a huge plan.
const CHUNK_LINES: u64 = 8192;

/// What the backend is told about a range the cache dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PassDown {
    /// Nothing: the backend keeps what it has.
    Nothing,
    /// A discard: a hole punched, `BLKDISCARD`, NBD_CMD_TRIM.
    Discard,
    /// Zeroes; with `keep_allocated`, without a hole.
    Zeroes { keep_allocated: bool },
}

/// How [`Engine::write_zeroes_with`] zeroes a range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Zeroing {
    /// Durable before the call returns.
    pub fua: bool,
    /// No hole may be left (NBD's NO_HOLE).
    pub keep_allocated: bool,
    /// Fail with [`EngineError::NotSupported`], changing nothing, unless the
    /// backend zeroes quicker than writing zero buffers (NBD's FAST_ZERO).
    pub fast_only: bool,
}

/// Discards, zeroings and warming (NBD's TRIM, WRITE_ZEROES and CACHE) as
/// [`crate::EngineStats::block_commands`] reports them; a server reports
/// them as they are (serialized).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockCommandStats {
    /// Discard (TRIM) requests served.
    pub discards: u64,
    /// Zeroing requests served without zero buffers for their whole lines.
    pub zeroings: u64,
    /// Lines dropped by discards and zeroings.
    pub dropped_lines: u64,
    /// Of those, lines whose dirty data was discarded, never written back.
    pub dropped_dirty_lines: u64,
    /// Bytes asked to be read into the cache ([`Engine::warm_range`]:
    /// NBD_CMD_CACHE, `ctl warm`), and those read so far.
    pub warm_requested_bytes: u64,
    pub warmed_bytes: u64,
}

/// Counters of discards and zeroings.
#[derive(Default)]
pub(super) struct DiscardCounters {
    /// Discard requests served.
    pub(super) discards: AtomicU64,
    /// Zeroing requests served.
    pub(super) zeroings: AtomicU64,
    /// Lines dropped by either.
    pub(super) dropped_lines: AtomicU64,
    /// Of those, lines whose dirty data was discarded unwritten.
    pub(super) dropped_dirty_lines: AtomicU64,
    /// Bytes asked to be warmed (NBD_CMD_CACHE, an operator's warm), and
    /// those read so far.
    pub(super) warm_requested_bytes: AtomicU64,
    pub(super) warmed_bytes: AtomicU64,
}

impl DiscardCounters {
    pub(super) fn read(&self) -> BlockCommandStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        BlockCommandStats {
            discards: load(&self.discards),
            zeroings: load(&self.zeroings),
            dropped_lines: load(&self.dropped_lines),
            dropped_dirty_lines: load(&self.dropped_dirty_lines),
            warm_requested_bytes: load(&self.warm_requested_bytes),
            warmed_bytes: load(&self.warmed_bytes),
        }
    }
}

impl Engine {
    /// Discards `length` bytes at `offset` of `volume` (a TRIM): the lines
    /// wholly inside are dropped, dirty ones included; lines the range only
    /// partly covers keep their data (a trimmed range may read as anything
    /// until it is written again, as NBD allows). With `pass_down` the
    /// backend then discards the whole range.
    pub fn discard_with(
        &self,
        volume: &Volume,
        offset: u64,
        length: u64,
        pass_down: bool,
    ) -> Result<(), EngineError> {
        let state = volume.state();
        let _serving = state.enter()?;
        self.inner.check_request(state.size_bytes, offset, length)?;
        let end = offset + length;
        let how = if pass_down {
            PassDown::Discard
        } else {
            PassDown::Nothing
        };
        // Only the whole lines are passed down: a line the range covers in
        // part keeps its data in the cache and on the backend alike (the
        // backend's hole would read as zeroes where the cache does not).
        let whole = self.inner.lines_inside(offset, end);
        if !whole.is_empty() {
            let line_bytes = self.inner.line_bytes;
            let (from, to) = (whole.start * line_bytes, whole.end * line_bytes);
            self.inner.drop_range(state.id, from, to, whole, how)?;
        }
        self.inner
            .discard_counters
            .discards
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes `length` bytes at `offset` of `volume` read as zeroes without
    /// writing zero buffers through the cache: the lines wholly inside are
    /// dropped (dirty ones included) and the backend zeroes their range;
    /// the partial lines at either end are written with zeroes as any write.
    pub fn write_zeroes_with(
        &self,
        volume: &Volume,
        offset: u64,
        length: u64,
        zeroing: Zeroing,
    ) -> Result<(), EngineError> {
        let state = volume.state();
        {
            let _serving = state.enter()?;
            self.inner.check_request(state.size_bytes, offset, length)?;
            if zeroing.fast_only && !self.inner.backend_of(state.id)?.zeroes_fast() {
                return Err(EngineError::NotSupported(
                    "the backend cannot zero a range quicker than by writing zeroes".into(),
                ));
            }
        }
        let end = offset + length;
        let whole = self.inner.lines_inside(offset, end);
        let line_bytes = self.inner.line_bytes;
        let (whole_start, whole_end) = if whole.is_empty() {
            (end, end)
        } else {
            (whole.start * line_bytes, whole.end * line_bytes)
        };
        for (at, until) in [(offset, whole_start.min(end)), (whole_end.max(offset), end)] {
            if at < until {
                self.write_zero_buffer(volume, at, until - at)?;
            }
        }
        if !whole.is_empty() {
            let _serving = state.enter()?;
            let how = PassDown::Zeroes {
                keep_allocated: zeroing.keep_allocated,
            };
            self.inner
                .drop_range(state.id, whole_start, whole_end, whole, how)?;
        }
        self.inner
            .discard_counters
            .zeroings
            .fetch_add(1, Ordering::Relaxed);
        if zeroing.fua {
            self.flush_with(volume)?;
        }
        Ok(())
    }

    /// Reads `length` bytes at `offset` of `volume` through the cache, the
    /// data sent nowhere (NBD_CMD_CACHE, an operator's warm-up): lines the
    /// promotion policy admits on a miss come in, as a client's read would
    /// bring them (with `nhit`, a line needs its hits first). Not counted
    /// as a client's request; counted in [`BlockCommandStats::warmed_bytes`],
    /// chunk by chunk, so a long warm-up shows its progress.
    pub fn warm_range(&self, volume: &Volume, offset: u64, length: u64) -> Result<(), EngineError> {
        {
            let state = volume.state();
            let _serving = state.enter()?;
            self.inner.check_request(state.size_bytes, offset, length)?;
        }
        let counters = &self.inner.discard_counters;
        counters.warm_requested_bytes.fetch_add(length, Ordering::Relaxed);
        // One line-aligned megabyte at a time: bounded memory, and a read
        // that the core sees as a client's would be.
        const CHUNK: u64 = 1 << 20;
        let mut buf = vec![0u8; CHUNK.min(length) as usize];
        let mut at = offset;
        let end = offset + length;
        while at < end {
            let n = (end - at).min(CHUNK - at % CHUNK);
            let result = self.warm_with(volume, at, &mut buf[..n as usize]);
            counters.warmed_bytes.fetch_add(n, Ordering::Relaxed);
            if let Err(e) = result {
                // What was not read is counted as done: the request ended.
                counters.warmed_bytes.fetch_add(end - at - n, Ordering::Relaxed);
                return Err(e);
            }
            at += n;
        }
        Ok(())
    }

    /// Which parts of `length` bytes at `offset` of `volume` hold data and
    /// which are holes (read as zeroes): the backend's allocation, with
    /// every line that holds dirty data in the cache counted as data (the
    /// backend does not have it yet). Extents in order, covering the range.
    /// For NBD's BLOCK_STATUS (`base:allocation`): a copy tool skips the
    /// holes, so a hole is said only where the data is surely not.
    pub fn allocation(
        &self,
        volume: &Volume,
        offset: u64,
        length: u64,
    ) -> Result<Vec<iocache_device::Allocation>, EngineError> {
        use iocache_device::Allocation;
        let state = volume.state();
        let _serving = state.enter()?;
        self.inner.check_request(state.size_bytes, offset, length)?;
        let backend = self.inner.backend_of(state.id)?;
        let read = || {
            backend
                .allocation(offset, length)
                .map_err(|e| self.inner.backend_error(e))
        };
        let first = read()?;
        if !first.iter().any(|e| e.hole) {
            return Ok(first);
        }
        // No dirty line and no line moving to or from a backend (the
        // write-back of an evicted line holds its line's ticket): the
        // backend has everything.
        if self.inner.dirty_lines_of(state.id) == 0 && self.inner.no_line_queued() {
            return Ok(first);
        }
        // The lines of the backend's holes that are dirty in the cache,
        // looked up before the backend is asked again: a line clean then
        // has its data on the backend by the second answer (a write-back
        // marks a line clean only after its write returned).
        let shift = self.inner.line_shift;
        let mut checked: Vec<std::ops::Range<u64>> = Vec::new();
        let mut dirty = std::collections::HashSet::new();
        let mut at = offset;
        for e in &first {
            let end = at + e.length_bytes;
            if e.hole && e.length_bytes > 0 {
                checked.push(at..end);
                for line in at >> shift..=(end - 1) >> shift {
                    if self.inner.line_is_dirty(LineKey {
                        volume: state.id,
                        line_index: line,
                    }) {
                        dirty.insert(line);
                    }
                }
            }
            at = end;
        }
        let mut out: Vec<Allocation> = Vec::new();
        let mut push = |length_bytes: u64, hole: bool| match out.last_mut() {
            Some(last) if last.hole == hole => last.length_bytes += length_bytes,
            _ => out.push(Allocation { length_bytes, hole }),
        };
        let mut at = offset;
        // Both answers run in offset order: one cursor into the first's holes.
        let mut next_checked = 0;
        for e in read()? {
            let end = at + e.length_bytes;
            if !e.hole {
                push(e.length_bytes, false);
                at = end;
                continue;
            }
            while at < end {
                let line = at >> shift;
                let piece_end = ((line + 1) << shift).min(end);
                // A hole only where the first answer had one too and the
                // line was not dirty.
                while checked.get(next_checked).is_some_and(|r| r.end <= at) {
                    next_checked += 1;
                }
                let was_hole = checked
                    .get(next_checked)
                    .is_some_and(|r| r.start <= at && piece_end <= r.end);
                push(piece_end - at, was_hole && !dirty.contains(&line));
                at = piece_end;
            }
        }
        Ok(out)
    }

    /// Whether the backend of `volume` zeroes a range quicker than by
    /// writing zero buffers (what [`Zeroing::fast_only`] asks).
    pub fn zeroes_fast(&self, volume: &Volume) -> bool {
        self.inner
            .backend_of(volume.state().id)
            .is_ok_and(|backend| backend.zeroes_fast())
    }

    /// Zeroes a part of a line (at most two per call) as an ordinary write.
    fn write_zero_buffer(&self, volume: &Volume, offset: u64, length: u64) -> Result<(), EngineError> {
        let zeroes = vec![0u8; length as usize];
        self.write_with(volume, offset, &zeroes, false)
    }
}

impl Inner {
    /// Checks a request's range against a volume of `size` bytes (every
    /// request's first step).
    pub(super) fn check_request(&self, size: u64, offset: u64, length: u64) -> Result<(), EngineError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(EngineError::Shutdown);
        }
        if length == 0 || offset.checked_add(length).is_none_or(|end| end > size) {
            return Err(EngineError::OutOfRange { offset, length, size });
        }
        if !offset.is_multiple_of(SECTOR_BYTES) || !length.is_multiple_of(SECTOR_BYTES) {
            return Err(EngineError::Unaligned { offset, length });
        }
        Ok(())
    }

    /// Whether the cache holds dirty sectors of `key`, or an op that moves
    /// the line to or from the backend is under way or queued (an evicted
    /// line's write-back: the line is out of the cache, its data not yet
    /// on the backend).
    fn line_is_dirty(&self, key: LineKey) -> bool {
        let state = lock(&self.shards[self.shard_of(key)].state);
        state.queues.is_queued(key) || state.cache.line_state(key).is_some_and(|l| l.dirty_sectors > 0)
    }

    /// Whether no shard has a line ticket taken.
    fn no_line_queued(&self) -> bool {
        self.shards.iter().all(|s| lock(&s.state).queues.is_empty())
    }

    /// The lines wholly inside `offset..end`.
    fn lines_inside(&self, offset: u64, end: u64) -> std::ops::Range<u64> {
        let first = offset.div_ceil(self.line_bytes);
        let last = end / self.line_bytes;
        first..last.max(first)
    }

    /// Drops the lines `drop` of `volume` and tells the backend `how` about
    /// the bytes `offset..end`, chunk by chunk, each chunk holding a ticket
    /// on every line the bytes touch.
    fn drop_range(
        &self,
        volume: VolumeId,
        offset: u64,
        end: u64,
        drop: std::ops::Range<u64>,
        how: PassDown,
    ) -> Result<(), EngineError> {
        if let Some(epochs) = &self.epochs {
            // Ordered write-back: the range goes down after every older
            // epoch, whose dirty lines in it are then clean (not dropped).
            self.wait_durable_before(epochs.current())?;
        }
        let touched = offset / self.line_bytes..end.div_ceil(self.line_bytes);
        let mut chunk_start = touched.start;
        while chunk_start < touched.end {
            let chunk = chunk_start..(chunk_start + CHUNK_LINES).min(touched.end);
            let dropping = chunk.start.max(drop.start)..chunk.end.min(drop.end);
            let bytes = (chunk.start * self.line_bytes).max(offset)..(chunk.end * self.line_bytes).min(end);
            let (plan, dirty_dropped) = self.plan_drop(volume, chunk.clone(), dropping)?;
            if !plan.all_served {
                self.wait_for_tickets(&plan.tickets);
            }
            // The backend first: a barrier that records the dropped slots
            // empty (another client's FLUSH, the commit interval) then
            // flushes the zeroes before it (its backend flush comes first),
            // so no crash finds a slot empty over the backend's old data.
            let passed = self.pass_down(volume, bytes.start, bytes.end - bytes.start, how);
            // The core dropped the lines when it decided: their slots must
            // be emptied in the shadow whatever the backend answered, or a
            // slot's reuse would wait for a record that never changes. A
            // failed zeroing leaves the range's contents unspecified, as
            // any failed write does.
            let mut emptied = Ok(());
            for segment in &plan.segments {
                let mut done = 0;
                emptied = emptied.and(self.execute(segment, &mut Buffer::Write(&[]), &mut done));
            }
            if dirty_dropped {
                // After the shadow has the change, so a barrier that resets
                // the mark cannot miss it.
                self.metadata.changed(|| self.now_ns());
            }
            self.release_tickets(&plan.tickets);
            passed.and(emptied)?;
            chunk_start = chunk.end;
        }
        Ok(())
    }

    /// Under the locks of the shards `lines` fall in (ascending): the core
    /// drops the lines of `dropping`, and a ticket is taken on every line
    /// of `lines` and on each dropped line's slot.
    fn plan_drop(
        &self,
        volume: VolumeId,
        lines: std::ops::Range<u64>,
        dropping: std::ops::Range<u64>,
    ) -> Result<(Plan, bool), EngineError> {
        let key = |line_index| LineKey { volume, line_index };
        let span_of = |line: u64| line / SHARD_SPAN_LINES * SHARD_SPAN_LINES;
        // The spans of the chunk, each with its shard.
        let mut spans: Vec<(u64, usize)> = Vec::new();
        let mut at = span_of(lines.start);
        while at < lines.end {
            spans.push((at, self.shard_of(key(at))));
            at += SHARD_SPAN_LINES;
        }
        let mut order: Vec<usize> = spans.iter().map(|&(_, shard)| shard).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, std::sync::MutexGuard<'_, ShardState>)> =
            order.iter().map(|&i| (i, lock(&self.shards[i].state))).collect();
        let mut plan = Plan::default();
        let mut dirty_dropped = false;
        let mut keys: Vec<(usize, TicketKey)> = Vec::new();
        let mut ops = OpList::new();
        for &(span, shard) in &spans {
            let Some((_, state)) = guards.iter_mut().find(|(i, _)| *i == shard) else {
                unreachable!("every span's shard is locked");
            };
            let from = span.max(lines.start);
            let to = (span + SHARD_SPAN_LINES).min(lines.end);
            keys.extend((from..to).map(|line| (shard, TicketKey::Line(key(line)))));
            let (drop_from, drop_to) = (from.max(dropping.start), to.min(dropping.end));
            if drop_from >= drop_to {
                continue;
            }
            let dropped = state.cache.discard_lines(volume, drop_from, drop_to, &mut ops);
            self.discard_counters
                .dropped_lines
                .fetch_add(dropped.lines, Ordering::Relaxed);
            self.discard_counters
                .dropped_dirty_lines
                .fetch_add(dropped.dirty, Ordering::Relaxed);
            dirty_dropped |= dropped.dirty > 0;
            if ops.ops().is_empty() {
                continue;
            }
            for op in ops.ops() {
                let Op::Invalidate { slot, .. } = *op else {
                    unreachable!("a discard only invalidates");
                };
                keys.push((shard, TicketKey::Slot(slot)));
            }
            match plan.segments.iter_mut().find(|s| s.shard == shard) {
                Some(segment) => segment.ops.extend_from_slice(ops.ops()),
                None => plan.segments.push(PlannedSegment {
                    shard,
                    volume,
                    buffer_offset: 0,
                    generations: SmallVec::new(),
                    request_offset: 0,
                    line_origin: false,
                    ops: SmallVec::from_slice(ops.ops()),
                }),
            }
        }
        keys.sort_unstable();
        keys.dedup();
        plan.tickets.reserve_exact(keys.len());
        for (shard, key) in keys {
            let Some((_, state)) = guards.iter_mut().find(|(i, _)| *i == shard) else {
                unreachable!("every ticket's shard is locked");
            };
            let (ticket, served) = state.take_ticket(key);
            plan.all_served &= served;
            plan.tickets.push((shard, key, ticket));
        }
        Ok((plan, dirty_dropped))
    }

    /// Tells the backend of `volume` `how` about `length` bytes at `offset`.
    fn pass_down(
        &self,
        volume: VolumeId,
        offset: u64,
        length: u64,
        how: PassDown,
    ) -> Result<(), EngineError> {
        if how == PassDown::Nothing || length == 0 {
            return Ok(());
        }
        let backend = self.backend_of(volume)?;
        self.queues
            .backend
            .time(&self.clock, queues::backend_class::WRITE, || match how {
                PassDown::Discard => backend.discard(offset, length),
                PassDown::Zeroes { keep_allocated } => backend.write_zeroes(offset, length, keep_allocated),
                PassDown::Nothing => Ok(()),
            })
            .map_err(|e| self.backend_error(e))
    }
}
