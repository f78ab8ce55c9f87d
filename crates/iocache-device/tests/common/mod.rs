//! Helpers shared by the device tests: temporary
//! device files that remove themselves, and deterministic test patterns.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A path under `dir` that is removed when dropped.
pub struct TempPath(pub PathBuf);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl TempPath {
    pub fn new(dir: &str, tag: &str) -> TempPath {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        TempPath(Path::new(dir).join(format!("iocache-device-test-{}-{tag}-{n}", std::process::id())))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A real disk directory where O_DIRECT works (not tmpfs).
pub const DISK_DIR: &str = "/var/tmp";
/// A tmpfs directory, where O_DIRECT may be refused.
pub const TMPFS_DIR: &str = "/dev/shm";

/// A new file device of `bytes` under `dir`, its name tagged `tag`, opened
/// with `O_DIRECT` if `direct` (tmpfs may refuse it: then buffered).
pub fn new_file_device(
    dir: &str,
    tag: &str,
    bytes: u64,
    direct: bool,
) -> (TempPath, iocache_device::FileDevice) {
    let p = TempPath::new(dir, tag);
    let options = iocache_device::OpenOptions {
        direct,
        create_size: Some(bytes),
        ..Default::default()
    };
    let d = iocache_device::FileDevice::open(&p.0, options).expect("open a new file device");
    (p, d)
}

/// Bytes that depend on position and seed, so misplaced data shows.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9).wrapping_add(seed.wrapping_mul(31)) >> 3) as u8)
        .collect()
}
