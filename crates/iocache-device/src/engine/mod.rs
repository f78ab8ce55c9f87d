//! One client request to the cache becomes several
//! device I/Os (a cache read, a backend read, a fill...), and the cache
//! engine wants them in flight together. `IoEngine` takes a batch of
//! positional reads and writes, each on its own device with its own buffer,
//! and returns when all are complete, with one result per request.

mod psync;
mod uring;

pub use psync::PsyncEngine;
pub use uring::{UringEngine, UringStats};

use crate::device::BlockDevice;
use crate::error::{DeviceError, IoKind};

/// The buffer of one request, which also says its direction.
#[derive(Debug)]
pub enum IoBuf<'a> {
    /// Fill this buffer from the device.
    Read(&'a mut [u8]),
    /// Write these bytes to the device.
    Write(&'a [u8]),
}

/// One positional I/O of a batch. `result` is `None` until the engine ran it.
#[derive(Debug)]
pub struct IoRequest<'a> {
    /// The device to read or write.
    pub device: &'a dyn BlockDevice,
    /// Byte offset on the device.
    pub offset: u64,
    /// Buffer and direction.
    pub buf: IoBuf<'a>,
    /// Outcome, set by [`IoEngine::submit`].
    pub result: Option<Result<(), DeviceError>>,
}

impl<'a> IoRequest<'a> {
    /// A read of `buf.len()` bytes at `offset`.
    pub fn read(device: &'a dyn BlockDevice, buf: &'a mut [u8], offset: u64) -> Self {
        IoRequest {
            device,
            offset,
            buf: IoBuf::Read(buf),
            result: None,
        }
    }

    /// A write of `data` at `offset`.
    pub fn write(device: &'a dyn BlockDevice, data: &'a [u8], offset: u64) -> Self {
        IoRequest {
            device,
            offset,
            buf: IoBuf::Write(data),
            result: None,
        }
    }

    /// `Read` or `Write`.
    pub fn kind(&self) -> IoKind {
        match self.buf {
            IoBuf::Read(_) => IoKind::Read,
            IoBuf::Write(_) => IoKind::Write,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.buf {
            IoBuf::Read(b) => b.len(),
            IoBuf::Write(b) => b.len(),
        }
    }

    /// Whether the request transfers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The request's outcome, treating "not run" as an error.
    pub fn outcome(&self) -> Result<(), &DeviceError> {
        match &self.result {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(e),
            None => panic!("request was not submitted"),
        }
    }

    /// Runs the request on the calling thread through the device's own
    /// `read_at` / `write_at`.
    pub(crate) fn run_sync(&mut self) {
        let r = match &mut self.buf {
            IoBuf::Read(b) => self.device.read_at(b, self.offset),
            IoBuf::Write(b) => self.device.write_at(b, self.offset),
        };
        self.result = Some(r);
    }

    pub(crate) fn not_executed(&self) -> DeviceError {
        DeviceError::NotExecuted {
            device: self.device.name().to_string(),
            kind: self.kind(),
            offset: self.offset,
            len: self.len() as u64,
        }
    }
}

/// Runs batches of positional I/O.
pub trait IoEngine: Send + Sync {
    /// A short name for messages and benchmarks.
    fn name(&self) -> &str;

    /// Runs every request of `ops` (in any order, possibly in parallel) and
    /// returns when all are complete; each request's `result` is then set.
    /// Requests of one batch must not overlap if any of them writes.
    /// `Err` means the engine itself failed; the requests it did not run
    /// then carry [`DeviceError::NotExecuted`].
    fn submit(&self, ops: &mut [IoRequest<'_>]) -> Result<(), DeviceError>;
}
