//! Writing dirty data back to a backend. A flush batch's dirty sectors are
//! sorted by backend address and merged into runs of adjacent sectors, and
//! several runs are in flight at once, so a backend that pays per request
//! (a disk that seeks, a remote volume) pays once per run, not per line.
//! Each piece is read from the cache device and checked exactly as a single
//! line's write-back is; a piece that fails fails only its own line.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use iocache_core::{Op, SlotId, VolumeId, SECTOR_BYTES};
use iocache_device::BlockDevice;

use super::queues::{backend_class, cache_class};
use super::{EngineError, Inner};
use crate::raid::MirrorState;

/// The largest run written back in one backend request.
pub(super) const WRITE_BACK_RUN_BYTES: u64 = 1 << 20;

/// Runs of one batch written back at once (the NBD backend's connection
/// pool is as large; a local file takes them in parallel).
pub(super) const WRITE_BACK_DEPTH: usize = 8;

/// Below this mean write-back latency the backend is fast enough that
/// starting helper threads (tens of µs each) costs more than it saves:
/// the runs are written one after the other.
const PARALLEL_WRITE_BACK_MIN_NS: u64 = 100_000;

/// Dirty sectors of one line to write back: one `WriteBack` op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    /// The flush token (line) it belongs to, as an index into the batch.
    pub(super) token: usize,
    pub(super) shard: usize,
    pub(super) slot: SlotId,
    pub(super) line_offset_bytes: u32,
    pub(super) length_bytes: u32,
    pub(super) volume: VolumeId,
    pub(super) offset_bytes: u64,
}

impl Piece {
    pub(super) fn end_bytes(&self) -> u64 {
        self.offset_bytes + u64::from(self.length_bytes)
    }

    /// The piece a `WriteBack` op writes back (`None` for another op), as
    /// part of line `token` of the batch, in `shard`.
    pub(super) fn of(op: &Op, token: usize, shard: usize) -> Option<Piece> {
        match *op {
            Op::WriteBack {
                slot,
                line_offset_bytes,
                length_bytes,
                volume,
                offset_bytes,
            } => Some(Piece {
                token,
                shard,
                slot,
                line_offset_bytes,
                length_bytes,
                volume,
                offset_bytes,
            }),
            _ => None,
        }
    }

    /// The `WriteBack` op it came from.
    pub(super) fn op(&self) -> Op {
        Op::WriteBack {
            slot: self.slot,
            line_offset_bytes: self.line_offset_bytes,
            length_bytes: self.length_bytes,
            volume: self.volume,
            offset_bytes: self.offset_bytes,
        }
    }
}

/// Sorts `pieces` by volume and backend address and returns the runs they
/// form: ranges of `pieces` on one volume, each spanning at most
/// `max_run_bytes` (a longer piece is a run of its own), where each piece
/// starts where the one before ends or at most `max_gap_bytes` after it.
/// A run with gaps is written whole, its gaps read from the backend first;
/// `may_fill(before, after)` says whether the gap between two pieces may be
/// filled so (the caller can hold the lines in it).
pub(super) fn plan_runs(
    pieces: &mut [Piece],
    max_run_bytes: u64,
    max_gap_bytes: u64,
    may_fill: &mut dyn FnMut(&Piece, &Piece) -> bool,
) -> Vec<Range<usize>> {
    pieces.sort_unstable_by_key(|p| (p.volume, p.offset_bytes));
    let mut runs: Vec<Range<usize>> = Vec::new();
    for i in 0..pieces.len() {
        let piece = pieces[i];
        let joins = runs.last().is_some_and(|run| {
            let first = &pieces[run.start];
            let last = &pieces[run.end - 1];
            last.volume == piece.volume
                && piece.offset_bytes >= last.end_bytes()
                && piece.offset_bytes - last.end_bytes() <= max_gap_bytes
                && piece.end_bytes() - first.offset_bytes <= max_run_bytes
                && (piece.offset_bytes == last.end_bytes() || may_fill(last, &piece))
        });
        if joins {
            runs.last_mut().expect("a run to join").end = i + 1;
        } else {
            runs.push(i..i + 1);
        }
    }
    runs
}

/// The bytes a run spans, from its first piece's start to its last one's end.
pub(super) fn run_span(run: &[Piece]) -> Range<u64> {
    run[0].offset_bytes..run[run.len() - 1].end_bytes()
}

/// What reading a piece found.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// Its data is in the buffer, to be written.
    Ready,
    /// The backend already has it (a cache array's write-through line).
    InBackend,
    /// Not read: a read failed, or the line may not be written back.
    Failed,
}

impl Inner {
    /// Writes back `pieces`, grouped into `runs` (see [`plan_runs`]), with
    /// up to [`WRITE_BACK_DEPTH`] runs in flight, and calls `done` once per
    /// piece with whether it reached the backend. A piece whose `blocked`
    /// entry is set is not read (it fails). Returns when every piece is
    /// done.
    pub(super) fn write_back_runs(
        &self,
        pieces: &[Piece],
        runs: &[Range<usize>],
        blocked: &(dyn Fn(&Piece) -> bool + Sync),
        done: &(dyn Fn(Range<usize>, &[bool]) + Sync),
    ) {
        let workers = if self.backend_is_fast() {
            1
        } else {
            runs.len().min(WRITE_BACK_DEPTH)
        };
        let next = AtomicUsize::new(0);
        let work = || {
            while let Some(r) = runs.get(next.fetch_add(1, Ordering::Relaxed)) {
                let written = self.write_back_run(&pieces[r.clone()], blocked);
                done(r.clone(), &written);
            }
        };
        // This thread is one of the workers; a helper thread that cannot
        // be started leaves its share to the others.
        std::thread::scope(|scope| {
            for _ in 1..workers {
                if std::thread::Builder::new()
                    .name("iocache-writeback".into())
                    .spawn_scoped(scope, work)
                    .is_err()
                {
                    break;
                }
            }
            work();
        });
    }

    /// One run: returns, per piece, whether it reached the backend. A run
    /// with gaps is first read whole from the backend, its pieces laid over
    /// it, and written in one request (a piece that could not be read
    /// leaves the backend's own bytes there, rewritten unchanged). A run
    /// without gaps, or one whose filling failed (the gap could not be read,
    /// or the whole span not written), writes each stretch of adjacent
    /// pieces read well, and a stretch that fails piece by piece: a piece
    /// that fails fails only its own line.
    fn write_back_run(&self, run: &[Piece], blocked: &(dyn Fn(&Piece) -> bool + Sync)) -> Vec<bool> {
        let span = run_span(run);
        let mut data = vec![0u8; (span.end - span.start) as usize];
        let gaps = run.iter().map(|p| u64::from(p.length_bytes)).sum::<u64>() < span.end - span.start;
        let volume = run[0].volume;
        let filled = gaps && self.read_from_backend(volume, span.start, &mut data).is_ok();
        let mut piece_buf = Vec::new();
        let reads: Vec<Read> = run
            .iter()
            .map(|piece| {
                if blocked(piece) {
                    return Read::Failed;
                }
                let at = (piece.offset_bytes - span.start) as usize;
                let into = &mut data[at..at + piece.length_bytes as usize];
                let read = if filled {
                    // Into a buffer of its own, so that a failed read
                    // leaves the backend's bytes in place.
                    piece_buf.resize(into.len(), 0);
                    let read = self.read_for_write_back(
                        piece.shard,
                        piece.slot,
                        piece.line_offset_bytes,
                        &mut piece_buf,
                    );
                    if read.as_ref().is_ok_and(|&ready| ready) {
                        into.copy_from_slice(&piece_buf);
                    }
                    read
                } else {
                    self.read_for_write_back(piece.shard, piece.slot, piece.line_offset_bytes, into)
                };
                match read {
                    Ok(true) => Read::Ready,
                    Ok(false) => Read::InBackend,
                    Err(_) => Read::Failed,
                }
            })
            .collect();
        let mut written: Vec<bool> = reads.iter().map(|&r| r == Read::InBackend).collect();
        if filled && self.write_to_backend(volume, span.start, &data).is_ok() {
            for (w, &r) in written.iter_mut().zip(&reads) {
                *w = r != Read::Failed;
            }
        } else {
            let slice = |from: usize, to: usize| {
                &data[(run[from].offset_bytes - span.start) as usize
                    ..(run[to - 1].end_bytes() - span.start) as usize]
            };
            let mut i = 0;
            while i < run.len() {
                if reads[i] != Read::Ready {
                    i += 1;
                    continue;
                }
                let mut j = i + 1;
                while j < run.len()
                    && reads[j] == Read::Ready
                    && run[j - 1].end_bytes() == run[j].offset_bytes
                {
                    j += 1;
                }
                if self
                    .write_to_backend(volume, run[i].offset_bytes, slice(i, j))
                    .is_ok()
                {
                    written[i..j].fill(true);
                } else if j - i > 1 {
                    for k in i..j {
                        written[k] = self
                            .write_to_backend(volume, run[k].offset_bytes, slice(k, k + 1))
                            .is_ok();
                    }
                }
                i = j;
            }
        }
        for (piece, &ok) in run.iter().zip(&written) {
            if ok {
                self.note_written_back(
                    piece.shard,
                    piece.slot,
                    piece.line_offset_bytes,
                    piece.length_bytes,
                );
            }
        }
        written
    }

    /// Whether the write-backs so far took less than
    /// [`PARALLEL_WRITE_BACK_MIN_NS`] on average (none yet: no).
    fn backend_is_fast(&self) -> bool {
        let snap = self.queues.backend.snapshot();
        let class = backend_class::WRITE_BACK;
        snap.latency_ns[class]
            .checked_div(snap.completed[class])
            .is_some_and(|mean| mean < PARALLEL_WRITE_BACK_MIN_NS)
    }

    /// One piece's write-back, on its own.
    pub(super) fn write_back(&self, piece: &Piece) -> Result<(), EngineError> {
        let mut data = vec![0u8; piece.length_bytes as usize];
        if self.read_for_write_back(piece.shard, piece.slot, piece.line_offset_bytes, &mut data)? {
            self.write_to_backend(piece.volume, piece.offset_bytes, &data)?;
        }
        self.note_written_back(
            piece.shard,
            piece.slot,
            piece.line_offset_bytes,
            piece.length_bytes,
        );
        Ok(())
    }

    /// Reads the dirty data to write back from `line_offset` of `slot` into
    /// `data`, checked against its dirty checksums when they are kept.
    /// Returns false when there is nothing to write: a cache array's line
    /// whose primary failed and whose dirty sectors were written through.
    fn read_for_write_back(
        &self,
        shard: usize,
        slot: SlotId,
        line_offset: u32,
        data: &mut [u8],
    ) -> Result<bool, EngineError> {
        if self.content_lost() {
            return Err(EngineError::Io(format!(
                "write-back of slot {slot}: the cache device lost its content, and the line's data with it"
            )));
        }
        let read = |data: &mut [u8]| {
            self.queues.cache.time(&self.clock, cache_class::EVICTION, || {
                self.slots
                    .dev
                    .read_at(data, self.cache_offset(shard, slot, line_offset))
            })
        };
        if let Some(array) = &self.slots.array {
            let global = self.shards[shard].base_slot + u64::from(slot);
            if array.primary_failed(global) || read(data).is_err() {
                // Dirty sectors: the mirror has them, or the backend already does.
                match array.mirror_state(global) {
                    MirrorState::Mirrored(m) => array.read_mirror(m, u64::from(line_offset), data)?,
                    MirrorState::Through => return Ok(false),
                    MirrorState::None => {
                        return Err(EngineError::Io(format!(
                            "write-back of slot {global}: its cache device failed and it has no mirror"
                        )))
                    }
                }
            }
        } else if let Err(e) = read(data) {
            self.cache_error("read for a write-back", &e);
            return Err(e.into());
        } else if !self.cache_read_believable(data) {
            return Err(EngineError::Io(format!(
                "write-back of slot {slot}: the cache device lost its content, and the line's data with it"
            )));
        }
        if self.metadata.dirty_checksums() {
            self.check_written_back_data(shard, slot, line_offset, data)?;
        }
        Ok(true)
    }

    fn read_from_backend(&self, volume: VolumeId, offset: u64, data: &mut [u8]) -> Result<(), EngineError> {
        self.write_back_io(volume, |backend| backend.read_at(data, offset))
    }

    fn write_to_backend(&self, volume: VolumeId, offset: u64, data: &[u8]) -> Result<(), EngineError> {
        self.write_back_io(volume, |backend| backend.write_at(data, offset))
    }

    /// One backend I/O of a write-back, timed in its queue class.
    fn write_back_io(
        &self,
        volume: VolumeId,
        io: impl FnOnce(&dyn BlockDevice) -> Result<(), iocache_device::DeviceError>,
    ) -> Result<(), EngineError> {
        let backend = self.backend_of(volume)?;
        self.queues
            .backend
            .time(&self.clock, backend_class::WRITE_BACK, || io(&*backend))
            .map_err(|e| self.backend_error(e))
    }

    /// The shadow learns that these sectors of `slot` are in the backend.
    fn note_written_back(&self, shard: usize, slot: SlotId, line_offset: u32, length: u32) {
        let first = line_offset / SECTOR_BYTES as u32;
        self.note_in_shadow(shard, |state| {
            state
                .shadow
                .note_write_back(slot, first, first + length / SECTOR_BYTES as u32)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(token: usize, volume: VolumeId, offset_bytes: u64, length_bytes: u32) -> Piece {
        Piece {
            token,
            shard: 0,
            slot: token as SlotId,
            line_offset_bytes: 0,
            length_bytes,
            volume,
            offset_bytes,
        }
    }

    #[test]
    fn adjacent_pieces_of_one_volume_form_one_run_up_to_its_limit() {
        // Out of order on purpose: 8K, 0, 4K and 16K on volume 1; 12K on
        // volume 2 (adjacent by address, but another volume).
        let mut pieces = vec![
            piece(0, 1, 8192, 4096),
            piece(1, 1, 0, 4096),
            piece(2, 1, 4096, 4096),
            piece(3, 1, 16384, 4096),
            piece(4, 2, 12288, 4096),
        ];
        let runs = plan_runs(&mut pieces, 1 << 20, 0, &mut |_, _| true);
        let offsets: Vec<Vec<(VolumeId, u64)>> = runs
            .iter()
            .map(|r| {
                pieces[r.clone()]
                    .iter()
                    .map(|p| (p.volume, p.offset_bytes))
                    .collect()
            })
            .collect();
        assert_eq!(
            offsets,
            vec![
                vec![(1, 0), (1, 4096), (1, 8192)],
                vec![(1, 16384)],
                vec![(2, 12288)]
            ]
        );
        let runs = plan_runs(&mut pieces, 8192, 0, &mut |_, _| true);
        let lengths: Vec<usize> = runs.iter().map(|r| r.len()).collect();
        assert_eq!(lengths, vec![2, 1, 1, 1]);
    }

    #[test]
    fn runs_cover_every_piece_once_and_join_only_allowed_gaps() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let mut used = std::collections::BTreeSet::new();
            let mut pieces = Vec::new();
            for token in 0..(next() % 64) as usize {
                let line = next() % 128;
                if used.insert(line) {
                    let sectors = 1 + (next() % 8) as u32;
                    pieces.push(piece(token, (next() % 2) as u32, line * 4096, sectors * 512));
                }
            }
            let limit = 4096 * (1 + next() % 4);
            let gap = [0, 512, 4096][(next() % 3) as usize];
            let allow = next() % 2 == 0;
            let runs = plan_runs(&mut pieces, limit, gap, &mut |_, _| allow);
            let covered: usize = runs.iter().map(|r| r.len()).sum();
            assert_eq!(covered, pieces.len());
            for (a, b) in runs.iter().zip(runs.iter().skip(1)) {
                assert_eq!(a.end, b.start);
            }
            for run in &runs {
                let span = run_span(&pieces[run.clone()]);
                assert!(run.len() == 1 || span.end - span.start <= limit);
                for w in pieces[run.clone()].windows(2) {
                    assert_eq!(w[0].volume, w[1].volume);
                    let hole = w[1].offset_bytes - w[0].end_bytes();
                    assert!(hole == 0 || (allow && hole <= gap), "{hole} {gap} {allow}");
                }
            }
            // Maximal: the next run could not have joined the one before.
            for (a, b) in runs.iter().zip(runs.iter().skip(1)) {
                let (last, next) = (pieces[a.end - 1], pieces[b.start]);
                let hole = next.offset_bytes.checked_sub(last.end_bytes());
                let fits = next.end_bytes().saturating_sub(pieces[a.start].offset_bytes) <= limit;
                let joinable =
                    last.volume == next.volume && fits && hole.is_some_and(|h| h == 0 || (allow && h <= gap));
                assert!(!joinable, "{last:?} {next:?}");
            }
        }
    }
}
