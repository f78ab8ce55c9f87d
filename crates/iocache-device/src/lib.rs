//! Why this crate exists: the device layer of iocache. The policy core
//! decides which bytes move between the cache device and the backends; this
//! crate moves them: block devices (files and block devices with optional
//! `O_DIRECT`, or mapped when they live in memory; RAM; a fault-injecting
//! wrapper for tests) behind one
//! [`BlockDevice`] trait, and I/O engines ([`PsyncEngine`], [`UringEngine`])
//! that run a batch of positional reads and writes with the batch's I/Os in
//! flight together.

mod aligned;
mod device;
mod engine;
mod error;
mod exclusive;
mod fault;
mod file;
mod identity;
mod mapped;
mod mem;
mod rng;
mod staged;

pub use aligned::AlignedBuf;
pub use device::{
    check_range, is_aligned, write_zero_buffers, Allocation, BlockDevice, RawTarget, ZERO_BUFFER_BYTES,
};
pub use engine::{IoBuf, IoEngine, IoRequest, PsyncEngine, UringEngine, UringStats};
pub use error::{DeviceError, IoKind};
pub use fault::{FaultDevice, FaultStats, PowerCut, PowerCutReport, SECTOR};
pub use file::{thread_stripe, DirectIo, FileDevice, OpenOptions};
pub use identity::{DeviceIdentity, Identified, IdentityKind};
pub use mem::MemDevice;
pub use staged::Staged;
