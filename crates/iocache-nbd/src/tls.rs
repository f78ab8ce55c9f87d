//! Why this file exists: NBD over TCP carries a volume's data in the clear
//! to anyone who can connect. NBD's answer is `NBD_OPT_STARTTLS`: during
//! option haggling the client asks, the server acknowledges, both run a TLS
//! handshake on the same socket, and the rest of the session (the remaining
//! options and the whole transmission phase) runs inside TLS.
//!
//! The server reads requests on one thread and writes replies from several
//! workers through a second handle of the stream; a TLS session is one
//! state machine for both directions and cannot be split that way. So after
//! the handshake a *pump* thread owns the socket and the TLS session, and
//! the server goes on over one end of a Unix socket pair whose other end
//! the pump relays, in both directions, without blocking on either (so a
//! client that stops reading replies cannot stop the pump from passing its
//! requests, or the other way round). The server code after the upgrade is
//! the same as for a plain socket; TLS costs a relay hop, which is fine for
//! a remote client and not the local fast path.
//!
//! Certificates follow nbdkit's and qemu-nbd's directory layout:
//! `server-cert.pem` (the chain, leaf first) and `server-key.pem`. TLS-PSK
//! is not supported: the TLS library used (rustls) implements no external
//! pre-shared keys.

use std::io::{self, Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Whether TCP (and Unix) clients may, or must, upgrade to TLS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is refused (NBD_REP_ERR_UNSUP).
    #[default]
    Off,
    /// Clients may upgrade; those that do not are served in the clear.
    On,
    /// Every option but STARTTLS and ABORT is refused with
    /// NBD_REP_ERR_TLS_REQD until the client upgrades.
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            other => Err(format!("`{other}`: expected off, on or require")),
        }
    }
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

/// Why the TLS credentials could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {what}")]
    Credentials { path: PathBuf, what: String },
}

/// A server's TLS mode and credentials.
#[derive(Clone, Debug)]
pub struct TlsServer {
    pub mode: TlsMode,
    config: Arc<rustls::ServerConfig>,
}

impl TlsServer {
    /// Loads `server-cert.pem` and `server-key.pem` from `dir`.
    pub fn from_dir(dir: &Path, mode: TlsMode) -> Result<TlsServer, TlsError> {
        let cert_path = dir.join("server-cert.pem");
        let key_path = dir.join("server-key.pem");
        let fail = |path: &Path, what: String| TlsError::Credentials {
            path: path.to_path_buf(),
            what,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
            .map_err(|e| fail(&cert_path, format!("cannot read the certificate chain: {e}")))?
            .collect::<Result<_, _>>()
            .map_err(|e| fail(&cert_path, format!("not a PEM certificate chain: {e}")))?;
        if certs.is_empty() {
            return Err(fail(&cert_path, "holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_file(&key_path)
            .map_err(|e| fail(&key_path, format!("no PEM private key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(dir, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| fail(&key_path, format!("does not match the certificate: {e}")))?;
        Ok(TlsServer {
            mode,
            config: Arc::new(config),
        })
    }
}

/// Runs the TLS handshake on `raw` (within `timeout`) and returns the
/// plaintext end of the session: a Unix stream whose other end a pump
/// thread relays through TLS on `raw`.
pub(crate) fn upgrade<S>(mut raw: S, tls: &TlsServer, timeout: Option<Duration>) -> io::Result<UnixStream>
where
    S: Read + Write + AsRawFd + Send + 'static,
{
    let mut conn = rustls::ServerConnection::new(Arc::clone(&tls.config)).map_err(io::Error::other)?;
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    while conn.is_handshaking() {
        if deadline.is_some_and(|d| std::time::Instant::now() > d) {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"));
        }
        conn.complete_io(&mut raw)?;
    }
    let (plain, relayed) = UnixStream::pair()?;
    std::thread::Builder::new()
        .name("nbd-tls".into())
        .spawn(move || pump(raw, conn, relayed))?;
    Ok(plain)
}

/// Largest amount of plaintext held in either direction before the pump
/// stops reading that direction's source (backpressure).
const PUMP_BUFFER_BYTES: usize = 256 << 10;

fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor the caller owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted
}

/// Relays between the TLS socket `raw` and the plaintext `pair` until both
/// directions are closed or either side fails. Both descriptors are
/// non-blocking; each direction holds at most [`PUMP_BUFFER_BYTES`] of
/// plaintext (and the session as much again of ciphertext) before it stops
/// reading its source.
fn pump<S: Read + Write + AsRawFd>(mut raw: S, mut conn: rustls::ServerConnection, mut pair: UnixStream) {
    if set_nonblocking(raw.as_raw_fd()).is_err() || pair.set_nonblocking(true).is_err() {
        return;
    }
    conn.set_buffer_limit(Some(PUMP_BUFFER_BYTES));
    // Plaintext from the client, not yet written to the server's end.
    let mut to_server: Vec<u8> = Vec::new();
    // Plaintext from the server, not yet taken by the session.
    let mut to_client: Vec<u8> = Vec::new();
    let mut raw_eof = false; // the client sent close_notify or hung up
    let mut pair_eof = false; // the server closed its end (or is gone)
    let mut told_server = false; // the client's end of input was passed on
    let mut closing = false; // close_notify queued
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // Bytes moved in this round: another round follows at once until a
        // round moves nothing; only then does the pump wait in poll.
        let mut moved = 0usize;
        // 1. Client to server: decrypted plaintext into the pair.
        while to_server.len() < PUMP_BUFFER_BYTES {
            match conn.reader().read(&mut buf) {
                Ok(0) => {
                    raw_eof = true;
                    break;
                }
                Ok(n) => {
                    to_server.extend_from_slice(&buf[..n]);
                    moved += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    raw_eof = true;
                    break;
                }
            }
        }
        while !to_server.is_empty() && !pair_eof {
            match pair.write(&to_server) {
                Ok(n) => {
                    to_server.drain(..n);
                    moved += n;
                }
                Err(e) if would_block(&e) => break,
                Err(_) => {
                    pair_eof = true;
                    to_server.clear();
                }
            }
        }
        if raw_eof && to_server.is_empty() && !told_server {
            let _ = pair.shutdown(std::net::Shutdown::Write);
            told_server = true;
        }
        // 2. Server to client: plaintext from the pair into the session.
        while !pair_eof && to_client.len() < PUMP_BUFFER_BYTES {
            match pair.read(&mut buf) {
                Ok(0) => pair_eof = true,
                Ok(n) => {
                    to_client.extend_from_slice(&buf[..n]);
                    moved += n;
                }
                Err(e) if would_block(&e) => break,
                Err(_) => pair_eof = true,
            }
        }
        while !to_client.is_empty() {
            match conn.writer().write(&to_client) {
                Ok(0) => break, // the session's buffer is full
                Ok(n) => {
                    to_client.drain(..n);
                    moved += n;
                }
                Err(_) => return,
            }
        }
        if pair_eof && to_client.is_empty() && !closing {
            conn.send_close_notify();
            closing = true;
        }
        // 3. Ciphertext to the client.
        while conn.wants_write() {
            match conn.write_tls(&mut raw) {
                Ok(n) => moved += n,
                Err(e) if would_block(&e) => break,
                Err(_) => return,
            }
        }
        if closing && !conn.wants_write() {
            // Everything the server said has left, then close_notify.
            let _ = shutdown_fd(raw.as_raw_fd());
            return;
        }
        if moved > 0 {
            continue;
        }
        // 4. Nothing moved: wait for something to do.
        let mut fds = [
            libc::pollfd {
                fd: raw.as_raw_fd(),
                events: 0,
                revents: 0,
            },
            libc::pollfd {
                fd: pair.as_raw_fd(),
                events: 0,
                revents: 0,
            },
        ];
        if !raw_eof && to_server.len() < PUMP_BUFFER_BYTES {
            fds[0].events |= libc::POLLIN;
        }
        if conn.wants_write() {
            fds[0].events |= libc::POLLOUT;
        }
        if !pair_eof && to_client.len() < PUMP_BUFFER_BYTES {
            fds[1].events |= libc::POLLIN;
        }
        if !to_server.is_empty() && !pair_eof {
            fds[1].events |= libc::POLLOUT;
        }
        // SAFETY: poll on two valid pollfd entries of a local array.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        if rc < 0 && !would_block(&io::Error::last_os_error()) {
            return;
        }
        if !raw_eof && fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            match conn.read_tls(&mut raw) {
                Ok(0) => raw_eof = true,
                Ok(_) => {
                    if conn.process_new_packets().is_err() {
                        // A fatal alert is queued: try to send it, then stop.
                        let _ = conn.write_tls(&mut raw);
                        return;
                    }
                }
                Err(e) if would_block(&e) => {}
                Err(_) => raw_eof = true,
            }
        }
        if raw_eof && told_server && pair_eof && to_client.is_empty() && !conn.wants_write() && closing {
            return;
        }
    }
}

fn shutdown_fd(fd: i32) -> io::Result<()> {
    // SAFETY: shutdown on a socket descriptor the pump owns.
    if unsafe { libc::shutdown(fd, libc::SHUT_RDWR) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
