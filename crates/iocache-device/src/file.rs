//! The cache device and the backends are files or
//! block devices. `FileDevice` gives them positional, thread-safe I/O with
//! optional `O_DIRECT` (bypassing the page cache so the cache's own memory
//! is the only cache), hides direct I/O's alignment rules behind an aligned
//! bounce buffer, and makes `flush` mean `fdatasync`. A file in memory
//! (tmpfs, ramfs) may instead be copied to and from through a mapping
//! ([`FileDevice::map_if_in_memory`], `mapped.rs`).

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::aligned::AlignedBuf;
use crate::device::{check_range, is_aligned, BlockDevice, RawTarget};
use crate::error::{DeviceError, IoKind};
use crate::exclusive;
use crate::identity::DeviceIdentity;
use crate::mapped::{self, Mapping};

/// Stripes of the lock that serialises read-modify-write of one aligned block.
const RMW_STRIPES: usize = 64;

/// Open file descriptions of one device, used by threads in turn (see
/// [`FileDevice::file`]): more than the threads that usually run at once.
const FILE_STRIPES: usize = 8;

/// How to open a [`FileDevice`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Ask for `O_DIRECT`. If the filesystem refuses it (tmpfs answers
    /// `EINVAL`), the device is opened buffered and reports
    /// [`DirectIo::FellBack`].
    pub direct: bool,
    /// Create the file if it is missing and make it at least this many bytes
    /// (sparse); the device's size is then exactly this. For a block device
    /// the size must not exceed the device's; the device is then limited to it.
    pub create_size: Option<u64>,
    /// Open read-only: writes, flushes of data and discards are refused.
    pub read_only: bool,
    /// Claim the device for this open (see `exclusive.rs`): a whole-file
    /// lock on a regular file (shared when `read_only`), `O_EXCL` on a
    /// block device, taken before anything is read, written or resized.
    /// A second claim, by any process or by this one, fails with
    /// [`DeviceError::Busy`]; the claim ends when the device is dropped.
    pub exclusive: bool,
    /// Refuse a path whose last component is a symbolic link (`O_NOFOLLOW`):
    /// for paths in a directory others could plant links in.
    pub no_follow: bool,
    /// Open the path relative to this directory and never outside it: one
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` from the
    /// directory, so no symbolic link (dangling or not, in any component)
    /// and no `..` that leaves it is followed, and what is opened is what
    /// the resolution found (no check-then-open race). A missing file is
    /// created with `O_EXCL` only. Regular files only.
    pub beneath: Option<PathBuf>,
}

/// Whether a device bypasses the page cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirectIo {
    /// Not asked for.
    Off,
    /// `O_DIRECT` is in effect; requests aligned to `alignment` go straight
    /// to the device, others through a bounce buffer.
    On {
        /// Required alignment of buffers, offsets and lengths.
        alignment: usize,
    },
    /// Asked for, refused by the filesystem with `errno`; the device is
    /// buffered (the page cache is in use).
    FellBack {
        /// The errno of the refused open (`EINVAL` on tmpfs).
        errno: i32,
    },
}

/// A regular file or a block device.
#[derive(Debug)]
pub struct FileDevice {
    /// The first is the one opened; the others are opened again from it
    /// (`/proc/self/fd`), each its own open file description of the same
    /// file. Every `pread` of a multi-threaded process takes a reference on
    /// its file description, an atomic increment on one cache line: threads
    /// on different cores sharing one description make that line bounce
    /// between them (the kernel's `fdget` and `fput` took 4.8 % of the
    /// cycles of two threads reading cache hits in `examples/loadgen` of
    /// iocache-engine, 2.6 % with a description per thread).
    files: Box<[File]>,
    path: PathBuf,
    name: String,
    len: u64,
    direct: DirectIo,
    align: usize,
    read_only: bool,
    block_device: bool,
    rmw_locks: Box<[Mutex<()>]>,
    /// When set, reads are copies out of this mapping of the file (a file
    /// in memory; see `mapped.rs`) and writes `pwrite`s refused once the
    /// mapping failed, an I/O engine is given no descriptor (`raw_target`)
    /// so every I/O goes through `read_at`/`write_at`, discards keep the
    /// pages, and flushes still `fdatasync` the file.
    mapping: Option<Mapping>,
    /// The file lives on a filesystem that keeps data only in memory
    /// (tmpfs, ramfs): reads are memory copies, mapped or not.
    in_memory: bool,
    /// What the file or block device is (`identity.rs`), read at open.
    identity: DeviceIdentity,
}

/// `_IO(0x12, 119)`: discard a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;
/// `_IO(0x12, 127)`: zero a byte range of a block device.
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// Whether an error says the operation is not supported here.
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS)
    )
}

fn open_err(path: &Path, what: &'static str, source: io::Error) -> DeviceError {
    DeviceError::Open {
        path: path.to_path_buf(),
        what,
        source,
    }
}

impl FileDevice {
    /// Opens `path` as a device.
    pub fn open(path: impl AsRef<Path>, opts: OpenOptions) -> Result<FileDevice, DeviceError> {
        let path = path.as_ref();
        if opts.read_only && opts.create_size.is_some() {
            return Err(open_err(
                path,
                "options",
                io::Error::new(io::ErrorKind::InvalidInput, "create_size with read_only"),
            ));
        }
        // The kernel's exclusive claim of a block device is asked for at
        // open; a regular file is locked right after it (below).
        let excl_block = opts.beneath.is_none()
            && opts.exclusive
            && std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
        // Beneath a directory: whether this open created the file (an
        // existing one keeps its size, as `create_size` says).
        let created_beneath = std::cell::Cell::new(false);
        let open = |direct: bool| {
            if let Some(dir) = &opts.beneath {
                let mut flags = libc::O_CLOEXEC;
                if direct {
                    flags |= libc::O_DIRECT;
                }
                let (file, created) =
                    open_beneath(dir, path, !opts.read_only, opts.create_size.is_some(), flags)?;
                created_beneath.set(created);
                return Ok(file);
            }
            let mut o = std::fs::OpenOptions::new();
            o.read(true).write(!opts.read_only);
            if opts.create_size.is_some() {
                o.create(true);
            }
            // A file created here is its owner's only: it holds a volume's data.
            o.mode(0o600);
            let mut flags = 0;
            if opts.no_follow {
                flags |= libc::O_NOFOLLOW;
            }
            if direct {
                flags |= libc::O_DIRECT;
            }
            if excl_block {
                flags |= libc::O_EXCL;
            }
            o.custom_flags(flags);
            o.open(path)
        };
        let busy = |path: &Path| DeviceError::Busy {
            path: path.to_path_buf(),
            holders: std::fs::metadata(path)
                .map(|m| exclusive::holders(&m))
                .unwrap_or_default(),
        };
        let (mut file, mut direct) = match open_direct_or_fallback(path, opts.direct, open) {
            Err(DeviceError::Open { source, .. }) if excl_block && exclusive::is_busy(&source) => {
                return Err(busy(path));
            }
            other => other?,
        };
        if opts.exclusive && !excl_block {
            if let Err(e) = exclusive::lock_whole_file(&file, opts.read_only) {
                if exclusive::is_busy(&e) {
                    drop(file);
                    let full = opts
                        .beneath
                        .as_ref()
                        .map_or_else(|| path.to_path_buf(), |dir| dir.join(path));
                    return Err(busy(&full));
                }
                return Err(open_err(path, "lock", e));
            }
        }
        set_noatime(&file);
        let meta = file.metadata().map_err(|e| open_err(path, "stat", e))?;
        if opts.beneath.is_some() && !meta.is_file() {
            return Err(open_err(
                path,
                "type",
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        let identity = DeviceIdentity::of_file(&file).map_err(|e| open_err(path, "stat", e))?;
        let block_device = meta.file_type().is_block_device();
        let mut len = if block_device {
            file.seek(SeekFrom::End(0))
                .map_err(|e| open_err(path, "seek to end", e))?
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(open_err(
                path,
                "type",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "neither a regular file nor a block device",
                ),
            ));
        };
        let create_size = opts
            .create_size
            .filter(|_| opts.beneath.is_none() || created_beneath.get());
        if let Some(size) = create_size {
            if block_device {
                if size > len {
                    return Err(open_err(
                        path,
                        "size",
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("create_size {size} exceeds the block device's {len} bytes"),
                        ),
                    ));
                }
            } else if len < size {
                file.set_len(size)
                    .map_err(|e| open_err(path, "extend (sparse)", e))?;
            }
            len = size;
        }
        let align = if let DirectIo::On { .. } = direct {
            let a = direct_alignment(&file, block_device);
            direct = DirectIo::On { alignment: a };
            a
        } else {
            1
        };
        let shown = opts
            .beneath
            .as_ref()
            .map_or_else(|| path.to_path_buf(), |dir| dir.join(path));
        let in_memory = !block_device && mapped::in_memory(&file);
        let files = reopen_stripes(file, &opts, &direct);
        Ok(FileDevice {
            files,
            path: shown.clone(),
            name: shown.display().to_string(),
            len,
            direct,
            align,
            read_only: opts.read_only,
            block_device,
            rmw_locks: (0..RMW_STRIPES).map(|_| Mutex::new(())).collect(),
            mapping: None,
            in_memory,
            identity,
        })
    }

    /// Maps the device, for reads, if it is a writable regular file whose
    /// filesystem keeps data only in memory (tmpfs such as `/dev/shm`,
    /// ramfs), where a copy out of a mapping is faster than `pread` (writes
    /// stay `pwrite`s, see `write_at`, but for `write_tearable_at`). Its
    /// whole size is allocated first
    /// (`fallocate`), so a filesystem without room for it fails here, not
    /// at some later write.
    /// Returns whether it is mapped now; an error leaves it unmapped and
    /// working as before.
    pub fn map_if_in_memory(&mut self) -> Result<bool, DeviceError> {
        if self.mapping.is_some() {
            return Ok(true);
        }
        if self.read_only || self.block_device || !mapped::in_memory(&self.files[0]) {
            return Ok(false);
        }
        let mapping = Mapping::new(&self.files[0], self.len).map_err(|e| open_err(&self.path, "map", e))?;
        self.mapping = Some(mapping);
        Ok(true)
    }

    /// Whether reads go through a mapping of the file.
    pub fn is_mapped(&self) -> bool {
        self.mapping.is_some()
    }

    /// The open file description this thread uses (each thread keeps one,
    /// chosen round robin when it first does I/O).
    #[inline]
    fn file(&self) -> &File {
        &self.files[thread_stripe() % self.files.len()]
    }

    /// Whether `O_DIRECT` is in effect, off, or was refused.
    pub fn direct_io(&self) -> &DirectIo {
        &self.direct
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path is a block device (rather than a regular file).
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate on our own fd with plain integer arguments.
        let rc = unsafe {
            libc::fallocate(
                self.files[0].as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// A block device ioctl taking a byte range (`BLKDISCARD`, `BLKZEROOUT`).
    fn range_ioctl(&self, request: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
        let range: [u64; 2] = [offset, len];
        // SAFETY: the ioctl reads two u64s from a live array on our own fd.
        let rc = unsafe { libc::ioctl(self.files[0].as_raw_fd(), request as _, range.as_ptr()) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // A range the logical block size does not divide (a 4Kn device
            // and 512-byte sectors): unsupported, so a discard is skipped
            // and zeroes are written as buffers.
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
            }
            return Err(e);
        }
        Ok(())
    }

    fn io_err(&self, kind: IoKind, offset: u64, len: usize, source: io::Error) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            kind,
            offset,
            len: len as u64,
            source,
        }
    }

    fn read_only_err(&self, kind: IoKind, offset: u64, len: u64) -> DeviceError {
        DeviceError::ReadOnly {
            device: self.name.clone(),
            kind,
            offset,
            len,
        }
    }

    /// Reads `buf` at `offset`, tolerating end of file once at least `need`
    /// bytes are in (the rest of `buf` is then left as it was). Stops after
    /// a short read that satisfied `need`: with `O_DIRECT` the next offset
    /// would be unaligned.
    fn read_upto(&self, buf: &mut [u8], offset: u64, need: usize) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file().read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => {
                    let short = done + n < buf.len();
                    done += n;
                    if short && done >= need {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if done < need {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("end of file after {done} of {need} bytes"),
            ));
        }
        Ok(())
    }

    fn align_down(&self, x: u64) -> u64 {
        x - x % self.align as u64
    }

    fn align_up(&self, x: u64) -> u64 {
        self.align_down(x + self.align as u64 - 1)
    }
}

/// This thread's stripe: a small number chosen round robin the first time
/// a thread asks, so concurrent threads usually get different ones.
#[inline]
pub fn thread_stripe() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    STRIPE.with(|s| *s)
}

/// Stops reads from updating the file's access time: a device read on every
/// cache hit has no use for it, and its check costs a few percent of a hit.
/// Best effort: the kernel allows it only to the file's owner (or with
/// `CAP_FOWNER`); otherwise the file keeps the mount's atime behaviour.
fn set_noatime(file: &File) {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on an fd we own; no pointers are passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NOATIME);
        }
    }
}

/// `file` and up to `FILE_STRIPES - 1` more open file descriptions of it,
/// opened with the same access mode and flags. Best effort: without
/// `/proc`, threads share `file`.
fn reopen_stripes(file: File, opts: &OpenOptions, direct: &DirectIo) -> Box<[File]> {
    let proc_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let mut files = vec![file];
    while files.len() < FILE_STRIPES {
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(!opts.read_only);
        if let DirectIo::On { .. } = direct {
            o.custom_flags(libc::O_DIRECT);
        }
        match o.open(&proc_path) {
            Ok(f) => {
                set_noatime(&f);
                files.push(f);
            }
            Err(_) => break,
        }
    }
    files.into_boxed_slice()
}

/// Opens `relative` under `dir` without leaving it (see
/// [`OpenOptions::beneath`]): `O_CREAT | O_EXCL` first when `create`, the
/// existing file when that says it exists. Also says whether it created it.
fn open_beneath(
    dir: &Path,
    relative: &Path,
    write: bool,
    create: bool,
    flags: i32,
) -> io::Result<(File, bool)> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::io::FromRawFd;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    let name = CString::new(relative.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    let access = if write { libc::O_RDWR } else { libc::O_RDONLY };
    let attempt = |extra: i32| -> io::Result<File> {
        // SAFETY: open_how is plain integers; all zero is a valid value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (access | flags | extra) as u64;
        how.mode = if extra & libc::O_CREAT != 0 { 0o600 } else { 0 };
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: openat2 reads the NUL-terminated name and the open_how we
        // own, of the size we pass; a nonnegative result is a new fd we own.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                name.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd as i32) })
    };
    if create {
        match attempt(libc::O_CREAT | libc::O_EXCL) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            other => return other.map(|f| (f, true)),
        }
    }
    attempt(0).map(|f| (f, false))
}

/// Opens with `O_DIRECT` if asked, and without it if the filesystem
/// answers `EINVAL` (the page cache is then in use: [`DirectIo::FellBack`]).
fn open_direct_or_fallback(
    path: &Path,
    direct: bool,
    open: impl Fn(bool) -> io::Result<File>,
) -> Result<(File, DirectIo), DeviceError> {
    if !direct {
        let f = open(false).map_err(|e| open_err(path, "open", e))?;
        return Ok((f, DirectIo::Off));
    }
    match open(true) {
        Ok(f) => Ok((f, DirectIo::On { alignment: 0 })),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let f = open(false).map_err(|e| open_err(path, "open", e))?;
            Ok((f, DirectIo::FellBack { errno: libc::EINVAL }))
        }
        Err(e) => Err(open_err(path, "open with O_DIRECT", e)),
    }
}

/// The direct-I/O alignment of an open file: the logical block size for a
/// block device, `statx`'s DIO alignment for a file, 4096 when unknown.
fn direct_alignment(file: &File, block_device: bool) -> usize {
    let fd = file.as_raw_fd();
    let mut align = 0usize;
    if block_device {
        let mut ssz: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int to the pointer we pass.
        if unsafe { libc::ioctl(fd, libc::BLKSSZGET, &mut ssz) } == 0 && ssz > 0 {
            align = ssz as usize;
        }
    } else {
        // SAFETY: statx with AT_EMPTY_PATH on a valid fd fills the struct we own.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::statx(
                fd,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_DIOALIGN,
                &mut stx,
            )
        };
        if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 {
            align = (stx.stx_dio_offset_align as usize).max(stx.stx_dio_mem_align as usize);
        }
    }
    if align == 0 || !align.is_power_of_two() {
        4096
    } else {
        align
    }
}

impl BlockDevice for FileDevice {
    fn len_bytes(&self) -> u64 {
        self.len
    }

    unsafe fn in_place(&self, offset: u64, len: usize) -> Option<&[u8]> {
        // SAFETY: the caller's promise, passed on.
        self.mapping
            .as_ref()
            .and_then(|m| unsafe { m.slice(offset, len) })
    }

    fn in_place_sound(&self) -> bool {
        self.mapping.as_ref().is_some_and(Mapping::sound)
    }

    fn reads_at_memory_speed(&self) -> bool {
        self.in_memory
    }

    fn write_tearable_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        // Whole blocks only: `write_at` reads, modifies and writes back a
        // partial block (direct I/O) under its stripe locks, which a copy
        // beside it would not take.
        let whole_blocks = offset.is_multiple_of(self.align as u64) && data.len().is_multiple_of(self.align);
        match &self.mapping {
            Some(mapping) if !self.read_only && whole_blocks => {
                check_range(self, IoKind::Write, offset, data.len() as u64)?;
                mapping
                    .write(data, offset)
                    .map_err(|e| self.io_err(IoKind::Write, offset, data.len(), e))
            }
            _ => self.write_at(data, offset),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Read, offset, buf.len() as u64)?;
        let len = buf.len();
        if len == 0 {
            return Ok(());
        }
        if let Some(mapping) = &self.mapping {
            return mapping
                .read(buf, offset)
                .map_err(|e| self.io_err(IoKind::Read, offset, len, e));
        }
        if is_aligned(buf.as_ptr(), offset, len, self.align) {
            return self
                .read_upto(buf, offset, len)
                .map_err(|e| self.io_err(IoKind::Read, offset, len, e));
        }
        let start = self.align_down(offset);
        let end = self.align_up(offset + len as u64);
        let mut bounce = AlignedBuf::zeroed((end - start) as usize, self.align);
        let skip = (offset - start) as usize;
        self.read_upto(&mut bounce, start, skip + len)
            .map_err(|e| self.io_err(IoKind::Read, offset, len, e))?;
        buf.copy_from_slice(&bounce[skip..skip + len]);
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        let len = data.len();
        if self.read_only {
            return Err(self.read_only_err(IoKind::Write, offset, len as u64));
        }
        check_range(self, IoKind::Write, offset, len as u64)?;
        if len == 0 {
            return Ok(());
        }
        let err = |e| self.io_err(IoKind::Write, offset, len, e);
        // A mapped file is still written with `pwrite`: a process killed in
        // the middle of a copy into the mapping leaves a sector half old and
        // half new, which a restart could serve (found by the crash soak on
        // /dev/shm), while the kernel stops a `pwrite` only between pages,
        // so every sector is old or new. Reads stay on the mapping; copies
        // in are for `write_tearable_at`.
        if let Some(mapping) = &self.mapping {
            mapping.refuse_if_failed().map_err(err)?;
        }
        if is_aligned(data.as_ptr(), offset, len, self.align) {
            return self.file().write_all_at(data, offset).map_err(err);
        }
        let a = self.align as u64;
        let start = self.align_down(offset);
        let end = self.align_up(offset + len as u64);
        let mut bounce = AlignedBuf::zeroed((end - start) as usize, self.align);
        let skip = (offset - start) as usize;
        let head_partial = offset != start;
        let tail_partial = offset + len as u64 != end;
        if !head_partial && !tail_partial {
            // Only the buffer address is unaligned: copy, no read needed.
            bounce.copy_from_slice(data);
            return self.file().write_all_at(&bounce, start).map_err(err);
        }
        // Read-modify-write of the partial first and last blocks, under the
        // stripe locks of those blocks so that two sub-block writes to
        // disjoint bytes of one block do not lose each other's bytes.
        let first_block = start / a;
        let last_block = end / a - 1;
        let s1 = (first_block % RMW_STRIPES as u64) as usize;
        let s2 = (last_block % RMW_STRIPES as u64) as usize;
        let (lo, hi) = (s1.min(s2), s1.max(s2));
        let _g1 = self.rmw_locks[lo].lock().unwrap_or_else(|p| p.into_inner());
        let _g2 = (hi != lo).then(|| self.rmw_locks[hi].lock().unwrap_or_else(|p| p.into_inner()));
        let blen = bounce.len();
        let ab = self.align;
        if head_partial {
            self.read_upto(&mut bounce[..ab], start, 0).map_err(err)?;
        }
        if tail_partial && (last_block != first_block || !head_partial) {
            self.read_upto(&mut bounce[blen - ab..], end - a, 0)
                .map_err(err)?;
        }
        bounce[skip..skip + len].copy_from_slice(data);
        self.file().write_all_at(&bounce, start).map_err(err)
    }

    fn flush(&self) -> Result<(), DeviceError> {
        if self.read_only {
            return Ok(());
        }
        // Syncs the file (the inode), whichever description wrote.
        self.files[0]
            .sync_data()
            .map_err(|e| self.io_err(IoKind::Flush, 0, 0, e))
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        if self.read_only {
            return Err(self.read_only_err(IoKind::Discard, offset, len));
        }
        check_range(self, IoKind::Discard, offset, len)?;
        // A mapped file keeps its pages: a hole would have to be filled
        // again by a later copy, which fails the whole mapping when the
        // filesystem has no room (see `mapped.rs`).
        if len == 0 || self.mapping.is_some() {
            return Ok(());
        }
        let done = if self.block_device {
            self.range_ioctl(BLKDISCARD, offset, len)
        } else {
            self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        };
        match done {
            // Advisory: a device that cannot discard keeps the data.
            Err(e) if unsupported(&e) => Ok(()),
            Err(e) => Err(self.io_err(IoKind::Discard, offset, len as usize, e)),
            Ok(()) => Ok(()),
        }
    }

    /// A regular file's holes, from `SEEK_DATA` and `SEEK_HOLE`; a block
    /// device, a mapped file or a file system without them: all data.
    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<crate::Allocation>, DeviceError> {
        check_range(self, IoKind::Read, offset, len)?;
        let all_data = || {
            vec![crate::Allocation {
                length_bytes: len,
                hole: false,
            }]
        };
        if self.block_device || self.mapping.is_some() || len == 0 {
            return Ok(all_data());
        }
        let fd = self.files[0].as_raw_fd();
        let seek = |pos: u64, whence: libc::c_int| -> io::Result<u64> {
            // SAFETY: lseek on our own fd; the device's I/O is positional,
            // so moving the file offset affects nothing else.
            let r = unsafe { libc::lseek(fd, pos as libc::off_t, whence) };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r as u64)
            }
        };
        let end = offset + len;
        let mut out: Vec<crate::Allocation> = Vec::new();
        let mut push = |length_bytes: u64, hole: bool| match out.last_mut() {
            Some(last) if last.hole == hole => last.length_bytes += length_bytes,
            _ => out.push(crate::Allocation { length_bytes, hole }),
        };
        let mut pos = offset;
        while pos < end {
            let data = match seek(pos, libc::SEEK_DATA) {
                Ok(at) => at.min(end),
                // No data from here to the end of the file.
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => end,
                Err(e) if unsupported(&e) || e.raw_os_error() == Some(libc::EINVAL) => return Ok(all_data()),
                Err(e) => return Err(self.io_err(IoKind::Read, pos, (end - pos) as usize, e)),
            };
            if data > pos {
                push(data - pos, true);
                pos = data;
                continue;
            }
            let hole = match seek(pos, libc::SEEK_HOLE) {
                Ok(at) => at.min(end),
                Err(e) => return Err(self.io_err(IoKind::Read, pos, (end - pos) as usize, e)),
            };
            // A hole never starts at `pos` here (SEEK_DATA said data).
            let hole = hole.max(pos + 1);
            push(hole - pos, false);
            pos = hole;
        }
        Ok(out)
    }

    /// Regular files punch a hole or zero a range in place; block devices
    /// take a zeroing command if their queue says it has one.
    fn zeroes_fast(&self) -> bool {
        if self.mapping.is_some() || self.read_only {
            return false;
        }
        if !self.block_device {
            return true;
        }
        let Ok(meta) = self.files[0].metadata() else {
            return false;
        };
        use std::os::unix::fs::MetadataExt;
        let rdev = meta.rdev();
        let path = format!(
            "/sys/dev/block/{}:{}/queue/write_zeroes_max_bytes",
            libc::major(rdev),
            libc::minor(rdev)
        );
        std::fs::read_to_string(path).is_ok_and(|s| s.trim().parse::<u64>().is_ok_and(|n| n > 0))
    }

    /// A block device: `BLKZEROOUT`. A regular file: a hole punched, or
    /// with `keep_allocated` the range zeroed in place (`FALLOC_FL_ZERO_RANGE`,
    /// or where the file system lacks it a hole punched and allocated again).
    /// Zero buffers where none of these works (a mapped file, a file system
    /// without `fallocate`, an unaligned range on a block device).
    fn write_zeroes(&self, offset: u64, len: u64, keep_allocated: bool) -> Result<(), DeviceError> {
        if self.read_only {
            return Err(self.read_only_err(IoKind::Write, offset, len));
        }
        check_range(self, IoKind::Write, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let done = if self.mapping.is_some() {
            Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
        } else if self.block_device {
            if offset.is_multiple_of(512) && len.is_multiple_of(512) {
                self.range_ioctl(BLKZEROOUT, offset, len)
            } else {
                Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
            }
        } else if !keep_allocated {
            self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        } else {
            match self.fallocate(
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ) {
                Err(e) if unsupported(&e) => self
                    .fallocate(
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        offset,
                        len,
                    )
                    .and_then(|()| self.fallocate(libc::FALLOC_FL_KEEP_SIZE, offset, len)),
                other => other,
            }
        };
        match done {
            Err(e) if unsupported(&e) => crate::device::write_zero_buffers(self, offset, len),
            Err(e) => Err(self.io_err(IoKind::Write, offset, len as usize, e)),
            Ok(()) => Ok(()),
        }
    }

    fn alignment(&self) -> usize {
        match self.mapping {
            // A copy has no alignment rules.
            Some(_) => 1,
            None => self.align,
        }
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn identity(&self) -> Option<DeviceIdentity> {
        Some(self.identity.clone())
    }

    /// A regular file must still be as long as when it was opened (a
    /// block device cannot shrink under an exclusive open).
    fn check_intact(&self) -> Result<(), DeviceError> {
        if self.block_device {
            return Ok(());
        }
        let now = self.files[0]
            .metadata()
            .map_err(|e| self.io_err(IoKind::Read, 0, 0, e))?
            .len();
        if now < self.len {
            return Err(DeviceError::Shrunk {
                device: self.name.clone(),
                now,
                len: self.len,
            });
        }
        Ok(())
    }

    fn raw_target(&self) -> Option<RawTarget> {
        if self.mapping.is_some() {
            // Through the mapping (read_at, write_at): its guard and its
            // failed mark apply to every I/O.
            return None;
        }
        Some(RawTarget {
            fd: self.files[0].as_raw_fd(),
            alignment: self.align,
            read_only: self.read_only,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_refused_with_einval_falls_back_to_buffered() {
        // tmpfs accepts O_DIRECT since Linux 6.6, so the refusal is simulated.
        let path = std::env::temp_dir().join(format!("iocache-fallback-{}", std::process::id()));
        let opener = |direct: bool| {
            if direct {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
            }
        };
        let (_f, d) = open_direct_or_fallback(&path, true, opener).unwrap();
        assert_eq!(d, DirectIo::FellBack { errno: libc::EINVAL });
        let (_f, d) = open_direct_or_fallback(&path, false, opener).unwrap();
        assert_eq!(d, DirectIo::Off);
        let e = open_direct_or_fallback(&path, true, |_| Err(io::Error::from_raw_os_error(libc::EACCES)))
            .unwrap_err();
        assert!(e.to_string().contains("iocache-fallback"), "{e}");
        let _ = std::fs::remove_file(&path);
    }

    /// Threads use different open file descriptions of one file; each sees
    /// what the others wrote, buffered and with `O_DIRECT`, and the file is
    /// opened read-only again when the device is read-only.
    #[test]
    fn threads_on_different_descriptions_see_each_others_writes() {
        for direct in [false, true] {
            let path = std::env::temp_dir().join(format!("iocache-stripes-{}-{direct}", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let threads = FILE_STRIPES * 2;
            let device = FileDevice::open(
                &path,
                OpenOptions {
                    direct,
                    create_size: Some((threads * 4096) as u64),
                    ..Default::default()
                },
            )
            .unwrap();
            assert_eq!(device.files.len(), FILE_STRIPES, "one description per stripe");
            std::thread::scope(|scope| {
                for t in 0..threads {
                    let device = &device;
                    scope.spawn(move || {
                        let mut block = AlignedBuf::zeroed(4096, 4096);
                        block.fill(t as u8 + 1);
                        device.write_at(&block, (t * 4096) as u64).unwrap();
                    });
                }
            });
            std::thread::scope(|scope| {
                for t in 0..threads {
                    let device = &device;
                    scope.spawn(move || {
                        let mut block = AlignedBuf::zeroed(4096, 4096);
                        for other in 0..threads {
                            device.read_at(&mut block, (other * 4096) as u64).unwrap();
                            assert!(
                                block.iter().all(|&b| b == other as u8 + 1),
                                "thread {t} reads block {other} as written"
                            );
                        }
                    });
                }
            });
            device.flush().unwrap();
            drop(device);
            let reader = FileDevice::open(
                &path,
                OpenOptions {
                    direct,
                    read_only: true,
                    ..Default::default()
                },
            )
            .unwrap();
            for file in reader.files.iter() {
                // SAFETY: F_GETFL on an fd the device owns.
                let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
                assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
            }
            let _ = std::fs::remove_file(&path);
        }
    }

    /// A mapped device gives an I/O engine no descriptor (every I/O goes
    /// through the mapping and its guard) and keeps its pages on discard.
    #[test]
    fn a_mapped_device_keeps_every_io_on_the_mapping() {
        let path = Path::new("/dev/shm").join(format!("iocache-mapped-device-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let Ok(mut device) = FileDevice::open(
            &path,
            OpenOptions {
                create_size: Some(1 << 20),
                exclusive: true,
                ..Default::default()
            },
        ) else {
            eprintln!("skipped: no /dev/shm");
            return;
        };
        assert!(device.raw_target().is_some(), "unmapped: the descriptor");
        // Unmapped, a tearable write is a `pwrite`.
        device.write_tearable_at(&[3u8; 4096], 0).unwrap();
        if !device.map_if_in_memory().unwrap() {
            eprintln!("skipped: /dev/shm is not in memory here");
            let _ = std::fs::remove_file(&path);
            return;
        }
        assert!(device.is_mapped() && device.raw_target().is_none());
        assert_eq!(device.alignment(), 1);
        device.write_at(&[7u8; 8192], 4096).unwrap();
        device.discard(0, 1 << 20).unwrap();
        let mut back = vec![0u8; 8192];
        device.read_at(&mut back, 4096).unwrap();
        assert!(
            back.iter().all(|&b| b == 7),
            "a discard keeps a mapped file's pages"
        );
        // A tearable write is a copy into the mapping: the file's pages.
        device.write_tearable_at(&[9u8; 4096], 64 << 10).unwrap();
        let mut through_file = vec![0u8; 4096];
        std::fs::File::open(&path)
            .unwrap()
            .read_exact_at(&mut through_file, 64 << 10)
            .unwrap();
        assert!(through_file.iter().all(|&b| b == 9));
        device.read_at(&mut through_file, 0).unwrap();
        assert!(through_file.iter().all(|&b| b == 3), "the pwrite before mapping");
        assert!(device.write_tearable_at(&[1u8; 4096], (1 << 20) - 2048).is_err());
        // Someone truncates the file: the read that meets a missing page
        // fails the mapping, and the device's writes (pwrites, which would
        // not fault) are refused from then on too.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(64 << 10)
            .unwrap();
        assert!(device.read_at(&mut back, 512 << 10).is_err());
        let e = device.write_at(&[1u8; 4096], 0).unwrap_err();
        assert!(e.to_string().contains("SIGBUS"), "{e}");
        let e = device.write_tearable_at(&[1u8; 4096], 0).unwrap_err();
        assert!(e.to_string().contains("SIGBUS"), "{e}");
        drop(device);
        let _ = std::fs::remove_file(&path);
    }
}

#[cfg(test)]
mod beneath_tests {
    use super::*;

    fn opts(dir: &Path, create: Option<u64>) -> OpenOptions {
        OpenOptions {
            create_size: create,
            exclusive: true,
            beneath: Some(dir.to_path_buf()),
            ..OpenOptions::default()
        }
    }

    #[test]
    fn opening_beneath_a_directory_never_leaves_it() {
        let root = std::env::temp_dir().join(format!("iocache-beneath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let allowed = root.join("allowed");
        let outside = root.join("outside");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.img"), vec![1u8; 4096]).unwrap();
        std::fs::write(allowed.join("mine.img"), vec![2u8; 8192]).unwrap();

        // A file in the directory opens, keeping its size even when a
        // size to create with is given.
        let dev = FileDevice::open("mine.img", opts(&allowed, Some(1 << 20))).unwrap();
        assert_eq!(dev.len_bytes(), 8192);
        assert_eq!(dev.path(), allowed.join("mine.img"));
        drop(dev);
        // A new one is created (O_EXCL) at the size given.
        let dev = FileDevice::open("new.img", opts(&allowed, Some(1 << 20))).unwrap();
        assert_eq!(dev.len_bytes(), 1 << 20);
        drop(dev);

        // A dangling link planted in the directory creates nothing outside.
        std::os::unix::fs::symlink(outside.join("created.img"), allowed.join("dangling.img")).unwrap();
        assert!(FileDevice::open("dangling.img", opts(&allowed, Some(1 << 20))).is_err());
        assert!(!outside.join("created.img").exists(), "nothing created outside");
        // A link to a file outside, absolute or relative, is not followed.
        std::os::unix::fs::symlink(outside.join("secret.img"), allowed.join("abs.img")).unwrap();
        std::os::unix::fs::symlink("../outside/secret.img", allowed.join("rel.img")).unwrap();
        for name in ["abs.img", "rel.img"] {
            assert!(FileDevice::open(name, opts(&allowed, None)).is_err(), "{name}");
        }
        // Nor is a link inside the directory, nor a linked directory.
        std::os::unix::fs::symlink(allowed.join("mine.img"), allowed.join("inside.img")).unwrap();
        assert!(FileDevice::open("inside.img", opts(&allowed, None)).is_err());
        std::os::unix::fs::symlink(&outside, allowed.join("sub")).unwrap();
        assert!(FileDevice::open("sub/secret.img", opts(&allowed, None)).is_err());
        // `..` out of the directory, and an absolute path, are refused.
        assert!(FileDevice::open("../outside/secret.img", opts(&allowed, None)).is_err());
        assert!(FileDevice::open(outside.join("secret.img"), opts(&allowed, None)).is_err());
        // The outside file is untouched.
        assert_eq!(
            std::fs::read(outside.join("secret.img")).unwrap(),
            vec![1u8; 4096]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
