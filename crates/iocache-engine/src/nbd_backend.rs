//! A remote NBD export as the backend device: the SYSTOR'14 scenario of
//! caching network storage on the client side.

use std::sync::Mutex;

use iocache_device::{check_range, BlockDevice, DeviceError, IoKind};
use iocache_nbd::Client;

/// One connection to the remote export; requests take turns on it.
pub struct NbdBackend {
    uri: String,
    size: u64,
    client: Mutex<Client>,
}

impl std::fmt::Debug for NbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NbdBackend({})", self.uri)
    }
}

impl NbdBackend {
    /// Connects to `nbd://host[:port]/name` or `nbd+unix:///name?socket=PATH`.
    pub fn connect(uri: &str) -> Result<NbdBackend, DeviceError> {
        let client = Client::connect(uri).map_err(|e| DeviceError::Open {
            path: uri.into(),
            what: "connect to the NBD export",
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(NbdBackend {
            uri: uri.to_string(),
            size: client.size(),
            client: Mutex::new(client),
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

    fn client(&self) -> std::sync::MutexGuard<'_, Client> {
        self.client.lock().unwrap_or_else(|p| p.into_inner())
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

    fn flush(&self) -> Result<(), DeviceError> {
        self.client()
            .flush()
            .map_err(|e| self.error(IoKind::Flush, 0, 0, e))
    }

    fn name(&self) -> &str {
        &self.uri
    }
}
