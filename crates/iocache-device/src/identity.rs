//! A cache must never hand one backend's lines to
//! another, so a device says what it is in terms that survive a rename, a
//! restart and a reordering of device names at boot: a file by its inode
//! and birth time, a disk by its WWN or serial, a loop device by its
//! backing file, an NBD export by its address and name. The engine records
//! a digest of [`DeviceIdentity::key`] per volume on the cache device and
//! refuses a backend whose key differs.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// What kind of thing an identity names (stored beside its digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdentityKind {
    /// A regular file: inode and birth time.
    File,
    /// A block device: WWN, serial or the backing file of a loop device.
    BlockDevice,
    /// A remote NBD export: address and export name.
    Nbd,
    /// A device in RAM: this process's instance.
    Memory,
    /// Given by the operator (a UUID or any text), whatever the device is.
    Given,
}

impl IdentityKind {
    /// Every kind, in the order of [`IdentityKind::code`] (1, 2, ...).
    pub const ALL: [IdentityKind; 5] = [
        IdentityKind::File,
        IdentityKind::BlockDevice,
        IdentityKind::Nbd,
        IdentityKind::Memory,
        IdentityKind::Given,
    ];

    /// Its code on the cache device (never 0: 0 means "none recorded").
    pub fn code(self) -> u8 {
        match self {
            IdentityKind::File => 1,
            IdentityKind::BlockDevice => 2,
            IdentityKind::Nbd => 3,
            IdentityKind::Memory => 4,
            IdentityKind::Given => 5,
        }
    }

    /// The kind of a code, if it is one.
    pub fn from_code(code: u8) -> Option<IdentityKind> {
        IdentityKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// A word for messages.
    pub fn name(self) -> &'static str {
        match self {
            IdentityKind::File => "file",
            IdentityKind::BlockDevice => "block device",
            IdentityKind::Nbd => "NBD export",
            IdentityKind::Memory => "RAM device",
            IdentityKind::Given => "operator-given identity",
        }
    }
}

/// What a device is, as far as telling it from another goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceIdentity {
    pub kind: IdentityKind,
    /// Canonical text: the same for the same device across restarts and
    /// renames, different for another device. Only its digest is stored.
    pub key: String,
    /// Whether the key may change without the device changing (a block
    /// device known only by its major:minor numbers, a file whose
    /// filesystem gives no birth time): the engine says so in its log.
    pub weak: bool,
}

impl DeviceIdentity {
    /// An identity the operator gives (`text` is taken as it is).
    pub fn given(text: &str) -> DeviceIdentity {
        DeviceIdentity {
            kind: IdentityKind::Given,
            key: format!("given {text}"),
            weak: false,
        }
    }

    /// A fresh identity for a device that lives only in this process.
    pub fn memory() -> DeviceIdentity {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        DeviceIdentity {
            kind: IdentityKind::Memory,
            key: format!(
                "memory pid={} n={} t={nanos}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            weak: false,
        }
    }

    /// An NBD export: its URI (address) and export name.
    pub fn nbd(uri: &str, export: &str) -> DeviceIdentity {
        DeviceIdentity {
            kind: IdentityKind::Nbd,
            key: format!("nbd uri={uri} export={export}"),
            weak: false,
        }
    }

    /// The identity of an open regular file or block device.
    pub fn of_file(file: &File) -> std::io::Result<DeviceIdentity> {
        let meta = file.metadata()?;
        if meta.file_type().is_block_device() {
            return Ok(block_device(meta.rdev()));
        }
        Ok(regular_file(file, &meta))
    }
}

impl std::fmt::Display for DeviceIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.kind.name(), self.key)
    }
}

/// A regular file: inode and birth time (`statx`), which a rename keeps and
/// a copy does not. Without a birth time, the filesystem's device number
/// stands in (weak: it may change at a reboot).
fn regular_file(file: &File, meta: &std::fs::Metadata) -> DeviceIdentity {
    // SAFETY: statx with AT_EMPTY_PATH on a valid fd fills the struct we own.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_INO | libc::STATX_BTIME,
            &mut stx,
        )
    };
    // The filesystem's id (from its UUID on ext4 and btrfs, its device on
    // xfs; its own per btrfs subvolume): a snapshot or a block-level copy
    // of the filesystem keeps inode numbers and birth times.
    let fsid = filesystem_id(file).map_or_else(String::new, |id| format!("fs={id:016x} "));
    if rc == 0 && stx.stx_mask & libc::STATX_BTIME != 0 {
        return DeviceIdentity {
            kind: IdentityKind::File,
            key: format!(
                "file {fsid}ino={} born={}.{:09}",
                stx.stx_ino, stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec
            ),
            weak: false,
        };
    }
    DeviceIdentity {
        kind: IdentityKind::File,
        key: format!(
            "file dev={}:{} ino={}",
            libc::major(meta.dev()),
            libc::minor(meta.dev()),
            meta.ino()
        ),
        weak: true,
    }
}

/// The filesystem id `fstatfs` gives for the file, when it gives one.
fn filesystem_id(file: &File) -> Option<u64> {
    // SAFETY: fstatfs on a valid fd fills the struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    // fsid_t is two ints; read them without naming its private fields.
    // SAFETY: fsid_t is 8 bytes of plain integers.
    let raw: [i32; 2] = unsafe { std::mem::transmute(st.f_fsid) };
    let id = (u64::from(raw[0] as u32) << 32) | u64::from(raw[1] as u32);
    (id != 0).then_some(id)
}

/// Reads a sysfs attribute, trimmed; `None` when missing or empty.
fn sysfs(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// A block device by what the hardware or the kernel says it is: a WWN or
/// serial (whole disk or its partition number), a device-mapper or md UUID,
/// or a loop device's backing file; its major:minor numbers only when none
/// of these exists (weak: names and numbers may be reordered at boot).
fn block_device(rdev: u64) -> DeviceIdentity {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let sys = Path::new("/sys/dev/block").join(format!("{major}:{minor}"));
    if let Some(key) = hardware_key(&sys) {
        return DeviceIdentity {
            kind: IdentityKind::BlockDevice,
            key,
            weak: false,
        };
    }
    DeviceIdentity {
        kind: IdentityKind::BlockDevice,
        key: format!("blockdev dev={major}:{minor}"),
        weak: true,
    }
}

/// The stable key of a block device's sysfs directory, if it has one.
fn hardware_key(sys: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(sys).ok()?;
    if let Some(part) = sysfs(&dir.join("partition")) {
        // A partition: its disk's key and its number.
        let disk = dir.parent()?;
        return hardware_key(disk).map(|key| format!("{key} part={part}"));
    }
    for (attr, label) in [
        ("wwid", "wwid"),
        ("device/wwid", "wwid"),
        ("device/serial", "serial"),
        ("serial", "serial"),
        ("dm/uuid", "dm-uuid"),
        ("md/uuid", "md-uuid"),
    ] {
        if let Some(value) = sysfs(&dir.join(attr)) {
            return Some(format!("blockdev {label}={value}"));
        }
    }
    let backing = sysfs(&dir.join("loop/backing_file"))?;
    let offset = sysfs(&dir.join("loop/offset")).unwrap_or_else(|| "0".to_string());
    let file = File::open(&backing).ok()?;
    let meta = file.metadata().ok()?;
    let inner = regular_file(&file, &meta);
    Some(format!("loop offset={offset} of {}", inner.key))
}

/// A device under an identity the operator gave (a UUID, a label): for a
/// backend whose own identity is weak or changes. Everything else is the
/// wrapped device's.
#[derive(Debug)]
pub struct Identified {
    inner: std::sync::Arc<dyn crate::BlockDevice>,
    identity: DeviceIdentity,
}

impl Identified {
    /// `inner` known as [`DeviceIdentity::given`]`(text)`.
    pub fn new(inner: std::sync::Arc<dyn crate::BlockDevice>, text: &str) -> Identified {
        Identified {
            inner,
            identity: DeviceIdentity::given(text),
        }
    }
}

impl crate::BlockDevice for Identified {
    crate::device::forward_block_device!(inner;
        len_bytes, read_at, write_at, flush, discard, zeroes_fast, allocation, write_zeroes,
        alignment, name, raw_target, in_place, write_tearable_at, in_place_sound, check_intact,
        reads_at_memory_speed,
    );
    fn identity(&self) -> Option<DeviceIdentity> {
        Some(self.identity.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_never_use_zero() {
        for kind in IdentityKind::ALL {
            assert_ne!(kind.code(), 0);
            assert_eq!(IdentityKind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(IdentityKind::from_code(0), None);
        assert_eq!(IdentityKind::from_code(200), None);
    }

    #[test]
    fn a_file_keeps_its_identity_across_a_rename_and_a_copy_does_not() {
        let dir = std::env::temp_dir().join(format!("iocache-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.img");
        std::fs::write(&a, vec![7u8; 4096]).unwrap();
        let before = DeviceIdentity::of_file(&File::open(&a).unwrap()).unwrap();
        let renamed = dir.join("renamed.img");
        std::fs::rename(&a, &renamed).unwrap();
        let after = DeviceIdentity::of_file(&File::open(&renamed).unwrap()).unwrap();
        assert_eq!(before, after);
        let copy = dir.join("copy.img");
        std::fs::copy(&renamed, &copy).unwrap();
        let copied = DeviceIdentity::of_file(&File::open(&copy).unwrap()).unwrap();
        assert_ne!(before.key, copied.key, "a copy is another file");
        assert_eq!(before.kind, IdentityKind::File);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memory_identities_differ() {
        assert_ne!(DeviceIdentity::memory(), DeviceIdentity::memory());
        assert_eq!(DeviceIdentity::given("x"), DeviceIdentity::given("x"));
        assert_ne!(
            DeviceIdentity::nbd("nbd://a", "e"),
            DeviceIdentity::nbd("nbd://b", "e")
        );
    }
}
