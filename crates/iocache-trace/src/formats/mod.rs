//! One line parser per trace format, behind a single enum so the reader's hot
//! loop dispatches with a `match` rather than a virtual call.
//!
//! A parser sees one line at a time (end-of-line bytes removed, never blank)
//! and says whether it is a data record, a well-formed line that is not data
//! I/O (counted as ignored), or a header/comment (skipped silently). Parsers
//! keep only bounded state: volume interners and small counters.

mod arc;
pub(crate) mod blkparse;
mod disksim;
mod fio;
mod fiu;
mod lba;
pub(crate) mod msr;
mod systor;
mod tencent;
mod vscsi;

use crate::bytes::show;
use crate::error::FieldError;
use crate::{IoKind, TraceFormat, TraceRecord};

/// What one line turned out to be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Outcome {
    /// A data read or write.
    Record(TraceRecord),
    /// A well-formed line that is not data I/O (counted in
    /// `ignored_records`).
    Ignored,
    /// A header, comment or summary line (not counted).
    Skip,
}

/// Bytes in one disk sector, the unit of most block traces.
pub(crate) const SECTOR_BYTES: u64 = 512;

/// Nanoseconds per second.
pub(crate) const NS_PER_S: u64 = 1_000_000_000;

/// A line parser for one format.
#[derive(Debug)]
pub(crate) enum Parser {
    Msr(msr::Msr),
    Systor(systor::Systor),
    Tencent(tencent::Tencent),
    Fiu(fiu::Fiu),
    Vscsi(vscsi::Vscsi),
    Disksim(disksim::Disksim),
    Arc(arc::Arc),
    Blkparse(blkparse::Blkparse),
    Fio(fio::Fio),
    Lba(lba::Lba),
}

impl Parser {
    pub(crate) fn new(format: TraceFormat) -> Parser {
        match format {
            TraceFormat::Msr => Parser::Msr(msr::Msr::default()),
            TraceFormat::Systor => Parser::Systor(systor::Systor),
            TraceFormat::Tencent => Parser::Tencent(tencent::Tencent),
            TraceFormat::Fiu => Parser::Fiu(fiu::Fiu::default()),
            TraceFormat::VscsiCsv => Parser::Vscsi(vscsi::Vscsi),
            TraceFormat::Disksim => Parser::Disksim(disksim::Disksim),
            TraceFormat::Arc => Parser::Arc(arc::Arc::default()),
            TraceFormat::Blkparse { action } => Parser::Blkparse(blkparse::Blkparse::new(action)),
            TraceFormat::Fio => Parser::Fio(fio::Fio::default()),
            TraceFormat::Lba { block_bytes } => Parser::Lba(lba::Lba::new(block_bytes)),
        }
    }

    /// Parses one non-blank line (without its line terminator).
    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        match self {
            Parser::Msr(p) => p.parse(line),
            Parser::Systor(p) => p.parse(line),
            Parser::Tencent(p) => p.parse(line),
            Parser::Fiu(p) => p.parse(line),
            Parser::Vscsi(p) => p.parse(line),
            Parser::Disksim(p) => p.parse(line),
            Parser::Arc(p) => p.parse(line),
            Parser::Blkparse(p) => p.parse(line),
            Parser::Fio(p) => p.parse(line),
            Parser::Lba(p) => p.parse(line),
        }
    }
}

impl Parser {
    /// The line at the start of `buf` when this format can take it in the
    /// same pass that finds its end: the bytes it spans (its `\n`
    /// included) and what [`Parser::parse`] makes of it. `None` leaves the
    /// line to the general path (find the end, then parse), which decides
    /// every line this declines; only the ARC format has such a pass.
    #[inline]
    pub(crate) fn parse_leading_line(&mut self, buf: &[u8]) -> Option<(usize, Outcome)> {
        match self {
            Parser::Arc(p) => p.parse_leading_line(buf),
            _ => None,
        }
    }
}

/// Parses a read/write marker: `R`/`W` or `Read`/`Write`, any case.
#[inline]
pub(crate) fn read_write(s: &[u8], field: &'static str) -> Result<IoKind, FieldError> {
    match s {
        [b'R' | b'r'] => Ok(IoKind::Read),
        [b'W' | b'w'] => Ok(IoKind::Write),
        _ if s.eq_ignore_ascii_case(b"read") => Ok(IoKind::Read),
        _ if s.eq_ignore_ascii_case(b"write") => Ok(IoKind::Write),
        _ => Err(FieldError::new(
            field,
            format!("expected `R`/`Read` or `W`/`Write`, found `{}`", show(s)),
        )),
    }
}

/// Parses a 0/1 direction flag; `one` is the kind that 1 stands for.
#[inline]
pub(crate) fn zero_one(s: &[u8], field: &'static str, one: IoKind) -> Result<IoKind, FieldError> {
    let zero = match one {
        IoKind::Read => IoKind::Write,
        IoKind::Write => IoKind::Read,
    };
    match s {
        b"0" => Ok(zero),
        b"1" => Ok(one),
        _ => Err(FieldError::new(
            field,
            format!(
                "expected 0 ({}) or 1 ({}), found `{}`",
                kind_name(zero),
                kind_name(one),
                show(s)
            ),
        )),
    }
}

fn kind_name(kind: IoKind) -> &'static str {
    match kind {
        IoKind::Read => "read",
        IoKind::Write => "write",
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Helpers for the per-format tests: run a whole text through a
    //! `TraceReader` of a given format.

    use crate::{ReaderOptions, TraceError, TraceFormat, TraceReader, TraceRecord};

    pub(crate) fn reader(format: TraceFormat, text: &str, skip_bad: bool) -> TraceReader {
        TraceReader::from_bytes(
            "test",
            text,
            Some(format),
            ReaderOptions {
                skip_bad_lines: skip_bad,
            },
        )
        .expect("opening an in-memory reader")
    }

    /// All records; panics on any error.
    pub(crate) fn records(format: TraceFormat, text: &str) -> Vec<TraceRecord> {
        reader(format, text, false)
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The first error's (line, field), checking iteration stops after it.
    pub(crate) fn first_error(format: TraceFormat, text: &str) -> (u64, &'static str, String) {
        let mut reader = reader(format, text, false);
        for item in reader.by_ref() {
            if let Err(e) = item {
                assert!(reader.next().is_none(), "iteration must end after an error");
                return match e {
                    TraceError::Parse {
                        line, field, reason, ..
                    } => (line, field, reason),
                    other => panic!("expected a parse error, got {other}"),
                };
            }
        }
        panic!("expected an error in {text:?}");
    }

    /// For each `(bad, field)`: `prefix` then `bad` stops at `line` with
    /// an error naming `field`.
    pub(crate) fn assert_first_errors(format: TraceFormat, prefix: &str, line: u64, cases: &[(&str, &str)]) {
        for (bad, field) in cases {
            let (at, named, reason) = first_error(format, &format!("{prefix}{bad}"));
            assert_eq!((at, named), (line, *field), "{bad}: {reason}");
        }
    }

    /// (records, skipped, ignored) in skip-bad-lines mode.
    pub(crate) fn skipping(format: TraceFormat, text: &str) -> (Vec<TraceRecord>, u64, u64) {
        let mut reader = reader(format, text, true);
        let records = reader
            .by_ref()
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
        (records, reader.skipped_lines(), reader.ignored_records())
    }
}
