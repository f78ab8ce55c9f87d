//! The cache device as a whole: its superblocks, formatting a fresh
//! cache, and telling a blank device from a zeroed or shrunken one.

use super::*;

pub(super) fn random_uuid() -> [u8; 16] {
    // Not cryptographic: tells caches apart. Time, address-space layout and
    // the process id give enough entropy for that.
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// Writes zeros over `[offset, offset + len)`.
pub(super) fn zero(dev: &dyn BlockDevice, offset: u64, len: u64) -> Result<(), EngineError> {
    let chunk = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(chunk.len() as u64) as usize;
        dev.write_at(&chunk[..n], offset + at)?;
        at += n as u64;
    }
    Ok(())
}

/// Writes `superblock` into `copy` and flushes.
pub fn write_superblock(dev: &dyn BlockDevice, superblock: &Superblock, copy: u8) -> Result<(), EngineError> {
    let bytes = superblock.encode().map_err(format_err)?;
    dev.write_at(&bytes, SUPERBLOCK_OFFSETS[copy as usize])?;
    dev.flush()?;
    Ok(())
}

/// The id of each volume the configuration serves: the id its name has in
/// the device's volume table, or a new one (the smallest the table does not
/// use). Names are the identity of volumes: lines recorded under another
/// name are never handed to a volume (a renamed export with dirty lines is
/// refused by [`open`], naming the old name).
pub fn assign_ids(table: &[VolumeEntry], wanted: &[(String, u64)]) -> Vec<u32> {
    let mut taken: Vec<u32> = table.iter().map(|v| v.id).collect();
    let mut ids = Vec::with_capacity(wanted.len());
    for (name, _) in wanted {
        let id = match table.iter().find(|v| &v.name == name) {
            Some(v) => v.id,
            None => {
                let id = (0..).find(|id| !taken.contains(id)).unwrap_or(u32::MAX);
                taken.push(id);
                id
            }
        };
        ids.push(id);
    }
    ids
}

/// The volume table entries of the configured volumes.
pub(super) fn entries(spec: &OpenSpec, ids: &[u32], backends: &[&dyn BlockDevice]) -> Vec<VolumeEntry> {
    spec.volumes
        .iter()
        .zip(ids)
        .zip(backends)
        .map(|(((name, size_bytes), &id), backend)| VolumeEntry {
            id,
            name: name.clone(),
            size_bytes: *size_bytes,
            identity: backend_identity(*backend),
        })
        .collect()
}

/// Formats the device for `spec`. `replaced`: the layout of the cache it
/// held, whose dirty lines were written back or given up; its records are
/// written empty first, so a crash in the middle of the format finds no
/// line record behind blank superblocks (which would refuse the start).
pub(super) fn format_fresh(
    dev: &dyn BlockDevice,
    backends: &[&dyn BlockDevice],
    spec: &OpenSpec,
    report: RecoveryReport,
    replaced: Option<&Layout>,
) -> Result<Opened, EngineError> {
    let volume_ids: Vec<u32> = (0..spec.volumes.len() as u32).collect();
    let layout = fit_slots(spec.line_bytes, spec.slots, dev.len_bytes()).map_err(|e| match e {
        LayoutError::Format(e) => format_err(e),
        LayoutError::DoesNotFit {
            needed_bytes,
            device_bytes,
            ..
        } => EngineError::CacheDeviceTooSmall {
            device_bytes,
            cache_bytes: needed_bytes,
        },
    })?;
    if let Some(old) = replaced {
        blank_records(dev, old)?;
    }
    // The old cache goes first (whatever it held that mattered was written
    // back, or its loss acknowledged): a crash from here on finds blank
    // superblocks, which format again unless line records follow them
    // (none of a `replaced` cache: they were written empty above).
    zero(dev, SUPERBLOCK_OFFSETS[0], 2 * SUPERBLOCK_BYTES as u64)?;
    dev.flush()?;
    // Old records from whatever the device held before must not be read as
    // this cache's: every slot of both regions starts with an empty record
    // (never all zeroes, so that zeroed records are seen as damage).
    let empty = blank_records(dev, &layout)?;
    // Intents of an earlier cache must not be tied to this one's records
    // (sequences start again).
    zero(dev, layout.intent_offset(), layout.intent_bytes)?;
    let superblock = Superblock {
        format_version: FORMAT_VERSION,
        sequence: 1,
        cache_uuid: random_uuid(),
        layout,
        shards: spec.shards,
        persistence: spec.persistence,
        state: ShutdownState::Running,
        volumes: entries(spec, &volume_ids, backends),
        settings: spec.settings.encode(),
    };
    // The records are durable before the superblock that says they exist.
    dev.flush()?;
    write_superblock(dev, &superblock, 0)?;
    let writer = RecordWriter::new(
        layout,
        [empty.clone(), empty],
        vec![
            SlotDisk {
                sequence: 0,
                newest_copy: Some(0),
            };
            layout.slots as usize
        ],
    );
    Ok(Opened {
        volume_ids,
        unloaded_slots: Vec::new(),
        superblock,
        superblock_copy: 0,
        writer,
        lines: Vec::new(),
        stale_dirty: Vec::new(),
        report,
        previous_settings: iocache_format::SettingsRecord::default(),
    })
}

/// Reads both superblock copies of `dev` and picks the current one.
pub(crate) fn read_superblocks(
    dev: &dyn BlockDevice,
) -> Result<Result<SuperblockFound, iocache_format::FormatError>, EngineError> {
    let mut head = vec![0u8; 2 * SUPERBLOCK_BYTES];
    dev.read_at(&mut head, 0)?;
    Ok(pick_superblock(
        &head[..SUPERBLOCK_BYTES],
        &head[SUPERBLOCK_BYTES..],
    ))
}

/// How far past the superblocks [`records_follow`] looks.
pub(super) const RECORD_SCAN_BYTES: u64 = 64 << 20;

/// Whether the metadata area after blank superblocks holds records of
/// lines (their tag and the line kind at a record boundary, in the first
/// 64 MiB): the superblocks of a cache were zeroed, and it may hold dirty
/// lines. Empty records alone (a format interrupted after the records
/// were written) describe nothing and do not count.
pub(super) fn records_follow(dev: &dyn BlockDevice) -> Result<bool, EngineError> {
    let start = iocache_format::METADATA_OFFSET;
    let len = dev.len_bytes().saturating_sub(start).min(RECORD_SCAN_BYTES);
    let step = iocache_format::RECORD_BYTES_MIN as usize;
    let mut buf = vec![0u8; (1 << 20).min(len as usize)];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        dev.read_at(&mut buf[..n], start + at)?;
        if buf[..n].chunks_exact(step).any(|record| {
            record.starts_with(&iocache_format::RECORD_TAG) && record[4] == iocache_format::RECORD_KIND_LINE
        }) {
            return Ok(true);
        }
        at += n as u64;
    }
    Ok(false)
}

/// The refusal of a device smaller than the cache it holds.
pub(super) fn shrunk_device(dev: &dyn BlockDevice, layout: &Layout) -> EngineError {
    unless_formatted(format!(
        "the cache device {} holds a cache of {} lines of {} B needing {} bytes, but has only {} bytes: it \
         was truncated, or is another, smaller device. What it held past byte {} is gone, and growing it \
         again would make that read as zeroes, so do not; find the original device. If it is gone for good, \
         the dirty lines it held are lost",
        dev.name(),
        layout.slots,
        layout.line_bytes,
        layout.device_bytes(),
        dev.len_bytes(),
        dev.len_bytes()
    ))
}

/// Refuses a device that holds a cache larger than the device (a cache
/// file truncated, or another device under its name); `Ok` for a blank
/// device or one whose cache fits. For callers that size a cache from the
/// device before opening it.
pub fn check_not_shrunk(dev: &dyn BlockDevice) -> Result<(), EngineError> {
    if dev.len_bytes() < 2 * SUPERBLOCK_BYTES as u64 {
        return Ok(());
    }
    match read_superblocks(dev)? {
        Ok(SuperblockFound::Found { superblock, .. })
            if dev.len_bytes() < superblock.layout.device_bytes() =>
        {
            Err(shrunk_device(dev, &superblock.layout))
        }
        _ => Ok(()),
    }
}

/// Whether `dev` holds no cache: too small for the superblocks, or neither
/// copy carries the magic and no record follows them (a damaged or zeroed
/// superblock is not blank: [`open`] refuses it).
pub fn is_blank(dev: &dyn BlockDevice) -> Result<bool, EngineError> {
    if dev.len_bytes() < 2 * SUPERBLOCK_BYTES as u64 {
        return Ok(true);
    }
    Ok(matches!(read_superblocks(dev)?, Ok(SuperblockFound::Blank)) && !records_follow(dev)?)
}

/// Writes an empty record over every record of both copy regions of
/// `layout`, and flushes: the device then reads as an empty cache of that
/// geometry. Returns the region written.
fn blank_records(dev: &dyn BlockDevice, layout: &Layout) -> Result<Vec<u8>, EngineError> {
    let empty = iocache_format::empty_region(layout).map_err(format_err)?;
    for copy in 0..2u8 {
        dev.write_at(&empty, layout.copy_region_offset(copy))?;
    }
    dev.flush()?;
    Ok(empty)
}
