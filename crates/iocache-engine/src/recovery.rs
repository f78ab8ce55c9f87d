//! Opening a cache device: formatting a blank one, or loading the cache it
//! holds (superblock, then every slot's newest valid record) and deciding
//! which lines can be trusted. See docs/format.md for the format and
//! `persist.rs` for the rules that make the records trustworthy.

use iocache_core::bitmap;
use iocache_core::LineKey;
use iocache_device::BlockDevice;
use iocache_device::IdentityKind;
use std::collections::HashMap;

use iocache_format::{
    data_hash, load_metadata, pick_superblock, Intent, Layout, Persistence, ShutdownState, SlotDisk,
    Superblock, SuperblockFound, VolumeEntry, VolumeIdentity, FORMAT_VERSION, FORMAT_VERSION_INTENTS,
    FORMAT_VERSION_WRITES_EVERY_RECORD, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS,
};

use crate::layout::{fit_slots, LayoutError};
use crate::persist::RecordWriter;
use crate::raid::CacheArray;
use crate::EngineError;

/// Whether an existing cache is loaded or replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitMode {
    /// Load the cache the device holds (format it if blank). A device whose
    /// cache cannot be used as configured is refused with the reason.
    #[default]
    Load,
    /// Format the device even if it holds a cache. Refused when that cache
    /// holds dirty lines (or cannot be read, or its metadata is damaged
    /// where dirty lines may be), unless `discard_dirty`.
    Format { discard_dirty: bool },
    /// Like `Load`, but start even when the metadata is damaged where it may
    /// describe dirty lines (which `Load` refuses with
    /// [`EngineError::DamagedMetadata`]): the operator accepts losing
    /// whatever the damaged records described. Only what can be verified is
    /// loaded from the damaged slots, the damage is reported
    /// ([`RecoveryReport::damaged_slots`]) and the damaged copies are
    /// blanked, so the next start does not refuse again.
    LoadAcceptingDamage,
}

/// What an operator can acknowledge to get past a refused start: the
/// engine says what it would cost; a front end names its own way of
/// saying so (a flag, a config key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acknowledgement {
    /// Format the cache device anew, losing what it holds, dirty lines
    /// included ([`InitMode::Format`] with `discard_dirty`).
    FormatLosingData,
    /// Start over damaged metadata with what can be verified
    /// ([`InitMode::LoadAcceptingDamage`]).
    AcceptDamage,
    /// Bind volumes to the backends given ([`OpenSpec::rebind`]).
    Rebind,
}

impl std::fmt::Display for Acknowledgement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Acknowledgement::FormatLosingData => {
                "formatting the cache device anew, which loses what it holds, needs the acknowledgement"
            }
            Acknowledgement::AcceptDamage => {
                "starting with what can be verified, which loses what the damaged records described, needs the \
                 acknowledgement of damaged metadata"
            }
            Acknowledgement::Rebind => {
                "binding the volume to the backend given, which writes its dirty lines there and drops its clean \
                 lines, needs the acknowledgement"
            }
        })
    }
}

impl EngineError {
    /// The acknowledgement that would get past this refusal, if one would.
    pub fn acknowledgement(&self) -> Option<Acknowledgement> {
        match self {
            EngineError::Unacknowledged { acknowledgement, .. } => Some(*acknowledgement),
            EngineError::DamagedMetadata(_) => Some(Acknowledgement::AcceptDamage),
            EngineError::BackendMismatch(_) => Some(Acknowledgement::Rebind),
            _ => None,
        }
    }
}

/// A refusal that formatting anew (losing data) would get past.
fn unless_formatted(reason: String) -> EngineError {
    EngineError::Unacknowledged {
        reason,
        acknowledgement: Acknowledgement::FormatLosingData,
    }
}

/// What a damaged record copy probably described (its fields read without
/// checks: a guess, for the operator).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbableLine {
    pub volume: u32,
    /// The volume's name in the superblock's table, if the id is there.
    pub volume_name: Option<String>,
    pub line_index: u64,
    pub dirty: bool,
}

/// A slot whose metadata cannot be trusted: a corrupt record copy that may
/// have been its newest record (and may have described dirty data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedSlot {
    pub slot: u64,
    /// Device offsets of the damaged record copies.
    pub device_offsets: Vec<u64>,
    /// Why each is not valid.
    pub problem: String,
    /// What the damaged copies probably described (the first that seems to
    /// describe a line), when their fields say anything.
    pub probably: Option<ProbableLine>,
}

impl std::fmt::Display for DamagedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let offsets: Vec<String> = self.device_offsets.iter().map(u64::to_string).collect();
        write!(
            f,
            "slot {} (record at device offset {}: {})",
            self.slot,
            offsets.join(" and "),
            self.problem
        )?;
        if let Some(p) = &self.probably {
            let volume = match &p.volume_name {
                Some(name) => format!("volume `{name}` (id {})", p.volume),
                None => format!("volume id {}", p.volume),
            };
            write!(
                f,
                ", probably {} line {} of {volume}",
                if p.dirty { "dirty" } else { "clean" },
                p.line_index
            )?;
        }
        Ok(())
    }
}

/// The start was refused: records that may describe dirty lines are damaged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the cache device's metadata is damaged where it may describe dirty data: {}{}; \
     the data those records vouched for cannot be verified and is not served; starting with what can be \
     verified, losing what they described, needs the acknowledgement of damaged metadata",
    .slots.iter().take(8).map(ToString::to_string).collect::<Vec<_>>().join("; "),
    if .slots.len() > 8 { format!("; and {} more slots", .slots.len() - 8) } else { String::new() }
)]
pub struct DamagedMetadata {
    pub slots: Vec<DamagedSlot>,
}

/// What the engine wants the device to be.
pub struct OpenSpec {
    pub line_bytes: u64,
    pub slots: u64,
    pub shards: u32,
    pub persistence: Persistence,
    pub init: InitMode,
    /// The volumes to serve: name and size in bytes, in the order of the
    /// backends passed to [`open`].
    pub volumes: Vec<(String, u64)>,
    pub settings: String,
    /// After a crash, how long comparing clean lines with the backend may
    /// take; the lines left are dropped ([`RecoveryReport::unchecked_clean_lines`]).
    pub clean_check_budget: std::time::Duration,
    /// The operator acknowledges that a backend whose identity differs
    /// from the one the cache recorded is that volume's (restored from a
    /// copy, say): its dirty lines are kept (to be written to it), its
    /// clean lines dropped, and the new identity recorded. Without dirty
    /// lines no acknowledgement is needed: the clean lines are dropped.
    pub rebind: bool,
}

/// The start was refused: a configured backend is not the one the cache
/// holds the volume's dirty lines for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "volume `{volume}`: the cache device holds {dirty_lines} dirty and {clean_lines} clean lines of the backend \
     it was bound to ({recorded}), but the backend given, {backend}, is another one ({given}); none of those lines \
     is served or written back. Serve the backend the cache was bound to; if {backend} is that backend restored \
     from a copy, binding the volume to it (its dirty lines are then written to it, its clean lines dropped) \
     needs the acknowledgement"
)]
pub struct BackendMismatch {
    pub volume: String,
    /// The backend given (its name: a path or URI).
    pub backend: String,
    /// The identity recorded on the cache device.
    pub recorded: String,
    /// The identity of the backend given.
    pub given: String,
    pub dirty_lines: u64,
    pub clean_lines: u64,
}

/// A line found on the device that the engine should load.
pub struct RecoveredLine {
    pub slot: u64,
    pub key: LineKey,
    pub valid: Vec<u64>,
    pub dirty: Vec<u64>,
    pub hash: Option<u64>,
    /// Whether the record that vouches for it says dirty.
    pub dirty_on_disk: bool,
    /// The record's sequence (device-wide: larger is newer).
    pub sequence: u64,
    /// The mirror slot of a dirty line on a cache array.
    pub mirror: Option<u32>,
    /// A verified dirty line's checksum term of each sector as read (one
    /// per sector of the line; those of dirty sectors count).
    pub terms: Option<Vec<u64>>,
    /// Its record verified only with intents: the first barrier writes it
    /// again, so that the intent log can be reused.
    pub rewrite_record: bool,
}

impl RecoveredLine {
    /// A clean line loaded from `slot`, as its record (of `sequence`) says.
    fn clean(slot: u64, key: LineKey, line: iocache_format::LineRecord, sequence: u64) -> RecoveredLine {
        RecoveredLine {
            slot,
            key,
            valid: line.valid,
            dirty: line.dirty_bits,
            hash: line.data_hash,
            dirty_on_disk: false,
            sequence,
            mirror: None,
            terms: None,
            rewrite_record: false,
        }
    }
}

/// What opening found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The device held a cache (rather than being blank or formatted now).
    pub loaded: bool,
    /// It had been shut down cleanly.
    pub clean_shutdown: bool,
    pub dirty_lines: u64,
    pub clean_lines: u64,
    /// Clean lines not loaded: without a hash after a crash, whose data no
    /// longer matches its hash, older than the backend, unchecked, or not
    /// kept by the persistence mode.
    pub dropped_clean_lines: u64,
    /// After a crash: clean lines whose data matched the backend's (and
    /// their hash). A later step may still drop some (an older copy of a
    /// line found twice, a slot the engine cannot restore), so this may
    /// exceed what `clean_lines` ends at.
    pub checked_clean_lines: u64,
    /// After a crash: clean lines whose data matched their hash but not
    /// the backend, which a write had reached before the crash (dropped).
    pub stale_clean_lines: u64,
    /// After a crash: clean lines dropped without being compared with the
    /// backend: the check's time budget ran out (every line left then
    /// counts, whatever its hash), or the backend did not read. The budget
    /// is looked at between lines, so one backend read that hangs holds
    /// the start.
    pub unchecked_clean_lines: u64,
    pub corrupt_copies: u64,
    pub corrupt_examples: Vec<(u64, String)>,
    /// Dirty lines whose data was checked against their record's checksum
    /// and matched (lines recorded without one, by an older build or while
    /// a write was in flight, are not counted).
    pub verified_dirty_lines: u64,
    /// Of those, lines on a cache array whose primary copy failed the check
    /// and was rewritten from its mirror, which passed.
    pub repaired_from_mirror: u64,
    /// Of those, lines whose record has intents tied to it (writes that were
    /// to land on checksummed dirty sectors before the next barrier): each
    /// sector held its old data or what an intent names.
    pub verified_with_intents: u64,
    /// Dirty lines written straight back to the backend at start-up: those
    /// of an earlier geometry, and older copies of a line that a crash left
    /// in two slots.
    pub written_back_lines: u64,
    /// Lines found in two slots (the older record is dropped).
    pub duplicate_lines: u64,
    /// Knobs changed at run time before, brought back (`KEY=VALUE`).
    pub restored_settings: Vec<String>,
    /// Run-time changes not brought back, and why (the configuration
    /// changed since).
    pub dropped_settings: Vec<String>,
    /// A superblock copy is damaged (not valid, not blank): why. The cache
    /// is then treated as not shut down cleanly, whatever the valid copy says.
    pub damaged_superblock: Option<String>,
    /// Slots whose records are damaged where they may have described dirty
    /// data, started over with [`InitMode::LoadAcceptingDamage`] (without
    /// it, the start is refused with [`EngineError::DamagedMetadata`]).
    pub damaged_slots: Vec<DamagedSlot>,
    /// The cache had another geometry (line size, lines or shards): its
    /// dirty lines were written back and it was formatted anew. Says what
    /// it was and what it is now (e.g. `16384 lines of 4096 B in 4 shards`).
    pub geometry_changed: Option<(String, String)>,
    /// Volumes whose backend identity was recorded at this start (new
    /// volumes, and volumes of a cache that recorded none), and volumes
    /// bound anew to a backend whose identity differs (the acknowledged
    /// rebinding, or a volume that held no line): name and what happened.
    pub identity_changes: Vec<String>,
    /// The device was written in an older format version and upgraded.
    pub upgraded_from_version: Option<u32>,
}

pub struct Opened {
    /// The id of each volume of [`OpenSpec::volumes`] (see [`assign_ids`]).
    pub volume_ids: Vec<u32>,
    /// Slots whose record describes a clean line that is not loaded: their
    /// records should be blanked before a volume that could claim them is
    /// attached.
    pub unloaded_slots: Vec<u64>,
    pub superblock: Superblock,
    /// Which superblock copy holds `superblock`.
    pub superblock_copy: u8,
    pub writer: RecordWriter,
    pub lines: Vec<RecoveredLine>,
    /// Slots whose record says dirty but whose line is not loaded (an older
    /// copy of a line found twice): they must be rewritten before reuse.
    pub stale_dirty: Vec<(u64, LineKey)>,
    pub report: RecoveryReport,
    /// The settings text the superblock held before this start (empty for
    /// a new cache): run-time changes of knobs are recorded there.
    pub previous_settings: String,
}

fn format_err(e: iocache_format::FormatError) -> EngineError {
    EngineError::Format(e.to_string())
}

fn random_uuid() -> [u8; 16] {
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
fn zero(dev: &dyn BlockDevice, offset: u64, len: u64) -> Result<(), EngineError> {
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

/// The identity recorded for `backend` (`None` when it cannot say).
pub fn backend_identity(backend: &dyn BlockDevice) -> Option<VolumeIdentity> {
    backend
        .identity()
        .map(|id| VolumeIdentity::of(id.kind.code(), &id.key))
}

/// An identity for messages: its kind and digest.
pub fn describe_identity(identity: Option<VolumeIdentity>) -> String {
    match identity {
        None => "no identity".to_string(),
        Some(id) => match IdentityKind::from_code(id.kind) {
            Some(kind) => format!("{} {:016x}", kind.name(), id.digest),
            None => format!("identity of unknown kind {} {:016x}", id.kind, id.digest),
        },
    }
}

/// A backend's identity in full, for messages and logs.
pub fn describe_backend(backend: &dyn BlockDevice) -> String {
    match backend.identity() {
        None => "no identity".to_string(),
        Some(id) => format!(
            "{} {:016x}: {}{}",
            id.kind.name(),
            VolumeIdentity::of(id.kind.code(), &id.key).digest,
            id.key,
            if id.weak {
                ", which may change at a reboot"
            } else {
                ""
            }
        ),
    }
}

/// Two configured volumes must not share a backend: each would cache it
/// apart from the other.
fn check_distinct_backends(spec: &OpenSpec, backends: &[&dyn BlockDevice]) -> Result<(), EngineError> {
    let identities: Vec<Option<VolumeIdentity>> = backends.iter().map(|b| backend_identity(*b)).collect();
    for (i, a) in identities.iter().enumerate() {
        let Some(a) = a else { continue };
        if let Some(j) = identities[..i].iter().position(|b| b.as_ref() == Some(a)) {
            return Err(EngineError::Config(format!(
                "volumes `{}` and `{}` have the same backend ({}): each would cache it without the other",
                spec.volumes[j].0,
                spec.volumes[i].0,
                describe_backend(backends[i])
            )));
        }
    }
    Ok(())
}

/// The volume table entries of the configured volumes.
fn entries(spec: &OpenSpec, ids: &[u32], backends: &[&dyn BlockDevice]) -> Vec<VolumeEntry> {
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

fn format_fresh(
    dev: &dyn BlockDevice,
    backends: &[&dyn BlockDevice],
    spec: &OpenSpec,
    report: RecoveryReport,
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
    // The old cache goes first (whatever it held that mattered was written
    // back, or its loss acknowledged): a crash from here on finds blank
    // superblocks, which format again unless line records follow them.
    zero(dev, SUPERBLOCK_OFFSETS[0], 2 * SUPERBLOCK_BYTES as u64)?;
    dev.flush()?;
    // Old records from whatever the device held before must not be read as
    // this cache's: every slot of both regions starts with an empty record
    // (never all zeroes, so that zeroed records are seen as damage).
    let empty = iocache_format::empty_region(&layout).map_err(format_err)?;
    for copy in 0..2u8 {
        dev.write_at(&empty, layout.copy_region_offset(copy))?;
    }
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
        settings: spec.settings.clone(),
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
        previous_settings: String::new(),
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
const RECORD_SCAN_BYTES: u64 = 64 << 20;

/// Whether the metadata area after blank superblocks holds records of
/// lines (their tag and the line kind at a record boundary, in the first
/// 64 MiB): the superblocks of a cache were zeroed, and it may hold dirty
/// lines. Empty records alone (a format interrupted after the records
/// were written) describe nothing and do not count.
fn records_follow(dev: &dyn BlockDevice) -> Result<bool, EngineError> {
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
fn shrunk_device(dev: &dyn BlockDevice, layout: &Layout) -> EngineError {
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

/// Formats a blank device or loads the cache it holds. `backends[i]` is the
/// backend of `spec.volumes[i]`.
pub fn open(
    dev: &dyn BlockDevice,
    backends: &[&dyn BlockDevice],
    spec: &OpenSpec,
    array: Option<&CacheArray>,
) -> Result<Opened, EngineError> {
    assert_eq!(backends.len(), spec.volumes.len(), "one backend per volume");
    if dev.len_bytes() < 2 * SUPERBLOCK_BYTES as u64 {
        return Err(EngineError::CacheDeviceTooSmall {
            device_bytes: dev.len_bytes(),
            cache_bytes: 2 * SUPERBLOCK_BYTES as u64,
        });
    }
    let found = read_superblocks(dev)?;
    let shutdown_state = found.as_ref().ok().and_then(SuperblockFound::shutdown_state);
    let (superblock, copy, damaged_superblock) = match found {
        Ok(SuperblockFound::Blank) => {
            if spec.init != (InitMode::Format { discard_dirty: true }) && records_follow(dev)? {
                return Err(unless_formatted(
                    "both superblock copies of the cache device are blank, but records of lines follow them: \
                     the device held a cache whose superblocks were zeroed, and it may hold dirty lines that \
                     cannot be found without them"
                        .to_string(),
                ));
            }
            return format_fresh(dev, backends, spec, RecoveryReport::default());
        }
        Ok(SuperblockFound::Found {
            superblock,
            copy,
            other_copy_error,
            other_copy_damaged,
        }) => {
            let damaged = other_copy_damaged.then(|| {
                other_copy_error.map_or_else(|| "damaged".to_string(), |e| e.to_string())
            });
            (superblock, copy, damaged)
        }
        Err(_) if spec.init == (InitMode::Format { discard_dirty: true }) => {
            return format_fresh(dev, backends, spec, RecoveryReport::default());
        }
        Err(e) => {
            return Err(unless_formatted(format!(
                "the cache device holds a cache whose superblock cannot be read ({e}), so whether it holds dirty \
                 data is unknown"
            )))
        }
    };
    let layout = superblock.layout;
    if dev.len_bytes() < layout.device_bytes() {
        if spec.init == (InitMode::Format { discard_dirty: true }) {
            return format_fresh(dev, backends, spec, RecoveryReport::default());
        }
        return Err(shrunk_device(dev, &layout));
    }
    let region = layout.copy_region_bytes as usize;
    let mut images = [vec![0u8; region], vec![0u8; region]];
    for (copy_index, image) in images.iter_mut().enumerate() {
        dev.read_at(image, layout.metadata_offset + (copy_index * region) as u64)?;
    }
    let mut loaded =
        load_metadata(&images[0], &images[1], &layout, superblock.format_version).map_err(format_err)?;
    let intents = read_intents(dev, &layout, &loaded)?;
    // An invalid superblock copy never means "clean" (it may be the newest).
    let clean_shutdown = shutdown_state == Some(ShutdownState::Clean);
    if let Some(why) = &damaged_superblock {
        log::warn!(
            "a superblock copy of the cache device is damaged ({why}); treating the cache as not shut \
             down cleanly"
        );
    }
    let mut damaged = damaged_slots(&loaded, &superblock, damaged_superblock.is_some());
    let mut checksums = verify_dirty_checksums(dev, array, &layout, &superblock, &loaded, &intents)?;
    // Every record with intents is written again by the first barrier,
    // verified or not, before the intent log is reused.
    checksums.rewrite.extend(intents.keys().copied());
    if !checksums.damaged.is_empty() {
        for d in std::mem::take(&mut checksums.damaged) {
            match damaged.binary_search_by_key(&d.slot, |x| x.slot) {
                Ok(at) => {
                    let x = &mut damaged[at];
                    x.problem = format!("{}; {}", x.problem, d.problem);
                    for offset in d.device_offsets {
                        if !x.device_offsets.contains(&offset) {
                            x.device_offsets.push(offset);
                        }
                    }
                }
                Err(at) => damaged.insert(at, d),
            }
        }
    }
    let mut report = RecoveryReport {
        loaded: true,
        clean_shutdown,
        verified_dirty_lines: checksums.verified,
        repaired_from_mirror: checksums.repaired_from_mirror,
        verified_with_intents: checksums.with_intents,
        corrupt_copies: loaded.corrupt_copies,
        corrupt_examples: loaded.corrupt_examples.clone(),
        damaged_superblock: damaged_superblock.clone(),
        ..RecoveryReport::default()
    };
    let accept_damage = match spec.init {
        InitMode::Load => false,
        InitMode::LoadAcceptingDamage => true,
        InitMode::Format { discard_dirty } => discard_dirty,
    };
    if !damaged.is_empty() && !accept_damage {
        return Err(EngineError::DamagedMetadata(DamagedMetadata { slots: damaged }));
    }
    // Accepted damage: the damaged slots keep only what can be verified
    // (their valid copy may be older than the damaged one, and the slot may
    // hold another line's data since), and their damaged copies are blanked
    // so that the next start does not stop on them again.
    let mut damaged_dirty = Vec::new();
    let mut damaged_unloaded = Vec::new();
    if !damaged.is_empty() {
        for d in &damaged {
            log::warn!("starting despite damaged metadata: {d}");
        }
        if spec.init == InitMode::LoadAcceptingDamage {
            blank_damaged_copies(dev, &layout, &mut images, &damaged)?;
        }
        let mut line_buf = vec![0u8; layout.line_bytes as usize];
        loaded.lines.retain(|(slot, record)| {
            let Some(line) = &record.line else { return true };
            if damaged.binary_search_by_key(slot, |d| d.slot).is_err()
                || data_matches_hash(dev, &layout, *slot, line, &mut line_buf)
            {
                return true;
            }
            let key = LineKey {
                volume: line.volume,
                line_index: line.line_index,
            };
            if line.dirty {
                damaged_dirty.push((*slot, key));
            } else {
                damaged_unloaded.push(*slot);
            }
            false
        });
        report.damaged_slots = damaged;
    }
    let dirty_count = loaded
        .lines
        .iter()
        .filter(|(_, r)| r.line.as_ref().is_some_and(|l| l.dirty))
        .count() as u64;
    if let InitMode::Format { discard_dirty } = spec.init {
        if dirty_count > 0 && !discard_dirty {
            return Err(unless_formatted(format!(
                "the cache device holds {dirty_count} dirty lines ({} bytes at most) not yet written to the backend, \
                 which formatting it would lose; loading it instead recovers them and writes them back",
                dirty_count * layout.line_bytes
            )));
        }
        return format_fresh(dev, backends, spec, report);
    }
    // Volumes: a dirty line of a volume this engine does not serve cannot
    // be written back by it.
    let ids = assign_ids(&superblock.volumes, &spec.volumes);
    let position = |volume: u32| ids.iter().position(|&id| id == volume);
    let dirty_of = |volume: u32| {
        loaded
            .lines
            .iter()
            .filter(|(_, r)| r.line.as_ref().is_some_and(|l| l.dirty && l.volume == volume))
            .count()
    };
    let mut foreign: Vec<u32> = loaded
        .lines
        .iter()
        .filter_map(|(_, r)| r.line.as_ref())
        .filter(|l| l.dirty && position(l.volume).is_none())
        .map(|l| l.volume)
        .collect();
    foreign.sort_unstable();
    foreign.dedup();
    if !foreign.is_empty() {
        let entry = |id: u32| superblock.volumes.iter().find(|v| v.id == id);
        let name_of = |id: u32| {
            entry(id).map_or(format!("an unnamed volume (id {id})"), |v| {
                format!("`{}`", v.name)
            })
        };
        let backend_of = |id: u32| describe_identity(entry(id).and_then(|v| v.identity));
        let total: usize = foreign.iter().map(|&v| dirty_of(v)).sum();
        return Err(unless_formatted(format!(
            "the cache device holds {total} dirty lines of volumes this configuration does not serve: {}; \
             serve them again (same export names, same backends, same cache; a volume attached while the \
             server ran must be named in the configuration) to write them back (volumes on the device: {})",
            foreign
                .iter()
                .map(|&v| format!(
                    "{} ({} lines; backend {})",
                    name_of(v),
                    dirty_of(v),
                    backend_of(v)
                ))
                .collect::<Vec<_>>()
                .join(", "),
            superblock
                .volumes
                .iter()
                .map(|v| format!("{} `{}`", v.id, v.name))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    for ((_, size_bytes), &id) in spec.volumes.iter().zip(&ids) {
        let Some(volume) = superblock.volumes.iter().find(|v| v.id == id) else {
            continue;
        };
        let dirty = dirty_of(id);
        if volume.size_bytes != *size_bytes && dirty > 0 {
            return Err(unless_formatted(format!(
                "volume `{}` was {} bytes when its {dirty} dirty lines were cached, the backend now has {} bytes; \
                 serve the original backend to write them back",
                volume.name, volume.size_bytes, size_bytes
            )));
        }
    }
    // Identities: lines are only ever handed to the backend they were
    // cached from (checked before anything is written back).
    check_distinct_backends(spec, backends)?;
    let mut rebound: Vec<u32> = Vec::new();
    for (at, &id) in ids.iter().enumerate() {
        let name = &spec.volumes[at].0;
        let backend = backends[at];
        let given = backend_identity(backend);
        let recorded = superblock.volumes.iter().find(|v| v.id == id).map(|v| v.identity);
        let recorded = match recorded {
            None => continue,
            Some(None) => {
                report.identity_changes.push(format!(
                    "`{name}`: bound to {} ({}; the cache recorded no identity)",
                    backend.name(),
                    describe_backend(backend)
                ));
                continue;
            }
            Some(recorded) if recorded == given => continue,
            Some(recorded) => recorded,
        };
        let (mut dirty, mut clean) = (0u64, 0u64);
        for line in loaded.lines.iter().filter_map(|(_, r)| r.line.as_ref()) {
            if line.volume == id {
                if line.dirty {
                    dirty += 1;
                } else {
                    clean += 1;
                }
            }
        }
        let was = describe_identity(recorded);
        // Dirty lines are writes no backend has: only the operator can say
        // this backend is theirs. Clean lines are only the old backend's
        // data: dropped.
        if dirty > 0 && !spec.rebind {
            return Err(EngineError::BackendMismatch(BackendMismatch {
                volume: name.clone(),
                backend: backend.name().to_string(),
                recorded: was,
                given: describe_backend(backend),
                dirty_lines: dirty,
                clean_lines: clean,
            }));
        }
        if dirty + clean > 0 {
            rebound.push(id);
        }
        report.identity_changes.push(format!(
            "`{name}`: bound anew to {} ({}); it was bound to {was}{}",
            backend.name(),
            describe_backend(backend),
            if dirty + clean == 0 {
                ", and the cache held none of its lines".to_string()
            } else if dirty == 0 {
                format!("; its {clean} clean lines (the other backend's data) are dropped")
            } else {
                format!(", as acknowledged: its {dirty} dirty lines are kept for it, its {clean} clean lines dropped")
            }
        ));
    }
    let same_geometry = layout.line_bytes == spec.line_bytes
        && layout.slots == spec.slots
        && superblock.shards == spec.shards;
    let same_format = superblock.format_version >= FORMAT_VERSION_INTENTS;
    if !same_geometry || !same_format {
        // Another geometry: write the dirty lines straight back, then start
        // over with the configured one (how a cache is grown or shrunk). A
        // device of a version without an intent log goes the same way: its
        // data area starts elsewhere.
        let describe = |slots: u64, line_bytes: u64, shards| {
            format!("{slots} lines of {line_bytes} B in {shards} shards")
        };
        if !same_geometry {
            report.geometry_changed = Some((
                describe(layout.slots, layout.line_bytes, superblock.shards),
                describe(spec.slots, spec.line_bytes, spec.shards),
            ));
        }
        if !same_format {
            report.upgraded_from_version = Some(superblock.format_version);
        }
        for (slot, record) in &loaded.lines {
            let Some(line) = &record.line else { continue };
            let Some(at) = position(line.volume).filter(|_| line.dirty) else {
                continue;
            };
            write_back_record(dev, backends[at], &layout, *slot, line)?;
            report.written_back_lines += 1;
        }
        for backend in backends {
            backend.flush()?;
        }
        report.dropped_clean_lines = loaded.lines.len() as u64 - report.written_back_lines;
        return format_fresh(dev, backends, spec, report);
    }
    let mut lines = Vec::new();
    let mut unloaded_slots = Vec::new();
    let mut to_check = Vec::new();
    for (slot, record) in loaded.lines {
        let Some(line) = record.line else { continue };
        let key = LineKey {
            volume: line.volume,
            line_index: line.line_index,
        };
        let inside = position(line.volume).is_some_and(|at| {
            (line.line_index + 1) * layout.line_bytes
                <= spec.volumes[at].1.next_multiple_of(layout.line_bytes)
        });
        if !inside || (!line.dirty && rebound.contains(&line.volume)) {
            // Clean lines of other volumes, beyond the volume, or of a
            // volume rebound to another backend: not ours.
            report.dropped_clean_lines += 1;
            if !line.dirty {
                unloaded_slots.push(slot);
            }
            continue;
        }
        if line.dirty {
            // After a crash, only the dirty sectors are certain: a clean
            // sector of a dirty line may have been overwritten in place by a
            // write that was never flushed.
            // A rebound volume's clean sectors are the old backend's.
            let valid = if clean_shutdown && !rebound.contains(&line.volume) {
                line.valid.clone()
            } else {
                line.dirty_bits.clone()
            };
            report.dirty_lines += 1;
            lines.push(RecoveredLine {
                slot,
                key,
                valid,
                dirty: line.dirty_bits,
                // Verified above (a mismatch refused the start or dropped it).
                hash: line.data_hash,
                dirty_on_disk: true,
                sequence: record.sequence,
                mirror: line.mirror,
                terms: checksums.terms.remove(&slot),
                rewrite_record: checksums.rewrite.contains(&slot),
            });
            continue;
        }
        if spec.persistence != Persistence::All {
            report.dropped_clean_lines += 1;
            unloaded_slots.push(slot);
            continue;
        }
        if !clean_shutdown {
            // After a crash: checked below, against the backend too.
            let at = position(line.volume).expect("checked inside a served volume");
            to_check.push((at, slot, key, line, record.sequence));
            continue;
        }
        report.clean_lines += 1;
        lines.push(RecoveredLine::clean(slot, key, line, record.sequence));
    }
    let checked = check_clean_lines(
        dev,
        backends,
        &spec.volumes,
        &layout,
        to_check,
        spec.clean_check_budget,
        &mut report,
    );
    for outcome in checked {
        match outcome {
            Ok(line) => lines.push(line),
            Err(slot) => unloaded_slots.push(slot),
        }
    }
    unloaded_slots.extend(damaged_unloaded);
    let mut stale_dirty = damaged_dirty;
    let backend_of = |volume: u32| position(volume).map(|at| backends[at]);
    let lines = resolve_duplicates(
        dev,
        &backend_of,
        &layout,
        lines,
        &mut report,
        &mut stale_dirty,
        &mut unloaded_slots,
    )?;
    let mut superblock = superblock;
    superblock.persistence = spec.persistence;
    let previous_settings = std::mem::replace(&mut superblock.settings, spec.settings.clone());
    // The table names the volumes served: others had no dirty line (or
    // opening was refused), and their clean lines are not loaded.
    superblock.volumes = entries(spec, &ids, backends);
    let writer = RecordWriter::new(layout, images, loaded.slots);
    Ok(Opened {
        volume_ids: ids,
        unloaded_slots,
        superblock,
        superblock_copy: copy,
        writer,
        lines,
        stale_dirty,
        report,
        previous_settings,
    })
}

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
fn damaged_slots(
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
            .map(|guess| ProbableLine {
                volume: guess.volume,
                volume_name: superblock
                    .volumes
                    .iter()
                    .find(|v| v.id == guess.volume)
                    .map(|v| v.name.clone()),
                line_index: guess.line_index,
                dirty: guess.dirty,
            });
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
fn blank_damaged_copies(
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
fn data_matches_hash(
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
        hash == hash_valid_sectors(buf, &line.valid, layout.sectors_per_line())
    }
}

/// What checking the dirty lines' checksums found.
struct ChecksumCheck {
    /// Dirty lines whose data matched their checksum.
    verified: u64,
    /// Of those, lines whose record had intents tied to it.
    with_intents: u64,
    /// Per verified slot, each sector's checksum term as read.
    terms: HashMap<u64, Vec<u64>>,
    /// Slots whose record verified with intents (rewritten by the first
    /// barrier).
    rewrite: std::collections::HashSet<u64>,
    /// Of those, lines whose primary copy did not match (or did not read)
    /// and whose mirror did: the primary was rewritten from the mirror.
    repaired_from_mirror: u64,
    /// Slots whose dirty data matches neither copy.
    damaged: Vec<DamagedSlot>,
    /// Lines whose copies do not read (a failed array member): not verified.
    unreadable: u64,
}

/// The intents of the intent log tied to the records loaded: per slot,
/// those naming the sequence of the slot's current record, in log order.
/// Others (tied to records since replaced, torn, or of an earlier cache)
/// are ignored.
fn read_intents(
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

/// Lines of one kind logged one by one at start-up; the rest are counted.
const LOGGED_EXAMPLES: u64 = 4;

/// Reads every dirty line whose record carries a checksum and checks its
/// dirty sectors (docs/format.md, "Dirty checksums"). On a cache array a
/// line whose primary copy fails the check is checked in its mirror, and
/// repaired from it when that matches. A mismatch makes the slot damaged:
/// the start is refused, or with damage accepted the line is dropped.
fn verify_dirty_checksums(
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
        rewrite: std::collections::HashSet::new(),
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
                check.rewrite.insert(*slot);
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
            probably: Some(ProbableLine {
                volume: line.volume,
                volume_name: superblock
                    .volumes
                    .iter()
                    .find(|v| v.id == line.volume)
                    .map(|v| v.name.clone()),
                line_index: line.line_index,
                dirty: true,
            }),
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

const SECTOR_BYTES: usize = iocache_format::SECTOR_BYTES as usize;

/// Writes the runs of `dirty` sectors of `line` (a whole line's bytes) to
/// mirror slot `mirror` of `array` (made durable by the next cache flush).
fn copy_dirty_runs_to_mirror(
    array: &CacheArray,
    mirror: u32,
    layout: &Layout,
    dirty: &[u64],
    line: &[u8],
) -> Result<(), EngineError> {
    let mut result = Ok(());
    bitmap::for_each_run(dirty, 0, layout.sectors_per_line(), |first, end, set| {
        if set && result.is_ok() {
            let (a, b) = (first as usize * SECTOR_BYTES, end as usize * SECTOR_BYTES);
            result = array.write_mirror(mirror, a as u64, &line[a..b]);
        }
    });
    Ok(result?)
}

/// Writes the runs of `dirty` sectors of `line` (a whole line's bytes) to
/// `slot`, and flushes.
fn write_dirty_runs(
    dev: &dyn BlockDevice,
    layout: &Layout,
    slot: u64,
    dirty: &[u64],
    line: &[u8],
) -> Result<(), EngineError> {
    let mut result = Ok(());
    bitmap::for_each_run(dirty, 0, layout.sectors_per_line(), |first, end, set| {
        if set && result.is_ok() {
            let (a, b) = (first as usize * SECTOR_BYTES, end as usize * SECTOR_BYTES);
            result = dev.write_at(&line[a..b], layout.line_offset(slot) + a as u64);
        }
    });
    result?;
    dev.flush()?;
    Ok(())
}

/// A crash in the middle of a barrier can leave a line in two slots: the
/// old slot's record still saying dirty, and the slot it was readmitted to.
/// The newer record (larger sequence) wins. The older one's dirty sectors
/// that the newer one does not hold dirty are written back first: they
/// are the latest data of those sectors unless the newer copy came from a
/// fill, which read them from the backend after the old copy was written
/// back (so a clean newer copy needs no write-back).
fn resolve_duplicates<'a>(
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
type CleanCandidate = (usize, u64, LineKey, iocache_format::LineRecord, u64);

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
fn check_clean_lines(
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
fn same_valid_sectors(a: &[u8], b: &[u8], valid: &[u64], sectors: u32) -> bool {
    let mut same = true;
    bitmap::for_each_run(valid, 0, sectors, |start, end, set| {
        if set && same {
            let (from, to) = (start as usize * 512, end as usize * 512);
            same = to <= a.len() && a[from..to] == b[from..to];
        }
    });
    same
}

/// The hash of a line's valid sectors, in ascending order (what a clean
/// record's `data_hash` covers).
pub fn hash_valid_sectors(line: &[u8], valid: &[u64], sectors: u32) -> u64 {
    if bitmap::count_range(valid, 0, sectors) == sectors {
        return data_hash(line);
    }
    let mut bytes = Vec::with_capacity(line.len());
    bitmap::for_each_run(valid, 0, sectors, |start, end, set| {
        if set {
            bytes.extend_from_slice(&line[start as usize * 512..end as usize * 512]);
        }
    });
    data_hash(&bytes)
}

fn write_back_record(
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

#[cfg(test)]
mod tests {
    use super::*;
    use iocache_device::MemDevice;
    use iocache_format::LineRecord;

    #[test]
    fn only_valid_sectors_are_compared_with_the_backend() {
        let cached = vec![1u8; 4096];
        let mut backend = cached.clone();
        backend[3 * 512] = 9; // sector 3 differs
        let all = [0xffu64];
        let without_3 = [0xffu64 & !(1 << 3)];
        assert!(!same_valid_sectors(&cached, &backend, &all, 8));
        assert!(same_valid_sectors(&cached, &backend, &without_3, 8));
        // A valid sector past the end of what was read (the volume's end)
        // is not the backend's.
        assert!(same_valid_sectors(
            &cached[..3 * 512],
            &backend[..3 * 512],
            &[0b111],
            8
        ));
        assert!(!same_valid_sectors(
            &cached[..3 * 512],
            &backend[..3 * 512],
            &[0b1111],
            8
        ));
    }

    fn spec() -> OpenSpec {
        OpenSpec {
            line_bytes: 4096,
            slots: 8,
            shards: 1,
            persistence: Persistence::Dirty,
            init: InitMode::Load,
            volumes: vec![("v".into(), 1 << 20)],
            settings: String::new(),
            clean_check_budget: std::time::Duration::from_secs(60),
            rebind: false,
        }
    }

    fn dirty_line(line_index: u64, dirty: u64) -> Option<LineRecord> {
        Some(LineRecord {
            volume: 0,
            line_index,
            dirty: true,
            data_hash: None,
            valid: vec![dirty],
            dirty_bits: vec![dirty],
            mirror: None,
        })
    }

    #[test]
    fn a_line_in_two_slots_keeps_the_newer_and_writes_back_what_only_the_older_holds() {
        let layout = Layout::for_slots(4096, 8).unwrap();
        let dev = MemDevice::new("cache", layout.device_bytes());
        let backend = MemDevice::new("backend", 1 << 20);
        let mut opened = open(&dev, &[&backend], &spec(), None).unwrap();
        assert!(!opened.report.loaded);
        // Line 5: sectors 0-1 dirty in slot 1 (older), sector 1-2 in slot 3 (newer).
        dev.write_at(&[0x11; 4096], layout.line_offset(1)).unwrap();
        dev.write_at(&[0x33; 4096], layout.line_offset(3)).unwrap();
        let (c1, s1) = opened.writer.stage(1, dirty_line(5, 0b011)).unwrap();
        let (c3, s3) = opened.writer.stage(3, dirty_line(5, 0b110)).unwrap();
        assert!(s3 > s1);
        for (offset, bytes) in opened.writer.take_writes() {
            dev.write_at(bytes, offset).unwrap();
        }
        opened.writer.durable(1, c1, s1);
        opened.writer.durable(3, c3, s3);

        let again = open(&dev, &[&backend], &spec(), None).unwrap();
        assert_eq!(again.lines.len(), 1, "one copy of line 5 is loaded");
        assert_eq!(again.lines[0].slot, 3);
        assert_eq!(again.lines[0].dirty, vec![0b110]);
        assert_eq!(
            again.stale_dirty,
            vec![(
                1,
                LineKey {
                    volume: 0,
                    line_index: 5
                }
            )]
        );
        assert_eq!(again.report.duplicate_lines, 1);
        assert_eq!(again.report.written_back_lines, 1);
        // Sector 0 only the older copy held dirty: it went to the backend;
        // sector 1 is the newer copy's and stays in the cache.
        let mut sector = [0u8; 1024];
        backend.read_at(&mut sector, 5 * 4096).unwrap();
        assert!(sector[..512].iter().all(|&b| b == 0x11));
        assert!(
            sector[512..].iter().all(|&b| b == 0),
            "sector 1 is not written back from the older copy"
        );
    }

    #[test]
    fn formatting_over_dirty_lines_is_refused_unless_forced() {
        let layout = Layout::for_slots(4096, 8).unwrap();
        let dev = MemDevice::new("cache", layout.device_bytes());
        let backend = MemDevice::new("backend", 1 << 20);
        let mut opened = open(&dev, &[&backend], &spec(), None).unwrap();
        let (c, s) = opened.writer.stage(2, dirty_line(7, 1)).unwrap();
        for (offset, bytes) in opened.writer.take_writes() {
            dev.write_at(bytes, offset).unwrap();
        }
        opened.writer.durable(2, c, s);
        let format = |discard_dirty| OpenSpec {
            init: InitMode::Format { discard_dirty },
            ..spec()
        };
        let err = open(&dev, &[&backend], &format(false), None)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("1 dirty lines"), "{err}");
        let fresh = open(&dev, &[&backend], &format(true), None).unwrap();
        assert!(fresh.lines.is_empty());
        let reloaded = open(&dev, &[&backend], &spec(), None).unwrap();
        assert!(reloaded.lines.is_empty(), "formatting blanked the records");
    }

    #[test]
    fn a_damaged_superblock_is_refused_and_named() {
        let layout = Layout::for_slots(4096, 8).unwrap();
        let dev = MemDevice::new("cache", layout.device_bytes());
        let backend = MemDevice::new("backend", 1 << 20);
        open(&dev, &[&backend], &spec(), None).unwrap();
        dev.write_at(&[0xff; 16], 100).unwrap();
        let err = open(&dev, &[&backend], &spec(), None).err().expect("refused");
        assert!(err.to_string().contains("superblock"), "{err}");
        let forced = OpenSpec {
            init: InitMode::Format { discard_dirty: true },
            ..spec()
        };
        assert!(open(&dev, &[&backend], &forced, None).is_ok());
    }

    #[test]
    fn volumes_keep_their_ids_by_name_and_new_ones_take_unused_ids() {
        let entry = |id, name: &str| VolumeEntry {
            id,
            name: name.into(),
            size_bytes: 1,
            identity: None,
        };
        let table = [entry(0, "a"), entry(3, "b")];
        let wanted = |names: &[&str]| names.iter().map(|n| (n.to_string(), 1)).collect::<Vec<_>>();
        assert_eq!(assign_ids(&table, &wanted(&["b", "a"])), vec![3, 0]);
        assert_eq!(assign_ids(&table, &wanted(&["c", "b", "d"])), vec![1, 3, 2]);
        assert_eq!(assign_ids(&[], &wanted(&["x", "y"])), vec![0, 1]);
        // One volume, another name: another volume.
        assert_eq!(assign_ids(&[entry(0, "old")], &wanted(&["new"])), vec![1]);
    }

    #[test]
    fn dirty_lines_of_a_volume_no_longer_served_are_refused_by_name() {
        let layout = Layout::for_slots(4096, 8).unwrap();
        let dev = MemDevice::new("cache", layout.device_bytes());
        let backend = MemDevice::new("backend", 1 << 20);
        let mut opened = open(&dev, &[&backend], &spec(), None).unwrap();
        let (c, s) = opened.writer.stage(2, dirty_line(7, 1)).unwrap();
        let clean = LineRecord {
            volume: 0,
            line_index: 9,
            dirty: false,
            data_hash: Some(1),
            valid: vec![1],
            dirty_bits: vec![0],
            mirror: None,
        };
        let (c5, s5) = opened.writer.stage(5, Some(clean)).unwrap();
        for (offset, bytes) in opened.writer.take_writes() {
            dev.write_at(bytes, offset).unwrap();
        }
        opened.writer.durable(2, c, s);
        opened.writer.durable(5, c5, s5);
        // The export was renamed: its dirty line is not handed to another name.
        let renamed = OpenSpec {
            volumes: vec![("w".into(), 1 << 20)],
            ..spec()
        };
        let err = open(&dev, &[&backend], &renamed, None)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("`v` (1 lines; backend RAM device") && err.contains("does not serve"),
            "{err}"
        );
        // Served with another volume, it loads; the clean line of the other
        // volume is listed for blanking.
        let backend2 = MemDevice::new("backend2", 1 << 20);
        let both = OpenSpec {
            volumes: vec![("w".into(), 1 << 20), ("v".into(), 1 << 20)],
            persistence: Persistence::Dirty,
            ..spec()
        };
        let opened = open(&dev, &[&backend2, &backend], &both, None).unwrap();
        assert_eq!(opened.volume_ids, vec![1, 0]);
        assert_eq!(opened.lines.len(), 1);
        assert_eq!(
            opened.unloaded_slots,
            vec![5],
            "a clean line mode `dirty` does not keep"
        );
        let names: Vec<&str> = opened
            .superblock
            .volumes
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(names, ["w", "v"]);
    }
}
