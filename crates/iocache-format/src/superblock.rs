//! The superblock: one 4096-byte little-endian block describing the cache
//! device, kept in two copies (A at 0, B at 4096) updated alternately.
//!
//! Field offsets (relative to the copy; `docs/format.md` has the table):
//!
//! ```text
//!    0  magic              [u8; 8]  "IOCACHE\0"
//!    8  format_version     u32      5 (1 to 4 are read too)
//!   12  reserved           u32      0
//!   16  sequence           u64
//!   24  cache_uuid         [u8; 16]
//!   40  line_bytes         u64
//!   48  slots              u64
//!   56  record_bytes       u64
//!   64  metadata_offset    u64
//!   72  copy_region_bytes  u64
//!   80  data_offset        u64
//!   88  shards             u32
//!   92  persistence        u8       0 all, 1 dirty, 2 none
//!   93  state              u8       0 clean, 1 running
//!   94  volume_count       u16      <= 64
//!   96  settings_len       u16      <= 1024
//!   98  reserved           [u8; 30] 0
//!  128  volume table       volume_count × (id u32, size_bytes u64, name_len u8,
//!                          [v3: identity_kind u8, identity_digest u64,] name)
//!       settings           settings_len bytes of UTF-8
//!       padding            0 up to 4092
//! 4092  crc32c             u32      Castagnoli, of bytes 0..4092
//! ```

use std::fmt;
use std::str::FromStr;

use crate::error::{FormatError, SuperblockAt};
use crate::layout::{check_line_bytes, Layout};
use crate::le::{get_u16, get_u32, get_u64};
use crate::{
    FORMAT_VERSION, FORMAT_VERSION_OLDEST, FORMAT_VERSION_WRITES_EVERY_RECORD, MAGIC, SUPERBLOCK_BYTES,
    SUPERBLOCK_OFFSETS,
};

/// Most volumes a superblock lists.
pub const MAX_VOLUMES: usize = 64;
/// Longest volume name, in bytes of UTF-8.
pub const MAX_VOLUME_NAME_BYTES: usize = 255;
/// Longest settings text, in bytes of UTF-8.
pub const MAX_SETTINGS_BYTES: usize = 1024;

pub(crate) mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const RESERVED0: usize = 12;
    pub const SEQUENCE: usize = 16;
    pub const UUID: usize = 24;
    pub const LINE_BYTES: usize = 40;
    pub const SLOTS: usize = 48;
    pub const RECORD_BYTES: usize = 56;
    pub const METADATA_OFFSET: usize = 64;
    pub const COPY_REGION_BYTES: usize = 72;
    pub const DATA_OFFSET: usize = 80;
    pub const SHARDS: usize = 88;
    pub const PERSISTENCE: usize = 92;
    pub const STATE: usize = 93;
    pub const VOLUME_COUNT: usize = 94;
    pub const SETTINGS_LEN: usize = 96;
    pub const RESERVED1: usize = 98;
    pub const VARIABLE: usize = 128;
    pub const CRC: usize = 4092;
}

/// Bytes of a volume table entry before its name: id u32, size_bytes u64, name_len u8.
const VOLUME_ENTRY_FIXED: usize = 13;
/// Bytes a version 3 entry adds after `name_len`: the identity's kind and digest.
const VOLUME_IDENTITY_BYTES: usize = 9;

/// The fixed part of a volume entry in `version`.
fn entry_fixed(version: u32) -> usize {
    if version >= FORMAT_VERSION_WRITES_EVERY_RECORD {
        VOLUME_ENTRY_FIXED + VOLUME_IDENTITY_BYTES
    } else {
        VOLUME_ENTRY_FIXED
    }
}

/// Which lines the engine keeps across a restart (stored in the superblock
/// so a restart knows what the metadata promises).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Clean and dirty lines: the whole cache survives a restart.
    All,
    /// Dirty lines only: clean lines are dropped on restart.
    Dirty,
    /// Nothing: the cache starts empty (only usable without dirty data).
    None,
}

impl Persistence {
    /// The command-line names, in order.
    pub const NAMES: [&'static str; 3] = ["all", "dirty", "none"];

    /// The name: `all`, `dirty` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            Persistence::All => "all",
            Persistence::Dirty => "dirty",
            Persistence::None => "none",
        }
    }

    fn code(self) -> u8 {
        match self {
            Persistence::All => 0,
            Persistence::Dirty => 1,
            Persistence::None => 2,
        }
    }

    fn from_code(code: u8) -> Option<Persistence> {
        match code {
            0 => Some(Persistence::All),
            1 => Some(Persistence::Dirty),
            2 => Some(Persistence::None),
            _ => None,
        }
    }
}

impl fmt::Display for Persistence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Persistence {
    type Err = FormatError;

    /// Parses `all`, `dirty` or `none`; the error names the value and the choices.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(Persistence::All),
            "dirty" => Ok(Persistence::Dirty),
            "none" => Ok(Persistence::None),
            _ => Err(FormatError::invalid(
                "persistence",
                format!("{s:?}"),
                "expected one of: all, dirty, none",
            )),
        }
    }
}

/// Whether the engine shut down cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownState {
    /// Stopped cleanly: every metadata write completed before this superblock.
    Clean,
    /// Running, or stopped without a clean shutdown (crash, power loss).
    Running,
}

impl ShutdownState {
    fn code(self) -> u8 {
        match self {
            ShutdownState::Clean => 0,
            ShutdownState::Running => 1,
        }
    }

    fn from_code(code: u8) -> Option<ShutdownState> {
        match code {
            0 => Some(ShutdownState::Clean),
            1 => Some(ShutdownState::Running),
            _ => None,
        }
    }
}

impl fmt::Display for ShutdownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShutdownState::Clean => "clean",
            ShutdownState::Running => "running",
        })
    }
}

/// Which backend a volume's lines belong to: the kind of identity (a code
/// the engine gives meaning to, never 0) and a 64-bit digest of its
/// canonical text. A volume whose backend now has another identity must
/// not be handed the lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VolumeIdentity {
    /// Nonzero (0 on the device means "none recorded").
    pub kind: u8,
    pub digest: u64,
}

impl VolumeIdentity {
    /// The identity of `kind` whose canonical text is `key` (xxh3-64 of it).
    pub fn of(kind: u8, key: &str) -> VolumeIdentity {
        VolumeIdentity {
            kind,
            digest: xxhash_rust::xxh3::xxh3_64(key.as_bytes()),
        }
    }
}

impl fmt::Display for VolumeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:016x}", self.kind, self.digest)
    }
}

/// A backend volume the cache holds lines of; records refer to it by `id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeEntry {
    /// The id records carry (unique in the superblock).
    pub id: u32,
    /// The volume's name (unique, at most 255 bytes of UTF-8).
    pub name: String,
    /// The volume's size when the superblock was written.
    pub size_bytes: u64,
    /// The backend the volume's lines belong to; `None` in a version 1 or
    /// 2 superblock (which has no field for it) or when none was known.
    pub identity: Option<VolumeIdentity>,
}

/// The decoded superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The format version it is encoded in: [`FORMAT_VERSION`] for a
    /// superblock this build makes, the stored one for a decoded one (so it
    /// re-encodes to its bytes). Identities need version 3.
    pub format_version: u32,
    /// Update counter: the valid copy with the highest sequence is current.
    pub sequence: u64,
    /// Identifies this cache (chosen at format time).
    pub cache_uuid: [u8; 16],
    /// Where everything lies; always `Layout::for_slots_in_version(format_version,
    /// line_bytes, slots)`.
    pub layout: Layout,
    /// The engine's shard count (at least 1).
    pub shards: u32,
    /// Which lines survive a restart.
    pub persistence: Persistence,
    /// Clean shutdown or not.
    pub state: ShutdownState,
    /// The volumes, at most [`MAX_VOLUMES`], unique ids and names.
    pub volumes: Vec<VolumeEntry>,
    /// The text of a [`crate::SettingsRecord`], at most [`MAX_SETTINGS_BYTES`] of UTF-8.
    pub settings: String,
}

impl Superblock {
    /// Checks every field as [`decode`](Superblock::decode) would.
    fn validate(&self) -> Result<(), FormatError> {
        self.layout.validate()?;
        if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&self.format_version) {
            return Err(FormatError::invalid(
                "format_version",
                self.format_version,
                format!("{FORMAT_VERSION_OLDEST}..={FORMAT_VERSION}"),
            ));
        }
        if self.layout.has_intents() != (self.format_version >= crate::FORMAT_VERSION_INTENTS) {
            return Err(FormatError::invalid(
                "layout.intent_bytes",
                self.layout.intent_bytes,
                format!(
                    "format version {} {} an intent log",
                    self.format_version,
                    if self.format_version >= crate::FORMAT_VERSION_INTENTS {
                        "has"
                    } else {
                        "has no"
                    }
                ),
            ));
        }
        if self.shards == 0 {
            return Err(FormatError::invalid("shards", self.shards, "at least one shard"));
        }
        if self.volumes.len() > MAX_VOLUMES {
            return Err(FormatError::invalid(
                "volumes",
                format!("{} entries", self.volumes.len()),
                format!("at most {MAX_VOLUMES} volumes"),
            ));
        }
        for (i, v) in self.volumes.iter().enumerate() {
            if v.name.len() > MAX_VOLUME_NAME_BYTES {
                return Err(FormatError::invalid(
                    format!("volumes[{i}].name"),
                    format!("{} bytes", v.name.len()),
                    format!("at most {MAX_VOLUME_NAME_BYTES} bytes"),
                ));
            }
            if let Some(identity) = v.identity {
                if self.format_version < FORMAT_VERSION_WRITES_EVERY_RECORD {
                    return Err(FormatError::invalid(
                        format!("volumes[{i}].identity"),
                        identity,
                        format!("format version {} has no identities", self.format_version),
                    ));
                }
                if identity.kind == 0 {
                    return Err(FormatError::invalid(
                        format!("volumes[{i}].identity"),
                        identity,
                        "kind 0 means none",
                    ));
                }
            }
            if let Some(j) = self.volumes[..i].iter().position(|w| w.id == v.id) {
                return Err(FormatError::invalid(
                    format!("volumes[{i}].id"),
                    v.id,
                    format!("same id as volumes[{j}]"),
                ));
            }
            if let Some(j) = self.volumes[..i].iter().position(|w| w.name == v.name) {
                return Err(FormatError::invalid(
                    format!("volumes[{i}].name"),
                    format!("{:?}", v.name),
                    format!("same name as volumes[{j}]"),
                ));
            }
        }
        if self.settings.len() > MAX_SETTINGS_BYTES {
            return Err(FormatError::invalid(
                "settings",
                format!("{} bytes", self.settings.len()),
                format!("at most {MAX_SETTINGS_BYTES} bytes"),
            ));
        }
        let variable = self.variable_bytes();
        if off::VARIABLE + variable > off::CRC {
            return Err(FormatError::invalid(
                "volumes and settings",
                format!("{variable} bytes"),
                format!(
                    "at most {} bytes fit in the superblock ({} bytes per volume plus its name, \
                     plus the settings)",
                    off::CRC - off::VARIABLE,
                    entry_fixed(self.format_version)
                ),
            ));
        }
        Ok(())
    }

    /// Bytes of the volume table and settings.
    fn variable_bytes(&self) -> usize {
        self.volumes
            .iter()
            .map(|v| entry_fixed(self.format_version) + v.name.len())
            .sum::<usize>()
            + self.settings.len()
    }

    /// Encodes the superblock: exactly [`SUPERBLOCK_BYTES`] bytes, crc32c in
    /// the last four.
    ///
    /// Errors: an inconsistent layout, no shard, more than 64 volumes, a name
    /// over 255 bytes, duplicate volume ids or names, settings over 1024
    /// bytes, or volumes and settings together over the 3964 bytes between
    /// offset 128 and the crc.
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        self.validate()?;
        let mut b = vec![0u8; SUPERBLOCK_BYTES];
        b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&MAGIC);
        b[off::VERSION..off::VERSION + 4].copy_from_slice(&self.format_version.to_le_bytes());
        b[off::SEQUENCE..off::SEQUENCE + 8].copy_from_slice(&self.sequence.to_le_bytes());
        b[off::UUID..off::UUID + 16].copy_from_slice(&self.cache_uuid);
        let l = &self.layout;
        for (at, value) in [
            (off::LINE_BYTES, l.line_bytes),
            (off::SLOTS, l.slots),
            (off::RECORD_BYTES, l.record_bytes),
            (off::METADATA_OFFSET, l.metadata_offset),
            (off::COPY_REGION_BYTES, l.copy_region_bytes),
            (off::DATA_OFFSET, l.data_offset),
        ] {
            b[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        b[off::SHARDS..off::SHARDS + 4].copy_from_slice(&self.shards.to_le_bytes());
        b[off::PERSISTENCE] = self.persistence.code();
        b[off::STATE] = self.state.code();
        b[off::VOLUME_COUNT..off::VOLUME_COUNT + 2]
            .copy_from_slice(&(self.volumes.len() as u16).to_le_bytes());
        b[off::SETTINGS_LEN..off::SETTINGS_LEN + 2]
            .copy_from_slice(&(self.settings.len() as u16).to_le_bytes());
        let mut at = off::VARIABLE;
        for v in &self.volumes {
            b[at..at + 4].copy_from_slice(&v.id.to_le_bytes());
            b[at + 4..at + 12].copy_from_slice(&v.size_bytes.to_le_bytes());
            b[at + 12] = v.name.len() as u8;
            at += VOLUME_ENTRY_FIXED;
            if self.format_version >= FORMAT_VERSION_WRITES_EVERY_RECORD {
                let identity = v.identity.unwrap_or(VolumeIdentity { kind: 0, digest: 0 });
                b[at] = identity.kind;
                b[at + 1..at + 9].copy_from_slice(&identity.digest.to_le_bytes());
                at += VOLUME_IDENTITY_BYTES;
            }
            b[at..at + v.name.len()].copy_from_slice(v.name.as_bytes());
            at += v.name.len();
        }
        b[at..at + self.settings.len()].copy_from_slice(self.settings.as_bytes());
        let crc = crc32c::crc32c(&b[..off::CRC]);
        b[off::CRC..].copy_from_slice(&crc.to_le_bytes());
        Ok(b)
    }

    /// Decodes one superblock copy read from `device_offset` (0 for copy A,
    /// 4096 for copy B; used in error messages). `bytes` must be exactly
    /// [`SUPERBLOCK_BYTES`] long.
    ///
    /// Checks, in order: length, magic, crc32c, format version, then every
    /// field (reserved bytes and padding zero, layout equal to
    /// `Layout::for_slots`, codes in range, volume table and settings
    /// well-formed). Any `Ok` value re-encodes to exactly `bytes`.
    pub fn decode(bytes: &[u8], device_offset: u64) -> Result<Superblock, FormatError> {
        let at = SuperblockAt(device_offset);
        if bytes.len() != SUPERBLOCK_BYTES {
            return Err(FormatError::SuperblockLength { at, len: bytes.len() });
        }
        let magic: [u8; 8] = bytes[..8].try_into().expect("8 bytes");
        let stored = get_u32(bytes, off::CRC);
        if magic != MAGIC {
            // A flipped byte in the magic must not make a cache look like a
            // blank device (which would be formatted): with the magic put
            // back, does the crc match?
            let restored = crc32c::crc32c_append(crc32c::crc32c(&MAGIC), &bytes[8..off::CRC]);
            if restored == stored {
                return Err(FormatError::DamagedMagic { at, found: magic });
            }
            return Err(FormatError::NoMagic { at, found: magic });
        }
        let computed = crc32c::crc32c(&bytes[..off::CRC]);
        if stored != computed {
            return Err(FormatError::SuperblockCrc {
                at,
                offset: device_offset + off::CRC as u64,
                stored,
                computed,
            });
        }
        let version = get_u32(bytes, off::VERSION);
        if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion {
                at,
                offset: device_offset + off::VERSION as u64,
                found: version,
            });
        }
        let field = |name: &str, value: &dyn fmt::Display, offset: usize, reason: String| {
            FormatError::SuperblockField {
                at,
                field: name.to_string(),
                value: value.to_string(),
                offset: device_offset + offset as u64,
                reason,
            }
        };
        let check_zero = |name: &str, range: std::ops::Range<usize>| -> Result<(), FormatError> {
            match bytes[range.clone()].iter().position(|&x| x != 0) {
                None => Ok(()),
                Some(i) => Err(field(
                    name,
                    &format_args!("{:#04x}", bytes[range.start + i]),
                    range.start + i,
                    "must be zero".to_string(),
                )),
            }
        };
        check_zero("reserved", off::RESERVED0..off::RESERVED0 + 4)?;
        check_zero("reserved", off::RESERVED1..off::VARIABLE)?;

        let line_bytes = get_u64(bytes, off::LINE_BYTES);
        check_line_bytes(line_bytes)
            .map_err(|reason| field("line_bytes", &line_bytes, off::LINE_BYTES, reason))?;
        let slots = get_u64(bytes, off::SLOTS);
        let layout = Layout::for_slots_in_version(version, line_bytes, slots).map_err(|e| {
            let reason = match e {
                FormatError::Invalid { reason, .. } => reason,
                other => other.to_string(),
            };
            field("slots", &slots, off::SLOTS, reason)
        })?;
        for (name, at_off, want) in [
            ("record_bytes", off::RECORD_BYTES, layout.record_bytes),
            ("metadata_offset", off::METADATA_OFFSET, layout.metadata_offset),
            (
                "copy_region_bytes",
                off::COPY_REGION_BYTES,
                layout.copy_region_bytes,
            ),
            ("data_offset", off::DATA_OFFSET, layout.data_offset),
        ] {
            let value = get_u64(bytes, at_off);
            if value != want {
                return Err(field(
                    name,
                    &value,
                    at_off,
                    format!("expected {want} for {slots} slots of {line_bytes} bytes"),
                ));
            }
        }
        let shards = get_u32(bytes, off::SHARDS);
        if shards == 0 {
            return Err(field("shards", &shards, off::SHARDS, "at least one shard".into()));
        }
        // A one-byte code that names no value.
        let unknown_code = |name: &str, offset: usize, expected: &str| {
            field(name, &bytes[offset], offset, format!("expected {expected}"))
        };
        let persistence = Persistence::from_code(bytes[off::PERSISTENCE])
            .ok_or_else(|| unknown_code("persistence", off::PERSISTENCE, "0 (all), 1 (dirty) or 2 (none)"))?;
        let state = ShutdownState::from_code(bytes[off::STATE])
            .ok_or_else(|| unknown_code("state", off::STATE, "0 (clean) or 1 (running)"))?;
        // A 16-bit count, refused above `max`.
        let at_most = |name: &str, offset: usize, max: usize| -> Result<usize, FormatError> {
            let value = get_u16(bytes, offset) as usize;
            if value > max {
                return Err(field(name, &value, offset, format!("at most {max}")));
            }
            Ok(value)
        };
        let volume_count = at_most("volume_count", off::VOLUME_COUNT, MAX_VOLUMES)?;
        let settings_len = at_most("settings_len", off::SETTINGS_LEN, MAX_SETTINGS_BYTES)?;

        let mut volumes: Vec<VolumeEntry> = Vec::with_capacity(volume_count);
        let mut at_byte = off::VARIABLE;
        let fixed = entry_fixed(version);
        for i in 0..volume_count {
            if at_byte + fixed > off::CRC {
                return Err(field(
                    &format!("volumes[{i}]"),
                    &format_args!("{fixed}-byte entry header"),
                    at_byte,
                    format!(
                        "runs past the crc32c at offset {}",
                        device_offset + off::CRC as u64
                    ),
                ));
            }
            let id = get_u32(bytes, at_byte);
            let size_bytes = get_u64(bytes, at_byte + 4);
            let name_len = bytes[at_byte + 12] as usize;
            let name_at = at_byte + fixed;
            let identity = if fixed > VOLUME_ENTRY_FIXED {
                let kind_at = at_byte + VOLUME_ENTRY_FIXED;
                let digest = get_u64(bytes, kind_at + 1);
                match bytes[kind_at] {
                    0 if digest != 0 => {
                        return Err(field(
                            &format!("volumes[{i}].identity_digest"),
                            &format_args!("{digest:#018x}"),
                            kind_at + 1,
                            "must be zero when identity_kind is 0".to_string(),
                        ))
                    }
                    0 => None,
                    kind => Some(VolumeIdentity { kind, digest }),
                }
            } else {
                None
            };
            if name_at + name_len > off::CRC {
                return Err(field(
                    &format!("volumes[{i}].name_len"),
                    &name_len,
                    at_byte + 12,
                    format!(
                        "the name runs past the crc32c at offset {}",
                        device_offset + off::CRC as u64
                    ),
                ));
            }
            let name = std::str::from_utf8(&bytes[name_at..name_at + name_len]).map_err(|e| {
                field(
                    &format!("volumes[{i}].name"),
                    &format_args!("{name_len} bytes"),
                    name_at,
                    e.to_string(),
                )
            })?;
            if let Some(j) = volumes.iter().position(|w| w.id == id) {
                return Err(field(
                    &format!("volumes[{i}].id"),
                    &id,
                    at_byte,
                    format!("same id as volumes[{j}]"),
                ));
            }
            if let Some(j) = volumes.iter().position(|w| w.name == name) {
                return Err(field(
                    &format!("volumes[{i}].name"),
                    &format_args!("{name:?}"),
                    name_at,
                    format!("same name as volumes[{j}]"),
                ));
            }
            volumes.push(VolumeEntry {
                id,
                name: name.to_string(),
                size_bytes,
                identity,
            });
            at_byte = name_at + name_len;
        }
        if at_byte + settings_len > off::CRC {
            return Err(field(
                "settings_len",
                &settings_len,
                off::SETTINGS_LEN,
                format!(
                    "the settings at offset {} run past the crc32c at offset {}",
                    device_offset + at_byte as u64,
                    device_offset + off::CRC as u64
                ),
            ));
        }
        let settings = std::str::from_utf8(&bytes[at_byte..at_byte + settings_len])
            .map_err(|e| {
                field(
                    "settings",
                    &format_args!("{settings_len} bytes"),
                    at_byte,
                    e.to_string(),
                )
            })?
            .to_string();
        check_zero("padding", at_byte + settings_len..off::CRC)?;

        Ok(Superblock {
            format_version: version,
            sequence: get_u64(bytes, off::SEQUENCE),
            cache_uuid: bytes[off::UUID..off::UUID + 16].try_into().expect("16 bytes"),
            layout,
            shards,
            persistence,
            state,
            volumes,
            settings,
        })
    }
}

/// What [`pick_superblock`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // read once at start-up; the API keeps the superblock unboxed
pub enum SuperblockFound {
    /// Neither copy carries the magic: a fresh device, to be formatted.
    Blank,
    /// The current superblock.
    Found {
        /// The valid copy with the highest sequence (A on a tie).
        superblock: Superblock,
        /// Which copy it is: 0 (A, offset 0) or 1 (B, offset 4096).
        copy: u8,
        /// Why the other copy is not valid, if it is not (`NoMagic` when it
        /// was never written).
        other_copy_error: Option<FormatError>,
        /// The other copy is not valid and not all zero: damaged, or torn by
        /// an update that did not complete. It may have been the newest
        /// copy, so what `superblock` says about the shutdown cannot be
        /// believed: see [`SuperblockFound::shutdown_state`].
        other_copy_damaged: bool,
    },
}

impl SuperblockFound {
    /// The shutdown state to act on: the found superblock's, unless the
    /// other copy is damaged, in which case [`ShutdownState::Running`]. An
    /// invalid copy never means "clean": it may be the newest copy (damaged
    /// after it was written, or torn while being written), saying "running",
    /// while the valid older one says "clean". `None` for a blank device.
    pub fn shutdown_state(&self) -> Option<ShutdownState> {
        match self {
            SuperblockFound::Blank => None,
            SuperblockFound::Found {
                other_copy_damaged: true,
                ..
            } => Some(ShutdownState::Running),
            SuperblockFound::Found { superblock, .. } => Some(superblock.state),
        }
    }

    /// Where the next superblock update goes: the copy that is not the
    /// current one, and the sequence it carries (current + 1). `None` for a
    /// blank device, which is formatted instead (both copies written).
    pub fn update_target(&self) -> Option<(u8, u64)> {
        match self {
            SuperblockFound::Blank => None,
            SuperblockFound::Found { superblock, copy, .. } => {
                Some((1 - copy, superblock.sequence.wrapping_add(1)))
            }
        }
    }
}

/// Picks the current superblock from the two copies (`copy_a` read at
/// offset 0, `copy_b` at 4096, each exactly [`SUPERBLOCK_BYTES`]).
///
/// - Both valid: the one with the higher sequence (A on a tie).
/// - One valid: that one, with the other's error; the other copy counts as
///   damaged (`other_copy_damaged`, so the state is taken as running, see
///   [`SuperblockFound::shutdown_state`]) unless it is all zero (never
///   written).
/// - Neither carries the magic: [`SuperblockFound::Blank`].
/// - Otherwise (a magic but no valid copy): [`FormatError::NoValidSuperblock`]
///   naming both copies' problems.
///
/// Buffers of the wrong length are an error (`SuperblockLength`) whatever
/// they hold.
pub fn pick_superblock(copy_a: &[u8], copy_b: &[u8]) -> Result<SuperblockFound, FormatError> {
    for (bytes, offset) in [(copy_a, SUPERBLOCK_OFFSETS[0]), (copy_b, SUPERBLOCK_OFFSETS[1])] {
        if bytes.len() != SUPERBLOCK_BYTES {
            return Err(FormatError::SuperblockLength {
                at: SuperblockAt(offset),
                len: bytes.len(),
            });
        }
    }
    let a = Superblock::decode(copy_a, SUPERBLOCK_OFFSETS[0]);
    let b = Superblock::decode(copy_b, SUPERBLOCK_OFFSETS[1]);
    let written = |bytes: &[u8]| bytes.iter().any(|&x| x != 0);
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(if b.sequence > a.sequence {
            SuperblockFound::Found {
                superblock: b,
                copy: 1,
                other_copy_error: None,
                other_copy_damaged: false,
            }
        } else {
            SuperblockFound::Found {
                superblock: a,
                copy: 0,
                other_copy_error: None,
                other_copy_damaged: false,
            }
        }),
        (Ok(a), Err(e)) => Ok(SuperblockFound::Found {
            superblock: a,
            copy: 0,
            other_copy_error: Some(e),
            other_copy_damaged: written(copy_b),
        }),
        (Err(e), Ok(b)) => Ok(SuperblockFound::Found {
            superblock: b,
            copy: 1,
            other_copy_error: Some(e),
            other_copy_damaged: written(copy_a),
        }),
        (Err(ea), Err(eb)) => {
            if matches!(ea, FormatError::NoMagic { .. }) && matches!(eb, FormatError::NoMagic { .. }) {
                Ok(SuperblockFound::Blank)
            } else {
                Err(FormatError::NoValidSuperblock {
                    a: Box::new(ea),
                    b: Box::new(eb),
                })
            }
        }
    }
}
