//! A storage daemon runs under a service manager,
//! which needs to know its process (a pid file) and when it is ready to
//! serve (systemd's `Type=notify`: `READY=1` on `$NOTIFY_SOCKET` once the
//! listeners are bound and every volume is loaded; `STOPPING=1` when it
//! begins to stop). Both are optional and cost nothing when unused.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use crate::error::{refused, Result, Within};

/// A pid file this process wrote, removed when dropped (if it still holds
/// this process's id).
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    /// Writes this process's id to `path`. Refuses when the file names a
    /// live process (another server, or the same one started twice); a
    /// stale file (its process gone) is replaced.
    pub fn create(path: &Path) -> Result<PidFile> {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(pid) = text.trim().parse::<i32>() {
                // Signal 0 checks that the process exists.
                // SAFETY: kill with signal 0 sends nothing.
                let alive = pid > 0
                    && (unsafe { libc::kill(pid, 0) } == 0
                        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
                if alive && pid as u32 != std::process::id() {
                    return Err(refused!(
                        "{}: process {pid} named there is running; stop it, or remove the \
                         file if it is not an iocache server",
                        path.display()
                    ));
                }
            }
        }
        let temporary = path.with_extension(format!("tmp{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temporary)
            .within(|| path.display().to_string())?;
        writeln!(file, "{}", std::process::id())?;
        file.sync_all()?;
        std::fs::rename(&temporary, path).within(|| path.display().to_string())?;
        Ok(PidFile {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let ours =
            std::fs::read_to_string(&self.path).is_ok_and(|t| t.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Sends `state` (e.g. `READY=1`) to the service manager when it asked
/// for notifications (`$NOTIFY_SOCKET`, a path or an abstract name
/// starting with `@`); does nothing otherwise. Failures are logged, never
/// fatal: the server works without its manager's notice.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let bytes = target.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &address)
        } else {
            socket.send_to(state.as_bytes(), &target)
        }
    });
    if let Err(e) = sent {
        log::warn!("cannot notify the service manager ({state}) on {target:?}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_names_this_process_and_goes_away() {
        let dir = crate::scratch_dir("pid");
        let path = dir.join("iocache.pid");
        // A stale file (no such process) is replaced.
        std::fs::write(&path, "999999999\n").unwrap();
        let pid = PidFile::create(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            std::process::id().to_string()
        );
        drop(pid);
        assert!(!path.exists());
        // A live process (pid 1) is not taken over.
        std::fs::write(&path, "1\n").unwrap();
        let e = PidFile::create(&path).err().expect("refused").to_string();
        assert!(e.contains("process 1"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn notify_reaches_the_socket_named_in_the_environment() {
        let dir = crate::scratch_dir("notify");
        let path = dir.join("notify.sock");
        let receiver = UnixDatagram::bind(&path).unwrap();
        // SAFETY: no other thread of this test binary reads NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        notify("READY=1");
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
