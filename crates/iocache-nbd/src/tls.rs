//! NBD over TCP carries a volume's data in the clear
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
//! The TLS library is the system's OpenSSL (the `openssl` crate), the one
//! stack for everything: rustls has no external pre-shared keys, which
//! nbdkit's and qemu-nbd's PSK clients need. OpenSSL never touches the
//! socket: it reads and writes ciphertext in memory ([`Wire`]) and the pump
//! moves that to and from the socket, so the pump alone decides when to
//! block (in `poll`) and how much each direction may hold.
//!
//! Credentials follow nbdkit's and qemu-nbd's conventions, so one set
//! serves all three servers:
//! - certificates: a directory with `server-cert.pem` (the chain, leaf
//!   first) and `server-key.pem`; with `verify_peer`, also `ca-cert.pem`,
//!   the CA that must have signed every client's certificate;
//! - TLS-PSK: a file of `identity:hexkey` lines, as GnuTLS's `psktool`
//!   writes (see [`parse_psk_file`]).
//!
//! Either or both may be given. With both, a client that offers a key from
//! the file is authenticated by it (a PSK handshake sends no certificate
//! either way); others get the certificate (and, with `verify_peer`, must
//! show their own).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::error::ErrorStack;
use openssl::pkey::PKey;
use openssl::ssl::{
    self, ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef, SslSessionCacheMode,
    SslStream, SslVerifyMode, SslVersion,
};
use openssl::x509::{X509Name, X509VerifyResult, X509};

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
    #[error("{path}: {what}")]
    Psk { path: PathBuf, what: String },
    #[error("{path}, line {line}: {what}")]
    PskLine {
        path: PathBuf,
        line: usize,
        what: String,
    },
    #[error(
        "{path}: the pre-shared keys are open to group or others (mode {mode:04o}): \
         refused, as ssh refuses such keys; make it the owner's only (chmod 600)"
    )]
    PskMode { path: PathBuf, mode: u32 },
    #[error("no credentials: TLS needs certificates, a PSK file, or both")]
    NoCredentials,
    #[error("verifying client certificates needs the certificates directory (its ca-cert.pem)")]
    VerifyPeerWithoutCertificates,
    #[error("setting up TLS: {0}")]
    Setup(#[from] ErrorStack),
}

impl TlsError {
    /// Whether the PSK file is at fault (rather than the certificates).
    pub fn concerns_psk(&self) -> bool {
        matches!(
            self,
            TlsError::Psk { .. } | TlsError::PskLine { .. } | TlsError::PskMode { .. }
        )
    }
}

/// Where a server's TLS credentials are.
#[derive(Clone, Debug, Default)]
pub struct TlsCredentials {
    /// A directory holding `server-cert.pem` and `server-key.pem` (and
    /// `ca-cert.pem` with `verify_peer`).
    pub certificates: Option<PathBuf>,
    /// A file of pre-shared keys, `identity:hexkey` per line (psktool's).
    pub psk: Option<PathBuf>,
    /// Require a client certificate signed by `ca-cert.pem` (clients
    /// authenticated by a pre-shared key show none and need none).
    pub verify_peer: bool,
}

/// What the PSK callback saw of a client (its identity, escaped for the
/// log): kept on the session so a failed handshake can say why.
#[derive(Debug)]
enum PskSeen {
    /// The client's identity is in the file (so a failure means a wrong key).
    Known(String),
    /// The client's identity is not in the file.
    Unknown(String),
}

/// The session slot where the PSK callback leaves what it saw: one for
/// the process (OpenSSL's indexes are global and never freed).
fn psk_seen_index() -> Result<openssl::ex_data::Index<Ssl, PskSeen>, ErrorStack> {
    static INDEX: std::sync::OnceLock<openssl::ex_data::Index<Ssl, PskSeen>> = std::sync::OnceLock::new();
    if let Some(i) = INDEX.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index::<PskSeen>()?;
    Ok(*INDEX.get_or_init(|| i))
}

/// A server's TLS mode and credentials.
#[derive(Clone)]
pub struct TlsServer {
    pub mode: TlsMode,
    context: SslContext,
    psk_seen: openssl::ex_data::Index<Ssl, PskSeen>,
    psk_file: Option<PathBuf>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer")
            .field("mode", &self.mode)
            .field("psk_file", &self.psk_file)
            .finish_non_exhaustive()
    }
}

/// The identities and keys of a PSK file.
pub type PskKeys = HashMap<String, Vec<u8>>;

/// Longest identity OpenSSL passes to the server (PSK_MAX_IDENTITY_LEN).
const MAX_IDENTITY_BYTES: usize = 128;
/// Longest key OpenSSL takes from the server (PSK_MAX_PSK_LEN in 3.x).
const MAX_KEY_BYTES: usize = 512;

/// Parses a PSK file's text: one `identity:hexkey` per line, as GnuTLS's
/// `psktool` writes; empty lines are skipped. An error gives the line
/// (counted from one) and what is wrong: a missing colon, an empty or
/// overlong identity, a duplicate identity, a key that is empty, overlong
/// or not hex digits.
pub fn parse_psk_file(text: &str) -> Result<PskKeys, (usize, String)> {
    let mut keys = PskKeys::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let Some((identity, hex)) = line.split_once(':') else {
            return Err((
                n,
                "no `:` between the identity and the key (expected identity:hexkey)".into(),
            ));
        };
        if identity.is_empty() {
            return Err((n, "empty identity".into()));
        }
        if identity.len() > MAX_IDENTITY_BYTES {
            return Err((n, format!("identity longer than {MAX_IDENTITY_BYTES} bytes")));
        }
        let key = parse_hex(hex).map_err(|what| (n, format!("identity `{identity}`: {what}")))?;
        if key.len() > MAX_KEY_BYTES {
            return Err((
                n,
                format!("identity `{identity}`: key longer than {MAX_KEY_BYTES} bytes"),
            ));
        }
        if keys.insert(identity.to_string(), key).is_some() {
            return Err((n, format!("identity `{identity}` is given twice")));
        }
    }
    Ok(keys)
}

fn parse_hex(hex: &str) -> Result<Vec<u8>, String> {
    if hex.is_empty() {
        return Err("empty key".into());
    }
    if let Some((at, c)) = hex.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(format!("the key is not hex: `{c}` at its character {}", at + 1));
    }
    if !hex.len().is_multiple_of(2) {
        return Err(format!("the key has an odd number of hex digits ({})", hex.len()));
    }
    Ok((0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("checked hex digits"))
        .collect())
}

/// Reads and checks a PSK file: refused if group or others may read or
/// write it, or if a line is malformed.
pub fn load_psk_file(path: &Path) -> Result<PskKeys, TlsError> {
    let fail = |what: String| TlsError::Psk {
        path: path.to_path_buf(),
        what,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(format!("cannot read the PSK file: {e}")))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TlsError::PskMode {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read the PSK file: {e}")))?;
    let keys = parse_psk_file(&text).map_err(|(line, what)| TlsError::PskLine {
        path: path.to_path_buf(),
        line,
        what,
    })?;
    if keys.is_empty() {
        return Err(fail("holds no key (expected identity:hexkey lines)".into()));
    }
    Ok(keys)
}

impl TlsServer {
    /// Loads `server-cert.pem` and `server-key.pem` from `dir` (the
    /// certificates alone: no PSK, no client certificates).
    pub fn from_dir(dir: &Path, mode: TlsMode) -> Result<TlsServer, TlsError> {
        TlsServer::new(
            mode,
            &TlsCredentials {
                certificates: Some(dir.to_path_buf()),
                ..TlsCredentials::default()
            },
        )
    }

    /// Loads and checks the credentials `creds` names.
    pub fn new(mode: TlsMode, creds: &TlsCredentials) -> Result<TlsServer, TlsError> {
        if creds.certificates.is_none() && creds.psk.is_none() {
            return Err(TlsError::NoCredentials);
        }
        if creds.verify_peer && creds.certificates.is_none() {
            return Err(TlsError::VerifyPeerWithoutCertificates);
        }
        let mut b = SslContextBuilder::new(SslMethod::tls_server())?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
        b.set_options(SslOptions::NO_RENEGOTIATION | SslOptions::CIPHER_SERVER_PREFERENCE);
        // No resumption: every connection runs a full handshake (so no
        // tickets to send, and client certificates checked every time).
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_num_tickets(0)?;
        b.set_session_id_context(b"iocache-nbd")?;
        if let Some(dir) = &creds.certificates {
            load_certificates(&mut b, dir, creds.verify_peer)?;
        }
        let psk_seen = psk_seen_index()?;
        if let Some(path) = &creds.psk {
            let keys = Arc::new(load_psk_file(path)?);
            // A key from the PSK callback is used in TLS 1.3 only with a
            // SHA-256 cipher suite (RFC 8446's default for external keys),
            // and OpenSSL prefers those by itself only when it has no
            // certificate: so with a PSK file, TLS 1.3 offers those alone.
            b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")?;
            b.set_psk_server_callback(move |ssl: &mut SslRef, identity: Option<&[u8]>, out: &mut [u8]| {
                let identity = identity.unwrap_or_default();
                // The client chose these bytes: escaped before they reach the log.
                let shown = String::from_utf8_lossy(identity).escape_debug().to_string();
                // Identities in the file are text: others match none.
                match std::str::from_utf8(identity).ok().and_then(|i| keys.get(i)) {
                    Some(key) if key.len() <= out.len() => {
                        out[..key.len()].copy_from_slice(key);
                        ssl.set_ex_data(psk_seen, PskSeen::Known(shown));
                        Ok(key.len())
                    }
                    _ => {
                        // No key: OpenSSL goes on without a PSK (and fails
                        // unless the client can use the certificate).
                        ssl.set_ex_data(psk_seen, PskSeen::Unknown(shown));
                        Ok(0)
                    }
                }
            });
        }
        Ok(TlsServer {
            mode,
            context: b.build(),
            psk_seen,
            psk_file: creds.psk.clone(),
        })
    }
}

/// Puts the server's chain and key (and, with `verify_peer`, the client
/// CA) from `dir` into `b`.
fn load_certificates(b: &mut SslContextBuilder, dir: &Path, verify_peer: bool) -> Result<(), TlsError> {
    let cert_path = dir.join("server-cert.pem");
    let key_path = dir.join("server-key.pem");
    let fail = |path: &Path, what: String| TlsError::Credentials {
        path: path.to_path_buf(),
        what,
    };
    let pem = std::fs::read(&cert_path)
        .map_err(|e| fail(&cert_path, format!("cannot read the certificate chain: {e}")))?;
    let mut chain = X509::stack_from_pem(&pem)
        .map_err(|e| {
            fail(
                &cert_path,
                format!("not a PEM certificate chain: {}", reasons(&e)),
            )
        })?
        .into_iter();
    let leaf = chain
        .next()
        .ok_or_else(|| fail(&cert_path, "holds no certificate".into()))?;
    b.set_certificate(&leaf)?;
    for extra in chain {
        b.add_extra_chain_cert(extra)?;
    }
    let pem =
        std::fs::read(&key_path).map_err(|e| fail(&key_path, format!("cannot read the private key: {e}")))?;
    let key = PKey::private_key_from_pem(&pem)
        .map_err(|e| fail(&key_path, format!("no PEM private key: {}", reasons(&e))))?;
    let mismatch = |e: ErrorStack| {
        fail(
            &key_path,
            format!("does not match the certificate: {}", reasons(&e)),
        )
    };
    b.set_private_key(&key).map_err(mismatch)?;
    b.check_private_key().map_err(mismatch)?;
    if verify_peer {
        let ca_path = dir.join("ca-cert.pem");
        let names = X509Name::load_client_ca_file(&ca_path)
            .map_err(|e| fail(&ca_path, format!("cannot load the client CA: {}", reasons(&e))))?;
        b.set_ca_file(&ca_path)
            .map_err(|e| fail(&ca_path, format!("cannot load the client CA: {}", reasons(&e))))?;
        b.set_client_ca_list(names);
        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    }
    Ok(())
}

/// The reasons in an OpenSSL error stack, without its codes and source
/// locations ("binder does not verify; ...").
fn reasons(e: &ErrorStack) -> String {
    let r: Vec<String> = e
        .errors()
        .iter()
        .map(|e| e.reason().map_or_else(|| e.to_string(), str::to_string))
        .collect();
    if r.is_empty() {
        "unknown error".into()
    } else {
        r.join("; ")
    }
}

/// The ciphertext side of a session, in memory: OpenSSL reads what the
/// pump received from the socket and writes what the pump is to send.
#[derive(Default)]
struct Wire {
    incoming: Vec<u8>,
    /// Bytes of `incoming` already read.
    taken: usize,
    /// The socket reached end of file: reads past `incoming` end too.
    eof: bool,
    outgoing: Vec<u8>,
}

impl Wire {
    fn pending_in(&self) -> usize {
        self.incoming.len() - self.taken
    }
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = &self.incoming[self.taken..];
        if left.is_empty() {
            return if self.eof {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = left.len().min(buf.len());
        buf[..n].copy_from_slice(&left[..n]);
        self.taken += n;
        if self.taken == self.incoming.len() {
            self.incoming.clear();
            self.taken = 0;
        }
        Ok(n)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outgoing.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Waits until `fd` is ready for `events` or `deadline` passes.
fn wait_for(fd: i32, events: libc::c_short, deadline: Option<Instant>) -> io::Result<()> {
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the TLS handshake timed out",
                    ));
                }
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            }
        };
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc > 0 {
            return Ok(());
        }
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Sends everything in `out` on `raw` before `deadline`.
fn send_all<S: Write + AsRawFd>(raw: &mut S, out: &mut Vec<u8>, deadline: Option<Instant>) -> io::Result<()> {
    let mut sent = 0;
    while sent < out.len() {
        wait_for(raw.as_raw_fd(), libc::POLLOUT, deadline)?;
        match raw.write(&out[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if would_block(&e) || e.kind() == io::ErrorKind::TimedOut => {}
            Err(e) => return Err(e),
        }
    }
    out.clear();
    Ok(())
}

/// Why a handshake failed, in words for the log.
fn describe_failure(tls: &TlsServer, e: &ssl::Error, session: &SslRef) -> String {
    let mut what = match (e.ssl_error(), e.io_error()) {
        // The last error is the handshake's own ("certificate verify
        // failed"); those before it are the library's steps to it.
        (Some(stack), _) => stack
            .errors()
            .last()
            .and_then(|e| e.reason())
            .map_or_else(|| reasons(stack), str::to_string),
        (None, Some(io)) => io.to_string(),
        (None, None) => "the client closed the connection".into(),
    };
    match session.ex_data(tls.psk_seen) {
        Some(PskSeen::Unknown(id)) => {
            let file = tls.psk_file.as_deref().unwrap_or(Path::new("the PSK file"));
            return format!("the client's PSK identity `{id}` is not in {}", file.display());
        }
        Some(PskSeen::Known(id)) => {
            what = format!("{what} (PSK identity `{id}`: the client's key differs from the file's?)");
        }
        None => {}
    }
    let verify = session.verify_result();
    if verify != X509VerifyResult::OK {
        what = format!("{what} (client certificate: {})", verify.error_string());
    }
    what
}

/// Runs the TLS handshake on `raw` (within `timeout`) and returns the
/// plaintext end of the session: a Unix stream whose other end a pump
/// thread relays through TLS on `raw`. The error says why the handshake
/// failed (for the log).
pub(crate) fn upgrade<S>(mut raw: S, tls: &TlsServer, timeout: Option<Duration>) -> io::Result<UnixStream>
where
    S: Read + Write + AsRawFd + Send + 'static,
{
    let deadline = timeout.map(|t| Instant::now() + t);
    let session = Ssl::new(&tls.context).map_err(io::Error::other)?;
    let mut conn = SslStream::new(session, Wire::default()).map_err(io::Error::other)?;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match conn.accept() {
            Ok(()) => break,
            Err(e) if e.code() == ErrorCode::WANT_READ => {
                send_all(&mut raw, &mut conn.get_mut().outgoing, deadline)?;
                wait_for(raw.as_raw_fd(), libc::POLLIN, deadline)?;
                match raw.read(&mut buf) {
                    Ok(0) => conn.get_mut().eof = true,
                    Ok(n) => conn.get_mut().incoming.extend_from_slice(&buf[..n]),
                    Err(e) if would_block(&e) || e.kind() == io::ErrorKind::TimedOut => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => {
                // Send the alert OpenSSL queued (small: one write).
                let _ = raw.write(&conn.get_ref().outgoing);
                return Err(io::Error::other(describe_failure(tls, &e, conn.ssl())));
            }
        }
    }
    send_all(&mut raw, &mut conn.get_mut().outgoing, deadline)?;
    let (plain, relayed) = UnixStream::pair()?;
    std::thread::Builder::new()
        .name("nbd-tls".into())
        .spawn(move || pump(raw, conn, relayed))?;
    Ok(plain)
}

/// Largest amount of plaintext held in either direction before the pump
/// stops reading that direction's source (backpressure); ciphertext is
/// bounded the same way.
const PUMP_BUFFER_BYTES: usize = 256 << 10;

/// Plaintext handed to OpenSSL per write: one TLS record's worth.
const RECORD_BYTES: usize = 16 << 10;

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
/// plaintext (and about as much again of ciphertext) before it stops
/// reading its source.
fn pump<S: Read + Write + AsRawFd>(mut raw: S, mut conn: SslStream<Wire>, mut pair: UnixStream) {
    if set_nonblocking(raw.as_raw_fd()).is_err() || pair.set_nonblocking(true).is_err() {
        return;
    }
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
        while !raw_eof && to_server.len() < PUMP_BUFFER_BYTES {
            match conn.ssl_read(&mut buf) {
                Ok(0) => raw_eof = true,
                Ok(n) => {
                    to_server.extend_from_slice(&buf[..n]);
                    moved += n;
                }
                Err(e) if e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE => break,
                // close_notify, or the socket's end without it.
                Err(e) if e.code() == ErrorCode::ZERO_RETURN || e.code() == ErrorCode::SYSCALL => {
                    raw_eof = true
                }
                Err(_) => {
                    // A fatal alert may be queued: try to send it, then stop.
                    let out = std::mem::take(&mut conn.get_mut().outgoing);
                    let _ = raw.write(&out);
                    return;
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
        let mut taken = 0;
        while taken < to_client.len() && conn.get_ref().outgoing.len() < PUMP_BUFFER_BYTES {
            let end = to_client.len().min(taken + RECORD_BYTES);
            match conn.ssl_write(&to_client[taken..end]) {
                Ok(n) => {
                    taken += n;
                    moved += n;
                }
                Err(e) if e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE => break,
                Err(_) => return,
            }
        }
        to_client.drain(..taken);
        if pair_eof && to_client.is_empty() && !closing {
            let _ = conn.shutdown();
            closing = true;
        }
        // 3. Ciphertext to the client.
        let wire = conn.get_mut();
        let mut sent = 0;
        while sent < wire.outgoing.len() {
            match raw.write(&wire.outgoing[sent..]) {
                Ok(n) => sent += n,
                Err(e) if would_block(&e) => break,
                Err(_) => return,
            }
        }
        wire.outgoing.drain(..sent);
        moved += sent;
        if closing && wire.outgoing.is_empty() {
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
        let reading = !raw_eof && !wire.eof && wire.pending_in() < PUMP_BUFFER_BYTES;
        if reading {
            fds[0].events |= libc::POLLIN;
        }
        if !wire.outgoing.is_empty() {
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
        if reading && fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            match raw.read(&mut buf) {
                Ok(0) => wire.eof = true,
                Ok(n) => wire.incoming.extend_from_slice(&buf[..n]),
                Err(e) if would_block(&e) => {}
                Err(_) => wire.eof = true,
            }
        }
        if raw_eof && told_server && pair_eof && to_client.is_empty() && wire.outgoing.is_empty() && closing {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_as_psktool_writes_them_parse() {
        let keys = parse_psk_file("alice:00ff10Ab\n\nbob:0102\n").unwrap();
        assert_eq!(keys["alice"], vec![0x00, 0xff, 0x10, 0xab]);
        assert_eq!(keys["bob"], vec![1, 2]);
        assert_eq!(keys.len(), 2);
        // CRLF line ends are accepted too.
        assert_eq!(parse_psk_file("carol:aa\r\n").unwrap()["carol"], vec![0xaa]);
    }

    #[test]
    fn malformed_psk_lines_are_named() {
        let err = |text: &str| parse_psk_file(text).unwrap_err();
        let (line, what) = err("alice:00\nbob 0102\n");
        assert_eq!(line, 2);
        assert!(what.contains("no `:`"), "{what}");
        let (line, what) = err(":0102");
        assert_eq!(line, 1);
        assert!(what.contains("empty identity"), "{what}");
        let (line, what) = err("a:01\n\nb:0g\n");
        assert_eq!(line, 3);
        assert!(what.contains("not hex") && what.contains("`g`"), "{what}");
        let (_, what) = err("a:012");
        assert!(what.contains("odd number"), "{what}");
        let (_, what) = err("a:");
        assert!(what.contains("empty key"), "{what}");
        let (line, what) = err("a:01\nb:02\na:03\n");
        assert_eq!(line, 3);
        assert!(what.contains("`a` is given twice"), "{what}");
        let (_, what) = err(&format!("{}:01", "x".repeat(200)));
        assert!(what.contains("identity longer"), "{what}");
    }

    #[test]
    fn psk_files_open_to_others_are_refused() {
        let dir = std::env::temp_dir().join(format!("iocache-psk-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys.psk");
        std::fs::write(&path, "alice:0102\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_psk_file(&path).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_psk_file(&path).unwrap()["alice"], vec![1, 2]);
        std::fs::write(&path, "alice:0102\nbob:zz\n").unwrap();
        let e = load_psk_file(&path).unwrap_err().to_string();
        assert!(e.contains("keys.psk, line 2") && e.contains("not hex"), "{e}");
        // A PSK alone is enough credentials; verify-peer without a CA is not.
        let psk_only = TlsCredentials {
            psk: Some(path.clone()),
            ..TlsCredentials::default()
        };
        std::fs::write(&path, "alice:0102\n").unwrap();
        assert!(TlsServer::new(TlsMode::Require, &psk_only).is_ok());
        let e = TlsServer::new(
            TlsMode::Require,
            &TlsCredentials {
                verify_peer: true,
                ..psk_only
            },
        )
        .unwrap_err();
        assert!(matches!(e, TlsError::VerifyPeerWithoutCertificates), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
