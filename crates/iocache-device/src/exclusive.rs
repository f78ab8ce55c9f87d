//! One process owns a device. Two servers on one
//! cache file each "recover" the other's live metadata and overwrite its
//! lines; two on one backend write back over each other. So a device opened
//! for the cache is claimed for the life of its open file description: a
//! regular file with an open-file-description lock (`F_OFD_SETLK`, a write
//! lock over the whole file, a read lock when read-only), a block device
//! with the kernel's exclusive open (`O_EXCL`). Both follow the file, not
//! the name, so hard links and symbolic links to a claimed file are the
//! same claim, and both end when the process does, even after `kill -9`.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;

/// Takes the whole-file lock on `file`: a write lock, or a read lock when
/// `read_only` (read-only openers then share the file, and exclude
/// writers). Fails with `EAGAIN`/`EACCES` (`WouldBlock` or
/// `PermissionDenied`) when another open file description holds a
/// conflicting lock, in this process or another one.
pub(crate) fn lock_whole_file(file: &File, read_only: bool) -> io::Result<()> {
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = if read_only { libc::F_RDLCK } else { libc::F_WRLCK } as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // l_len 0: to the end of the file, however it grows.
    // l_pid stays 0, as OFD locks require.
    // SAFETY: F_OFD_SETLK reads the struct we pass by pointer; the fd is ours.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether a lock or exclusive-open error means "someone else holds it".
pub(crate) fn is_busy(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::EACCES) | Some(libc::EBUSY)
    )
}

/// The processes that hold the file `(dev, ino)` open, as `pid N (name)`,
/// found by reading `/proc/*/fd` (only what this process may read; OFD
/// locks do not record their owner). This process is named "this process".
pub(crate) fn holders(meta: &std::fs::Metadata) -> Vec<String> {
    let wanted = if meta.file_type().is_block_device() {
        Wanted::Rdev(meta.rdev())
    } else {
        Wanted::Inode(meta.dev(), meta.ino())
    };
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::metadata(fd.path()).is_ok_and(|m| match wanted {
                Wanted::Inode(dev, ino) => m.dev() == dev && m.ino() == ino,
                Wanted::Rdev(rdev) => m.file_type().is_block_device() && m.rdev() == rdev,
            })
        });
        if !holds {
            continue;
        }
        if pid == me {
            out.push("this process".to_string());
        } else {
            let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            out.push(format!("pid {pid} ({})", name.trim()));
        }
    }
    out
}

enum Wanted {
    Inode(u64, u64),
    Rdev(u64),
}
