//! Dirty data checked against its record's checksum and the intents tied
//! to it (docs/format.md, "Dirty checksums" and "Intents").

use super::*;

/// What checking the dirty lines' checksums found.
pub(super) struct ChecksumCheck {
    /// Dirty lines whose data matched their checksum.
    pub(super) verified: u64,
    /// Of those, lines whose record had intents tied to it.
    pub(super) with_intents: u64,
    /// Per verified slot, each sector's checksum term as read.
    pub(super) terms: HashMap<u64, Vec<u64>>,
    /// Of those, lines whose primary copy did not match (or did not read)
    /// and whose mirror did: the primary was rewritten from the mirror.
    pub(super) repaired_from_mirror: u64,
    /// Slots whose dirty data matches neither copy.
    pub(super) damaged: Vec<DamagedSlot>,
    /// Lines whose copies do not read (a failed array member): not verified.
    pub(super) unreadable: u64,
}

/// The intents of the intent log tied to the records loaded: per slot,
/// those naming the sequence of the slot's current record, in log order.
/// Others (tied to records since replaced, torn, or of an earlier cache)
/// are ignored.
pub(super) fn read_intents(
    dev: &dyn BlockDevice,
    layout: &Layout,
    loaded: &iocache_format::MetadataLoad,
) -> Result<HashMap<u64, Vec<Intent>>, EngineError> {
    let mut out: HashMap<u64, Vec<Intent>> = HashMap::new();
    if !layout.has_intents() {
        return Ok(out);
    }
    let mut log = vec![0u8; layout.intent_bytes as usize];
    dev.read_at(&mut log, layout.intent_offset())?;
    let scan = iocache_format::scan_intents(&log, layout);
    if scan.intents.is_empty() {
        return Ok(out);
    }
    let current: HashMap<u64, u64> = loaded
        .lines
        .iter()
        .filter(|(_, r)| r.line.as_ref().is_some_and(|l| l.dirty && l.data_hash.is_some()))
        .map(|(slot, r)| (*slot, r.sequence))
        .collect();
    for intent in scan.intents {
        if current.get(&intent.slot) == Some(&intent.sequence) {
            out.entry(intent.slot).or_default().push(intent);
        }
    }
    Ok(out)
}

/// Reads every dirty line whose record carries a checksum and checks its
/// dirty sectors (docs/format.md, "Dirty checksums"). On a cache array a
/// line whose primary copy fails the check is checked in its mirror, and
/// repaired from it when that matches. A mismatch makes the slot damaged:
/// the start is refused, or with damage accepted the line is dropped.
pub(super) fn verify_dirty_checksums(
    dev: &dyn BlockDevice,
    array: Option<&CacheArray>,
    layout: &Layout,
    superblock: &Superblock,
    loaded: &iocache_format::MetadataLoad,
    intents: &HashMap<u64, Vec<Intent>>,
) -> Result<ChecksumCheck, EngineError> {
    let mut check = ChecksumCheck {
        verified: 0,
        with_intents: 0,
        terms: HashMap::new(),
        repaired_from_mirror: 0,
        damaged: Vec::new(),
        unreadable: 0,
    };
    let mut buf = vec![0u8; layout.line_bytes as usize];
    let mut terms = vec![0u64; layout.sectors_per_line() as usize];
    let no_intents = Vec::new();
    for (slot, record) in &loaded.lines {
        let Some(line) = &record.line else { continue };
        let (true, Some(sum)) = (line.dirty, line.data_hash) else {
            continue;
        };
        let tied: Vec<&Intent> = intents.get(slot).unwrap_or(&no_intents).iter().collect();
        // The line's data as read agrees with its record and intents; its
        // terms are kept for the engine.
        let mut matches = |data: &[u8], check: &mut ChecksumCheck| {
            iocache_format::sector_checksums_into(0, data, &mut terms);
            if !iocache_format::dirty_terms_match(&terms, &line.dirty_bits, sum, &tied) {
                return false;
            }
            check.terms.insert(*slot, terms.clone());
            if !tied.is_empty() {
                check.with_intents += 1;
            }
            true
        };
        // A copy that does not read (a failed array member) proves nothing:
        // the engine reads the other copy, or the line is not served from
        // the cache. Only a copy that reads and does not match is damage.
        let primary = match dev.read_at(&mut buf, layout.line_offset(*slot)) {
            Ok(()) if matches(&buf, &mut check) => {
                check.verified += 1;
                if let (false, Some(array), Some(mirror)) = (tied.is_empty(), array, line.mirror) {
                    // A write in flight at the crash may have reached one
                    // copy only: the mirror takes the primary's dirty data.
                    if let Err(e) = copy_dirty_runs_to_mirror(array, mirror, layout, &line.dirty_bits, &buf) {
                        log::warn!(
                            "dirty line {} in slot {slot}: its mirror could not be brought in step: {e}",
                            line.line_index
                        );
                    }
                }
                continue;
            }
            Ok(()) => Some("its data does not match the checksum its record carries".to_string()),
            Err(e) => {
                check.unreadable += 1;
                if check.unreadable <= LOGGED_EXAMPLES {
                    log::warn!(
                        "dirty line {} in slot {slot}: its data does not read ({e}); not verified",
                        line.line_index
                    );
                }
                None
            }
        };
        let mirror = match (array, line.mirror) {
            (Some(array), Some(mirror)) => match array.read_mirror(mirror, 0, &mut buf) {
                Ok(()) => Some(matches(&buf, &mut check)),
                Err(_) => None,
            },
            _ => None,
        };
        match (&primary, mirror) {
            (_, Some(true)) => {
                // The mirror holds the dirty sectors: put them back in place
                // when the primary copy reads but is wrong.
                if let Some(why) = &primary {
                    let repaired = match write_dirty_runs(dev, layout, *slot, &line.dirty_bits, &buf) {
                        Ok(()) => "was copied back".to_string(),
                        Err(e) => format!("is used (copying it back failed: {e})"),
                    };
                    check.repaired_from_mirror += 1;
                    if check.repaired_from_mirror <= LOGGED_EXAMPLES {
                        log::warn!(
                            "dirty line {} of volume id {} in slot {slot}: {why}; its mirror matches and {repaired}",
                            line.line_index,
                            line.volume
                        );
                    }
                }
                check.verified += 1;
                continue;
            }
            (None, None) => continue,
            _ => {}
        }
        let primary = primary.unwrap_or_else(|| "its data does not read".to_string());
        let problem = if mirror == Some(false) {
            format!("{primary}; its mirror does not match either")
        } else {
            primary
        };
        check.damaged.push(DamagedSlot {
            slot: *slot,
            // Both copies: with the damage accepted, an older copy must not
            // come back as the slot's record.
            device_offsets: vec![layout.record_offset(*slot, 0), layout.record_offset(*slot, 1)],
            problem: format!("dirty line: {problem}"),
            probably: Some(ProbableLine::named(
                superblock,
                line.volume,
                line.line_index,
                true,
            )),
        });
    }
    if check.unreadable > LOGGED_EXAMPLES || check.repaired_from_mirror > LOGGED_EXAMPLES {
        log::warn!(
            "dirty checksums at start-up: {} lines not verified (their data does not read), {} repaired from \
             their mirror",
            check.unreadable,
            check.repaired_from_mirror
        );
    }
    Ok(check)
}

/// Writes the runs of `dirty` sectors of `line` (a whole line's bytes) to
/// mirror slot `mirror` of `array` (made durable by the next cache flush).
pub(super) fn copy_dirty_runs_to_mirror(
    array: &CacheArray,
    mirror: u32,
    layout: &Layout,
    dirty: &[u64],
    line: &[u8],
) -> Result<(), EngineError> {
    each_dirty_run(layout, dirty, |a, b| {
        array.write_mirror(mirror, a as u64, &line[a..b])?;
        Ok(())
    })
}

/// Calls `write` with the byte range `a..b` of each run of `dirty`
/// sectors of a line, in order, until one fails.
fn each_dirty_run(
    layout: &Layout,
    dirty: &[u64],
    mut write: impl FnMut(usize, usize) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    let mut result = Ok(());
    bitmap::for_each_run(dirty, 0, layout.sectors_per_line(), |first, end, set| {
        if set && result.is_ok() {
            result = write(first as usize * SECTOR_BYTES, end as usize * SECTOR_BYTES);
        }
    });
    result
}

/// Writes the runs of `dirty` sectors of `line` (a whole line's bytes) to
/// `slot`, and flushes.
pub(super) fn write_dirty_runs(
    dev: &dyn BlockDevice,
    layout: &Layout,
    slot: u64,
    dirty: &[u64],
    line: &[u8],
) -> Result<(), EngineError> {
    each_dirty_run(layout, dirty, |a, b| {
        dev.write_at(&line[a..b], layout.line_offset(slot) + a as u64)?;
        Ok(())
    })?;
    dev.flush()?;
    Ok(())
}
