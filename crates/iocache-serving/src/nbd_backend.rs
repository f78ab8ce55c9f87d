//! A remote NBD export as the backend device: the SYSTOR'14 scenario of
//! caching network storage on the client side.
//!
//! The client sends one request at a time per connection, so the backend
//! keeps a pool of connections and each I/O takes a free one: misses of
//! concurrent requests reach the remote server in parallel.
//!
//! A remote server can stall, restart or vanish, and none of that may hang
//! the cache or leave it failing forever. So every request has a deadline
//! (the connection's socket timeouts); a connection that fails at the
//! transport level (not an NBD error reply, after which it stays usable)
//! is dropped and opened again by the next request that needs it; and the
//! first such failure opens a circuit breaker: for a back-off that doubles
//! from 100 ms to 5 s while the server stays unreachable, requests fail at
//! once with EIO instead of each waiting out its own deadline. The engine
//! already treats a failed backend request as "retry later" (dirty lines
//! stay dirty), so a restarted server is simply used again.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use iocache_device::{check_range, BlockDevice, DeviceError, DeviceIdentity, IoKind};
use iocache_nbd::proto::{
    NBD_FLAG_CAN_MULTI_CONN, NBD_FLAG_SEND_FAST_ZERO, NBD_FLAG_SEND_TRIM, NBD_FLAG_SEND_WRITE_ZEROES,
};
use iocache_nbd::{parse_nbd_uri, Client, ClientError, ConnectOptions, NbdAddr};

/// Connections opened by [`NbdBackend::connect`].
pub const NBD_BACKEND_CONNECTIONS: usize = 8;

/// How long one request (or a connection's handshake) may take before the
/// connection is considered dead.
pub const NBD_BACKEND_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The first and the longest wait of the circuit breaker.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// One connection of the pool: absent after a transport failure until a
/// request reopens it.
struct Conn {
    client: Option<Client>,
    /// Writes completed on this connection since its last FLUSH.
    unflushed_writes: bool,
}

/// Whether requests are let through.
#[derive(Default)]
struct Breaker {
    /// Requests fail at once until then.
    closed_until: Option<Instant>,
    backoff: Duration,
    /// The failure that opened it, for the errors it returns.
    reason: String,
}

/// Connections to the remote export, used by whichever I/O finds one free.
pub struct NbdBackend {
    uri: String,
    addr: NbdAddr,
    options: ConnectOptions,
    size: u64,
    /// The server said a FLUSH on one connection covers writes completed on
    /// every connection (NBD_FLAG_CAN_MULTI_CONN).
    multi_conn: bool,
    /// The export's transmission flags (TRIM, WRITE_ZEROES, FAST_ZERO
    /// offered), as its first connection saw them.
    flags: u16,
    conns: Vec<Mutex<Conn>>,
    next: AtomicUsize,
    breaker: Mutex<Breaker>,
    /// Whether the breaker holds any state (read without its lock on every
    /// request: a healthy backend never takes it).
    breaker_armed: AtomicBool,
    /// A connection was lost after writes it had not flushed: without
    /// multi-conn, no FLUSH on another connection covers them, so the
    /// next FLUSH reports it instead of claiming durability.
    lost_unflushed: Mutex<bool>,
    reconnects: AtomicU64,
}

impl std::fmt::Debug for NbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NbdBackend({})", self.uri)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn open_error(uri: &str, e: impl std::fmt::Display + OpenCause) -> DeviceError {
    DeviceError::Open {
        path: uri.into(),
        what: "connect to the NBD export",
        // The kind says whether the export may be reachable later (a
        // refused or timed-out connection) for whoever decides to retry.
        source: std::io::Error::new(e.io_kind(), e.to_string()),
    }
}

/// What kind of I/O failure, if any, kept a connection from opening.
trait OpenCause {
    fn io_kind(&self) -> std::io::ErrorKind {
        std::io::ErrorKind::Other
    }
}

impl OpenCause for ClientError {
    fn io_kind(&self) -> std::io::ErrorKind {
        match self {
            // No socket file yet: nothing listens there yet, as a refused
            // TCP connection says.
            ClientError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::io::ErrorKind::ConnectionRefused
            }
            ClientError::Io(e) => e.kind(),
            _ => std::io::ErrorKind::Other,
        }
    }
}

impl OpenCause for iocache_nbd::UriError {}

impl NbdBackend {
    /// Connects to `nbd://host[:port]/name` or `nbd+unix:///name?socket=PATH`
    /// with [`NBD_BACKEND_CONNECTIONS`] connections.
    pub fn connect(uri: &str) -> Result<NbdBackend, DeviceError> {
        Self::connect_with(uri, NBD_BACKEND_CONNECTIONS, NBD_BACKEND_REQUEST_TIMEOUT)
    }

    /// Connects with `connections` connections, each request bounded by
    /// `timeout`.
    pub fn connect_with(uri: &str, connections: usize, timeout: Duration) -> Result<NbdBackend, DeviceError> {
        let parsed = parse_nbd_uri(uri).map_err(|e| open_error(uri, e))?;
        let options = ConnectOptions {
            timeout: Some(timeout),
            allocation: true,
            ..ConnectOptions::export(parsed.export_name.clone())
        };
        let mut conns = Vec::with_capacity(connections.max(1));
        let mut size = 0;
        let mut multi_conn = false;
        let mut flags = 0;
        for _ in 0..connections.max(1) {
            let client = Client::connect_addr(&parsed.addr, &options).map_err(|e| open_error(uri, e))?;
            size = client.size();
            flags = client.transmission_flags();
            multi_conn = flags & NBD_FLAG_CAN_MULTI_CONN != 0;
            conns.push(Mutex::new(Conn {
                client: Some(client),
                unflushed_writes: false,
            }));
        }
        Ok(NbdBackend {
            uri: uri.to_string(),
            addr: parsed.addr,
            options,
            size,
            multi_conn,
            flags,
            conns,
            next: AtomicUsize::new(0),
            breaker: Mutex::new(Breaker::default()),
            breaker_armed: AtomicBool::new(false),
            lost_unflushed: Mutex::new(false),
            reconnects: AtomicU64::new(0),
        })
    }

    /// Connections opened again after a failure, since the start.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    fn error(&self, kind: IoKind, offset: u64, len: u64, e: impl std::fmt::Display) -> DeviceError {
        DeviceError::Io {
            device: self.uri.clone(),
            kind,
            offset,
            len,
            source: std::io::Error::other(e.to_string()),
        }
    }

    /// A free connection if there is one, else the next in turn (waiting for it).
    fn conn(&self) -> std::sync::MutexGuard<'_, Conn> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.conns.len() {
            if let Ok(guard) = self.conns[(start + i) % self.conns.len()].try_lock() {
                return guard;
            }
        }
        lock(&self.conns[start % self.conns.len()])
    }

    /// `Err(reason)` while the breaker holds requests back.
    fn check_breaker(&self) -> Result<(), String> {
        if !self.breaker_armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let breaker = lock(&self.breaker);
        match breaker.closed_until {
            Some(until) if Instant::now() < until => Err(format!(
                "the NBD backend is unreachable ({}); retrying within {} ms",
                breaker.reason,
                until.saturating_duration_since(Instant::now()).as_millis()
            )),
            _ => Ok(()),
        }
    }

    fn trip(&self, reason: &str) {
        let mut breaker = lock(&self.breaker);
        breaker.backoff = if breaker.backoff.is_zero() {
            BACKOFF_FIRST
        } else {
            (breaker.backoff * 2).min(BACKOFF_MAX)
        };
        breaker.closed_until = Some(Instant::now() + breaker.backoff);
        breaker.reason = reason.to_string();
        self.breaker_armed.store(true, Ordering::Release);
    }

    fn healthy(&self) {
        if !self.breaker_armed.load(Ordering::Acquire) {
            return;
        }
        let mut breaker = lock(&self.breaker);
        *breaker = Breaker::default();
        self.breaker_armed.store(false, Ordering::Release);
    }

    /// Drops a connection that failed at the transport level (the next
    /// request reopens it), remembers writes it had not flushed, and opens
    /// the breaker.
    fn lose(&self, mut conn: std::sync::MutexGuard<'_, Conn>, e: &ClientError) {
        if conn.unflushed_writes && !self.multi_conn {
            *lock(&self.lost_unflushed) = true;
        }
        conn.client = None;
        conn.unflushed_writes = false;
        drop(conn);
        self.trip(&e.to_string());
    }

    /// Runs `f` on a connection (reopened if it was lost), with the breaker
    /// and the connection's fate handled.
    fn request<T>(
        &self,
        kind: IoKind,
        offset: u64,
        len: u64,
        f: impl FnOnce(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, DeviceError> {
        self.check_breaker()
            .map_err(|e| self.error(kind, offset, len, e))?;
        let mut conn = self.conn();
        if conn.client.is_none() {
            let client = Client::connect_addr(&self.addr, &self.options).map_err(|e| {
                let reason = format!("reconnecting: {e}");
                self.trip(&reason);
                self.error(kind, offset, len, reason)
            })?;
            if client.size() != self.size {
                let reason = format!(
                    "the export now has {} bytes, not {}: not the volume this cache was started on",
                    client.size(),
                    self.size
                );
                self.trip(&reason);
                return Err(self.error(kind, offset, len, reason));
            }
            self.reconnects.fetch_add(1, Ordering::Relaxed);
            conn.client = Some(client);
            conn.unflushed_writes = false;
        }
        let client = conn.client.as_mut().expect("opened above");
        match f(client) {
            Ok(v) => {
                if kind == IoKind::Write {
                    conn.unflushed_writes = true;
                }
                drop(conn);
                self.healthy();
                Ok(v)
            }
            // The server answered with an error: the connection is fine.
            Err(e) if e.errno().is_some() => Err(self.error(kind, offset, len, e)),
            Err(e) => {
                self.lose(conn, &e);
                Err(self.error(kind, offset, len, e))
            }
        }
    }
}

impl BlockDevice for NbdBackend {
    fn len_bytes(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Read, offset, buf.len() as u64)?;
        let len = buf.len() as u64;
        self.request(IoKind::Read, offset, len, |c| c.read(offset, buf))
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Write, offset, data.len() as u64)?;
        self.request(IoKind::Write, offset, data.len() as u64, |c| {
            c.write(offset, data, false)
        })
    }

    /// Flushes every live connection: a write completed on any of them is
    /// covered. Fails (once) if a connection was lost after writes it had
    /// not flushed and the server does not promise multi-conn consistency.
    fn flush(&self) -> Result<(), DeviceError> {
        self.check_breaker()
            .map_err(|e| self.error(IoKind::Flush, 0, 0, e))?;
        for slot in &self.conns {
            let mut conn = lock(slot);
            let Some(client) = conn.client.as_mut() else {
                continue;
            };
            match client.flush() {
                Ok(()) => conn.unflushed_writes = false,
                Err(e) if e.errno().is_some() => return Err(self.error(IoKind::Flush, 0, 0, e)),
                Err(e) => {
                    self.lose(conn, &e);
                    return Err(self.error(IoKind::Flush, 0, 0, e));
                }
            }
        }
        if std::mem::take(&mut *lock(&self.lost_unflushed)) {
            return Err(self.error(
                IoKind::Flush,
                0,
                0,
                "a connection was lost after writes it had not flushed, and the server does not \
                 promise that a FLUSH on another connection covers them (no multi-conn)",
            ));
        }
        self.healthy();
        Ok(())
    }

    /// NBD_CMD_TRIM where the export offers it; nothing otherwise (a
    /// discard is advisory).
    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Discard, offset, len)?;
        if self.flags & NBD_FLAG_SEND_TRIM == 0 || len == 0 {
            return Ok(());
        }
        // A trim changes the export like a write: a FLUSH must cover it.
        self.request(IoKind::Write, offset, len, |c| c.trim(offset, len))
    }

    /// The export's `base:allocation` extents where it serves the context
    /// (asked a piece at a time, each answer taken as far as it goes);
    /// all data otherwise.
    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<iocache_device::Allocation>, DeviceError> {
        use iocache_device::Allocation;
        check_range(self, IoKind::Read, offset, len)?;
        let mut out: Vec<Allocation> = Vec::new();
        let mut at = offset;
        let end = offset + len;
        while at < end {
            // Pieces of at most 64 MiB (multiples of any block size): at
            // most 131,072 extents of 512 bytes, within what the client
            // reads of one reply.
            let piece = (end - at).min(64 << 20) as u32;
            let extents = self.request(IoKind::Read, at, u64::from(piece), |c| {
                if c.has_allocation() {
                    c.block_status(at, piece)
                } else {
                    Ok(Vec::new())
                }
            })?;
            let before = at;
            if extents.is_empty() {
                // No context on this connection: the rest counts as data.
                out.push(Allocation {
                    length_bytes: end - at,
                    hole: false,
                });
                break;
            }
            for e in extents {
                let length_bytes = u64::from(e.length).min(end - at);
                if length_bytes == 0 {
                    continue;
                }
                // A hole here reads as zeroes: HOLE without ZERO is data.
                use iocache_nbd::proto::{NBD_STATE_HOLE, NBD_STATE_ZERO};
                let hole = e.flags & (NBD_STATE_HOLE | NBD_STATE_ZERO) == NBD_STATE_HOLE | NBD_STATE_ZERO;
                match out.last_mut() {
                    Some(last) if last.hole == hole => last.length_bytes += length_bytes,
                    _ => out.push(Allocation { length_bytes, hole }),
                }
                at += length_bytes;
                if at >= end {
                    break;
                }
            }
            if at == before {
                // Extents of no length: nothing learned; the rest is data.
                out.push(Allocation {
                    length_bytes: end - at,
                    hole: false,
                });
                break;
            }
        }
        Ok(out)
    }

    /// Only an export that offers FAST_ZERO promises a quick zeroing.
    fn zeroes_fast(&self) -> bool {
        self.flags & (NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO)
            == NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO
    }

    /// NBD_CMD_WRITE_ZEROES (NO_HOLE with `keep_allocated`) where the
    /// export offers it; zero buffers otherwise.
    fn write_zeroes(&self, offset: u64, len: u64, keep_allocated: bool) -> Result<(), DeviceError> {
        check_range(self, IoKind::Write, offset, len)?;
        if self.flags & NBD_FLAG_SEND_WRITE_ZEROES == 0 {
            return iocache_device::write_zero_buffers(self, offset, len);
        }
        if len == 0 {
            return Ok(());
        }
        self.request(IoKind::Write, offset, len, |c| {
            c.write_zeroes(offset, len, false, keep_allocated)
        })
    }

    fn name(&self) -> &str {
        &self.uri
    }

    /// The server's address and the export's name: other URI parameters
    /// (TLS files, say) may change without the export changing.
    fn identity(&self) -> Option<DeviceIdentity> {
        let addr = match &self.addr {
            NbdAddr::Tcp { host, port } => format!("tcp:{host}:{port}"),
            NbdAddr::Unix { socket } => format!("unix:{}", socket.display()),
        };
        Some(DeviceIdentity::nbd(&addr, &self.options.export_name))
    }
}
