//! A remote NBD export as the backend device: the SYSTOR'14 scenario of
//! caching network storage on the client side.
//!
//! The client sends one request at a time per connection, so the backend
//! keeps a pool of connections and each I/O takes a free one: misses of
//! concurrent requests reach the remote server in parallel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use iocache_device::{check_range, BlockDevice, DeviceError, IoKind};
use iocache_nbd::Client;

/// Connections to the remote export, used by whichever I/O finds one free.
pub struct NbdBackend {
    uri: String,
    size: u64,
    clients: Vec<Mutex<Client>>,
    next: AtomicUsize,
}

/// Connections opened by [`NbdBackend::connect`].
pub const NBD_BACKEND_CONNECTIONS: usize = 8;

impl std::fmt::Debug for NbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NbdBackend({})", self.uri)
    }
}

impl NbdBackend {
    /// Connects to `nbd://host[:port]/name` or `nbd+unix:///name?socket=PATH`
    /// with [`NBD_BACKEND_CONNECTIONS`] connections.
    pub fn connect(uri: &str) -> Result<NbdBackend, DeviceError> {
        Self::connect_with(uri, NBD_BACKEND_CONNECTIONS)
    }

    pub fn connect_with(uri: &str, connections: usize) -> Result<NbdBackend, DeviceError> {
        let mut clients = Vec::with_capacity(connections.max(1));
        for _ in 0..connections.max(1) {
            let client = Client::connect(uri).map_err(|e| DeviceError::Open {
                path: uri.into(),
                what: "connect to the NBD export",
                source: std::io::Error::other(e.to_string()),
            })?;
            clients.push(Mutex::new(client));
        }
        let size = clients[0].lock().unwrap_or_else(|p| p.into_inner()).size();
        Ok(NbdBackend {
            uri: uri.to_string(),
            size,
            clients,
            next: AtomicUsize::new(0),
        })
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
    fn client(&self) -> std::sync::MutexGuard<'_, Client> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.clients.len() {
            if let Ok(guard) = self.clients[(start + i) % self.clients.len()].try_lock() {
                return guard;
            }
        }
        self.clients[start % self.clients.len()]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl BlockDevice for NbdBackend {
    fn len_bytes(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Read, offset, buf.len() as u64)?;
        let len = buf.len() as u64;
        self.client()
            .read(offset, buf)
            .map_err(|e| self.error(IoKind::Read, offset, len, e))
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Write, offset, data.len() as u64)?;
        self.client()
            .write(offset, data, false)
            .map_err(|e| self.error(IoKind::Write, offset, data.len() as u64, e))
    }

    /// Flushes every connection: a write completed on any of them is covered.
    fn flush(&self) -> Result<(), DeviceError> {
        for client in &self.clients {
            client
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .flush()
                .map_err(|e| self.error(IoKind::Flush, 0, 0, e))?;
        }
        Ok(())
    }

    fn name(&self) -> &str {
        &self.uri
    }
}
