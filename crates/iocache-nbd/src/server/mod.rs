//! The NBD server: listeners, connections, and the transmission phase.
//!
//! This is where the protocol meets threads and sockets. A [`Server`] holds
//! the exports and a [`ServerConfig`]; [`Server::start`] binds a Unix socket
//! and/or a TCP address and returns a [`RunningServer`]. Each accepted
//! connection gets a thread that runs the handshake, then a few threads
//! (`workers_per_connection`) serve its requests as leader and followers:
//! the one holding the reader role reads one request, hands the role to the
//! next free thread and serves the request itself (calls the [`Export`],
//! writes the reply if the socket takes it without waiting, else queues
//! it for the connection's writer thread: `outbox.rs`). So a request is
//! served by the thread the socket woke, with no hand-off between threads,
//! pipelined requests are still served in parallel and answered out of
//! order, and a client that reads its replies late never stops the server
//! reading its requests. Memory per connection is bounded by the threads
//! and an in-flight byte budget (which a queued reply keeps until it is
//! written); when every thread is busy, or the budget is spent, nobody
//! reads the socket (backpressure), while queued replies still drain.
//!
//! Shutdown ([`RunningServer::shutdown`]) stops accepting, shuts down the
//! read side of every connection so no new request is read, lets the
//! threads finish and answer the requests already read, then closes.
//!
//! # Resource bounds
//!
//! What clients can make the server hold is bounded per client and in
//! total:
//!
//! - **Payload bytes.** Each request's payload (a WRITE's data read, a
//!   READ's data to send) takes budget from its connection
//!   (`max_inflight_bytes`) and then from a budget all connections share
//!   (`max_total_inflight_bytes`), before the buffer exists; it is given
//!   back when the reply is written or fails. A reader that cannot get
//!   budget waits (and so stops reading its socket); the shared budget is
//!   two pools, one for requests of at most 128 KiB (an eighth of it) and
//!   one for larger ones, each handed out first come, first served: a
//!   large request is not starved by small ones, and clients pinning large
//!   replies cannot make a small request wait. Budget is only ever held by a request between
//!   its header and its reply, and both ends are bounded in time: a WRITE's
//!   payload must arrive, and a reply must be written, within
//!   `reply_timeout` (a whole-transfer deadline, not one per system call),
//!   and, while another connection waits for the shared budget, without
//!   ever making no progress for `stall_timeout`; else the connection is
//!   closed and its budget returned. So a client that never reads its
//!   replies holds budget for at most `reply_timeout`, and for at most
//!   `stall_timeout` once someone else needs it: it cannot deadlock the
//!   others, nor keep them waiting long.
//! - **Connections.** Each listener (the Unix socket, TCP) has its own
//!   `max_connections`, so a TCP flood cannot lock out the local socket
//!   (the administrator's way in). When a listener is full, a new
//!   connection makes room: first by closing the oldest connection still
//!   in its handshake, then by closing the transmission connection that
//!   has had nothing in flight for longest, if that is at least
//!   `idle_eviction`, then by closing the connection whose requests in
//!   flight have made no progress (no request read, no reply finished) for
//!   longest, if that is at least `stall_timeout` (a client that stopped
//!   reading its replies); otherwise the new connection is closed. At most
//!   `max_handshakes` connections of a listener may be in the handshake at
//!   once (a new one evicts the oldest), and a handshake must finish within
//!   `handshake_timeout` in total, so neither idle nor trickling
//!   ("slowloris") handshakes can keep a legitimate client out: it only
//!   needs to finish its handshake before `max_handshakes` newer
//!   connections arrive. Idle transmission connections are closed only
//!   when their listener is full: they hold no request, so nothing a
//!   client was told is lost, and clients that reconnect (qemu, nbdkit)
//!   reconnect on their next request.
//! - **Connections per peer.** A peer (the client's user id on the Unix
//!   socket, its IPv4 address or IPv6 /64 on TCP: `peer.rs`) may hold at
//!   most `max_connections_per_peer` places of a listener and
//!   `max_handshakes_per_peer` handshakes. Past either, a new connection
//!   of the peer displaces one of the peer's own (its oldest handshake,
//!   or as above its idle or stalled connection) or is closed before the
//!   greeting ([`ServerStats::refused_per_peer`]); it never takes another
//!   peer's place. A full listener evicts the oldest handshake *of the
//!   peer holding the most places*, not the oldest of all. So one client
//!   reconnecting as fast as it is evicted (the DoS soak with no
//!   reconnect delay) holds at most its share, and a client of another
//!   peer always finds a place.
//! - **Threads.** A thread that cannot be created (the connection's, or a
//!   worker) never panics: the connection is closed (or served by the
//!   workers that could be created), counted in
//!   [`ServerStats::spawn_failures`], and the server keeps serving.
//! - **Kept buffers.** A thread keeps its payload buffer for the next
//!   request (no allocation per request): up to 128 KiB always, a larger
//!   one (up to 1 MiB and a header) only within a server-wide allowance of
//!   an eighth of `max_total_inflight_bytes` (`kept.rs`). So buffers held
//!   between requests add at most 128 KiB per thread and that allowance.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::export::{validate_block_sizes, Export, ExportError, ExportLookup, Exports};
use crate::handshake::{negotiate_tls, Haggle, HandshakeError, Negotiated, Negotiation, NegotiationLimits};
use crate::kept::{KeptAllowance, KeptBuffer, LARGEST_KEPT_BYTES};
use crate::listen::{bind_unix_socket, ListenError, SocketFileRemover};
use crate::peer::Peer;
use crate::proto::*;
use crate::request_reader::{BusyReaders, RequestReader};
use crate::tls::{TlsMode, TlsServer};

mod admission;
mod budgets;
mod outbox;
mod pieces;
mod stream;
mod transmission;

use admission::*;
pub use budgets::SMALL_REQUEST_BYTES;
use budgets::*;
use outbox::*;
pub use stream::ConnectionStream;
use stream::*;
pub(crate) use stream::{deadline_passed, is_timeout, Stream};
use transmission::*;

/// Smallest accepted `limits.max_payload`: the largest minimum block size an
/// export may have (64 KiB), so every export can serve one block.
pub const MIN_MAX_PAYLOAD: u32 = 64 * 1024;
/// Largest accepted `limits.max_payload` (1 GiB), far below the 4 GiB - 8
/// a single structured read chunk can carry.
pub const MAX_MAX_PAYLOAD: u32 = 1 << 30;
/// The longest [`ServerConfig::poll_before_sleep`]: a millisecond of
/// polling per request is already far past any gain (a reader spinning
/// longer only burns a core).
pub const POLL_BEFORE_SLEEP_MAX: Duration = Duration::from_millis(1);

/// Default of [`ServerConfig::max_total_inflight_bytes`]: 256 MiB, four
/// connections' full budgets (eight maximum-size requests). Far more than
/// any device's bandwidth-delay product (3 GB/s at 10 ms is 30 MB), so it
/// costs no throughput, while the payload memory all clients together can
/// pin stays a small part of a cache server's RAM (without it, 64
/// connections could pin 4 GiB).
pub const DEFAULT_MAX_TOTAL_INFLIGHT_BYTES: usize = 256 << 20;

/// How the server listens and how much a client may make it hold.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Path of a Unix socket to listen on (a stale socket file there is
    /// replaced, a live one or anything else refused; the file is removed
    /// at shutdown if it is still the one bound).
    pub unix_socket: Option<PathBuf>,
    /// Permission bits of the Unix socket (0o600: its owner only; a
    /// client needs write permission on it to connect).
    pub unix_socket_mode: u32,
    /// The group the Unix socket belongs to (the process's group if
    /// `None`): with mode 0o660, that group's members may connect.
    pub unix_socket_group: Option<u32>,
    /// TCP address to listen on (port 0 picks a free port; see
    /// [`RunningServer::tcp_addr`]).
    pub tcp: Option<SocketAddr>,
    /// Threads serving one connection's requests: each reads a request when
    /// it holds the reader role, then serves it; so also the most requests
    /// of one connection served at once.
    pub workers_per_connection: usize,
    /// How long a connection's reader polls its socket for the next
    /// request before it sleeps in the read (`request_reader.rs`): a
    /// client at low queue depth then finds it awake. Only while the
    /// client's waits are short and no more connections are busy than the
    /// cores but one; zero never polls. At most
    /// [`POLL_BEFORE_SLEEP_MAX`] (a longer one is a configuration error).
    pub poll_before_sleep: Duration,
    /// Payload bytes (write data read, read data to send) held per
    /// connection at once; raised to at least `limits.max_payload`.
    pub max_inflight_bytes: usize,
    /// Payload bytes held by all connections together; raised to at least
    /// `limits.max_payload`. A connection that cannot get budget stops
    /// reading its socket until some is given back (see the module doc).
    pub max_total_inflight_bytes: usize,
    /// Connections served at once on each listener (the Unix socket and
    /// TCP are counted apart). A new connection on a full listener evicts
    /// the oldest handshaking one, or an idle one (`idle_eviction`), or is
    /// closed.
    pub max_connections: usize,
    /// Connections of one listener in the handshake at once (at most
    /// `max_connections`); one more evicts the oldest, taken from the peer
    /// holding the most places.
    pub max_handshakes: usize,
    /// Connections one peer (a user on the Unix socket, an IPv4 address or
    /// an IPv6 /64 on TCP: see `peer.rs`) may hold at once on each
    /// listener (at most `max_connections`). One more first closes the
    /// peer's own oldest handshake (or, as on a full listener, its own
    /// idle or stalled connection); if the peer has none, it is closed at
    /// once, before the greeting, and counted in
    /// [`ServerStats::refused_per_peer`].
    ///
    /// Default 16, a quarter of `max_connections`: at least four peers are
    /// needed to fill a listener, so one client that reconnects as fast as
    /// it is evicted can no longer take every place; and 16 is more than
    /// one client usually opens (nbdcopy, a multi-conn client, opens 4 by
    /// default). Raise it when many clients run as one user: libvirt runs
    /// every virtual machine's qemu as the same user.
    pub max_connections_per_peer: usize,
    /// Connections of one peer in the handshake at once on each listener
    /// (at most `max_handshakes` and `max_connections_per_peer`); one more
    /// evicts the peer's own oldest handshake, never another peer's.
    ///
    /// Default 16, no tighter than `max_handshakes`: clients open their
    /// connections at once (`fio --ioengine=nbd --numjobs=16`, as
    /// scripts/bench-engine.py runs it, makes 16 handshakes at once from
    /// one user; with 4 here, `--numjobs=8` already lost jobs whose
    /// handshakes were evicted). Other peers need no tighter limit: a full
    /// listener evicts the handshakes of the peer holding the most places,
    /// which is the flooding peer, and a peer at
    /// `max_connections_per_peer` only evicts its own. Lower it to keep a
    /// peer from using the whole handshake budget for a moment.
    pub max_handshakes_per_peer: usize,
    /// On a full listener, a transmission connection with no request in
    /// flight for at least this long may be closed to make room for a new
    /// one (the one idle longest). `None`: never.
    pub idle_eviction: Option<Duration>,
    /// Time a client has to finish the whole handshake (not each read).
    pub handshake_timeout: Option<Duration>,
    /// Time a reply may take to be written, and a WRITE's payload to
    /// arrive after its header, before the client is considered gone (a
    /// client that stops reading replies cannot hold budget or block
    /// shutdown forever). A deadline for the whole transfer.
    pub reply_timeout: Option<Duration>,
    /// While some connection waits for the shared payload budget, a reply
    /// (or a WRITE's payload) that makes no progress at all for this long
    /// closes its connection, giving its budget back: clients that stop
    /// reading cannot keep the others waiting for a whole `reply_timeout`.
    pub stall_timeout: Duration,
    /// Handshake limits and the maximum READ/WRITE payload.
    pub limits: NegotiationLimits,
    /// TLS (NBD_OPT_STARTTLS): its mode and credentials; `None` refuses
    /// STARTTLS (NBD_REP_ERR_UNSUP), as [`TlsMode::Off`] does.
    pub tls: Option<TlsServer>,
    /// How long a shutdown waits for connections to answer the requests
    /// they read before it closes them.
    pub shutdown_grace: Duration,
    /// The largest READ or WRITE served. One above the export's advertised
    /// maximum block size is served in pieces of at most that size (its
    /// budget is one piece); one above this is refused with EINVAL (a
    /// WRITE's payload read and dropped) and the connection kept. Raised
    /// to at least `limits.max_payload`; at most [`MAX_MAX_PAYLOAD`].
    pub max_request_bytes: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            unix_socket: None,
            unix_socket_mode: 0o600,
            unix_socket_group: None,
            tcp: None,
            workers_per_connection: 4,
            poll_before_sleep: Duration::from_micros(20),
            max_inflight_bytes: 64 << 20,
            max_total_inflight_bytes: DEFAULT_MAX_TOTAL_INFLIGHT_BYTES,
            max_connections: 64,
            max_handshakes: 16,
            max_connections_per_peer: 16,
            max_handshakes_per_peer: 16,
            idle_eviction: Some(Duration::from_secs(60)),
            handshake_timeout: Some(Duration::from_secs(30)),
            reply_timeout: Some(Duration::from_secs(60)),
            stall_timeout: Duration::from_secs(5),
            limits: NegotiationLimits::default(),
            tls: None,
            shutdown_grace: Duration::from_secs(10),
            max_request_bytes: MAX_MAX_PAYLOAD,
        }
    }
}

/// Why the server could not be set up.
#[derive(Debug, Error)]
pub enum ServerError {
    #[error("cannot listen on {what}: {source}")]
    Bind {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error("no listener configured (set unix_socket and/or tcp)")]
    NoListener,
    #[error("no exports")]
    NoExports,
    #[error("no export named {0:?}")]
    UnknownExport(String),
    #[error("export {name:?}: {reason}")]
    BadExport { name: String, reason: String },
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Counters of a running server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ServerStats {
    /// Connections accepted (including those refused by the limit).
    pub connections: u64,
    /// Connections being served now.
    pub active_connections: u64,
    /// Connections that reached the transmission phase.
    pub transmissions: u64,
    /// Requests answered.
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Reads served by the thread that read them while it kept the reader
    /// role (the export said the read was quick): no other thread was
    /// woken for them.
    pub served_inline: u64,
    /// Replies (or their rest) the socket did not take at once, queued for
    /// their connection's writer thread (a client reading replies late).
    /// Not serialized: the serving layer's stats JSON never carried it.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub replies_queued: u64,
    /// Payload bytes held now, all connections together.
    pub inflight_bytes: u64,
    /// The most payload bytes held at once since the start.
    pub peak_inflight_bytes: u64,
    /// Connections closed on accept because their listener was full.
    pub refused_connections: u64,
    /// Connections closed on accept because their peer held
    /// `max_connections_per_peer` places on the listener, none of which
    /// could be given up (not counted in `refused_connections`).
    pub refused_per_peer: u64,
    /// Connections closed to make room for a new one (handshaking or idle).
    pub evicted_connections: u64,
    /// Handshakes closed because they did not finish in time.
    pub handshake_timeouts: u64,
    /// TLS handshakes that failed (after NBD_OPT_STARTTLS was acknowledged).
    pub tls_failures: u64,
    /// Threads that could not be created (each closed a connection, or
    /// left it with fewer workers).
    pub spawn_failures: u64,
}

/// An NBD server before it listens.
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    exports: Exports,
    /// The listeners, once [`Server::bind`] (or `start`) bound them.
    bound: Option<Bound>,
}

/// Listeners bound before the server starts accepting.
#[derive(Debug)]
struct Bound {
    listeners: Vec<Listener>,
    tcp_addr: Option<SocketAddr>,
    unix: Option<SocketFileRemover>,
}

impl Server {
    /// A server with no exports yet.
    pub fn new(config: ServerConfig) -> Server {
        Server {
            config,
            exports: Exports::new(),
            bound: None,
        }
    }

    /// Adds an export under `name`; the first one added is also the default
    /// export, reachable under the empty name.
    pub fn add_export(
        &mut self,
        name: impl Into<String>,
        export: Arc<dyn Export>,
    ) -> Result<(), ServerError> {
        let name = name.into();
        check_export(&name, export.as_ref())?;
        self.exports.insert(name, export);
        Ok(())
    }

    /// Makes `name` the default export.
    pub fn set_default_export(&mut self, name: &str) -> Result<(), ServerError> {
        if self.exports.set_default(name) {
            Ok(())
        } else {
            Err(ServerError::UnknownExport(name.to_string()))
        }
    }

    /// Checks the configuration and the exports (listeners aside) and
    /// returns the configuration the connections will use.
    fn checked_config(&self) -> Result<ServerConfig, ServerError> {
        let mut config = self.config.clone();
        if self.exports.is_empty() {
            return Err(ServerError::NoExports);
        }
        if config.workers_per_connection == 0 {
            return Err(ServerError::Config(
                "workers_per_connection must be at least 1".into(),
            ));
        }
        let max_payload = config.limits.max_payload;
        if !(MIN_MAX_PAYLOAD..=MAX_MAX_PAYLOAD).contains(&max_payload) {
            return Err(ServerError::Config(format!(
                "limits.max_payload {max_payload} is outside {MIN_MAX_PAYLOAD}..={MAX_MAX_PAYLOAD}"
            )));
        }
        if config.poll_before_sleep > POLL_BEFORE_SLEEP_MAX {
            return Err(ServerError::Config(format!(
                "poll_before_sleep {:?} is above {POLL_BEFORE_SLEEP_MAX:?}",
                config.poll_before_sleep
            )));
        }
        config.max_request_bytes = config.max_request_bytes.clamp(max_payload, MAX_MAX_PAYLOAD);
        config.max_inflight_bytes = config.max_inflight_bytes.max(config.limits.max_payload as usize);
        config.max_total_inflight_bytes = config
            .max_total_inflight_bytes
            .max(config.limits.max_payload as usize);
        config.max_handshakes = config.max_handshakes.max(1).min(config.max_connections.max(1));
        config.max_connections_per_peer = config
            .max_connections_per_peer
            .max(1)
            .min(config.max_connections.max(1));
        config.max_handshakes_per_peer = config
            .max_handshakes_per_peer
            .max(1)
            .min(config.max_handshakes)
            .min(config.max_connections_per_peer);
        // A zero socket timeout is refused by the system.
        config.stall_timeout = config.stall_timeout.max(Duration::from_millis(1));
        Ok(config)
    }

    /// Serves one client over an already connected `stream`, on the calling
    /// thread and the connection's workers, exactly as an accepted
    /// connection is served (handshake, then transmission), and returns
    /// the counters when the connection has ended. The listeners and the
    /// connection limit of the configuration are not used, and nothing can
    /// shut the connection down from elsewhere.
    ///
    /// This is how tests and fuzz targets drive a whole session without
    /// sockets (the `fuzzing` module's `MemStream`); a `UnixStream` from
    /// `UnixStream::pair` works too.
    pub fn serve_stream<S: ConnectionStream>(&self, stream: S) -> Result<ServerStats, ServerError> {
        let config = self.checked_config()?;
        let shared = Shared::new(self.exports.clone(), config, Vec::new());
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        serve_connection(&shared, stream, None, Arc::new(Activity::default()));
        Ok(shared.stats.snapshot(&shared))
    }

    /// Binds the listeners without accepting yet: a program binds first,
    /// so that a busy address or a live server on the socket path stops it
    /// before it opens (and changes) anything else. The Unix socket is
    /// bound with `unix_socket_mode` (see `listen.rs`: a live server's
    /// socket is never taken, nor a file that is not a socket removed).
    /// Connections that arrive before [`Server::start`] wait in the backlog.
    pub fn bind(&mut self) -> Result<(), ServerError> {
        if self.bound.is_some() {
            return Ok(());
        }
        if self.config.unix_socket.is_none() && self.config.tcp.is_none() {
            return Err(ServerError::NoListener);
        }
        let mut listeners = Vec::new();
        let mut tcp_addr = None;
        if let Some(addr) = self.config.tcp {
            let l = TcpListener::bind(addr).map_err(|source| ServerError::Bind {
                what: addr.to_string(),
                source,
            })?;
            let local = l.local_addr().map_err(|source| ServerError::Bind {
                what: addr.to_string(),
                source,
            })?;
            tcp_addr = Some(local);
            listeners.push(Listener::Tcp(l));
        }
        let mut unix = None;
        if let Some(path) = &self.config.unix_socket {
            let bound = bind_unix_socket(path, self.config.unix_socket_mode, self.config.unix_socket_group)?;
            unix = Some(bound.remover());
            listeners.push(Listener::Unix(bound.listener));
        }
        self.bound = Some(Bound {
            listeners,
            tcp_addr,
            unix,
        });
        Ok(())
    }

    /// The TCP address bound by [`Server::bind`] (port 0 resolved).
    pub fn bound_tcp_addr(&self) -> Option<SocketAddr> {
        self.bound.as_ref().and_then(|b| b.tcp_addr)
    }

    /// Binds the listeners (unless [`Server::bind`] did) and starts
    /// accepting connections.
    pub fn start(mut self) -> Result<RunningServer, ServerError> {
        if self.config.unix_socket.is_none() && self.config.tcp.is_none() {
            return Err(ServerError::NoListener);
        }
        let config = self.checked_config()?;
        self.bind()?;
        let Bound {
            listeners,
            tcp_addr,
            unix,
        } = self.bound.take().expect("bound above");
        let exports = std::mem::take(&mut self.exports);
        let unix_path = unix
            .as_ref()
            .map(|_| config.unix_socket.clone().expect("bound from it"));
        // Second handles on the listening sockets: shutting them down wakes
        // the accept calls (whatever became of the socket file meanwhile).
        let wake = listeners.iter().filter_map(|l| l.try_clone().ok()).collect();

        let shared = Arc::new(Shared::new(exports, config, wake));
        let mut accept_threads = Vec::new();
        for l in listeners {
            let shared = Arc::clone(&shared);
            let t = thread::Builder::new()
                .name("nbd-accept".into())
                .spawn(move || accept_loop(shared, l))
                .map_err(|e| ServerError::Config(format!("cannot spawn thread: {e}")))?;
            accept_threads.push(t);
        }
        Ok(RunningServer {
            shared,
            accept_threads,
            tcp_addr,
            unix_path,
            unix_remover: unix,
            stopped: false,
        })
    }
}

impl Drop for Server {
    /// A server bound but never started removes its socket file.
    fn drop(&mut self) {
        if let Some(unix) = self.bound.as_ref().and_then(|b| b.unix.as_ref()) {
            unix.remove();
        }
    }
}

/// Checks an export's name and block sizes before it is served.
fn check_export(name: &str, export: &dyn Export) -> Result<(), ServerError> {
    if name.len() > MAX_STRING_LEN || name.contains('\0') {
        return Err(ServerError::BadExport {
            name: name.to_string(),
            reason: "name longer than 4096 bytes or containing NUL".into(),
        });
    }
    validate_block_sizes(export.block_sizes()).map_err(|reason| ServerError::BadExport {
        name: name.to_string(),
        reason,
    })
}

/// A server that is accepting connections. Dropping it shuts it down.
pub struct RunningServer {
    shared: Arc<Shared>,
    accept_threads: Vec<JoinHandle<()>>,
    tcp_addr: Option<SocketAddr>,
    unix_path: Option<PathBuf>,
    unix_remover: Option<SocketFileRemover>,
    stopped: bool,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("tcp_addr", &self.tcp_addr)
            .field("unix_path", &self.unix_path)
            .finish()
    }
}

/// Triggers a shutdown from another thread (for example a signal handler's).
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Stops accepting and stops reading requests on every connection;
    /// requests already read are still answered. Returns at once; the
    /// [`RunningServer`] waits for the connections.
    pub fn shutdown(&self) {
        self.0.begin_shutdown();
    }
}

/// Adds and removes exports of a running server (see
/// [`RunningServer::exports`]). Every handshake looks exports up when the
/// client names one, so a change applies to every connection negotiated
/// after it.
#[derive(Clone)]
pub struct ExportHandle(Arc<Shared>);

impl std::fmt::Debug for ExportHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ExportHandle").field(&self.names()).finish()
    }
}

impl ExportHandle {
    /// The server's statistics now (as [`RunningServer::stats`]).
    pub fn server_stats(&self) -> ServerStats {
        self.0.stats.snapshot(&self.0)
    }

    /// Serves `export` under `name` from now on. Refused if an export of
    /// that name is being served (remove it first). If `name` was the
    /// default export before it was removed, it is the default again.
    pub fn add_export(&self, name: impl Into<String>, export: Arc<dyn Export>) -> Result<(), ServerError> {
        let name = name.into();
        check_export(&name, export.as_ref())?;
        let mut exports = write_lock(&self.0.exports);
        if exports.contains(&name) {
            return Err(ServerError::BadExport {
                name,
                reason: "an export of this name is already served".into(),
            });
        }
        exports.insert(name, export);
        Ok(())
    }

    /// Stops serving the export `name`: new handshakes no longer find it
    /// (NBD_OPT_GO and NBD_OPT_INFO get NBD_REP_ERR_UNKNOWN, NBD_OPT_EXPORT_NAME
    /// a closed connection), and connections already using it stop reading
    /// requests: those already read are still executed and answered (by
    /// the export, which may answer ESHUTDOWN), then the connection closes.
    /// Returns the export, or `None` if there was none of that name.
    pub fn remove_export(&self, name: &str) -> Option<Arc<dyn Export>> {
        let removed = write_lock(&self.0.exports).remove(name)?;
        let conns = lock(&self.0.conns);
        for entry in conns.entries.values() {
            if entry.export.as_deref() == Some(name) {
                let _ = entry.stream.shutdown(Shutdown::Read);
            }
        }
        Some(removed)
    }

    /// The names of the exports served now.
    pub fn names(&self) -> Vec<String> {
        read_lock(&self.0.exports)
            .iter()
            .map(|(n, _)| n.to_string())
            .collect()
    }

    /// Connections in the transmission phase on the export `name`.
    pub fn connections_to(&self, name: &str) -> usize {
        lock(&self.0.conns)
            .entries
            .values()
            .filter(|e| e.export.as_deref() == Some(name))
            .count()
    }
}

impl RunningServer {
    /// A handle to add and remove exports while the server runs.
    pub fn exports(&self) -> ExportHandle {
        ExportHandle(Arc::clone(&self.shared))
    }

    /// The bound TCP address (with the real port when 0 was asked for).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// The Unix socket path.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// A handle that can start the shutdown from elsewhere.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(Arc::clone(&self.shared))
    }

    /// Current counters.
    pub fn stats(&self) -> ServerStats {
        self.shared.stats.snapshot(&self.shared)
    }

    /// Graceful shutdown: stop accepting, finish the requests already read
    /// on every connection, close them, and return.
    pub fn shutdown(mut self) -> ServerStats {
        self.shared.begin_shutdown();
        self.finish();
        self.stats()
    }

    /// Blocks until a [`ShutdownHandle`] stops the server, then finishes as
    /// [`RunningServer::shutdown`] does.
    pub fn wait(mut self) -> ServerStats {
        self.finish();
        self.stats()
    }

    fn finish(&mut self) {
        if self.stopped {
            return;
        }
        for t in self.accept_threads.drain(..) {
            let _ = t.join();
        }
        // No connection can be added now; wait for the ones there are, for
        // at most `shutdown_grace`: then every connection still open (a
        // client that stopped reading its replies, say) is closed, which
        // fails the writes its workers are blocked in.
        let handles: Vec<JoinHandle<()>> = {
            let mut conns = lock(&self.shared.conns);
            conns.threads.drain(..).collect()
        };
        let deadline = std::time::Instant::now() + self.shared.config.shutdown_grace;
        while handles.iter().any(|h| !h.is_finished()) && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        if handles.iter().any(|h| !h.is_finished()) {
            for e in lock(&self.shared.conns).entries.values() {
                let _ = e.stream.shutdown(Shutdown::Both);
            }
        }
        for h in handles {
            let _ = h.join();
        }
        if let Some(r) = &self.unix_remover {
            r.remove();
        }
        self.stopped = true;
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if !self.stopped {
            self.shared.begin_shutdown();
            self.finish();
        }
    }
}

// ---------------------------------------------------------------------------
// Shared state, listeners and streams
// ---------------------------------------------------------------------------

struct Shared {
    exports: RwLock<Exports>,
    config: ServerConfig,
    shutting_down: AtomicBool,
    conns: Mutex<Conns>,
    stats: StatsCounters,
    /// Second handles on the listening sockets, shut down to stop accepting.
    wake: Mutex<Vec<Listener>>,
    /// The payload budget all connections share.
    global: GlobalBudget,
    /// What threads may keep of large payload buffers between requests.
    kept: KeptAllowance,
    /// The origin of [`Activity::last_ms`].
    epoch: Instant,
    /// How many connections are busy: their readers poll only while few
    /// are (`request_reader.rs`).
    busy_readers: Arc<BusyReaders>,
}

#[derive(Default)]
struct StatsCounters {
    connections: AtomicU64,
    transmissions: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
    served_inline: AtomicU64,
    replies_queued: AtomicU64,
    refused_connections: AtomicU64,
    refused_per_peer: AtomicU64,
    evicted_connections: AtomicU64,
    handshake_timeouts: AtomicU64,
    tls_failures: AtomicU64,
    spawn_failures: AtomicU64,
}

impl StatsCounters {
    fn snapshot(&self, shared: &Shared) -> ServerStats {
        let (held, peak) = shared.global.held_and_peak();
        ServerStats {
            connections: self.connections.load(Ordering::Relaxed),
            active_connections: lock(&shared.conns).entries.len() as u64,
            transmissions: self.transmissions.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            served_inline: self.served_inline.load(Ordering::Relaxed),
            replies_queued: self.replies_queued.load(Ordering::Relaxed),
            inflight_bytes: held as u64,
            peak_inflight_bytes: peak as u64,
            refused_connections: self.refused_connections.load(Ordering::Relaxed),
            refused_per_peer: self.refused_per_peer.load(Ordering::Relaxed),
            evicted_connections: self.evicted_connections.load(Ordering::Relaxed),
            handshake_timeouts: self.handshake_timeouts.load(Ordering::Relaxed),
            tls_failures: self.tls_failures.load(Ordering::Relaxed),
            spawn_failures: self.spawn_failures.load(Ordering::Relaxed),
        }
    }
}

fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// The export table of a running server, looked up under its lock for each
/// option of a handshake.
impl ExportLookup for RwLock<Exports> {
    fn find_export(&self, name: &str) -> Option<(String, Arc<dyn Export>)> {
        read_lock(self).find_export(name)
    }

    fn list_exports(&self) -> Vec<(String, Option<String>)> {
        read_lock(self).list_exports()
    }
}

/// The exports as one connection's handshake sees them: entering
/// transmission marks the connection as transmitting in the server's table
/// before the client gets the reply that lets it send requests, so a new
/// connection making room never takes it for a handshake still under way.
struct ConnLookup<'a> {
    shared: &'a Shared,
    id: Option<u64>,
}

impl ExportLookup for ConnLookup<'_> {
    fn find_export(&self, name: &str) -> Option<(String, Arc<dyn Export>)> {
        self.shared.exports.find_export(name)
    }

    fn list_exports(&self) -> Vec<(String, Option<String>)> {
        self.shared.exports.list_exports()
    }

    fn entering_transmission(&self, name: &str) -> bool {
        let Some(id) = self.id else { return true };
        let mut conns = lock(&self.shared.conns);
        match conns.entries.get_mut(&id) {
            Some(entry) if !entry.evicted => {
                entry.export = Some(name.to_string());
                true
            }
            _ => false,
        }
    }
}

/// Locks a mutex, ignoring poisoning (a panicking export is caught, but the
/// server must keep going whatever happened under a lock).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn new(exports: Exports, config: ServerConfig, wake: Vec<Listener>) -> Shared {
        Shared {
            exports: RwLock::new(exports),
            global: GlobalBudget::new(
                config.max_total_inflight_bytes,
                config.limits.max_payload as usize,
            ),
            // An eighth of what requests may hold (32 MiB by default).
            kept: KeptAllowance::new(config.max_total_inflight_bytes / 8),
            config,
            shutting_down: AtomicBool::new(false),
            conns: Mutex::new(Conns::default()),
            stats: StatsCounters::default(),
            wake: Mutex::new(wake),
            epoch: Instant::now(),
            busy_readers: Arc::new(BusyReaders::for_this_machine()),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn begin_shutdown(&self) {
        {
            let conns = lock(&self.conns);
            if self.shutting_down.swap(true, Ordering::SeqCst) {
                return;
            }
            for e in conns.entries.values() {
                let _ = e.stream.shutdown(Shutdown::Read);
            }
        }
        // Wake the blocking accept() calls so the loops see the flag: a
        // listening socket shut down fails its accept with EINVAL (Linux),
        // even when its file was removed or its address is unreachable.
        for l in lock(&self.wake).drain(..) {
            l.shutdown_listening();
        }
    }
}

/// The socket streams' [`ConnectionStream`]: the standard library's own
/// calls, and the non-blocking ones on the socket's descriptor.
macro_rules! socket_connection_stream {
    ($socket:ident, |$this:ident| $peer_name:expr) => {
        impl ConnectionStream for $socket {
            fn try_clone(&self) -> io::Result<Self> {
                $socket::try_clone(self)
            }
            fn shutdown(&self, how: Shutdown) -> io::Result<()> {
                $socket::shutdown(self, how)
            }
            fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                $socket::set_read_timeout(self, timeout)
            }
            fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                $socket::set_write_timeout(self, timeout)
            }
            fn read_vectored_now(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
                recv_now(self.as_raw_fd(), bufs)
            }
            fn write_now(&mut self, buf: &[u8]) -> io::Result<usize> {
                send_now(self.as_raw_fd(), buf)
            }
            fn write_vectored_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
                send_vectored_now(self.as_raw_fd(), bufs)
            }
            fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
                poll_writable(self.as_raw_fd(), timeout)
            }
            fn start_tls(self, tls: &TlsServer, timeout: Option<Duration>) -> io::Result<UnixStream> {
                crate::tls::upgrade(self, tls, timeout)
            }
            fn peer_name(&self) -> String {
                let $this = self;
                $peer_name
            }
        }
    };
}

socket_connection_stream!(TcpStream, |s| s
    .peer_addr()
    .map_or_else(|_| "a TCP client".into(), |a| a.to_string()));
socket_connection_stream!(UnixStream, |_s| "a Unix socket client".into());

fn accept_loop(shared: Arc<Shared>, listener: Listener) {
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(_) => {
                if shared.shutting_down.load(Ordering::SeqCst) {
                    return;
                }
                // EMFILE and friends: do not spin.
                thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let family = listener.family();
        let mut conns = lock(&shared.conns);
        if shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        conns.threads.retain(|t| !t.is_finished());
        match conns.make_room(family, peer, &shared) {
            Room::Made => {}
            refused => {
                // Closed before the greeting: the protocol has no way to
                // say why before the client sends an option, and waiting
                // for one would hold a thread for the refused client.
                let counter = match refused {
                    Room::PeerFull => &shared.stats.refused_per_peer,
                    _ => &shared.stats.refused_connections,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                let _ = stream.shutdown(Shutdown::Both);
                continue;
            }
        }
        let Ok(registered) = stream.try_clone() else {
            continue;
        };
        let id = conns.next_id;
        conns.next_id += 1;
        let activity = Arc::new(Activity::default());
        conns.entries.insert(
            id,
            Entry {
                stream: registered,
                family,
                peer,
                accepted: Instant::now(),
                export: None,
                activity: Arc::clone(&activity),
                evicted: false,
            },
        );
        let s2 = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                serve_connection(&s2, stream, Some(id), activity);
                lock(&s2.conns).entries.remove(&id);
            });
        match spawned {
            Ok(t) => conns.threads.push(t),
            Err(_) => {
                // The closure (and the stream in it) was dropped; the
                // registered clone goes too: the connection is closed.
                shared.stats.spawn_failures.fetch_add(1, Ordering::Relaxed);
                if let Some(e) = conns.entries.remove(&id) {
                    let _ = e.stream.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// One connection
// ---------------------------------------------------------------------------

/// Why a connection ended; kept for debugging, never reported to clients.
#[derive(Debug)]
#[allow(dead_code)]
enum ConnEnd {
    Handshake(HandshakeError),
    Disconnect,
    Eof,
    Fatal(ProtoError),
    Io(io::Error),
}

/// Serves one client: the handshake, then the transmission phase. `id` is
/// the connection's key in the server's table (`None` for a stream served
/// on its own, [`Server::serve_stream`]).
fn serve_connection<S: ConnectionStream>(
    shared: &Shared,
    stream: S,
    id: Option<u64>,
    activity: Arc<Activity>,
) {
    let mut hs = stream;
    let deadline = shared.config.handshake_timeout.map(|t| Instant::now() + t);
    let mut haggle = Haggle::default();
    let Some(first) = negotiate_round(shared, id, &mut hs, deadline, &mut haggle) else {
        return;
    };
    match first {
        Negotiation::Done(negotiated) => enter_transmission(shared, hs, negotiated, id, activity),
        Negotiation::StartTls => {
            let Some(tls) = shared.config.tls.as_ref() else {
                return; // negotiate_tls never accepts STARTTLS with TLS off
            };
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            // The TLS handshake, then the rest of the options inside TLS,
            // over the plaintext end of the relay (see tls.rs).
            let peer = hs.peer_name();
            let mut plain = match hs.start_tls(tls, left) {
                Ok(plain) => plain,
                Err(e) => {
                    shared.stats.tls_failures.fetch_add(1, Ordering::Relaxed);
                    log::warn!("TLS handshake with {peer} failed: {e}");
                    return;
                }
            };
            let _ = plain.set_read_timeout(shared.config.handshake_timeout);
            match negotiate_round(shared, id, &mut plain, deadline, &mut haggle) {
                Some(Negotiation::Done(negotiated)) => {
                    enter_transmission(shared, plain, negotiated, id, activity)
                }
                Some(Negotiation::StartTls) => {
                    let _ = plain.shutdown(Shutdown::Both);
                }
                None => {}
            }
        }
    }
}

/// One call of [`negotiate_tls`] on `stream` (the socket, or the plaintext
/// end of a TLS relay) within `deadline`. A failed negotiation is counted
/// when it timed out and closes the stream: `None`.
fn negotiate_round<T: ConnectionStream>(
    shared: &Shared,
    id: Option<u64>,
    stream: &mut T,
    deadline: Option<Instant>,
    haggle: &mut Haggle,
) -> Option<Negotiation> {
    let tls_mode = shared.config.tls.as_ref().map_or(TlsMode::Off, |t| t.mode);
    let negotiated = negotiate_tls(
        &mut Deadlined {
            stream: &mut *stream,
            deadline,
        },
        &ConnLookup { shared, id },
        &shared.config.limits,
        &shared.shutting_down,
        tls_mode,
        haggle,
    );
    match negotiated {
        Ok(negotiation) => Some(negotiation),
        Err(e) => {
            if matches!(&e, HandshakeError::Io(io) if is_timeout(io)) {
                shared.stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
            }
            let _ = stream.shutdown(Shutdown::Both);
            None
        }
    }
}

/// Registers a negotiated connection and serves its transmission phase on
/// `hs` (the socket, or the plaintext end of a TLS relay).
fn enter_transmission<T: ConnectionStream>(
    shared: &Shared,
    hs: T,
    negotiated: Negotiated,
    id: Option<u64>,
    activity: Arc<Activity>,
) {
    activity.touch(shared);
    if let Some(id) = id {
        // Registered before checking that the export is still served: a
        // removal either comes first (and the check sees it) or finds this
        // connection registered (and stops its reads). A connection
        // evicted during its handshake stops here.
        {
            let mut conns = lock(&shared.conns);
            match conns.entries.get_mut(&id) {
                Some(entry) if !entry.evicted => entry.export = Some(negotiated.name.clone()),
                _ => {
                    drop(conns);
                    let _ = hs.shutdown(Shutdown::Both);
                    return;
                }
            }
        }
        let still_served = read_lock(&shared.exports)
            .find(&negotiated.name)
            .is_some_and(|(_, e)| Arc::ptr_eq(e, &negotiated.export));
        if !still_served {
            let _ = hs.shutdown(Shutdown::Both);
            return;
        }
    }
    shared.stats.transmissions.fetch_add(1, Ordering::Relaxed);
    let _ = hs.set_read_timeout(None);
    let step = shared
        .config
        .reply_timeout
        .map_or(shared.config.stall_timeout, |t| {
            t.min(shared.config.stall_timeout)
        });
    let _ = hs.set_write_timeout(Some(step.max(Duration::from_millis(1))));
    let _ = transmission(shared, hs, negotiated, activity);
}
