//! One error type for the whole device layer, so that
//! every failure names the device, the byte offset and the length it was
//! about, and the cache engine can report "which device, where" without
//! extra bookkeeping.

use std::io;
use std::path::PathBuf;

/// The kind of I/O an error (or an injected fault) is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    /// A positional read.
    Read,
    /// A positional write.
    Write,
    /// A durability barrier (`fdatasync` for files).
    Flush,
    /// A discard / hole punch.
    Discard,
}

impl std::fmt::Display for IoKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
            IoKind::Discard => "discard",
        })
    }
}

/// Every error the device layer reports.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// Opening (or sizing) a device failed.
    #[error("cannot open device {path}: {what}: {source}")]
    Open {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// Another open of the same file or block device holds it: another
    /// process (named in `holders` where `/proc` tells), or this one.
    #[error("{path} is in use by {}: a device is served by one process at a time (two caches on one device overwrite each other's data)", holders_text(.holders))]
    Busy { path: PathBuf, holders: Vec<String> },
    /// A request reaches past the end of the device.
    #[error("{kind} of {len} bytes at offset {offset} is out of range on device {device} ({size} bytes)")]
    OutOfRange {
        device: String,
        kind: IoKind,
        offset: u64,
        len: u64,
        size: u64,
    },
    /// The operating system reported an error for this I/O.
    #[error("{kind} of {len} bytes at offset {offset} on device {device} failed: {source}")]
    Io {
        device: String,
        kind: IoKind,
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    /// A write, flush or discard on a device opened read-only.
    #[error("{kind} of {len} bytes at offset {offset} on read-only device {device}")]
    ReadOnly {
        device: String,
        kind: IoKind,
        offset: u64,
        len: u64,
    },
    /// A fault injected by [`crate::FaultDevice`].
    #[error("injected fault ({fault}): {kind} of {len} bytes at offset {offset} on device {device}")]
    Injected {
        device: String,
        kind: IoKind,
        offset: u64,
        len: u64,
        fault: &'static str,
    },
    /// io_uring cannot be used here (kernel without it, sandbox that forbids it, ...).
    #[error("io_uring is unavailable: {what}: {source}")]
    UringUnavailable {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The io_uring engine itself failed (not one request).
    #[error("io_uring engine failed: {what}: {source}")]
    Engine {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The device is smaller than when it was opened (a file truncated
    /// under it): what it held past `now` is gone.
    #[error("device {device} has {now} bytes, fewer than its {len}: it was truncated, and what it held past byte {now} is gone")]
    Shrunk { device: String, now: u64, len: u64 },
    /// A request in a batch that the engine never ran (only seen when the
    /// whole batch failed before reaching it).
    #[error("{kind} of {len} bytes at offset {offset} on device {device} was not executed")]
    NotExecuted {
        device: String,
        kind: IoKind,
        offset: u64,
        len: u64,
    },
}

fn holders_text(holders: &[String]) -> String {
    if holders.is_empty() {
        "another process".to_string()
    } else {
        holders.join(", ")
    }
}

impl DeviceError {
    /// The offset the error is about, when it is about one request.
    pub fn offset(&self) -> Option<u64> {
        match self {
            DeviceError::OutOfRange { offset, .. }
            | DeviceError::Io { offset, .. }
            | DeviceError::ReadOnly { offset, .. }
            | DeviceError::Injected { offset, .. }
            | DeviceError::NotExecuted { offset, .. } => Some(*offset),
            _ => None,
        }
    }

    /// Whether the error was injected by a [`crate::FaultDevice`].
    pub fn is_injected(&self) -> bool {
        matches!(self, DeviceError::Injected { .. })
    }
}
