//! The streaming trace reader: decompression, optional format detection, and
//! a hot loop that turns lines into records.
//!
//! Memory stays bounded whatever the trace length: one reused line buffer,
//! fixed-size I/O buffers, a few lookahead lines kept for detection, and
//! per-format state that grows only with the number of distinct volumes.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::bytes::strip_eol;
use crate::detect::{detect_format_bytes, DETECT_LINES};
use crate::error::FieldError;
use crate::formats::{Outcome, Parser};
use crate::input::{decompress, Compression, CountingReader, BUFFER_BYTES};
use crate::{TraceError, TraceFormat, TraceRecord};

/// Longest line accepted, in bytes (longer lines are malformed).
pub const MAX_LINE_BYTES: u64 = 1 << 20;

/// Most bytes read ahead for format detection.
const LOOKAHEAD_BYTES: u64 = 1 << 20;

/// Options for [`TraceReader`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderOptions {
    /// Skip malformed lines (counting them in
    /// [`TraceReader::skipped_lines`]) instead of stopping at the first one.
    pub skip_bad_lines: bool,
}

enum LineRead {
    Line,
    TooLong,
    Eof,
}

/// A streaming reader of one trace: an iterator of records.
///
/// With `skip_bad_lines` off, the first malformed line yields
/// `Err(TraceError::Parse)` and the iteration ends there; an I/O or
/// decompression error also ends it.
pub struct TraceReader {
    name: String,
    format: TraceFormat,
    compression: Compression,
    input: BufReader<Box<dyn Read + Send>>,
    /// Lines read ahead for detection, replayed before `input`.
    pending: VecDeque<Vec<u8>>,
    line: Vec<u8>,
    line_no: u64,
    parser: Parser,
    skip_bad_lines: bool,
    skipped: u64,
    ignored: u64,
    records: u64,
    done: bool,
    consumed: Arc<AtomicU64>,
    input_len: Option<u64>,
}

impl std::fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReader")
            .field("name", &self.name)
            .field("format", &self.format)
            .field("compression", &self.compression)
            .field("line_no", &self.line_no)
            .field("records", &self.records)
            .field("skipped", &self.skipped)
            .field("ignored", &self.ignored)
            .finish_non_exhaustive()
    }
}

/// A read error part-way through: a compressed input that ends inside a
/// frame is "truncated" (the decoders say so with UnexpectedEof or, for
/// zstd, "incomplete frame").
#[cold]
fn interrupted(name: &str, records: u64, line: u64, source: io::Error) -> TraceError {
    let text = source.to_string();
    let truncated = source.kind() == io::ErrorKind::UnexpectedEof
        || text.contains("incomplete frame")
        || text.contains("unexpected end");
    TraceError::Interrupted {
        path: name.to_string(),
        truncated,
        records,
        line,
        source,
    }
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

impl TraceReader {
    /// Opens a trace file. `format: None` detects the format from the first
    /// lines of the (decompressed) content.
    pub fn open(
        path: &Path,
        format: Option<TraceFormat>,
        options: ReaderOptions,
    ) -> Result<Self, TraceError> {
        let name = path.display().to_string();
        let io_err = |source| TraceError::Io {
            path: name.clone(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let metadata = file.metadata().map_err(io_err)?;
        let len = metadata.is_file().then_some(metadata.len());
        let mut reader = Self::from_reader(&name, Box::new(file), format, options)?;
        reader.input_len = len;
        Ok(reader)
    }

    /// Reads a trace held in memory, named `name` in messages (compressed
    /// or not, as [`TraceReader::from_reader`] reads any stream).
    pub fn from_bytes(
        name: &str,
        bytes: impl Into<Vec<u8>>,
        format: Option<TraceFormat>,
        options: ReaderOptions,
    ) -> Result<Self, TraceError> {
        Self::from_reader(
            name,
            Box::new(std::io::Cursor::new(bytes.into())),
            format,
            options,
        )
    }

    /// Reads a trace from any byte stream (stdin, memory, ...), named `name`
    /// in messages. Compression is sniffed as for files.
    pub fn from_reader(
        name: &str,
        input: Box<dyn Read + Send>,
        format: Option<TraceFormat>,
        options: ReaderOptions,
    ) -> Result<Self, TraceError> {
        let io_err = |source| TraceError::Io {
            path: name.to_string(),
            source,
        };
        let consumed = Arc::new(AtomicU64::new(0));
        let counting = CountingReader::new(input, Arc::clone(&consumed));
        let (decoded, compression) = decompress(Box::new(counting)).map_err(io_err)?;
        let mut input = BufReader::with_capacity(BUFFER_BYTES, decoded);
        let mut pending = VecDeque::new();
        let format = match format {
            Some(format) => format,
            None => {
                pending = read_ahead(&mut input).map_err(|e| interrupted(name, 0, 0, e))?;
                detect(name, &pending)?
            }
        };
        Ok(TraceReader {
            name: name.to_string(),
            format,
            compression,
            input,
            pending,
            line: Vec::with_capacity(256),
            line_no: 0,
            parser: Parser::new(format),
            skip_bad_lines: options.skip_bad_lines,
            skipped: 0,
            ignored: 0,
            records: 0,
            done: false,
            consumed,
            input_len: None,
        })
    }

    /// The format being read (given or detected).
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// The compression detected on the input.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The name used in messages (the path for files).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether malformed lines are skipped (and counted) rather than errors.
    pub fn skips_bad_lines(&self) -> bool {
        self.skip_bad_lines
    }

    /// Malformed lines skipped so far (only with `skip_bad_lines`).
    pub fn skipped_lines(&self) -> u64 {
        self.skipped
    }

    /// Well-formed lines so far that are not data I/O (non-read/write SCSI
    /// opcodes, fio add/open/close/sync/trim/wait, blkparse lines with another
    /// action, discards, flushes). Headers, comments and blkparse's summary
    /// are not counted.
    pub fn ignored_records(&self) -> u64 {
        self.ignored
    }

    /// Records returned so far.
    pub fn records_read(&self) -> u64 {
        self.records
    }

    /// Lines read so far (1-based number of the last line read).
    pub fn lines_read(&self) -> u64 {
        self.line_no
    }

    /// Raw (possibly compressed) input bytes read so far, for progress
    /// reporting against [`Self::input_len`]. Includes read-ahead buffering.
    pub fn input_bytes_consumed(&self) -> u64 {
        self.consumed.load(Ordering::Relaxed)
    }

    /// The input's size in bytes when known (regular files opened with
    /// [`Self::open`]).
    pub fn input_len(&self) -> Option<u64> {
        self.input_len
    }

    /// Reads the next line (with its terminator) into `self.line`.
    fn read_line(&mut self) -> io::Result<LineRead> {
        if let Some(ahead) = self.pending.pop_front() {
            self.line = ahead;
            if self.line.last() == Some(&b'\n') {
                return Ok(LineRead::Line);
            }
            // A line cut by the look-ahead limit (or the last line of the
            // input): read the rest of it.
        } else {
            self.line.clear();
        }
        let limit = MAX_LINE_BYTES.saturating_sub(self.line.len() as u64);
        (&mut self.input).take(limit).read_until(b'\n', &mut self.line)?;
        if self.line.is_empty() {
            return Ok(LineRead::Eof);
        }
        if self.line.last() != Some(&b'\n') && self.line.len() as u64 >= MAX_LINE_BYTES {
            self.discard_rest_of_line()?;
            return Ok(LineRead::TooLong);
        }
        Ok(LineRead::Line)
    }

    fn discard_rest_of_line(&mut self) -> io::Result<()> {
        loop {
            let buf = self.input.fill_buf()?;
            if buf.is_empty() {
                return Ok(());
            }
            match buf.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.input.consume(i + 1);
                    return Ok(());
                }
                None => {
                    let n = buf.len();
                    self.input.consume(n);
                }
            }
        }
    }

    /// Handles a malformed line: skip and count it, or report it and stop.
    #[cold]
    fn bad_line(&mut self, field: &'static str, reason: String) -> Option<TraceError> {
        if self.skip_bad_lines {
            self.skipped += 1;
            None
        } else {
            self.done = true;
            Some(TraceError::Parse {
                path: self.name.clone(),
                line: self.line_no,
                field,
                reason,
            })
        }
    }
}

impl TraceReader {
    /// Accounts for one parsed line: `Some(item)` to hand out, `None` to go
    /// on to the next line.
    #[inline]
    fn settle(&mut self, result: Result<Outcome, FieldError>) -> Option<Result<TraceRecord, TraceError>> {
        match result {
            Ok(Outcome::Record(record)) => {
                self.records += 1;
                Some(Ok(record))
            }
            Ok(Outcome::Ignored) => {
                self.ignored += 1;
                None
            }
            Ok(Outcome::Skip) => None,
            Err(e) => self.bad_line(e.field, e.reason).map(Err),
        }
    }

    /// The slow path: a line read ahead for detection, crossing the end of
    /// the input buffer, too long, or at the end of the input.
    #[cold]
    fn next_slow(&mut self) -> Option<Option<Result<TraceRecord, TraceError>>> {
        match self.read_line() {
            Ok(LineRead::Line) => {}
            Ok(LineRead::Eof) => {
                self.done = true;
                return Some(None);
            }
            Ok(LineRead::TooLong) => {
                self.line_no += 1;
                let reason = format!("line longer than {MAX_LINE_BYTES} bytes");
                return self.bad_line("line", reason).map(|e| Some(Err(e)));
            }
            Err(source) => {
                self.done = true;
                return Some(Some(Err(interrupted(
                    &self.name,
                    self.records,
                    self.line_no,
                    source,
                ))));
            }
        }
        self.line_no += 1;
        let line = strip_eol(&self.line);
        if is_blank(line) {
            return None;
        }
        let result = self.parser.parse(line);
        self.settle(result).map(Some)
    }
}

impl Iterator for TraceReader {
    type Item = Result<TraceRecord, TraceError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            // Fast path: parse a whole line in place in the input buffer,
            // without copying it.
            let whole_line = if self.pending.is_empty() {
                match self.input.fill_buf() {
                    // A format that parses a line as it finds its end.
                    Ok(buf) => match self.parser.parse_leading_line(buf) {
                        Some((used, outcome)) => Some((used, Some(Ok(outcome)))),
                        None => buf.iter().position(|&b| b == b'\n').map(|end| {
                            let line = strip_eol(&buf[..end]);
                            let result = if is_blank(line) {
                                None
                            } else {
                                Some(self.parser.parse(line))
                            };
                            (end + 1, result)
                        }),
                    },
                    // Let the slow path report (or retry) the error.
                    Err(_) => None,
                }
            } else {
                None
            };
            match whole_line {
                Some((used, result)) => {
                    self.input.consume(used);
                    self.line_no += 1;
                    if let Some(result) = result {
                        if let Some(item) = self.settle(result) {
                            return Some(item);
                        }
                    }
                }
                None => {
                    if let Some(item) = self.next_slow() {
                        return item;
                    }
                }
            }
        }
    }
}

/// Reads up to [`DETECT_LINES`] non-empty lines (and at most
/// [`LOOKAHEAD_BYTES`]) for detection, keeping them to be parsed later.
fn read_ahead(input: &mut BufReader<Box<dyn Read + Send>>) -> io::Result<VecDeque<Vec<u8>>> {
    let mut lines = VecDeque::new();
    let mut total = 0u64;
    let mut non_empty = 0;
    while non_empty < DETECT_LINES && total < LOOKAHEAD_BYTES {
        let mut line = Vec::new();
        let n = input.take(LOOKAHEAD_BYTES - total).read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if !is_blank(strip_eol(&line)) {
            non_empty += 1;
        }
        lines.push_back(line);
    }
    Ok(lines)
}

fn detect(name: &str, lines: &VecDeque<Vec<u8>>) -> Result<TraceFormat, TraceError> {
    let unknown = |reason: String| TraceError::UnknownFormat {
        path: name.to_string(),
        reason,
    };
    if lines.iter().any(|l| l.contains(&0)) {
        return Err(unknown(
            "the input looks binary (it contains NUL bytes); traces must be text, \
             plain or compressed with gzip, zstd or bzip2"
                .to_string(),
        ));
    }
    // Leave out a last line cut short by the look-ahead limit.
    let total: usize = lines.iter().map(Vec::len).sum();
    let cut = total as u64 >= LOOKAHEAD_BYTES && lines.back().is_some_and(|l| l.last() != Some(&b'\n'));
    let keep = lines.len() - usize::from(cut);
    let complete: Vec<&[u8]> = lines.iter().take(keep).map(Vec::as_slice).collect();
    detect_format_bytes(&complete).map_err(unknown)
}
