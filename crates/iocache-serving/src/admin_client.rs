//! The client side of the admin socket: one request line, one JSON reply
//! line. `iocache stats`, `iocache ctl` and the lab's live target ask a
//! running server through it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a request to the admin socket got no answer, or got a refusal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    #[error("no iocache server is running with the admin socket {} (there is no such file)", socket.display())]
    NoSuchSocket { socket: PathBuf },
    #[error("{} is not a socket", socket.display())]
    NotASocket { socket: PathBuf },
    #[error("no iocache server is running with the admin socket {} (the socket file is left from one that stopped)", socket.display())]
    Stale { socket: PathBuf },
    #[error("the admin socket {} refuses this user (permission denied)", socket.display())]
    PermissionDenied { socket: PathBuf },
    #[error("the admin socket {}: {source}", socket.display())]
    Io {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An NBD server answered: the socket is an export's, not the admin one.
    #[error("{} is an NBD socket (it answered with the NBD handshake), not a server's admin socket", socket.display())]
    NbdSocket { socket: PathBuf },
    /// The server took the request and did not answer in time: it may
    /// still be starting (its answers wait until it serves).
    #[error(
        "the server at the admin socket {} did not answer within {} s: it may still be starting \
         (after a crash it checks the cache's clean lines against the backend first; its log says \
         how far it is)",
        socket.display(),
        waited.as_secs_f64()
    )]
    NoAnswer { socket: PathBuf, waited: Duration },
    #[error("the server's reply is not JSON: {reply}")]
    BadReply { reply: String },
    /// The server answered with an error.
    #[error("{0}")]
    Refused(String),
}

impl AdminError {
    fn connecting(socket: &Path, source: std::io::Error) -> AdminError {
        let socket = socket.to_path_buf();
        match source.kind() {
            std::io::ErrorKind::NotFound => AdminError::NoSuchSocket { socket },
            std::io::ErrorKind::PermissionDenied => AdminError::PermissionDenied { socket },
            _ if socket.exists() && !is_socket(&socket) => AdminError::NotASocket { socket },
            std::io::ErrorKind::ConnectionRefused => AdminError::Stale { socket },
            _ => AdminError::Io { socket, source },
        }
    }
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Sends one request line and returns the reply, failing with the
/// server's error when it answers with one. `timeout` bounds the wait for
/// the reply (none: wait as long as the server works, e.g. a detach).
pub fn request(
    socket: &Path,
    line: &str,
    timeout: Option<Duration>,
) -> Result<serde_json::Value, AdminError> {
    let io = |source| AdminError::Io {
        socket: socket.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(|e| AdminError::connecting(socket, e))?;
    stream.set_read_timeout(timeout).map_err(io)?;
    // One write; its failure is reported after the greeting is looked for.
    let sent = stream.write_all(format!("{line}\n").as_bytes());
    let mut bytes = Vec::new();
    let read = BufReader::new(&stream).read_until(b'\n', &mut bytes);
    // An NBD server greets first, and drops a client that sends text (the
    // write may then have failed: the greeting is still there to read).
    if bytes.starts_with(b"NBDMAGIC") {
        return Err(AdminError::NbdSocket {
            socket: socket.to_path_buf(),
        });
    }
    sent.map_err(io)?;
    match read {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Err(AdminError::NoAnswer {
                socket: socket.to_path_buf(),
                waited: timeout.unwrap_or_default(),
            })
        }
        other => other.map_err(io)?,
    };
    let reply = String::from_utf8_lossy(&bytes);
    let json: serde_json::Value = serde_json::from_str(reply.trim()).map_err(|_| AdminError::BadReply {
        reply: reply.trim().to_string(),
    })?;
    if let Some(error) = json.get("error").and_then(serde_json::Value::as_str) {
        return Err(AdminError::Refused(error.to_string()));
    }
    Ok(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_takes_the_request_and_stays_silent_is_named_as_such() {
        let dir = crate::scratch_dir("admin-silent");
        let socket = dir.join("admin.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let held = std::thread::spawn(move || listener.accept().map(|(stream, _)| stream));
        let e = request(&socket, "stats", Some(Duration::from_millis(200))).unwrap_err();
        assert!(matches!(e, AdminError::NoAnswer { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("did not answer within 0.2 s") && text.contains("starting"),
            "{text}"
        );
        drop(held.join());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
