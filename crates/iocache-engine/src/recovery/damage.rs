//! Damaged record copies: which may hide dirty data, and what is kept of
//! a slot when the damage is accepted.

use super::*;

/// The slots whose corrupt record copies may hide dirty data. A corrupt
/// copy may have been the slot's newest record (damaged after it was
/// written: its valid copy is then older and may describe data the slot no
/// longer holds), so it is harmless only when it cannot have described
/// anything: its header is all zero (no record was written there; a record
/// always has a nonzero tag, kind and line shift), or the last run kept no
/// records at all (`persistence = none` in a superblock whose other copy is
/// sound, so that it is the last run's).
///
/// A torn record write is not told apart from damage. Records of at most
/// 512 bytes lie in one sector and are never torn, so a corrupt one is
/// damage. A 1024-byte record (1 MiB lines) torn by a power loss in the
/// middle of a barrier is corrupt too; it is refused like damage (the
/// conservative choice: the barrier it belonged to had not completed, so
/// accepting it, [`InitMode::LoadAcceptingDamage`], loses nothing that was
/// promised; but the loader cannot know that the damage is not elsewhere).
pub(super) fn damaged_slots(
    loaded: &iocache_format::MetadataLoad,
    superblock: &Superblock,
    superblock_damaged: bool,
) -> Vec<DamagedSlot> {
    if superblock.persistence == Persistence::None && !superblock_damaged {
        return Vec::new();
    }
    // From version 3 on every copy was written at format time: one whose
    // header is zero was zeroed since, and may have been the newest.
    let every_copy_written = superblock.format_version >= FORMAT_VERSION_WRITES_EVERY_RECORD;
    let mut out: Vec<DamagedSlot> = Vec::new();
    for corrupt in &loaded.corrupt {
        if corrupt.guess.is_none() && !every_copy_written {
            continue;
        }
        let problem = format!("copy {}: {}", corrupt.copy, corrupt.reason);
        let probably = corrupt
            .guess
            .as_ref()
            .filter(|g| g.line)
            .map(|guess| ProbableLine::named(superblock, guess.volume, guess.line_index, guess.dirty));
        match out.last_mut() {
            Some(last) if last.slot == corrupt.slot => {
                last.device_offsets.push(corrupt.device_offset);
                last.problem = format!("{}; {problem}", last.problem);
                if last.probably.is_none() {
                    last.probably = probably;
                }
            }
            _ => out.push(DamagedSlot {
                slot: corrupt.slot,
                device_offsets: vec![corrupt.device_offset],
                problem,
                probably,
            }),
        }
    }
    out
}

/// Writes an empty record of sequence 0 (what formatting writes) over the
/// damaged record copies, in the images and on the device
/// (whole sectors, rewritten from the images), and flushes.
pub(super) fn blank_damaged_copies(
    dev: &dyn BlockDevice,
    layout: &Layout,
    images: &mut [Vec<u8>; 2],
    damaged: &[DamagedSlot],
) -> Result<(), EngineError> {
    let record_bytes = layout.record_bytes as usize;
    for d in damaged {
        for &offset in &d.device_offsets {
            let copy = u8::from(offset >= layout.copy_region_offset(1));
            let at = d.slot as usize * record_bytes;
            let mut one = vec![0u8; record_bytes];
            iocache_format::encode_record(
                &iocache_format::Record {
                    sequence: 0,
                    line: None,
                },
                layout,
                &mut one,
            )
            .map_err(format_err)?;
            images[copy as usize][at..at + record_bytes].copy_from_slice(&one);
            let (start, len) = layout.record_write_span(d.slot, copy);
            let from = (start - layout.copy_region_offset(copy)) as usize;
            dev.write_at(&images[copy as usize][from..from + len as usize], start)?;
        }
    }
    dev.flush()?;
    Ok(())
}

/// Whether the slot's data matches the record's hash: a clean record's
/// covers its valid sectors, a dirty record's checksum its dirty sectors. A
/// record without a hash, or data that does not read, does not match.
pub(super) fn data_matches_hash(
    dev: &dyn BlockDevice,
    layout: &Layout,
    slot: u64,
    line: &iocache_format::LineRecord,
    buf: &mut [u8],
) -> bool {
    let Some(hash) = line.data_hash else { return false };
    if dev.read_at(buf, layout.line_offset(slot)).is_err() {
        return false;
    }
    if line.dirty {
        hash == iocache_format::dirty_checksum(buf, &line.dirty_bits)
    } else {
        hash == iocache_format::data_hash_valid(buf, &line.valid)
    }
}
