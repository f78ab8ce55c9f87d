//! The one trait every device implements, so the cache
//! engine, the I/O engines and the tests can treat a cache SSD, a backing
//! disk, a RAM device and a fault-injecting wrapper alike.

use std::os::unix::io::RawFd;

use crate::error::{DeviceError, IoKind};
use crate::identity::DeviceIdentity;

/// A fixed-size array of bytes with positional, thread-safe I/O.
///
/// Every method takes `&self`: concurrent requests to disjoint ranges are
/// safe and independent; concurrent overlapping writes give no atomicity
/// guarantee (as on a real disk). Buffers and offsets may have any alignment:
/// a device whose [`alignment`](BlockDevice::alignment) is above 1 handles
/// unaligned requests itself (more slowly).
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Size of the device in bytes.
    fn len_bytes(&self) -> u64;

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError>;

    /// Writes `data` at `offset`. Not durable until [`flush`](BlockDevice::flush) returns.
    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError>;

    /// Makes every completed write durable (`fdatasync` for files).
    fn flush(&self) -> Result<(), DeviceError>;

    /// Tells the device that `offset..offset + len` is no longer needed.
    /// Its contents are unspecified afterwards. The default does nothing.
    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Discard, offset, len)
    }

    /// Whether [`write_zeroes`](BlockDevice::write_zeroes) is much quicker
    /// than writing zero buffers (a hole punched, a zeroing command): what
    /// NBD's FAST_ZERO asks. The default says no.
    fn zeroes_fast(&self) -> bool {
        false
    }

    /// Makes `offset..offset + len` read as zeroes; with `keep_allocated`,
    /// without leaving a hole (space a thin volume reserved stays reserved).
    /// Not durable until [`flush`](BlockDevice::flush) returns. The default
    /// writes zero buffers ([`write_zero_buffers`]).
    fn write_zeroes(&self, offset: u64, len: u64, keep_allocated: bool) -> Result<(), DeviceError> {
        let _ = keep_allocated;
        check_range(self, IoKind::Write, offset, len)?;
        write_zero_buffers(self, offset, len)
    }

    /// Which parts of `offset..offset + len` hold data and which are holes
    /// (unallocated, reading as zeroes): extents in order, covering the
    /// range. The default says it is all data.
    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<Allocation>, DeviceError> {
        check_range(self, IoKind::Read, offset, len)?;
        Ok(vec![Allocation {
            length_bytes: len,
            hole: false,
        }])
    }

    /// Alignment in bytes that buffers, offsets and lengths need for the
    /// fast path: 1 normally, the direct-I/O alignment (512 or 4096) when
    /// the device bypasses the page cache. Unaligned requests still work.
    fn alignment(&self) -> usize {
        1
    }

    /// A name for messages: the path for files.
    fn name(&self) -> &str;

    /// The raw file descriptor an I/O engine may drive directly (io_uring),
    /// or `None` when requests must go through `read_at` / `write_at`
    /// (RAM devices, fault-injecting wrappers).
    fn raw_target(&self) -> Option<RawTarget> {
        None
    }

    /// What this device is, to tell it from another one across restarts
    /// (see `identity.rs`), or `None` when it cannot say (a cache array).
    fn identity(&self) -> Option<DeviceIdentity> {
        None
    }

    /// The device's bytes `[offset, offset + len)` as memory to be read in
    /// place (a cache file in memory, mapped), or `None` when the device
    /// has no such memory (or it failed): then [`BlockDevice::read_at`].
    /// A page that vanished under a read in place (a file truncated by
    /// someone else) reads as zeroes and fails the device, which
    /// [`BlockDevice::in_place_sound`] reports afterwards.
    ///
    /// # Safety
    /// The bytes change with the device's writes: the caller must see to it
    /// that nothing writes the range while the slice lives (as it orders a
    /// `read_at` with writes to the same range).
    unsafe fn in_place(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let _ = (offset, len);
        None
    }

    /// Writes `data` at `offset` as [`BlockDevice::write_at`] does, except
    /// that a process killed in the middle may leave a sector half old and
    /// half new: for data that nothing trusts unchecked after a crash. A
    /// cache file in memory is then written by a copy into its mapping,
    /// cheaper than `pwrite` (which the kernel stops only between pages).
    /// The default is `write_at`.
    fn write_tearable_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.write_at(data, offset)
    }

    /// Whether no fault has hit the memory [`BlockDevice::in_place`] hands
    /// out: checked after reading it in place, before trusting what was
    /// read.
    fn in_place_sound(&self) -> bool {
        false
    }

    /// Whether a read of a few KiB completes in about the time of a memory
    /// copy (RAM, a file mapped from tmpfs), so that a scheduler may run it
    /// on the thread that received it rather than hand it to another. A
    /// device that waits on hardware, a network or added latency says no,
    /// the default: a read run inline there holds up every request queued
    /// behind it on that thread.
    fn reads_at_memory_speed(&self) -> bool {
        false
    }

    /// Checks that the device still holds all its bytes: a file truncated
    /// under it fails ([`DeviceError::Shrunk`]); the default, for devices
    /// that cannot shrink, passes. Cheap (one `fstat`): callers may check
    /// often.
    fn check_intact(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

/// What an engine needs to drive a device's file descriptor itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawTarget {
    /// The descriptor; valid as long as the device lives.
    pub fd: RawFd,
    /// Alignment of buffer address, offset and length required by the fd
    /// (1 unless opened with `O_DIRECT`).
    pub alignment: usize,
    /// Whether writes must be refused.
    pub read_only: bool,
}

/// Checks that `offset..offset + len` lies within `dev`.
pub fn check_range<D: BlockDevice + ?Sized>(
    dev: &D,
    kind: IoKind,
    offset: u64,
    len: u64,
) -> Result<(), DeviceError> {
    let size = dev.len_bytes();
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::OutOfRange {
            device: dev.name().to_string(),
            kind,
            offset,
            len,
            size,
        }),
    }
}

/// One extent of [`BlockDevice::allocation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub length_bytes: u64,
    /// Not allocated: reads as zeroes.
    pub hole: bool,
}

/// Bytes of zeroes [`write_zero_buffers`] writes at a time.
pub const ZERO_BUFFER_BYTES: usize = 1 << 20;

/// Writes zero buffers of at most [`ZERO_BUFFER_BYTES`] over
/// `offset..offset + len`: how a device with no quicker way zeroes a range.
pub fn write_zero_buffers<D: BlockDevice + ?Sized>(
    dev: &D,
    offset: u64,
    len: u64,
) -> Result<(), DeviceError> {
    let zeroes = vec![0u8; ZERO_BUFFER_BYTES.min(len as usize)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeroes.len() as u64) as usize;
        dev.write_at(&zeroes[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Whether a buffer address, offset and length all satisfy `alignment`.
pub fn is_aligned(ptr: *const u8, offset: u64, len: usize, alignment: usize) -> bool {
    alignment <= 1
        || ((ptr as usize).is_multiple_of(alignment)
            && offset.is_multiple_of(alignment as u64)
            && len.is_multiple_of(alignment))
}

/// Implements the named [`BlockDevice`] methods of a wrapper by passing
/// them on unchanged to the device it wraps, so that each wrapper writes
/// out only what it changes: `forward_block_device!(inner; flush, name)`
/// for a field, `forward_block_device!(*; ...)` for a pointer.
macro_rules! forward_block_device {
    ($to:tt; $($method:ident),+ $(,)?) => {
        $(crate::device::forward_block_device!(@method $to $method);)+
    };
    (@to $s:ident *) => { (**$s) };
    (@to $s:ident $field:ident) => { $s.$field };
    (@method $to:tt len_bytes) => {
        fn len_bytes(&self) -> u64 {
            crate::device::forward_block_device!(@to self $to).len_bytes()
        }
    };
    (@method $to:tt read_at) => {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), crate::DeviceError> {
            crate::device::forward_block_device!(@to self $to).read_at(buf, offset)
        }
    };
    (@method $to:tt write_at) => {
        fn write_at(&self, data: &[u8], offset: u64) -> Result<(), crate::DeviceError> {
            crate::device::forward_block_device!(@to self $to).write_at(data, offset)
        }
    };
    (@method $to:tt flush) => {
        fn flush(&self) -> Result<(), crate::DeviceError> {
            crate::device::forward_block_device!(@to self $to).flush()
        }
    };
    (@method $to:tt discard) => {
        fn discard(&self, offset: u64, len: u64) -> Result<(), crate::DeviceError> {
            crate::device::forward_block_device!(@to self $to).discard(offset, len)
        }
    };
    (@method $to:tt zeroes_fast) => {
        fn zeroes_fast(&self) -> bool {
            crate::device::forward_block_device!(@to self $to).zeroes_fast()
        }
    };
    (@method $to:tt allocation) => {
        fn allocation(&self, offset: u64, len: u64) -> Result<Vec<crate::Allocation>, crate::DeviceError> {
            crate::device::forward_block_device!(@to self $to).allocation(offset, len)
        }
    };
    (@method $to:tt write_zeroes) => {
        fn write_zeroes(&self, offset: u64, len: u64, keep_allocated: bool) -> Result<(), crate::DeviceError> {
            crate::device::forward_block_device!(@to self $to).write_zeroes(offset, len, keep_allocated)
        }
    };
    (@method $to:tt alignment) => {
        fn alignment(&self) -> usize {
            crate::device::forward_block_device!(@to self $to).alignment()
        }
    };
    (@method $to:tt name) => {
        fn name(&self) -> &str {
            crate::device::forward_block_device!(@to self $to).name()
        }
    };
    (@method $to:tt raw_target) => {
        fn raw_target(&self) -> Option<crate::RawTarget> {
            crate::device::forward_block_device!(@to self $to).raw_target()
        }
    };
    (@method $to:tt identity) => {
        fn identity(&self) -> Option<crate::DeviceIdentity> {
            crate::device::forward_block_device!(@to self $to).identity()
        }
    };
    (@method $to:tt check_intact) => {
        fn check_intact(&self) -> Result<(), crate::DeviceError> {
            crate::device::forward_block_device!(@to self $to).check_intact()
        }
    };
    (@method $to:tt in_place) => {
        unsafe fn in_place(&self, offset: u64, len: usize) -> Option<&[u8]> {
            // SAFETY: the caller's promise, passed on.
            unsafe { crate::device::forward_block_device!(@to self $to).in_place(offset, len) }
        }
    };
    (@method $to:tt write_tearable_at) => {
        fn write_tearable_at(&self, data: &[u8], offset: u64) -> Result<(), crate::DeviceError> {
            crate::device::forward_block_device!(@to self $to).write_tearable_at(data, offset)
        }
    };
    (@method $to:tt in_place_sound) => {
        fn in_place_sound(&self) -> bool {
            crate::device::forward_block_device!(@to self $to).in_place_sound()
        }
    };
    (@method $to:tt reads_at_memory_speed) => {
        fn reads_at_memory_speed(&self) -> bool {
            crate::device::forward_block_device!(@to self $to).reads_at_memory_speed()
        }
    };
}
pub(crate) use forward_block_device;

impl<T: BlockDevice + ?Sized> BlockDevice for std::sync::Arc<T> {
    forward_block_device!(*;
        len_bytes, read_at, write_at, flush, discard, zeroes_fast, allocation, write_zeroes,
        alignment, name, raw_target, identity, check_intact, in_place, write_tearable_at,
        in_place_sound, reads_at_memory_speed,
    );
}
