//! Streaming readers for block I/O trace formats.
//!
//! This crate exists so the cache simulator can replay published block I/O
//! traces, whatever their format or compression, as one uniform stream of
//! [`TraceRecord`]s, fast enough (several million lines per second) not to be
//! the bottleneck, and in memory that does not grow with trace length.
//!
//! ```no_run
//! use iocache_trace::{ReaderOptions, TraceReader};
//! # fn main() -> Result<(), iocache_trace::TraceError> {
//! let reader = TraceReader::open("trace.csv.gz".as_ref(), None, ReaderOptions::default())?;
//! for record in reader {
//!     let record = record?;
//!     println!("{} {:?} {}+{}", record.volume, record.kind, record.offset_bytes, record.length_bytes);
//! }
//! # Ok(()) }
//! ```
//!
//! # Input
//!
//! gzip, zstd and bzip2 input is decompressed transparently, chosen by magic
//! bytes; anything else is read as plain text. Lines end in `\n` or `\r\n`;
//! blank lines are skipped everywhere; line numbers in errors are 1-based
//! lines of the decompressed text. With no format given, the format is
//! detected from the first 20 non-empty lines (see [`detect_format`]).
//!
//! # Records
//!
//! Offsets and lengths are in bytes; `time_ns` is in nanoseconds. Times are
//! the trace's own timestamps converted to nanoseconds, never rebased:
//! Unix-epoch times for MSR (FILETIME converted), SYSTOR and Tencent;
//! CloudPhysics times as published (seconds); time since the start of the
//! trace for FIU, DiskSim/MQSim, blkparse and fio; and the record index
//! (0, 1, 2, ...) for formats without timestamps (ARC, LBA). Times need not be
//! monotone where the trace itself is not (SYSTOR, Tencent). `volume` is the
//! trace's own volume number where it has one (SYSTOR LUN, Tencent volume,
//! DiskSim device), a dense id in order of first appearance where the volume
//! is a name or a pair (MSR host and disk, FIU and blkparse device numbers,
//! fio file name), and 0 for single-volume formats.
//!
//! # Formats
//!
//! | name | fields | units |
//! |---|---|---|
//! | `msr` | `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime` | FILETIME ticks; bytes; `Read`/`Write` |
//! | `systor` | header `Timestamp,Response,IOType,LUN,Offset,Size` | seconds (decimal); bytes; `R`/`W` |
//! | `tencent` | `timestamp_s,offset_sectors,size_sectors,io_type,volume_id` | seconds; 512-byte sectors; 0 read, 1 write |
//! | `fiu` | `ts pid process lba size op major minor md5` | ns; 512-byte sectors; `R`/`W` |
//! | `vscsi-csv` | header `version,time,op,size,lbn` | seconds; bytes (`size`), sectors (`lbn`); SCSI opcode in hex |
//! | `disksim` | `arrival_time device lba_sectors size_sectors type` | ns (integer) or ms (decimal); sectors; 1 read, 0 write |
//! | `arc` | `start_sector nsectors ignored request_no` | sectors; all reads |
//! | `blkparse` | blkparse default output (`blkparse:action=X` to pick the action, default `Q`) | seconds.nanoseconds; sectors; RWBS |
//! | `fio` | fio iolog v2 / v3 | v2: waits in µs; v3: timestamps in µs; bytes |
//! | `lba` | one LBA per line (`lba:block=N`, default 512) | blocks; all reads |
//!
//! Each format's module documents its details and sources.

mod bytes;
mod detect;
mod digits;
mod error;
mod format;
mod formats;
mod input;
mod intern;
mod reader;

pub use detect::{detect_format, DETECT_LINES};
pub use error::{FormatNameError, TraceError};
pub use format::{TraceFormat, DEFAULT_BLKPARSE_ACTION, DEFAULT_LBA_BLOCK_BYTES, FORMAT_NAMES};
pub use input::Compression;
pub use reader::{ReaderOptions, TraceReader, MAX_LINE_BYTES};

/// Whether a request reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    /// A read.
    Read,
    /// A write.
    Write,
}

/// One data request from a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceRecord {
    /// Request time in nanoseconds (see the crate documentation for each
    /// format's epoch).
    pub time_ns: u64,
    /// The volume (disk, LUN, device or file) the request addresses.
    pub volume: u32,
    /// Start of the request in bytes from the start of the volume.
    pub offset_bytes: u64,
    /// Length of the request in bytes; never 0, and `offset_bytes +
    /// length_bytes` never overflows.
    pub length_bytes: u64,
    /// Read or write.
    pub kind: IoKind,
    /// The process that issued the request, where the format records one
    /// (blkparse's and FIU's PID); 0 otherwise.
    pub process: u32,
}

impl TraceRecord {
    /// A request with no process recorded (`process` 0).
    #[inline]
    pub fn new(time_ns: u64, volume: u32, offset_bytes: u64, length_bytes: u64, kind: IoKind) -> TraceRecord {
        TraceRecord {
            time_ns,
            volume,
            offset_bytes,
            length_bytes,
            kind,
            process: 0,
        }
    }

    /// The same request, issued by `process`.
    #[inline]
    pub fn by_process(self, process: u32) -> TraceRecord {
        TraceRecord { process, ..self }
    }
}
