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
    load_metadata, pick_superblock, Intent, Layout, Persistence, ShutdownState, SlotDisk, Superblock,
    SuperblockFound, VolumeEntry, VolumeIdentity, FORMAT_VERSION, FORMAT_VERSION_INTENTS,
    FORMAT_VERSION_WRITES_EVERY_RECORD, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS,
};

use crate::layout::{fit_slots, LayoutError};
use crate::persist::RecordWriter;
use crate::raid::CacheArray;
use crate::EngineError;

mod damage;
mod device;
mod identity;
mod lines;
mod verify;

use damage::{blank_damaged_copies, damaged_slots, data_matches_hash};
pub(crate) use device::read_superblocks;
pub use device::{assign_ids, check_not_shrunk, is_blank, write_superblock};
use device::{entries, format_fresh, records_follow, shrunk_device};
use identity::check_distinct_backends;
pub use identity::{backend_identity, describe_backend, describe_identity};
pub(crate) use lines::write_back_dirty_runs;
use lines::{check_clean_lines, resolve_duplicates, write_back_record};
use verify::{read_intents, verify_dirty_checksums};

/// Lines of one kind logged one by one at start-up; the rest are counted.
const LOGGED_EXAMPLES: u64 = 4;

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

impl ProbableLine {
    /// Line `line_index` of volume `volume`, named as `superblock`'s
    /// volume table names it.
    fn named(superblock: &Superblock, volume: u32, line_index: u64, dirty: bool) -> ProbableLine {
        ProbableLine {
            volume,
            volume_name: superblock
                .volumes
                .iter()
                .find(|v| v.id == volume)
                .map(|v| v.name.clone()),
            line_index,
            dirty,
        }
    }
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
    /// What the superblock records of the settings from this start on (the
    /// configuration opened with; run-time changes are added as they come).
    pub settings: iocache_format::SettingsRecord,
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
    /// A dirty line's flush epoch as recorded (ordered write-back).
    pub epoch: Option<u32>,
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
            epoch: None,
            terms: None,
            rewrite_record: false,
        }
    }
}

/// What opening found and did. A server reports its counters as they are
/// (serialized, in this order: the admin socket's schema); the lists and
/// descriptions after them are not part of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// Dirty lines whose data was checked against their record's checksum
    /// and matched (lines recorded without one, by an older build or while
    /// a write was in flight, are not counted).
    pub verified_dirty_lines: u64,
    /// Of those, lines whose record has intents tied to it (writes that were
    /// to land on checksummed dirty sectors before the next barrier): each
    /// sector held its old data or what an intent names.
    pub verified_with_intents: u64,
    /// Of the verified lines, those on a cache array whose primary copy
    /// failed the check and was rewritten from its mirror, which passed.
    pub repaired_from_mirror: u64,
    pub corrupt_copies: u64,
    /// Lines found in two slots (the older record is dropped).
    pub duplicate_lines: u64,
    /// Dirty lines written straight back to the backend at start-up: those
    /// of an earlier geometry, and older copies of a line that a crash left
    /// in two slots.
    pub written_back_lines: u64,
    #[serde(skip)]
    pub corrupt_examples: Vec<(u64, String)>,
    /// Knobs changed at run time before, brought back (`KEY=VALUE`).
    #[serde(skip)]
    pub restored_settings: Vec<String>,
    /// Run-time changes not brought back, and why (the configuration
    /// changed since).
    #[serde(skip)]
    pub dropped_settings: Vec<String>,
    /// A superblock copy is damaged (not valid, not blank): why. The cache
    /// is then treated as not shut down cleanly, whatever the valid copy says.
    #[serde(skip)]
    pub damaged_superblock: Option<String>,
    /// Slots whose records are damaged where they may have described dirty
    /// data, started over with [`InitMode::LoadAcceptingDamage`] (without
    /// it, the start is refused with [`EngineError::DamagedMetadata`]).
    #[serde(skip)]
    pub damaged_slots: Vec<DamagedSlot>,
    /// The cache had another geometry (line size, lines or shards): its
    /// dirty lines were written back and it was formatted anew. Says what
    /// it was and what it is now (e.g. `16384 lines of 4096 B in 4 shards`).
    #[serde(skip)]
    pub geometry_changed: Option<(String, String)>,
    /// Volumes whose backend identity was recorded at this start (new
    /// volumes, and volumes of a cache that recorded none), and volumes
    /// bound anew to a backend whose identity differs (the acknowledged
    /// rebinding, or a volume that held no line): name and what happened.
    #[serde(skip)]
    pub identity_changes: Vec<String>,
    /// The device was written in an older format version and upgraded.
    #[serde(skip)]
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
    /// The settings the superblock recorded before this start (none for a
    /// new cache): run-time changes of knobs are recorded there.
    pub previous_settings: iocache_format::SettingsRecord,
}

fn format_err(e: iocache_format::FormatError) -> EngineError {
    EngineError::Format(e.to_string())
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
            return format_fresh(dev, backends, spec, RecoveryReport::default(), None);
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
            return format_fresh(dev, backends, spec, RecoveryReport::default(), None);
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
            return format_fresh(dev, backends, spec, RecoveryReport::default(), None);
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
        return format_fresh(dev, backends, spec, report, Some(&layout));
    }
    // Volumes: a dirty line of a volume this engine does not serve cannot
    // be written back by it.
    let ids = assign_ids(&superblock.volumes, &spec.volumes);
    let position = |volume: u32| ids.iter().position(|&id| id == volume);
    check_volumes(spec, &superblock, &loaded, &ids)?;
    // Identities: lines are only ever handed to the backend they were
    // cached from (checked before anything is written back).
    let rebound = check_identities(spec, backends, &superblock, &loaded, &ids, &mut report)?;
    let same_geometry = layout.line_bytes == spec.line_bytes
        && layout.slots == spec.slots
        && superblock.shards == spec.shards;
    let same_format = superblock.format_version >= FORMAT_VERSION_INTENTS;
    if !same_geometry || !same_format {
        return start_over(dev, backends, spec, &superblock, &loaded, &ids, report);
    }
    let Sorted {
        mut lines,
        mut unloaded_slots,
        to_check,
    } = sort_lines(
        loaded.lines,
        spec,
        &layout,
        &ids,
        &rebound,
        clean_shutdown,
        &mut checksums,
        &intents,
        &mut report,
    );
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
    let previous_settings = iocache_format::SettingsRecord::decode(&std::mem::replace(
        &mut superblock.settings,
        spec.settings.encode(),
    ));
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

/// The volumes phase of [`open`]: every dirty line belongs to a volume
/// this engine serves (ids `ids`, one per configured volume), at the size
/// it had when the lines were cached.
fn check_volumes(
    spec: &OpenSpec,
    superblock: &Superblock,
    loaded: &iocache_format::MetadataLoad,
    ids: &[u32],
) -> Result<(), EngineError> {
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
    for ((_, size_bytes), &id) in spec.volumes.iter().zip(ids) {
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
    Ok(())
}

/// The identities phase of [`open`]: each volume's backend is the one its
/// lines were cached from, or the operator said it is (`spec.rebind`).
/// Returns the volumes bound anew that held lines (their clean lines are
/// dropped).
fn check_identities(
    spec: &OpenSpec,
    backends: &[&dyn BlockDevice],
    superblock: &Superblock,
    loaded: &iocache_format::MetadataLoad,
    ids: &[u32],
    report: &mut RecoveryReport,
) -> Result<Vec<u32>, EngineError> {
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
    Ok(rebound)
}

/// The lines of [`sort_lines`]: loaded as they are, left out (their slots'
/// records to be blanked), and clean ones still to be compared with the
/// backend.
struct Sorted {
    lines: Vec<RecoveredLine>,
    unloaded_slots: Vec<u64>,
    to_check: Vec<lines::CleanCandidate>,
}

/// The lines phase of [`open`]: which recorded lines are loaded. Dirty
/// lines of served volumes always (with only their dirty sectors valid
/// after a crash); clean ones in mode `all`, after a crash only once
/// compared with the backend; nothing of other volumes, beyond a volume's
/// end, or clean of a volume bound anew.
#[allow(clippy::too_many_arguments)]
fn sort_lines(
    records: Vec<(u64, iocache_format::Record)>,
    spec: &OpenSpec,
    layout: &Layout,
    ids: &[u32],
    rebound: &[u32],
    clean_shutdown: bool,
    checksums: &mut verify::ChecksumCheck,
    intents: &HashMap<u64, Vec<Intent>>,
    report: &mut RecoveryReport,
) -> Sorted {
    let position = |volume: u32| ids.iter().position(|&id| id == volume);
    let mut lines = Vec::new();
    let mut unloaded_slots = Vec::new();
    let mut to_check = Vec::new();
    for (slot, record) in records {
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
                epoch: line.epoch,
                terms: checksums.terms.remove(&slot),
                // Every record with intents is written again by the first
                // barrier, verified or not, before the intent log is reused.
                rewrite_record: intents.contains_key(&slot),
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
    Sorted {
        lines,
        unloaded_slots,
        to_check,
    }
}

/// The start-over phase of [`open`]: a cache of another geometry (line
/// size, lines or shards) or of a format version without an intent log
/// has its dirty lines written straight back, then the device is
/// formatted anew as configured (how a cache is grown or shrunk).
fn start_over(
    dev: &dyn BlockDevice,
    backends: &[&dyn BlockDevice],
    spec: &OpenSpec,
    superblock: &Superblock,
    loaded: &iocache_format::MetadataLoad,
    ids: &[u32],
    mut report: RecoveryReport,
) -> Result<Opened, EngineError> {
    let layout = superblock.layout;
    let position = |volume: u32| ids.iter().position(|&id| id == volume);
    let same_geometry = layout.line_bytes == spec.line_bytes
        && layout.slots == spec.slots
        && superblock.shards == spec.shards;
    let same_format = superblock.format_version >= FORMAT_VERSION_INTENTS;
    // Another geometry: write the dirty lines straight back, then start
    // over with the configured one (how a cache is grown or shrunk). A
    // device of a version without an intent log goes the same way: its
    // data area starts elsewhere.
    let describe =
        |slots: u64, line_bytes: u64, shards| format!("{slots} lines of {line_bytes} B in {shards} shards");
    if !same_geometry {
        report.geometry_changed = Some((
            describe(layout.slots, layout.line_bytes, superblock.shards),
            describe(spec.slots, spec.line_bytes, spec.shards),
        ));
    }
    if !same_format {
        report.upgraded_from_version = Some(superblock.format_version);
    }
    // Oldest flush epoch first, each on the backend before the next
    // (lines without an epoch count as the oldest), so that a kill here
    // leaves an ordered write-back's backend consistent.
    let ranks = iocache_format::epoch_ranks(
        loaded
            .lines
            .iter()
            .filter_map(|(_, r)| r.line.as_ref().and_then(|l| l.epoch)),
    );
    let mut dirty: Vec<(u64, u64, &iocache_format::LineRecord)> = loaded
        .lines
        .iter()
        .filter_map(|(slot, record)| record.line.as_ref().map(|line| (*slot, line)))
        .filter(|(_, line)| line.dirty && position(line.volume).is_some())
        .map(|(slot, line)| (line.epoch.map_or(0, |e| ranks[&e]), slot, line))
        .collect();
    dirty.sort_by_key(|&(rank, slot, _)| (rank, slot));
    for (i, &(rank, slot, line)) in dirty.iter().enumerate() {
        if i > 0 && dirty[i - 1].0 != rank {
            for backend in backends {
                backend.flush()?;
            }
        }
        let at = position(line.volume).expect("filtered above");
        write_back_record(dev, backends[at], &layout, slot, line)?;
        report.written_back_lines += 1;
    }
    for backend in backends {
        backend.flush()?;
    }
    report.dropped_clean_lines = loaded.lines.len() as u64 - report.written_back_lines;
    format_fresh(dev, backends, spec, report, Some(&layout))
}

const SECTOR_BYTES: usize = iocache_format::SECTOR_BYTES as usize;

#[cfg(test)]
mod tests {
    use super::lines::same_valid_sectors;
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
            settings: iocache_format::SettingsRecord::default(),
            clean_check_budget: std::time::Duration::from_secs(60),
            rebind: false,
        }
    }

    /// A cache device for [`spec`]'s cache, and a backend for its volume.
    fn devices() -> (Layout, MemDevice, MemDevice) {
        let layout = Layout::for_slots(4096, 8).unwrap();
        let dev = MemDevice::new("cache", layout.device_bytes());
        let backend = MemDevice::new("backend", 1 << 20);
        (layout, dev, backend)
    }

    /// Stages each `(slot, record)`, writes the records to `dev` and marks
    /// them durable, as a barrier does; returns their sequences.
    fn write_durable(
        opened: &mut Opened,
        dev: &MemDevice,
        records: Vec<(u64, Option<LineRecord>)>,
    ) -> Vec<u64> {
        let staged: Vec<(u64, u8, u64)> = records
            .into_iter()
            .map(|(slot, record)| {
                let (copy, sequence) = opened.writer.stage(slot, record).unwrap();
                (slot, copy, sequence)
            })
            .collect();
        for (offset, bytes) in opened.writer.take_writes() {
            dev.write_at(bytes, offset).unwrap();
        }
        for &(slot, copy, sequence) in &staged {
            opened.writer.durable(slot, copy, sequence);
        }
        staged.into_iter().map(|(_, _, sequence)| sequence).collect()
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
            epoch: None,
        })
    }

    #[test]
    fn a_line_in_two_slots_keeps_the_newer_and_writes_back_what_only_the_older_holds() {
        let (layout, dev, backend) = devices();
        let mut opened = open(&dev, &[&backend], &spec(), None).unwrap();
        assert!(!opened.report.loaded);
        // Line 5: sectors 0-1 dirty in slot 1 (older), sector 1-2 in slot 3 (newer).
        dev.write_at(&[0x11; 4096], layout.line_offset(1)).unwrap();
        dev.write_at(&[0x33; 4096], layout.line_offset(3)).unwrap();
        let sequences = write_durable(
            &mut opened,
            &dev,
            vec![(1, dirty_line(5, 0b011)), (3, dirty_line(5, 0b110))],
        );
        assert!(sequences[1] > sequences[0]);

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
        let (_, dev, backend) = devices();
        let mut opened = open(&dev, &[&backend], &spec(), None).unwrap();
        write_durable(&mut opened, &dev, vec![(2, dirty_line(7, 1))]);
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
        let (_, dev, backend) = devices();
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
        let (_, dev, backend) = devices();
        let mut opened = open(&dev, &[&backend], &spec(), None).unwrap();
        let clean = LineRecord {
            volume: 0,
            line_index: 9,
            dirty: false,
            data_hash: Some(1),
            valid: vec![1],
            dirty_bits: vec![0],
            mirror: None,
            epoch: None,
        };
        write_durable(&mut opened, &dev, vec![(2, dirty_line(7, 1)), (5, Some(clean))]);
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
