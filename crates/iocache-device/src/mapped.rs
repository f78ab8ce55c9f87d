//! A cache file that lives in memory (tmpfs such as
//! `/dev/shm`, or ramfs) is faster to copy to and from through a shared
//! mapping than through `pread`/`pwrite`, which walk the page cache one
//! 4 KiB page at a time per call (a 64 KiB `pwrite` into tmpfs took 14 µs
//! here against 9 µs for the same copy into a mapping, 1 MiB 240 against
//! 140 µs; `scripts/bench-serving.py` in docs/results/engine.md). On such a
//! filesystem the mapping and the file are the same pages, so nothing about
//! durability changes: `fdatasync` meant nothing there before either.
//!
//! Reads use the mapping; writes mostly do not. A copy into it can be cut
//! short anywhere by a kill (SIGKILL, the OOM killer), leaving a sector
//! half old and half new in a file that outlives the process, which a
//! restart could serve; the kernel stops a `pwrite` only between pages, so
//! `FileDevice::write_at` writes the file with `pwrite` (the crash soak on
//! /dev/shm found a torn sector in 34 kills with copies,
//! docs/results/durability.md). `FileDevice::write_tearable_at` copies in,
//! for data that no restart trusts unchecked (the engine decides which).
//!
//! A mapping has one hazard `pread` does not: touching a page that is gone
//! (the file truncated by someone else, or a hole tmpfs has no room to
//! fill) raises `SIGBUS`, which would kill the server. So every mapping is
//! registered here, and a `SIGBUS` handler turns a fault inside a
//! registered mapping into an I/O error of its device: it marks the
//! mapping failed, puts a private zero page where the missing one was (the
//! interrupted copy then completes harmlessly) and returns. Every copy
//! checks the mark after it finishes, and a failed mapping refuses all
//! later I/O: a copy that read the stand-in page, or wrote into it, is
//! reported as failed, never as done. Faults anywhere else go to the
//! handler that was there before (the Rust runtime's stack-overflow
//! check) or to the default action.

use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Once;

/// How many mappings may exist at once (cache devices of one process).
const REGIONS_MAX: usize = 64;

/// One registered mapping: `[start, end)` of the address space, 0 when the
/// place is free, and whether a fault hit it.
struct Region {
    start: AtomicUsize,
    end: AtomicUsize,
    failed: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Region = Region {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    failed: AtomicBool::new(false),
};

static REGIONS: [Region; REGIONS_MAX] = [FREE; REGIONS_MAX];

/// What the handler reads, as plain atomics (set before the handler is
/// installed): the page size, and the `SIGBUS` action that was in place
/// before ours (chained to for faults that are not in a mapping of ours;
/// leaked, never freed).
static PAGE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Once = Once::new();
/// The errno of a failed installation (0: installed).
static INSTALL_ERRNO: AtomicUsize = AtomicUsize::new(0);

/// Whether the filesystem holding `file` keeps its data in memory only
/// (tmpfs or ramfs): the filesystems where a mapping is both faster and
/// exactly as durable as `pwrite`.
pub(crate) fn in_memory(file: &std::fs::File) -> bool {
    // Not in the libc crate.
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    // SAFETY: fstatfs fills the struct we own from an fd we own.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return false;
    }
    let kind = fs.f_type as libc::c_long;
    kind == libc::TMPFS_MAGIC as libc::c_long || kind == RAMFS_MAGIC
}

/// A shared, writable mapping of a whole file, guarded against `SIGBUS`.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: *mut u8,
    len: usize,
    /// Its place in `REGIONS`.
    region: usize,
}

// SAFETY: the mapping is plain shared memory; concurrent copies to
// disjoint ranges are independent, and the engine orders overlapping ones
// (as for `pwrite` to a file).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `file` (open for reading and writing),
    /// after allocating them (`fallocate`: tmpfs then has no hole left to
    /// fill, so running out of room is an error here, at open, rather
    /// than a fault later; ramfs, which cannot, has no size limit) and
    /// with every page mapped in advance.
    pub(crate) fn new(file: &std::fs::File, len: u64) -> io::Result<Mapping> {
        let step = |what: String, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty file is not mapped",
            ));
        }
        install().map_err(|e| step("installing the SIGBUS handler".into(), e))?;
        let fd = file.as_raw_fd();
        // SAFETY: plain integer arguments on an fd we own.
        if unsafe { libc::fallocate(fd, 0, 0, len as libc::off_t) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(step(format!("allocating its {len} bytes (fallocate)"), e));
            }
        }
        let region = claim_region()?;
        // SAFETY: a new shared mapping of `len` bytes of our fd; the kernel
        // chooses the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            release_region(region);
            return Err(step(format!("mapping its {len} bytes (mmap)"), e));
        }
        let start = base as usize;
        debug_assert_eq!(start % PAGE_BYTES.load(Ordering::Relaxed), 0);
        let r = &REGIONS[region];
        r.failed.store(false, Ordering::SeqCst);
        r.end.store(start + len, Ordering::SeqCst);
        r.start.store(start, Ordering::SeqCst);
        Ok(Mapping {
            base: base.cast(),
            len,
            region,
        })
    }

    fn failed(&self) -> bool {
        REGIONS[self.region].failed.load(Ordering::SeqCst)
    }

    fn gone() -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "a page of the mapped cache file is gone (SIGBUS: the file was truncated by \
             someone else, or its filesystem is full); the device refuses further I/O",
        )
    }

    /// Copies `buf.len()` bytes at `offset` out of the mapping.
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let at = self.checked(offset, buf.len())?;
        // SAFETY: `at..at + buf.len()` lies within the mapping (`checked`),
        // which lives as long as `self`; `buf` is ours and cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at), buf.as_mut_ptr(), buf.len()) };
        self.after_copy()
    }

    /// `len` bytes at `offset` of the mapping, in place, unless it failed.
    ///
    /// # Safety
    /// As [`crate::BlockDevice::in_place`]: nothing may write the range
    /// while the slice lives.
    pub(crate) unsafe fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let at = self.checked(offset, len).ok()?;
        // SAFETY: `at..at + len` lies within the mapping, which lives as
        // long as `self`; the caller keeps writers of the range away.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(at), len) })
    }

    /// Whether no fault has hit the mapping (after reading it in place).
    pub(crate) fn sound(&self) -> bool {
        fence(Ordering::SeqCst);
        !self.failed()
    }

    /// An error if a fault has failed the mapping: its device then refuses
    /// every I/O, writes (which go through `pwrite`) included.
    pub(crate) fn refuse_if_failed(&self) -> io::Result<()> {
        match self.failed() {
            true => Err(Self::gone()),
            false => Ok(()),
        }
    }

    /// Copies `data` into the mapping at `offset`: a kill can stop the copy
    /// in the middle of a sector, so only `FileDevice::write_tearable_at`
    /// writes this way (`FileDevice::write_at` uses `pwrite`).
    pub(crate) fn write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let at = self.checked(offset, data.len())?;
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(at), data.len()) };
        self.after_copy()
    }

    /// Whether a copy that just ended touched a stand-in page (or any
    /// fault hit the mapping meanwhile): the copy's loads and stores
    /// complete before the mark is read, so another thread's stand-in page
    /// is seen with its mark.
    fn after_copy(&self) -> io::Result<()> {
        fence(Ordering::SeqCst);
        self.refuse_if_failed()
    }

    /// `offset` as an index into the mapping, if `offset..offset + len`
    /// lies in it and the mapping has not failed.
    fn checked(&self, offset: u64, len: usize) -> io::Result<usize> {
        self.refuse_if_failed()?;
        match usize::try_from(offset)
            .ok()
            .and_then(|at| Some((at, at.checked_add(len)?)))
        {
            Some((at, end)) if end <= self.len => Ok(at),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "beyond the mapping")),
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Unregistered first: once unmapped, the addresses may be reused by
        // anything, whose faults are not ours to handle.
        release_region(self.region);
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// A free place in `REGIONS`, reserved (its start set to 1, an address no
/// mapping has, until the mapping exists).
fn claim_region() -> io::Result<usize> {
    for (i, r) in REGIONS.iter().enumerate() {
        if r.start
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Ok(i);
        }
    }
    Err(io::Error::other(format!(
        "more than {REGIONS_MAX} mapped cache files in one process"
    )))
}

/// Frees a place of `REGIONS`, the end first: clearing the start frees it
/// for another mapping, whose registration a later store here would undo.
fn release_region(region: usize) {
    REGIONS[region].end.store(0, Ordering::SeqCst);
    REGIONS[region].start.store(0, Ordering::SeqCst);
}

/// Installs the `SIGBUS` handler once per process.
fn install() -> io::Result<()> {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        PAGE_BYTES.store(
            if page_bytes > 0 { page_bytes as usize } else { 4096 },
            Ordering::SeqCst,
        );
        // SAFETY: zeroed sigactions are valid values to fill in. The
        // previous action is read first and published before ours is in
        // place; the handler only does what is safe in a signal handler
        // (atomic loads and stores, mmap, sigaction, raise, a call of the
        // previous handler).
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                INSTALL_ERRNO.store(errno_now(), Ordering::SeqCst);
                return;
            }
            PREVIOUS.store(Box::into_raw(Box::new(previous)), Ordering::SeqCst);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                INSTALL_ERRNO.store(errno_now(), Ordering::SeqCst);
            }
        }
    });
    match INSTALL_ERRNO.load(Ordering::SeqCst) {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno as i32)),
    }
}

fn errno_now() -> usize {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL) as usize
}

extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (address, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    if code <= 0 {
        // Sent by a process (`kill -BUS`), not a fault: what the default
        // action does, end the process.
        default_action(signal);
        // SAFETY: raise is async-signal-safe; delivered once we return.
        unsafe { libc::raise(signal) };
        return;
    }
    let page_bytes = PAGE_BYTES.load(Ordering::SeqCst);
    for r in &REGIONS {
        let start = r.start.load(Ordering::SeqCst);
        if start > 1 && address >= start && address < r.end.load(Ordering::SeqCst) {
            // Marked before the stand-in page exists: a copy that reads or
            // writes the stand-in then sees the mark when it checks.
            r.failed.store(true, Ordering::SeqCst);
            let page = address & !(page_bytes - 1);
            // SAFETY: replaces one page of our own mapping with a private
            // anonymous page; mmap is a plain system call.
            let placed = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    page_bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if placed == libc::MAP_FAILED {
                default_action(signal);
            }
            return;
        }
    }
    // Not ours: the previous handler decides.
    // SAFETY: set once before our handler was installed, never freed.
    let Some(previous) = (unsafe { PREVIOUS.load(Ordering::SeqCst).as_ref() }) else {
        return default_action(signal);
    };
    match previous.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => default_action(signal),
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler was installed with SA_SIGINFO,
            // so it has this signature.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            f(signal, info, context)
        }
        handler => {
            // SAFETY: installed without SA_SIGINFO: a one-argument handler.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            f(signal)
        }
    }
}

/// Puts the default action back: returning from the handler then re-runs
/// the faulting access, which ends the process as if no handler existed.
fn default_action(signal: libc::c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL is the default action.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `len` bytes in `/dev/shm`, or `None` (the test skipped,
    /// and says so) where that is not tmpfs.
    fn shm_file(name: &str, len: u64) -> Option<(std::path::PathBuf, std::fs::File)> {
        let file = shm_file_or_none(name, len);
        if file.is_none() {
            eprintln!("skipped: /dev/shm is not tmpfs here");
        }
        file
    }

    fn shm_file_or_none(name: &str, len: u64) -> Option<(std::path::PathBuf, std::fs::File)> {
        let path =
            std::path::Path::new("/dev/shm").join(format!("iocache-mapped-{name}-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .ok()?;
        file.set_len(len).ok()?;
        if !in_memory(&file) {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        Some((path, file))
    }

    #[test]
    fn copies_in_and_out_match_the_file() {
        use std::os::unix::fs::FileExt;
        let Some((path, file)) = shm_file("copies", 1 << 20) else {
            return;
        };
        let mapping = Mapping::new(&file, 1 << 20).unwrap();
        let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
        mapping.write(&data, 4096).unwrap();
        let mut through_file = vec![0u8; data.len()];
        file.read_exact_at(&mut through_file, 4096).unwrap();
        assert_eq!(through_file, data, "the mapping writes the file's pages");
        file.write_all_at(&[9u8; 512], 1 << 19).unwrap();
        let mut back = [0u8; 512];
        mapping.read(&mut back, 1 << 19).unwrap();
        assert_eq!(back, [9u8; 512], "a pwrite is seen through the mapping");
        assert!(
            mapping.read(&mut back, (1 << 20) - 100).is_err(),
            "beyond the end"
        );
        drop(mapping);
        let _ = std::fs::remove_file(&path);
    }

    /// Someone truncates the file under the mapping: the copies that touch
    /// the missing pages fail (the process lives), and so does every copy
    /// after them, even of pages still there.
    #[test]
    fn a_truncated_file_is_an_error_not_a_crash() {
        let Some((path, file)) = shm_file("truncated", 1 << 20) else {
            return;
        };
        let mapping = Mapping::new(&file, 1 << 20).unwrap();
        mapping.write(&[5u8; 4096], 0).unwrap();
        let other = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        other.set_len(64 << 10).unwrap();
        let mut buf = vec![0u8; 8192];
        let e = mapping.read(&mut buf, 512 << 10).unwrap_err();
        assert!(e.to_string().contains("SIGBUS"), "{e}");
        assert!(
            mapping.write(&buf, 768 << 10).is_err(),
            "a write past the new end fails too"
        );
        assert!(
            mapping.read(&mut buf[..4096], 0).is_err(),
            "a failed mapping refuses even pages that are still there"
        );
        drop(mapping);
        // A new mapping of the (now shorter) file works.
        let mapping = Mapping::new(&file, 64 << 10).unwrap();
        let mut first = [0u8; 4096];
        mapping.read(&mut first, 0).unwrap();
        assert_eq!(first, [5u8; 4096]);
        drop(mapping);
        let _ = std::fs::remove_file(&path);
    }
}
