//! The lines a crash leaves: a line found in two slots, and clean lines
//! compared with the backend before they are trusted.

use super::*;

/// A crash in the middle of a barrier can leave a line in two slots: the
/// old slot's record still saying dirty, and the slot it was readmitted to.
/// The newer record (larger sequence) wins. The older one's dirty sectors
/// that the newer one does not hold dirty are written back first: they
/// are the latest data of those sectors unless the newer copy came from a
/// fill, which read them from the backend after the old copy was written
/// back (so a clean newer copy needs no write-back).
pub(super) fn resolve_duplicates<'a>(
    dev: &dyn BlockDevice,
    backend_of: &dyn Fn(u32) -> Option<&'a dyn BlockDevice>,
    layout: &Layout,
    mut lines: Vec<RecoveredLine>,
    report: &mut RecoveryReport,
    stale_dirty: &mut Vec<(u64, LineKey)>,
    unloaded: &mut Vec<u64>,
) -> Result<Vec<RecoveredLine>, EngineError> {
    let mut flushed: Vec<u32> = Vec::new();
    lines.sort_by_key(|l| (l.key, std::cmp::Reverse(l.sequence)));
    let mut kept: Vec<RecoveredLine> = Vec::with_capacity(lines.len());
    for line in lines {
        let Some(newer) = kept.last().filter(|k| k.key == line.key) else {
            kept.push(line);
            continue;
        };
        report.duplicate_lines += 1;
        if line.dirty_on_disk && newer.dirty_on_disk {
            let only_older: Vec<u64> = line.dirty.iter().zip(&newer.dirty).map(|(o, n)| o & !n).collect();
            if only_older.iter().any(|&w| w != 0) {
                let record = iocache_format::LineRecord {
                    volume: line.key.volume,
                    line_index: line.key.line_index,
                    dirty: true,
                    data_hash: None,
                    valid: only_older.clone(),
                    dirty_bits: only_older,
                    mirror: None,
                    epoch: None,
                };
                let backend = backend_of(line.key.volume).ok_or_else(|| {
                    EngineError::Refused(format!("no backend for volume id {}", line.key.volume))
                })?;
                write_back_record(dev, backend, layout, line.slot, &record)?;
                report.written_back_lines += 1;
                if !flushed.contains(&line.key.volume) {
                    flushed.push(line.key.volume);
                }
            }
        }
        if line.dirty_on_disk {
            report.dirty_lines -= 1;
            stale_dirty.push((line.slot, line.key));
        } else {
            report.clean_lines -= 1;
            unloaded.push(line.slot);
        }
    }
    for volume in flushed {
        if let Some(backend) = backend_of(volume) {
            backend.flush()?;
        }
    }
    Ok(kept)
}

/// A clean line found after a crash, before it is checked: the position
/// of its volume in the spec, its slot, line, record and record sequence.
pub(super) type CleanCandidate = (usize, u64, LineKey, iocache_format::LineRecord, u64);

/// After a crash, a clean line is loaded only if its data is still the
/// backend's. Its record's hash proves the slot still holds the data the
/// record described, but not that the backend still does: a write-through
/// write, a bypassed or invalidating write, or a write-back of the same
/// line from another slot may have reached the backend after the record
/// was written and before the crash, and the record is rewritten only at
/// the next barrier. Served from the cache, such a line would show the old
/// data until its eviction and the new data after it (found by the crash
/// suite: `tests/crash.rs`, write-through, and by `power_cut.rs` with more
/// iterations; docs/results/durability.md, "Clean lines older than the
/// backend").
///
/// So each line whose data matches its hash is compared, over its valid
/// sectors, with the backend, in backend order; lines that differ are
/// dropped (`stale_clean_lines`), and so are lines left unchecked when
/// `budget` runs out or whose backend does not read
/// (`unchecked_clean_lines`): dropping a clean line loses nothing but a
/// hit. Returns each candidate loaded (`Ok`) or dropped (`Err(slot)`).
pub(super) fn check_clean_lines(
    dev: &dyn BlockDevice,
    backends: &[&dyn BlockDevice],
    volumes: &[(String, u64)],
    layout: &Layout,
    mut candidates: Vec<CleanCandidate>,
    budget: std::time::Duration,
    report: &mut RecoveryReport,
) -> Vec<Result<RecoveredLine, u64>> {
    candidates.sort_unstable_by_key(|&(at, _, key, _, _)| (at, key.line_index));
    let started = std::time::Instant::now();
    let sectors = layout.sectors_per_line();
    let line_bytes = layout.line_bytes as usize;
    let mut cached = vec![0u8; line_bytes];
    let mut backend_data = vec![0u8; line_bytes];
    let mut out = Vec::with_capacity(candidates.len());
    let mut out_of_time = false;
    let mut left_unchecked = 0u64;
    let mut unreadable = 0u64;
    for (at, slot, key, line, sequence) in candidates {
        // A zero budget checks nothing, however coarse the clock.
        out_of_time = out_of_time || budget.is_zero() || started.elapsed() >= budget;
        let start = key.line_index * layout.line_bytes;
        // The volume's last line may be partial: its sectors past the end
        // are never valid.
        let (volume, volume_bytes) = &volumes[at];
        let len = (volume_bytes.saturating_sub(start) as usize).min(line_bytes);
        let kept = !out_of_time
            && data_matches_hash(dev, layout, slot, &line, &mut cached)
            && match backends[at].read_at(&mut backend_data[..len], start) {
                Ok(()) => {
                    let same = same_valid_sectors(&cached[..len], &backend_data[..len], &line.valid, sectors);
                    if !same {
                        report.stale_clean_lines += 1;
                        if report.stale_clean_lines <= LOGGED_EXAMPLES {
                            log::info!(
                                "clean line {} of volume `{volume}` (slot {slot}) is older than the backend \
                                 (a write reached the backend before the crash): dropped",
                                key.line_index,
                            );
                        }
                    }
                    same
                }
                Err(e) => {
                    report.unchecked_clean_lines += 1;
                    unreadable += 1;
                    if unreadable <= LOGGED_EXAMPLES {
                        log::warn!(
                            "clean line {} of volume `{volume}`: the backend does not read ({e}): dropped",
                            key.line_index,
                        );
                    }
                    false
                }
            };
        if out_of_time {
            report.unchecked_clean_lines += 1;
            left_unchecked += 1;
        }
        if !kept {
            report.dropped_clean_lines += 1;
            out.push(Err(slot));
            continue;
        }
        report.clean_lines += 1;
        report.checked_clean_lines += 1;
        out.push(Ok(RecoveredLine::clean(slot, key, line, sequence)));
    }
    if unreadable > LOGGED_EXAMPLES {
        log::warn!("{unreadable} clean lines dropped in all because the backend did not read");
    }
    if left_unchecked > 0 {
        log::warn!(
            "{left_unchecked} clean lines dropped unchecked: comparing them with the backend took longer than {budget:?}"
        );
    }
    out
}

/// Whether `a` and `b` hold the same bytes in every valid sector (of the
/// `sectors` of a line; both may be shorter than a line, and a valid
/// sector past their end differs).
pub(super) fn same_valid_sectors(a: &[u8], b: &[u8], valid: &[u64], sectors: u32) -> bool {
    let mut same = true;
    bitmap::for_each_run(valid, 0, sectors, |start, end, set| {
        if set && same {
            let (from, to) = (start as usize * 512, end as usize * 512);
            same = to <= a.len() && a[from..to] == b[from..to];
        }
    });
    same
}

pub(super) fn write_back_record(
    dev: &dyn BlockDevice,
    backend: &dyn BlockDevice,
    layout: &Layout,
    slot: u64,
    line: &iocache_format::LineRecord,
) -> Result<(), EngineError> {
    write_back_dirty_runs(
        dev,
        layout.line_offset(slot),
        backend,
        line.line_index * layout.line_bytes,
        &line.dirty_bits,
        layout.sectors_per_line(),
    )
}

/// Copies each run of `dirty` sectors of a line from the cache device (the
/// line at `line_at`) to the backend (the line at `backend_at`).
pub(crate) fn write_back_dirty_runs(
    dev: &dyn BlockDevice,
    line_at: u64,
    backend: &dyn BlockDevice,
    backend_at: u64,
    dirty: &[u64],
    sectors: u32,
) -> Result<(), EngineError> {
    let mut runs = Vec::new();
    bitmap::for_each_run(dirty, 0, sectors, |start, end, set| {
        if set {
            runs.push((u64::from(start) * 512, u64::from(end - start) * 512));
        }
    });
    for (offset, length) in runs {
        let at = backend_at + offset;
        if at + length > backend.len_bytes() {
            return Err(EngineError::Refused(format!(
                "a dirty line at backend offset {at} lies beyond the backend's {} bytes",
                backend.len_bytes()
            )));
        }
        let mut data = vec![0u8; length as usize];
        dev.read_at(&mut data, line_at + offset)?;
        backend.write_at(&data, at)?;
    }
    Ok(())
}
