//! Tests, the simulator's data-level checks and a
//! RAM-only cache need a device with no filesystem underneath. `MemDevice`
//! keeps its bytes in fixed-size chunks, each behind its own `RwLock`, so
//! concurrent requests to different parts of the device do not contend.

use std::sync::RwLock;

use crate::device::{check_range, BlockDevice};
use crate::error::{DeviceError, IoKind};
use crate::identity::DeviceIdentity;

/// Bytes per chunk (and per lock).
const CHUNK: usize = 64 * 1024;

/// A device in RAM. Flush is a no-op (nothing is ever lost); discard zeroes.
#[derive(Debug)]
pub struct MemDevice {
    name: String,
    len: u64,
    chunks: Box<[RwLock<Box<[u8]>>]>,
    identity: DeviceIdentity,
}

impl MemDevice {
    /// A zero-filled device of `len` bytes.
    pub fn new(name: impl Into<String>, len: u64) -> MemDevice {
        let n = len.div_ceil(CHUNK as u64) as usize;
        let chunks = (0..n)
            .map(|i| {
                let size = if i + 1 == n {
                    (len - (i as u64) * CHUNK as u64) as usize
                } else {
                    CHUNK
                };
                RwLock::new(vec![0u8; size].into_boxed_slice())
            })
            .collect();
        MemDevice {
            name: name.into(),
            len,
            chunks,
            identity: DeviceIdentity::memory(),
        }
    }

    /// The same device under `identity` instead of its own: for a test that
    /// copies a backend's bytes into a new device and means the same backend.
    pub fn identified(mut self, identity: DeviceIdentity) -> MemDevice {
        self.identity = identity;
        self
    }

    /// Calls `f(chunk_index, offset_in_chunk, range_in_request)` for each chunk
    /// the request `offset..offset + len` touches.
    fn for_each_chunk(offset: u64, len: usize, mut f: impl FnMut(usize, usize, std::ops::Range<usize>)) {
        let mut done = 0;
        while done < len {
            let pos = offset + done as u64;
            let chunk = (pos / CHUNK as u64) as usize;
            let within = (pos % CHUNK as u64) as usize;
            let n = (CHUNK - within).min(len - done);
            f(chunk, within, done..done + n);
            done += n;
        }
    }
}

impl BlockDevice for MemDevice {
    fn len_bytes(&self) -> u64 {
        self.len
    }

    fn reads_at_memory_speed(&self) -> bool {
        true
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Read, offset, buf.len() as u64)?;
        Self::for_each_chunk(offset, buf.len(), |c, within, r| {
            let chunk = self.chunks[c].read().unwrap_or_else(|p| p.into_inner());
            let n = r.len();
            buf[r].copy_from_slice(&chunk[within..within + n]);
        });
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Write, offset, data.len() as u64)?;
        Self::for_each_chunk(offset, data.len(), |c, within, r| {
            let mut chunk = self.chunks[c].write().unwrap_or_else(|p| p.into_inner());
            let n = r.len();
            chunk[within..within + n].copy_from_slice(&data[r]);
        });
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Discard, offset, len)?;
        Self::for_each_chunk(offset, len as usize, |c, within, r| {
            let mut chunk = self.chunks[c].write().unwrap_or_else(|p| p.into_inner());
            chunk[within..within + r.len()].fill(0);
        });
        Ok(())
    }

    fn zeroes_fast(&self) -> bool {
        true
    }

    fn write_zeroes(&self, offset: u64, len: u64, _keep_allocated: bool) -> Result<(), DeviceError> {
        check_range(self, IoKind::Write, offset, len)?;
        self.discard(offset, len)
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn identity(&self) -> Option<DeviceIdentity> {
        Some(self.identity.clone())
    }
}
