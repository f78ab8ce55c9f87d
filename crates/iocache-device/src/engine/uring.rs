//! io_uring lets one thread keep many positional I/Os
//! in flight with one system call per batch, which is how the cache engine
//! gets queue depth without a thread per I/O. `UringEngine` drives the raw
//! file descriptors of `FileDevice`s through a small set of rings and falls
//! back to the device's own methods for everything else.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use io_uring::{opcode, squeue, types, IoUring};

use super::{IoBuf, IoEngine, IoRequest};
use crate::device::{check_range, is_aligned};
use crate::error::{DeviceError, IoKind};

/// io_uring engine: `rings` rings of `entries` submission entries each; a
/// batch takes a free ring (or waits for one), submits its requests and
/// waits for all completions. Requests on devices without a raw descriptor
/// (RAM, fault injection) or not aligned as `O_DIRECT` requires run through
/// the device's `read_at` / `write_at` while the ring's requests are in flight.
/// Buffered reads first try `preadv2(RWF_NOWAIT)` and reach the ring only
/// when the page cache does not hold them.
pub struct UringEngine {
    rings: Box<[Mutex<IoUring>]>,
    entries: u32,
    next: AtomicUsize,
    ring_ops: AtomicU64,
    sync_ops: AtomicU64,
    nowait_reads: AtomicU64,
}

/// How a [`UringEngine`]'s requests were run so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UringStats {
    /// Requests submitted to a ring.
    pub ring_ops: u64,
    /// Requests run through the device's own methods (no raw descriptor,
    /// or not aligned as `O_DIRECT` requires).
    pub sync_ops: u64,
    /// Buffered reads served from the page cache by `preadv2(RWF_NOWAIT)`
    /// before reaching the ring (counted in neither of the above).
    pub nowait_reads: u64,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("rings", &self.rings.len())
            .field("entries", &self.entries)
            .finish()
    }
}

impl UringEngine {
    /// Creates `rings` rings (at least 1) of `entries` entries (at least 1),
    /// checking that io_uring works here by a no-op round trip. Fails with
    /// [`DeviceError::UringUnavailable`] when the kernel lacks io_uring or a
    /// sandbox forbids it.
    pub fn new(entries: u32, rings: usize) -> Result<Self, DeviceError> {
        let entries = entries.max(1);
        let mut v = Vec::new();
        for _ in 0..rings.max(1) {
            let mut ring = IoUring::new(entries).map_err(|source| DeviceError::UringUnavailable {
                what: "io_uring_setup",
                source,
            })?;
            probe(&mut ring)?;
            v.push(Mutex::new(ring));
        }
        Ok(UringEngine {
            rings: v.into_boxed_slice(),
            entries,
            next: AtomicUsize::new(0),
            ring_ops: AtomicU64::new(0),
            sync_ops: AtomicU64::new(0),
            nowait_reads: AtomicU64::new(0),
        })
    }

    /// How requests were run so far.
    pub fn stats(&self) -> UringStats {
        UringStats {
            ring_ops: self.ring_ops.load(Ordering::Relaxed),
            sync_ops: self.sync_ops.load(Ordering::Relaxed),
            nowait_reads: self.nowait_reads.load(Ordering::Relaxed),
        }
    }

    fn with_ring<R>(&self, f: impl FnOnce(&mut IoUring) -> R) -> Result<R, DeviceError> {
        let n = self.rings.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for i in 0..n {
            if let Ok(mut g) = self.rings[(start + i) % n].try_lock() {
                return Ok(f(&mut g));
            }
        }
        let mut g = self.rings[start].lock().map_err(|_| DeviceError::Engine {
            what: "ring lock",
            source: io::Error::other("a previous submission panicked"),
        })?;
        Ok(f(&mut g))
    }
}

fn probe(ring: &mut IoUring) -> Result<(), DeviceError> {
    let unavailable = |source| DeviceError::UringUnavailable {
        what: "no-op round trip",
        source,
    };
    let nop = opcode::Nop::new().build().user_data(u64::MAX);
    // SAFETY: a no-op references no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| unavailable(io::Error::other("submission queue full")))?;
    ring.submit_and_wait(1).map_err(unavailable)?;
    let cqe = ring
        .completion()
        .next()
        .ok_or_else(|| unavailable(io::Error::other("no completion")))?;
    if cqe.result() < 0 {
        return Err(unavailable(io::Error::from_raw_os_error(-cqe.result())));
    }
    Ok(())
}

/// A request the ring is driving: where its buffer is and how far it got.
struct Flight {
    index: usize,
    fd: i32,
    ptr: *mut u8,
    len: usize,
    offset: u64,
    write: bool,
}

impl Flight {
    fn entry(&self) -> squeue::Entry {
        let fd = types::Fd(self.fd);
        let e = if self.write {
            opcode::Write::new(fd, self.ptr as *const u8, self.len as u32)
                .offset(self.offset)
                .build()
        } else {
            opcode::Read::new(fd, self.ptr, self.len as u32)
                .offset(self.offset)
                .build()
        };
        e.user_data(self.index as u64)
    }
}

enum Nowait {
    /// The whole read was served from the page cache.
    Done,
    /// This many bytes were read (maybe 0): the rest needs the ring.
    Partial(usize),
    /// The filesystem has no non-blocking reads.
    Unsupported,
}

/// `preadv2(RWF_NOWAIT)` of a flight.
fn read_nowait(fl: &Flight) -> Nowait {
    let iov = libc::iovec {
        iov_base: fl.ptr.cast(),
        iov_len: fl.len,
    };
    // SAFETY: the iovec describes the request's own buffer, valid for len bytes.
    let n = unsafe { libc::preadv2(fl.fd, &iov, 1, fl.offset as libc::off_t, libc::RWF_NOWAIT) };
    if n as usize == fl.len {
        Nowait::Done
    } else if n > 0 {
        Nowait::Partial(n as usize)
    } else if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
        Nowait::Unsupported
    } else {
        Nowait::Partial(0)
    }
}

fn is_retryable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

impl IoEngine for UringEngine {
    fn name(&self) -> &str {
        "uring"
    }

    fn submit(&self, ops: &mut [IoRequest<'_>]) -> Result<(), DeviceError> {
        // Sort the batch: ring requests, synchronous requests, early errors.
        let mut flights = Vec::new();
        let mut sync = Vec::new();
        for (index, op) in ops.iter_mut().enumerate() {
            op.result = None;
            let kind = op.kind();
            let len = op.len();
            if let Err(e) = check_range(op.device, kind, op.offset, len as u64) {
                op.result = Some(Err(e));
                continue;
            }
            let Some(target) = op.device.raw_target() else {
                sync.push(index);
                continue;
            };
            if target.read_only && kind == IoKind::Write {
                op.result = Some(Err(DeviceError::ReadOnly {
                    device: op.device.name().to_string(),
                    kind,
                    offset: op.offset,
                    len: len as u64,
                }));
                continue;
            }
            let (ptr, write) = match &mut op.buf {
                IoBuf::Read(b) => (b.as_mut_ptr(), false),
                IoBuf::Write(b) => (b.as_ptr() as *mut u8, true),
            };
            if len == 0 {
                op.result = Some(Ok(()));
            } else if len > u32::MAX as usize || !is_aligned(ptr, op.offset, len, target.alignment) {
                sync.push(index);
            } else {
                let mut fl = Flight {
                    index,
                    fd: target.fd,
                    ptr,
                    len,
                    offset: op.offset,
                    write,
                };
                // A buffered read whose pages are cached completes at once
                // with RWF_NOWAIT; the ring would hand it to a kernel worker
                // on filesystems without non-blocking reads (tmpfs).
                // A filesystem that cannot read without blocking at all
                // (tmpfs answers EOPNOTSUPP) is memory-backed in practice: a
                // plain pread on this thread beats a trip through io-wq.
                if !write && target.alignment <= 1 {
                    match read_nowait(&fl) {
                        Nowait::Done => {
                            self.nowait_reads.fetch_add(1, Ordering::Relaxed);
                            op.result = Some(Ok(()));
                            continue;
                        }
                        Nowait::Unsupported => {
                            sync.push(index);
                            continue;
                        }
                        Nowait::Partial(n) => {
                            fl.ptr = fl.ptr.wrapping_add(n);
                            fl.len -= n;
                            fl.offset += n as u64;
                        }
                    }
                }
                flights.push(fl);
            }
        }
        self.ring_ops.fetch_add(flights.len() as u64, Ordering::Relaxed);
        self.sync_ops.fetch_add(sync.len() as u64, Ordering::Relaxed);
        if flights.is_empty() {
            for &i in &sync {
                ops[i].run_sync();
            }
            return Ok(());
        }
        let cap = self.entries as usize;
        let engine_result = self.with_ring(|ring| run_ring(ring, cap, &mut flights, ops, &sync))?;
        for op in ops.iter_mut() {
            if op.result.is_none() {
                op.result = Some(Err(op.not_executed()));
            }
        }
        engine_result
    }
}

/// Drives `flights` through `ring` (at most `cap` in flight), running the
/// `sync` requests once the first submission is made.
fn run_ring(
    ring: &mut IoUring,
    cap: usize,
    flights: &mut [Flight],
    ops: &mut [IoRequest<'_>],
    sync: &[usize],
) -> Result<(), DeviceError> {
    let mut next = 0; // next flight to push
    let mut inflight = 0usize;
    let mut retry: Vec<usize> = Vec::new(); // flights to push again
    let mut sync_done = false;
    let by_index = |flights: &[Flight], index: u64| {
        flights
            .binary_search_by_key(&(index as usize), |f| f.index)
            .expect("completion for a known request")
    };
    loop {
        // Fill the submission queue.
        while inflight < cap {
            let f = if let Some(f) = retry.pop() {
                f
            } else if next < flights.len() {
                next += 1;
                next - 1
            } else {
                break;
            };
            let entry = flights[f].entry();
            // SAFETY: the buffer belongs to a request of `ops`, which this
            // function does not return before every pushed entry completed.
            if unsafe { ring.submission().push(&entry) }.is_err() {
                retry.push(f);
                break;
            }
            inflight += 1;
        }
        if inflight == 0 {
            break;
        }
        if !sync_done {
            if let Err(e) = ring.submit() {
                if !is_retryable(&e) {
                    return Err(abandon(ring, inflight, e));
                }
            }
            for &i in sync {
                ops[i].run_sync();
            }
            sync_done = true;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if !is_retryable(&e) {
                return Err(abandon(ring, inflight, e));
            }
        }
        let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (user_data, res) in done {
            inflight -= 1;
            let f = by_index(flights, user_data);
            let fl = &mut flights[f];
            let op = &mut ops[fl.index];
            let kind = if fl.write { IoKind::Write } else { IoKind::Read };
            if res == -libc::EAGAIN || res == -libc::EINTR {
                retry.push(f);
            } else if res < 0 {
                op.result = Some(Err(DeviceError::Io {
                    device: op.device.name().to_string(),
                    kind,
                    offset: op.offset,
                    len: op.len() as u64,
                    source: io::Error::from_raw_os_error(-res),
                }));
            } else if res as usize == fl.len {
                op.result = Some(Ok(()));
            } else if res == 0 {
                op.result = Some(Err(DeviceError::Io {
                    device: op.device.name().to_string(),
                    kind,
                    offset: op.offset,
                    len: op.len() as u64,
                    source: io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("zero-length transfer at offset {}", fl.offset),
                    ),
                }));
            } else {
                // Short transfer: finish the rest through the device, which
                // copes with any alignment.
                let n = res as usize;
                let start = (fl.offset - op.offset) as usize + n;
                let off = fl.offset + n as u64;
                let r = match &mut op.buf {
                    IoBuf::Read(b) => op.device.read_at(&mut b[start..], off),
                    IoBuf::Write(b) => op.device.write_at(&b[start..], off),
                };
                op.result = Some(r);
            }
        }
    }
    if !sync_done {
        for &i in sync {
            ops[i].run_sync();
        }
    }
    Ok(())
}

/// The ring failed with requests in flight whose buffers the kernel may
/// still use: wait for them, and if that is impossible, stop the process
/// rather than hand the buffers back.
fn abandon(ring: &mut IoUring, mut inflight: usize, e: io::Error) -> DeviceError {
    let mut tries = 0;
    while inflight > 0 {
        inflight -= ring.completion().count().min(inflight);
        if inflight == 0 {
            break;
        }
        if ring.submitter().submit_and_wait(1).is_err() {
            tries += 1;
            if tries > 1000 {
                log::error!("io_uring failed with I/O in flight ({e}); aborting");
                std::process::abort();
            }
        }
    }
    DeviceError::Engine {
        what: "io_uring_enter",
        source: e,
    }
}
