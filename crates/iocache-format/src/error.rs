//! `FormatError`: every way a value or a device image can fail to be a valid
//! iocache cache device, each naming the field and where it lies.

use std::fmt;

use crate::{FORMAT_VERSION, FORMAT_VERSION_OLDEST, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS};

/// Names a superblock copy by its device offset in messages:
/// `superblock copy A at offset 0`, `superblock copy B at offset 4096`, or
/// `superblock at offset N` for any other offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperblockAt(pub u64);

impl fmt::Display for SuperblockAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == SUPERBLOCK_OFFSETS[0] {
            write!(f, "superblock copy A at offset {}", self.0)
        } else if self.0 == SUPERBLOCK_OFFSETS[1] {
            write!(f, "superblock copy B at offset {}", self.0)
        } else {
            write!(f, "superblock at offset {}", self.0)
        }
    }
}

/// An error of the on-disk format.
///
/// Errors about bytes read from a device name the superblock copy (or the
/// metadata copy) and the device offset of the offending field; errors about
/// values passed in by the caller (a layout request, a record to encode, a
/// superblock to encode) name the field and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A value given by the caller is out of range or inconsistent.
    #[error("{field} = {value}: {reason}")]
    Invalid {
        /// The field or argument (`line_bytes`, `volumes[3].name`, `record.line.valid`...).
        field: String,
        /// Its value, as text.
        value: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The device cannot hold even one slot of this line size.
    #[error(
        "device_bytes = {device_bytes}: too small for one {line_bytes}-byte line, \
         the smallest layout needs {needed} bytes"
    )]
    DeviceTooSmall {
        /// The device size given.
        device_bytes: u64,
        /// The line size asked for.
        line_bytes: u64,
        /// The size of the one-slot layout.
        needed: u64,
    },

    /// A superblock buffer that is not exactly [`SUPERBLOCK_BYTES`] long.
    #[error("{at}: {len} bytes given, a superblock copy is exactly {SUPERBLOCK_BYTES} bytes")]
    SuperblockLength {
        /// Which copy.
        at: SuperblockAt,
        /// The buffer's length.
        len: usize,
    },

    /// The copy does not start with [`MAGIC`](crate::MAGIC): never written
    /// (or not an iocache device).
    #[error("{at}: field magic = {found:02x?} at offset {at_offset}: not \"IOCACHE\\0\"", at_offset = .at.0)]
    NoMagic {
        /// Which copy.
        at: SuperblockAt,
        /// The first eight bytes found.
        found: [u8; 8],
    },

    /// The copy does not start with [`MAGIC`](crate::MAGIC), but its crc32c
    /// matches its bytes with the magic put back: a superblock whose magic
    /// was damaged, not a device that never held one.
    #[error(
        "{at}: field magic = {found:02x?} at offset {at_offset}: damaged (the crc32c matches \"IOCACHE\\0\")",
        at_offset = .at.0
    )]
    DamagedMagic {
        /// Which copy.
        at: SuperblockAt,
        /// The first eight bytes found.
        found: [u8; 8],
    },

    /// The stored crc32c does not match the copy's bytes.
    #[error("{at}: crc32c {stored:#010x} (field crc32c at offset {offset}) expected {computed:#010x}")]
    SuperblockCrc {
        /// Which copy.
        at: SuperblockAt,
        /// Device offset of the crc field.
        offset: u64,
        /// The crc stored in the copy.
        stored: u32,
        /// The crc of the copy's bytes.
        computed: u32,
    },

    /// A well-formed superblock of a format version this build does not read.
    #[error(
        "{at}: field format_version = {found} at offset {offset}: \
         this build reads format versions {FORMAT_VERSION_OLDEST} to {FORMAT_VERSION}"
    )]
    UnsupportedVersion {
        /// Which copy.
        at: SuperblockAt,
        /// Device offset of the version field.
        offset: u64,
        /// The version found.
        found: u32,
    },

    /// A superblock field (crc correct) with a value out of range.
    #[error("{at}: field {field} = {value} at offset {offset}: {reason}")]
    SuperblockField {
        /// Which copy.
        at: SuperblockAt,
        /// The field (`line_bytes`, `volumes[2].name`, `padding`...).
        field: String,
        /// Its value, as text.
        value: String,
        /// Device offset of the field.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// At least one copy carries the magic but neither is valid.
    #[error("no valid superblock: {a}; {b}")]
    NoValidSuperblock {
        /// Why copy A is not valid.
        a: Box<FormatError>,
        /// Why copy B is not valid.
        b: Box<FormatError>,
    },

    /// A metadata copy region given to [`load_metadata`](crate::load_metadata)
    /// is shorter than the layout's record table.
    #[error(
        "metadata copy {copy} at offset {device_offset}: {len} bytes given, \
         the record table needs {needed}"
    )]
    MetadataRegionLength {
        /// Copy 0 or 1.
        copy: u8,
        /// Device offset of the region.
        device_offset: u64,
        /// Bytes given.
        len: usize,
        /// `slots * record_bytes`.
        needed: u64,
    },
}

impl FormatError {
    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        FormatError::Invalid {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
