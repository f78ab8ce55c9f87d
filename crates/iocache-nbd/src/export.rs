//! What the NBD server serves: the [`Export`] trait, its errors, and a
//! RAM-backed export.
//!
//! The server knows nothing about caches or devices; it calls this trait from
//! its worker threads (concurrently, hence `Send + Sync`) after checking each
//! request against the export's size and block sizes. The cache engine will
//! implement it; [`MemExport`] is the default export and the test double.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, RwLock};

use thiserror::Error;

use crate::proto::{NBD_EINVAL, NBD_EIO, NBD_ENOMEM, NBD_ENOSPC, NBD_ENOTSUP, NBD_EPERM, NBD_ESHUTDOWN};

/// Why an export operation failed. Each variant maps to one NBD error
/// number ([`ExportError::nbd_errno`]) sent to the client.
#[derive(Debug, Error)]
pub enum ExportError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("range outside the export")]
    OutOfRange,
    #[error("export is read-only")]
    ReadOnly,
    #[error("no space left")]
    NoSpace,
    #[error("operation not supported")]
    NotSupported,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("out of memory")]
    NoMemory,
    #[error("export is shutting down")]
    Shutdown,
}

impl ExportError {
    /// The NBD error number for this error. I/O errors map by their OS
    /// error where the protocol has an equivalent (EDQUOT and EFBIG become
    /// ENOSPC as the spec asks, EROFS becomes EPERM), and to EIO otherwise.
    pub fn nbd_errno(&self) -> u32 {
        match self {
            ExportError::Io(e) => io_errno(e),
            ExportError::OutOfRange | ExportError::Invalid(_) => NBD_EINVAL,
            ExportError::ReadOnly => NBD_EPERM,
            ExportError::NoSpace => NBD_ENOSPC,
            ExportError::NotSupported => NBD_ENOTSUP,
            ExportError::NoMemory => NBD_ENOMEM,
            ExportError::Shutdown => NBD_ESHUTDOWN,
        }
    }
}

/// Linux errno values the protocol distinguishes.
fn io_errno(e: &io::Error) -> u32 {
    const EPERM: i32 = 1;
    const ENOMEM: i32 = 12;
    const EACCES: i32 = 13;
    const EFBIG: i32 = 27;
    const ENOSPC: i32 = 28;
    const EROFS: i32 = 30;
    const EINVAL: i32 = 22;
    const EOPNOTSUPP: i32 = 95;
    const EDQUOT: i32 = 122;
    match e.raw_os_error() {
        Some(EPERM | EACCES | EROFS) => NBD_EPERM,
        Some(ENOMEM) => NBD_ENOMEM,
        Some(EFBIG | ENOSPC | EDQUOT) => NBD_ENOSPC,
        Some(EINVAL) => NBD_EINVAL,
        Some(EOPNOTSUPP) => NBD_ENOTSUP,
        Some(_) => NBD_EIO,
        None => match e.kind() {
            io::ErrorKind::PermissionDenied => NBD_EPERM,
            io::ErrorKind::InvalidInput => NBD_EINVAL,
            io::ErrorKind::OutOfMemory => NBD_ENOMEM,
            io::ErrorKind::Unsupported => NBD_ENOTSUP,
            _ => NBD_EIO,
        },
    }
}

/// Bytes of zeroes the default [`Export::write_zeroes`] writes at a time.
pub const WRITE_ZEROES_CHUNK: usize = 1 << 20;

/// Where [`Export::read_in_place`] hands the bytes of a read: the parts, in
/// order, valid only during the call; it returns whether it took them.
pub type InPlace<'a> = &'a mut dyn FnMut(&[&[u8]]) -> bool;

/// A block device as the NBD server sees it.
///
/// The server calls these methods from several threads at once, only with
/// ranges inside `0..size_bytes()` (out-of-range requests are answered
/// before reaching the export), aligned to the minimum block size, and with
/// `read`/`write` lengths at most the maximum block size. Overlapping
/// concurrent requests may run in any order, as on a real disk.
pub trait Export: Send + Sync + 'static {
    /// Size of the export in bytes. Must not change while it is served.
    fn size_bytes(&self) -> u64;

    /// Fills `buf` with the bytes at `offset`: every byte, on success (the
    /// server reuses its buffers and does not clear them first).
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;

    /// Whether a read of `length` bytes at `offset` would complete now
    /// without waiting on slow I/O (a cache hit, memory). A hint: the server
    /// then serves the read on the thread that read the request, while more
    /// requests wait in its buffer, instead of waking another thread; a
    /// wrong "yes" only delays the requests behind it. The default says no.
    fn read_is_quick(&self, offset: u64, length: u64) -> bool {
        let _ = (offset, length);
        false
    }

    /// Reads `buf.len()` bytes at `offset` as [`Export::read`] does, or
    /// hands them where they lie (a cache in memory) to `in_place`, valid
    /// only during the call, which returns whether it took them (else they
    /// are copied into `buf`); returns whether they were taken. The server
    /// then writes its reply from those bytes, one copy fewer. The default
    /// reads into `buf`.
    fn read_in_place(&self, offset: u64, buf: &mut [u8], in_place: InPlace<'_>) -> Result<bool, ExportError> {
        let _ = in_place;
        self.read(offset, buf).map(|()| false)
    }

    /// Writes `data` at `offset`; with `fua`, the data must be persistent
    /// before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;

    /// Makes every write that has returned persistent.
    fn flush(&self) -> Result<(), ExportError>;

    /// Tells the export a range is no longer needed. Advisory: the default
    /// does nothing, and the range's contents are unspecified afterwards.
    fn trim(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        let _ = (offset, length);
        Ok(())
    }

    /// Makes a range read as zeroes. With `no_hole` the range must stay
    /// allocated (no hole may be punched). The default writes a zero buffer
    /// in chunks of [`WRITE_ZEROES_CHUNK`] bytes, which honours `no_hole`.
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool, no_hole: bool) -> Result<(), ExportError> {
        let _ = no_hole;
        let zeroes = vec![0u8; WRITE_ZEROES_CHUNK.min(length as usize)];
        let mut done = 0u64;
        while done < length {
            let n = (length - done).min(zeroes.len() as u64) as usize;
            self.write(offset + done, &zeroes[..n], false)?;
            done += n as u64;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Whether [`Export::write_zeroes`] is much quicker than writing zero
    /// buffers. A WRITE_ZEROES with FAST_ZERO is answered ENOTSUP at once,
    /// without calling it, when this says no (the default).
    fn zeroes_fast(&self) -> bool {
        false
    }

    /// Whether the export serves NBD_CMD_CACHE (advertised as
    /// NBD_FLAG_SEND_CACHE; without it the server answers CACHE with
    /// EINVAL). The default says no.
    fn can_cache(&self) -> bool {
        false
    }

    /// Brings `length` bytes at `offset` into the export's cache, sending
    /// no data back (NBD_CMD_CACHE). Advisory: the default does nothing.
    fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        let _ = (offset, length);
        Ok(())
    }

    /// The allocation status of `length` bytes at `offset` (the
    /// `base:allocation` context of NBD_CMD_BLOCK_STATUS): extents in
    /// order from `offset`, covering at least its first byte and at most
    /// `length` bytes, each with its `NBD_STATE_*` flags. The default says
    /// the whole range is allocated data.
    fn block_status(&self, offset: u64, length: u32) -> Result<Vec<crate::proto::Extent>, ExportError> {
        let _ = offset;
        Ok(vec![crate::proto::Extent { length, flags: 0 }])
    }

    /// Whether flush and FUA on one connection are visible to all others
    /// (advertised as NBD_FLAG_CAN_MULTI_CONN).
    fn can_multi_conn(&self) -> bool {
        false
    }

    /// Whether writes are refused (advertised as NBD_FLAG_READ_ONLY; the
    /// server then answers writes, trims and write-zeroes with EPERM).
    fn read_only(&self) -> bool {
        false
    }

    /// Minimum, preferred and maximum block sizes. The minimum and preferred
    /// must be powers of two (minimum at most 64 KiB, preferred at least 512
    /// and at least the minimum), the maximum a multiple of the minimum and
    /// at least the preferred. The server advertises them and enforces the
    /// minimum alignment and (capped by its own limit) the maximum.
    fn block_sizes(&self) -> (u32, u32, u32) {
        (512, 4096, 32 << 20)
    }

    /// A description for humans (NBD_INFO_DESCRIPTION and NBD_OPT_LIST).
    fn description(&self) -> Option<String> {
        None
    }
}

/// An export held in memory: zeroes at creation, shared by every
/// connection (so it can advertise multi-conn), nothing to persist.
#[derive(Debug)]
pub struct MemExport {
    data: RwLock<Vec<u8>>,
    size: u64,
    read_only: bool,
    description: Option<String>,
    block_sizes: (u32, u32, u32),
}

impl MemExport {
    /// A zero-filled export of `size_bytes` (the memory is allocated zeroed,
    /// so untouched pages cost nothing on Linux).
    pub fn new(size_bytes: usize) -> MemExport {
        MemExport::from_vec(vec![0u8; size_bytes])
    }

    /// An export holding `data`.
    pub fn from_vec(data: Vec<u8>) -> MemExport {
        MemExport {
            size: data.len() as u64,
            data: RwLock::new(data),
            read_only: false,
            description: None,
            block_sizes: (512, 4096, 32 << 20),
        }
    }

    /// Makes the export read-only.
    pub fn with_read_only(mut self, read_only: bool) -> MemExport {
        self.read_only = read_only;
        self
    }

    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> MemExport {
        self.description = Some(description.into());
        self
    }

    /// Sets the block sizes (minimum, preferred, maximum).
    pub fn with_block_sizes(mut self, minimum: u32, preferred: u32, maximum: u32) -> MemExport {
        self.block_sizes = (minimum, preferred, maximum);
        self
    }

    /// A copy of the contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn range(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>, ExportError> {
        let end = offset.checked_add(len).ok_or(ExportError::OutOfRange)?;
        if end > self.size {
            return Err(ExportError::OutOfRange);
        }
        Ok(offset as usize..end as usize)
    }
}

impl Export for MemExport {
    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let r = self.range(offset, buf.len() as u64)?;
        let data = self.data.read().unwrap_or_else(|e| e.into_inner());
        buf.copy_from_slice(&data[r]);
        Ok(())
    }

    /// Memory: every read in range is served at once.
    fn read_is_quick(&self, offset: u64, length: u64) -> bool {
        self.range(offset, length).is_ok()
    }

    /// The bytes where they lie, under the lock that keeps writers away.
    fn read_in_place(&self, offset: u64, buf: &mut [u8], in_place: InPlace<'_>) -> Result<bool, ExportError> {
        let r = self.range(offset, buf.len() as u64)?;
        let data = self.data.read().unwrap_or_else(|e| e.into_inner());
        if in_place(&[&data[r.clone()]]) {
            return Ok(true);
        }
        buf.copy_from_slice(&data[r]);
        Ok(false)
    }

    fn write(&self, offset: u64, src: &[u8], _fua: bool) -> Result<(), ExportError> {
        if self.read_only {
            return Err(ExportError::ReadOnly);
        }
        let r = self.range(offset, src.len() as u64)?;
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        data[r].copy_from_slice(src);
        Ok(())
    }

    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }

    fn trim(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        if self.read_only {
            return Err(ExportError::ReadOnly);
        }
        self.range(offset, length)?;
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, length: u64, _fua: bool, _no_hole: bool) -> Result<(), ExportError> {
        if self.read_only {
            return Err(ExportError::ReadOnly);
        }
        let r = self.range(offset, length)?;
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        data[r].fill(0);
        Ok(())
    }

    fn zeroes_fast(&self) -> bool {
        true
    }

    fn can_multi_conn(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn block_sizes(&self) -> (u32, u32, u32) {
        self.block_sizes
    }

    fn description(&self) -> Option<String> {
        self.description.clone()
    }
}

/// Where the handshake finds exports: a fixed [`Exports`], or the table of a
/// running server that exports can join and leave (each option of a
/// handshake looks it up afresh).
pub trait ExportLookup {
    /// The export a client asked for, with its canonical name (see
    /// [`Exports::find`]).
    fn find_export(&self, name: &str) -> Option<(String, Arc<dyn Export>)>;
    /// Every export's name and description, for NBD_OPT_LIST.
    fn list_exports(&self) -> Vec<(String, Option<String>)>;
    /// The client's last option was accepted for export `name`: called just
    /// before the reply that puts the client in transmission is written, so
    /// the server can count the connection as transmitting before the
    /// client can act on it. `false` (the connection was closed meanwhile)
    /// ends the handshake without that reply.
    fn entering_transmission(&self, _name: &str) -> bool {
        true
    }
}

impl ExportLookup for Exports {
    fn find_export(&self, name: &str) -> Option<(String, Arc<dyn Export>)> {
        self.find(name).map(|(n, e)| (n.to_string(), Arc::clone(e)))
    }

    fn list_exports(&self) -> Vec<(String, Option<String>)> {
        self.iter()
            .map(|(n, e)| (n.to_string(), e.description()))
            .collect()
    }
}

/// The exports of a server by name. The empty name `""` reaches the
/// default export (the first one inserted unless [`Exports::set_default`]
/// says otherwise), as NBD_OPT_EXPORT_NAME and NBD_OPT_GO require.
#[derive(Clone, Default)]
pub struct Exports {
    map: BTreeMap<String, Arc<dyn Export>>,
    default: Option<String>,
}

impl std::fmt::Debug for Exports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exports")
            .field("names", &self.map.keys().collect::<Vec<_>>())
            .field("default", &self.default)
            .finish()
    }
}

impl Exports {
    /// No exports.
    pub fn new() -> Exports {
        Exports::default()
    }

    /// Adds or replaces an export. The first one added becomes the default.
    pub fn insert(&mut self, name: impl Into<String>, export: Arc<dyn Export>) {
        let name = name.into();
        if self.default.is_none() {
            self.default = Some(name.clone());
        }
        self.map.insert(name, export);
    }

    /// Removes the export `name`, returning it. If it was the default export,
    /// the empty name reaches nothing until an export of that name is
    /// inserted again.
    pub fn remove(&mut self, name: &str) -> Option<Arc<dyn Export>> {
        self.map.remove(name)
    }

    /// Whether an export of exactly this name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Makes `name` the default export; false if there is no such export.
    pub fn set_default(&mut self, name: &str) -> bool {
        if self.map.contains_key(name) {
            self.default = Some(name.to_string());
            true
        } else {
            false
        }
    }

    /// The export a client asked for, with its canonical name: an exact
    /// match first, then the default export for the empty name.
    pub fn find(&self, name: &str) -> Option<(&str, &Arc<dyn Export>)> {
        if let Some((k, v)) = self.map.get_key_value(name) {
            return Some((k.as_str(), v));
        }
        if name.is_empty() {
            let d = self.default.as_deref()?;
            return self.map.get_key_value(d).map(|(k, v)| (k.as_str(), v));
        }
        None
    }

    /// Every export, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<dyn Export>)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of exports.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are no exports.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Checks block sizes against the protocol's rules (see
/// [`Export::block_sizes`]); the error says which rule is broken.
pub fn validate_block_sizes(sizes: (u32, u32, u32)) -> Result<(), String> {
    let (min, pref, max) = sizes;
    if !min.is_power_of_two() || min > 65536 {
        return Err(format!(
            "minimum block size {min} is not a power of two up to 64 KiB"
        ));
    }
    if !pref.is_power_of_two() || pref < min.max(512) {
        return Err(format!(
            "preferred block size {pref} is not a power of two at least max(512, minimum)"
        ));
    }
    if max != u32::MAX && (max % min != 0 || max < pref) {
        return Err(format!(
            "maximum block size {max} is not a multiple of the minimum at least the preferred"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_default_and_lookup() {
        let mut x = Exports::new();
        assert!(x.find("").is_none());
        x.insert("a", Arc::new(MemExport::new(512)));
        x.insert("b", Arc::new(MemExport::new(1024)));
        assert_eq!(x.find("").unwrap().0, "a");
        assert_eq!(x.find("b").unwrap().1.size_bytes(), 1024);
        assert!(x.find("c").is_none());
        assert!(x.set_default("b"));
        assert!(!x.set_default("zz"));
        assert_eq!(x.find("").unwrap().0, "b");
        assert_eq!(x.len(), 2);
        x.insert("", Arc::new(MemExport::new(2048)));
        assert_eq!(
            x.find("").unwrap().1.size_bytes(),
            2048,
            "an export named \"\" wins"
        );
    }

    #[test]
    fn block_size_rules() {
        assert!(validate_block_sizes((512, 4096, 32 << 20)).is_ok());
        assert!(validate_block_sizes((1, 512, u32::MAX)).is_ok());
        assert!(validate_block_sizes((3, 4096, 4096)).is_err());
        assert!(validate_block_sizes((1 << 17, 1 << 17, 1 << 20)).is_err());
        assert!(validate_block_sizes((512, 256, 4096)).is_err());
        assert!(validate_block_sizes((4096, 512, 8192)).is_err());
        assert!(validate_block_sizes((512, 4096, 1000)).is_err());
        assert!(validate_block_sizes((512, 4096, 2048)).is_err());
    }

    #[test]
    fn errno_mapping() {
        assert_eq!(ExportError::OutOfRange.nbd_errno(), NBD_EINVAL);
        assert_eq!(ExportError::ReadOnly.nbd_errno(), NBD_EPERM);
        assert_eq!(ExportError::NoSpace.nbd_errno(), NBD_ENOSPC);
        assert_eq!(ExportError::NotSupported.nbd_errno(), NBD_ENOTSUP);
        assert_eq!(ExportError::NoMemory.nbd_errno(), NBD_ENOMEM);
        assert_eq!(ExportError::Shutdown.nbd_errno(), NBD_ESHUTDOWN);
        assert_eq!(ExportError::Invalid("x".into()).nbd_errno(), NBD_EINVAL);
        let os = |n| ExportError::Io(io::Error::from_raw_os_error(n)).nbd_errno();
        assert_eq!(os(5), NBD_EIO);
        assert_eq!(os(28), NBD_ENOSPC);
        assert_eq!(os(122), NBD_ENOSPC);
        assert_eq!(os(27), NBD_ENOSPC);
        assert_eq!(os(30), NBD_EPERM);
        assert_eq!(os(22), NBD_EINVAL);
        assert_eq!(ExportError::Io(io::Error::other("x")).nbd_errno(), NBD_EIO);
    }

    #[test]
    fn mem_export_reads_what_was_written() {
        let e = MemExport::new(8192);
        e.write(1000, b"hello", false).unwrap();
        let mut b = [0u8; 7];
        e.read(999, &mut b).unwrap();
        assert_eq!(&b, b"\0hello\0");
        e.write_zeroes(1001, 2, true, true).unwrap();
        e.read(999, &mut b).unwrap();
        assert_eq!(&b, b"\0h\0\0lo\0");
        assert!(matches!(e.read(8190, &mut b), Err(ExportError::OutOfRange)));
        assert!(matches!(
            e.write(u64::MAX, b"x", false),
            Err(ExportError::OutOfRange)
        ));
        assert!(e.can_multi_conn());
    }

    #[test]
    fn read_only_mem_export_refuses_writes() {
        let e = MemExport::from_vec(vec![7; 1024]).with_read_only(true);
        assert!(e.read_only());
        assert!(matches!(e.write(0, b"x", false), Err(ExportError::ReadOnly)));
        assert!(matches!(e.trim(0, 512), Err(ExportError::ReadOnly)));
        assert!(matches!(
            e.write_zeroes(0, 512, false, false),
            Err(ExportError::ReadOnly)
        ));
        assert_eq!(e.snapshot(), vec![7; 1024]);
    }
}
