//! The executor: runs a request's plan (its ops on the cache device and the
//! backend) once its tickets are served, joining adjacent ops into one I/O
//! and undoing what a failed op leaves half done.

use super::*;

impl Inner {
    /// Step 3: wait, execute, release.
    pub(super) fn run(&self, plan: &Plan, mut buffer: Buffer<'_>) -> Result<(), EngineError> {
        if !plan.all_served {
            self.wait_for_tickets(&plan.tickets);
        }
        let ahead = self.metadata.dirty_checksums() && self.write_intents_of(plan, &buffer);
        let mut result = Ok(());
        // A miss over several shards' spans: their backend reads, which
        // would run one after another, as one read.
        let mut first_op = 0;
        if let (Buffer::Read(buf), Some(joined)) = (&mut buffer, Self::joined_backend_read(plan)) {
            if let Err(e) = self.read_backend_into(joined, buf) {
                self.abandon(plan, 0, 0);
                self.release_tickets(&plan.tickets);
                self.health.io_errors.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
            first_op = 1;
        }
        for (index, segment) in plan.segments.iter().enumerate() {
            let mut done = first_op;
            if let Err(e) = self.execute(segment, &mut buffer, &mut done) {
                self.abandon(plan, index, done);
                result = Err(e);
                break;
            }
        }
        if ahead {
            for segment in &plan.segments {
                lock(&self.shards[segment.shard].state)
                    .shadow
                    .drop_prewritten(Self::owner_of(segment));
            }
        }
        self.release_tickets(&plan.tickets);
        if result.is_err() {
            self.health.io_errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Runs a read whose ops (some segments' at least) count their buffer
    /// offsets from the start of their first line (a line fill): when the
    /// read is not whole lines, into a buffer widened to whole lines, and
    /// the read's bytes copied out of it.
    pub(super) fn run_line_fill(
        &self,
        plan: &mut Plan,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), EngineError> {
        let line = self.line_bytes;
        let origin = offset & !(line - 1);
        let end = offset + buf.len() as u64;
        if origin == offset && end.is_multiple_of(line) {
            return self.run(plan, Buffer::Read(buf));
        }
        for segment in &mut plan.segments {
            if segment.line_origin {
                segment.request_offset &= !(line - 1);
            }
            segment.buffer_offset = (segment.request_offset - origin) as usize;
        }
        let mut wide = vec![0u8; (end.div_ceil(line) * line - origin) as usize];
        self.run(plan, Buffer::Read(&mut wide))?;
        let at = (offset - origin) as usize;
        buf.copy_from_slice(&wide[at..at + buf.len()]);
        Ok(())
    }

    /// When every segment of `plan` starts with a backend read and those
    /// reads follow one another on the backend and in the buffer (a miss
    /// across shards' spans): the one read that does them all, as (volume,
    /// backend offset, buffer offset, length). Not when any segment writes
    /// an evicted line back: that line may be one a later segment reads,
    /// whose backend read must then wait for the write-back.
    fn joined_backend_read(plan: &Plan) -> Option<(VolumeId, u64, usize, u64)> {
        const JOINED_BYTES_MAX: u64 = 32 << 20;
        if plan.segments.len() < 2
            || plan
                .segments
                .iter()
                .any(|s| s.ops.iter().any(|op| matches!(op, Op::WriteBack { .. })))
        {
            return None;
        }
        let mut joined: Option<(VolumeId, u64, usize, u64)> = None;
        for segment in &plan.segments {
            let Some(&Op::ReadBackend {
                volume,
                offset_bytes,
                length_bytes,
                buffer_offset_bytes,
            }) = segment.ops.first()
            else {
                return None;
            };
            let at = segment.buffer_offset + buffer_offset_bytes as usize;
            joined = match joined {
                None => Some((volume, offset_bytes, at, length_bytes)),
                Some((v, offset, start, length))
                    if v == volume
                        && offset + length == offset_bytes
                        && start + length as usize == at
                        && length + length_bytes <= JOINED_BYTES_MAX =>
                {
                    Some((v, offset, start, length + length_bytes))
                }
                Some(_) => return None,
            };
        }
        joined
    }

    /// Runs one backend read (volume, backend offset, buffer offset,
    /// length) into `buf`.
    fn read_backend_into(
        &self,
        (volume, offset, at, length): (VolumeId, u64, usize, u64),
        buf: &mut [u8],
    ) -> Result<(), EngineError> {
        let backend = self.backend_of(volume)?;
        self.queues
            .backend
            .time(&self.clock, queues::backend_class::READ, || {
                backend.read_at(&mut buf[at..at + length as usize], offset)
            })
            .map_err(|e| self.backend_error(e))
    }

    /// A request failed at op `done` of segment `index`: the cache writes it
    /// did not make leave the slot holding another line's data (`fresh`) or
    /// a stale clean copy, so the core must forget those sectors (if no
    /// later decision changed the slot; they are poisoned either way, and
    /// read from the backend).
    fn abandon(&self, plan: &Plan, index: usize, done: usize) {
        for (i, segment) in plan.segments.iter().enumerate().skip(index) {
            let mut write_no = 0;
            for (o, op) in segment.ops.iter().enumerate() {
                let Op::WriteCache {
                    slot,
                    line_offset_bytes,
                    length_bytes,
                    buffer_offset_bytes,
                    fresh,
                    dirty,
                } = *op
                else {
                    continue;
                };
                let generation = segment.generations[write_no];
                write_no += 1;
                // Not run: a clean copy would now be stale (the backend
                // may have the new data), fresh sectors hold another line's
                // data; dirty sectors the line held keep its older data.
                if (i == index && o < done) || (dirty && !fresh) {
                    continue;
                }
                let key = self.op_key(segment, buffer_offset_bytes, line_offset_bytes);
                let first = line_offset_bytes / SECTOR_BYTES as u32;
                let end = first + length_bytes / SECTOR_BYTES as u32;
                self.forget_or_poison(segment.shard, slot, key, generation, first, end, true);
            }
        }
    }

    /// The line a cache op of `segment` belongs to: the segment's volume,
    /// at the op's buffer position minus its offset in the line.
    pub(super) fn op_key(
        &self,
        segment: &PlannedSegment,
        buffer_offset_bytes: u64,
        line_offset_bytes: u32,
    ) -> LineKey {
        self.key_of(
            segment.volume,
            segment.request_offset + buffer_offset_bytes - u64::from(line_offset_bytes),
        )
    }

    /// Runs one `ReadCache` op of `segment` into the request's buffer `buf`.
    fn read_cache_op(&self, segment: &PlannedSegment, op: &Op, buf: &mut [u8]) -> Result<(), EngineError> {
        let read =
            CacheRead::of(op, segment.buffer_offset).expect("only ReadCache ops are read from the cache");
        let key = self.op_key(segment, read.buffer_offset_bytes, read.line_offset_bytes);
        self.read_cache(
            segment.shard,
            read.slot,
            key,
            read.line_offset_bytes,
            &mut buf[read.buffer_range()],
        )
    }

    /// Runs one segment's ops in list order, from op `done` on (the ops
    /// before it were run for it): the dispatch of each op to its handler.
    /// `done` is how many ops finished (a failure abandons the rest, see
    /// `abandon`).
    pub(super) fn execute(
        &self,
        segment: &PlannedSegment,
        buffer: &mut Buffer<'_>,
        done: &mut usize,
    ) -> Result<(), EngineError> {
        let base = segment.buffer_offset;
        let mut i = *done;
        let mut write_no = 0;
        while i < segment.ops.len() {
            *done = i;
            let run = segment.ops[i..]
                .iter()
                .take_while(|op| matches!(op, Op::ReadCache { .. }))
                .count();
            if run >= 2 && self.shards[segment.shard].poisoned.load(Ordering::Relaxed) == 0 {
                let Buffer::Read(buf) = buffer else {
                    unreachable!("the core reads only for read requests");
                };
                if self.slots.io_engine.is_some() {
                    self.read_cache_run(segment, &segment.ops[i..i + run], buf)?;
                    i += run;
                    continue;
                }
                let span = self.cache_read_span_len(segment, &segment.ops[i..i + run]);
                if span >= 2 {
                    self.read_cache_span(segment, &segment.ops[i..i + span], buf)?;
                    i += span;
                    continue;
                }
            }
            let op = &segment.ops[i];
            i += 1;
            match *op {
                Op::ReadCache { .. } => {
                    let Buffer::Read(buf) = buffer else {
                        unreachable!("the core reads only for read requests");
                    };
                    self.read_cache_op(segment, op, buf)?;
                }
                Op::ReadBackend {
                    volume,
                    offset_bytes,
                    length_bytes,
                    buffer_offset_bytes,
                } => {
                    let Buffer::Read(buf) = buffer else {
                        unreachable!("the core reads only for read requests");
                    };
                    let at = base + buffer_offset_bytes as usize;
                    self.read_backend_into((volume, offset_bytes, at, length_bytes), buf)?;
                }
                Op::WriteCache { .. } => {
                    let run = self.cache_write_run_len(segment, &segment.ops[i - 1..]);
                    if run >= 2 {
                        let generations = &segment.generations[write_no..write_no + run];
                        self.write_cache_run(segment, &segment.ops[i - 1..i - 1 + run], generations, buffer)?;
                        write_no += run;
                        i += run - 1;
                        continue;
                    }
                    let generation = segment.generations[write_no];
                    write_no += 1;
                    self.write_cache_op(segment, op, generation, buffer)?;
                }
                Op::WriteBackend {
                    volume,
                    offset_bytes,
                    length_bytes,
                    buffer_offset_bytes,
                } => {
                    let Buffer::Write(data) = buffer else {
                        unreachable!("the core writes the backend only for write requests");
                    };
                    let at = base + buffer_offset_bytes as usize;
                    let backend = self.backend_of(volume)?;
                    self.queues
                        .backend
                        .time(&self.clock, queues::backend_class::WRITE, || {
                            backend.write_at(&data[at..at + length_bytes as usize], offset_bytes)
                        })
                        .map_err(|e| self.backend_error(e))?;
                }
                Op::WriteBack { .. } => self.write_back_evicted(segment.shard, op)?,
                Op::Invalidate { slot, .. } => {
                    if self.metadata.records_slots() || self.slots.array.is_some() {
                        let mut state = lock(&self.shards[segment.shard].state);
                        state.shadow.note_empty(slot);
                        self.mirror_unneeded(&state, segment.shard, slot);
                    }
                }
            }
        }
        *done = segment.ops.len();
        Ok(())
    }

    /// A run of `ReadCache` ops (a multi-line hit) as one batch on the
    /// I/O engine; if one of the reads failed, redone one by one, each with
    /// its own fall-back.
    fn read_cache_run(
        &self,
        segment: &PlannedSegment,
        ops: &[Op],
        buf: &mut [u8],
    ) -> Result<(), EngineError> {
        if self
            .read_cache_batch(segment.shard, segment.buffer_offset, ops, buf)
            .is_ok()
        {
            return Ok(());
        }
        for op in ops {
            self.read_cache_op(segment, op, buf)?;
        }
        Ok(())
    }

    /// The length of the run of `ReadCache` ops at the start of `ops` whose
    /// ranges follow one another on the cache device and in the buffer (a
    /// sequential hit on consecutive slots), at most 1 MiB: read with one
    /// device read by [`Inner::read_cache_span`] (1: none). Not on a cache
    /// array (its members' offsets differ).
    fn cache_read_span_len(&self, segment: &PlannedSegment, ops: &[Op]) -> usize {
        if self.slots.array.is_some() {
            return 1;
        }
        let place = |op: &Op| {
            CacheRead::of(op, 0).map(|read| {
                (
                    self.cache_offset(segment.shard, read.slot, read.line_offset_bytes),
                    read.buffer_offset_bytes,
                    read.length_bytes as u64,
                    false,
                )
            })
        };
        contiguous_run_len(ops.iter().map(place))
    }

    /// Reads `ops` (see [`Inner::cache_read_span_len`]) with one device
    /// read; if it fails, each op again on its own, with its own fall-back.
    fn read_cache_span(
        &self,
        segment: &PlannedSegment,
        ops: &[Op],
        buf: &mut [u8],
    ) -> Result<(), EngineError> {
        let span = |op: &Op| {
            let read =
                CacheRead::of(op, segment.buffer_offset).expect("only ReadCache ops are read from the cache");
            (
                self.cache_offset(segment.shard, read.slot, read.line_offset_bytes),
                read.buffer_range(),
            )
        };
        let (device_offset, first) = span(&ops[0]);
        let (_, last) = span(&ops[ops.len() - 1]);
        let (from, last_at, last_len) = (first.start, last.start, last.len());
        // A lost device is not read at all: op by op, each reads around it.
        if !self.content_lost() {
            let read = self.queues.cache.time_n(
                &self.clock,
                queues::cache_class::READ_HIT,
                ops.len() as u64,
                || {
                    self.slots
                        .dev
                        .read_at(&mut buf[from..last_at + last_len], device_offset)
                },
            );
            if read.is_ok() && self.cache_read_believable(&buf[from..last_at + last_len]) {
                return Ok(());
            }
        }
        for op in ops {
            self.read_cache_op(segment, op, buf)?;
        }
        Ok(())
    }
}

/// A `ReadCache` op's fields, with where it reads into a request's buffer
/// whose segment starts at `base`.
pub(super) struct CacheRead {
    pub slot: SlotId,
    pub line_offset_bytes: u32,
    pub length_bytes: u32,
    /// Offset in the segment's part of the buffer (as the op says it).
    pub buffer_offset_bytes: u64,
    base: usize,
}

impl CacheRead {
    /// The op's fields, or `None` for any other op.
    pub(super) fn of(op: &Op, base: usize) -> Option<Self> {
        match *op {
            Op::ReadCache {
                slot,
                line_offset_bytes,
                length_bytes,
                buffer_offset_bytes,
            } => Some(CacheRead {
                slot,
                line_offset_bytes,
                length_bytes,
                buffer_offset_bytes,
                base,
            }),
            _ => None,
        }
    }

    /// The bytes of the request's buffer the op fills.
    pub(super) fn buffer_range(&self) -> std::ops::Range<usize> {
        let at = self.base + self.buffer_offset_bytes as usize;
        at..at + self.length_bytes as usize
    }
}
