//! A Unix socket path is shared ground. A server that
//! unlinks whatever sits at its path before binding steals a live server's
//! socket (its clients can no longer connect, and its shutdown removes the
//! newcomer's file), and deletes a regular file an operator mistyped as the
//! path. So a socket is bound only where nothing is, or where a socket
//! nobody answers on (a stale one, left by a process that died) is; the
//! socket's mode is set before anyone can connect; and at exit the file is
//! removed only if it is still the one this process bound.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Why a Unix socket could not be bound at a path.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// A server answers on the socket at the path.
    #[error("{path}: a server is already listening on this socket (another iocache or NBD server?); stop it or choose another path")]
    InUse { path: PathBuf },
    /// The path holds something other than a socket: never removed.
    #[error("{path} exists and is not a socket ({kind}); not removing it: choose another path")]
    NotASocket { path: PathBuf, kind: &'static str },
    /// The path could not be examined, cleared, bound or given its mode.
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

type FileIdentity = (u64, u64, i64, i64);

/// Device, inode and modification time (to the nanosecond) of a file: an
/// inode number freed by an unlink is soon given to the next new file, so
/// the number alone does not tell a socket from the one bound after it.
fn identity(meta: &std::fs::Metadata) -> FileIdentity {
    (meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec())
}

/// A Unix socket this process bound, and which file that is.
#[derive(Debug)]
pub struct BoundUnixSocket {
    pub listener: UnixListener,
    path: PathBuf,
    /// Which file the socket is: see [`identity`].
    identity: FileIdentity,
}

fn describe_kind(t: std::fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_block_device() || t.is_char_device() {
        "a device node"
    } else {
        "not a socket"
    }
}

/// Binds a Unix socket at `path` with permission bits `mode` (e.g. 0o600)
/// and, if given, owned by the group `group` (e.g. with mode 0o660, to
/// share the socket with that group's members).
///
/// Nothing at `path`: bound. A socket at `path` that refuses connections
/// (its server is gone): removed and bound again. A socket a server accepts
/// on: [`ListenError::InUse`], nothing touched. Anything else (a regular
/// file, a directory, a symbolic link, even to a socket):
/// [`ListenError::NotASocket`], nothing touched.
pub fn bind_unix_socket(path: &Path, mode: u32, group: Option<u32>) -> Result<BoundUnixSocket, ListenError> {
    let io_err = |what: &'static str| {
        move |source: io::Error| ListenError::Io {
            path: path.to_path_buf(),
            what,
            source,
        }
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("examining the path")(e)),
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(ListenError::NotASocket {
                path: path.to_path_buf(),
                kind: describe_kind(meta.file_type()),
            })
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(ListenError::InUse {
                    path: path.to_path_buf(),
                })
            }
            // Nobody accepts on it: a leftover of a process that ended.
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                std::fs::remove_file(path).map_err(io_err("removing the stale socket"))?;
            }
            Err(e) => return Err(io_err("checking whether a server listens on the socket")(e)),
        },
    }
    // The socket is created with the umask's bits; clients can only connect
    // once it listens, which `bind` does before the chmod. So bind under a
    // umask that leaves only the owner's bits, then set the asked mode.
    // SAFETY: umask only changes this process's file creation mask.
    let old_mask = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the mask.
    unsafe { libc::umask(old_mask) };
    let listener = bound.map_err(|source| {
        if source.kind() == io::ErrorKind::AddrInUse {
            ListenError::InUse {
                path: path.to_path_buf(),
            }
        } else {
            io_err("binding")(source)
        }
    })?;
    if let Some(gid) = group {
        std::os::unix::fs::lchown(path, None, Some(gid)).map_err(io_err("giving the socket to its group"))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_err("setting the socket's mode"))?;
    let meta = std::fs::symlink_metadata(path).map_err(io_err("examining the bound socket"))?;
    Ok(BoundUnixSocket {
        listener,
        path: path.to_path_buf(),
        identity: identity(&meta),
    })
}

impl BoundUnixSocket {
    /// The path bound.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A token that removes the socket file later, if it is still this one.
    pub fn remover(&self) -> SocketFileRemover {
        SocketFileRemover {
            path: self.path.clone(),
            identity: self.identity,
        }
    }
}

/// Removes a socket file if it is still the one that was bound (not a
/// file someone put there since).
#[derive(Clone, Debug)]
pub struct SocketFileRemover {
    path: PathBuf,
    identity: FileIdentity,
}

impl SocketFileRemover {
    /// Removes the file if it is the bound socket; returns whether it did.
    pub fn remove(&self) -> bool {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.file_type().is_socket() && identity(&meta) == self.identity => {
                std::fs::remove_file(&self.path).is_ok()
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("iocache-listen-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_live_socket_is_never_taken_and_a_stale_one_is_replaced() {
        let dir = temp_dir("live");
        let path = dir.join("s.sock");
        let first = bind_unix_socket(&path, 0o600, None).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Old failure: the second server unlinked the first's socket.
        let err = bind_unix_socket(&path, 0o600, None).unwrap_err();
        assert!(matches!(err, ListenError::InUse { .. }), "{err}");
        assert!(
            UnixStream::connect(&path).is_ok(),
            "the first server still answers"
        );
        let remover = first.remover();
        drop(first);
        // Timestamps tick per jiffy: a socket bound within the same few
        // milliseconds on a reused inode number could not be told apart
        // (a server's socket lives far longer than that).
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Its server is gone: a stale socket, replaced.
        let second = bind_unix_socket(&path, 0o660, None).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        // The first's remover does not remove the second's socket.
        assert!(!remover.remove());
        assert!(path.exists());
        assert!(second.remover().remove());
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_path_that_is_not_a_socket_is_never_removed() {
        let dir = temp_dir("file");
        let file = dir.join("precious.img");
        std::fs::write(&file, b"data").unwrap();
        let err = bind_unix_socket(&file, 0o600, None).unwrap_err();
        assert!(
            err.to_string().contains("is not a socket (a regular file)"),
            "{err}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"data");
        let link = dir.join("link.sock");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = bind_unix_socket(&link, 0o600, None).unwrap_err();
        assert!(matches!(err, ListenError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"data");
        let err = bind_unix_socket(&dir, 0o600, None).unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
