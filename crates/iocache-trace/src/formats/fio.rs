//! fio iolog traces, versions 2 and 3 (fio HOWTO, "Trace file format").
//!
//! The first line is `fio version 2 iolog` or `fio version 3 iolog`.
//!
//! Version 2 lines are `filename action` (add/open/close) or
//! `filename action offset length` (read/write/sync/datasync/trim/wait), with
//! offset and length in bytes. The HOWTO says `wait` waits `offset`
//! microseconds, relative to the previous wait, so time is the sum of the
//! waits so far (every record before the first wait has time 0). Note that
//! fio's replay code actually treats a v2 wait value as an absolute deadline
//! in milliseconds since the job started; this reader follows the documented
//! format.
//!
//! Version 3 lines put a timestamp first: `timestamp filename action
//! [offset length]`. The HOWTO does not give the unit; fio writes it with
//! `utime_since_now()` and replays it as microseconds, so it is read as
//! microseconds since the start of the run. v3 does not allow `wait`; fio
//! skips such lines, and so does this reader (as ignored records).
//!
//! The volume is the file name, interned in order of first appearance (on
//! any line, `add` included). Only
//! `read` and `write` are records; add/open/close/sync/datasync/trim/wait are
//! ignored records.

use super::Outcome;
use crate::bytes::{check_extent, show, split_ws, u64_field};
use crate::error::FieldError;
use crate::intern::Interner;
use crate::{IoKind, TraceRecord};

const NS_PER_US: u64 = 1_000;

#[derive(Debug, Default)]
pub(crate) struct Fio {
    version: Option<u8>,
    /// v2: accumulated waits, in nanoseconds.
    clock_ns: u64,
    volumes: Interner,
}

enum Action {
    Data(IoKind),
    /// A well-formed line that is not data I/O.
    Other,
    Wait,
}

fn file_action(action: &[u8]) -> Result<(), FieldError> {
    match action {
        b"add" | b"open" | b"close" => Ok(()),
        _ => Err(FieldError::new(
            "action",
            format!(
                "expected add, open or close for a line without offset and length, found `{}`",
                show(action)
            ),
        )),
    }
}

fn io_action(action: &[u8]) -> Result<Action, FieldError> {
    match action {
        b"read" => Ok(Action::Data(IoKind::Read)),
        b"write" => Ok(Action::Data(IoKind::Write)),
        b"sync" | b"datasync" | b"trim" => Ok(Action::Other),
        b"wait" => Ok(Action::Wait),
        _ => Err(FieldError::new(
            "action",
            format!(
                "expected read, write, sync, datasync, trim or wait, found `{}`",
                show(action)
            ),
        )),
    }
}

#[cold]
fn too_many(version: Option<u8>, n: usize) -> FieldError {
    FieldError::new(
        "line",
        format!(
            "expected `{}filename action [offset length]`, found {n} fields",
            if version == Some(2) { "" } else { "timestamp " }
        ),
    )
}

impl Fio {
    fn header(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let (f, n) = split_ws::<4>(line);
        let version = match (n, f[2], f[3]) {
            (4, b"2", b"iolog") => 2,
            (4, b"3", b"iolog") => 3,
            _ => {
                return Err(FieldError::new(
                    "header",
                    format!(
                        "expected `fio version 2 iolog` or `fio version 3 iolog`, found `{}`",
                        show(line)
                    ),
                ))
            }
        };
        self.version = Some(version);
        Ok(Outcome::Skip)
    }

    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let line = crate::bytes::trim(line);
        if line.starts_with(b"fio version ") {
            return self.header(line);
        }
        let (f, n) = split_ws::<7>(line);
        if n > 6 {
            return Err(too_many(self.version, n));
        }
        // `fields` is `filename action [offset length]`.
        let (time_ns, fields) = match self.version {
            None => {
                return Err(FieldError::new(
                    "header",
                    "missing `fio version 2 iolog` or `fio version 3 iolog` first line",
                ))
            }
            Some(2) => (None, &f[..n]),
            Some(_) => {
                let us = u64_field(f[0], "timestamp")?;
                let ns = us.checked_mul(NS_PER_US).ok_or_else(|| {
                    FieldError::new("timestamp", format!("{us} µs overflows 64-bit nanoseconds"))
                })?;
                (Some(ns), &f[1..n])
            }
        };
        let (name, action, offset, length) = match *fields {
            [name, action] => {
                file_action(action)?;
                self.volumes.intern(&[name], "filename")?;
                return Ok(Outcome::Ignored);
            }
            [name, action, offset, length] => (name, action, offset, length),
            [] => return Err(FieldError::new("filename", "missing")),
            [_] => return Err(FieldError::new("action", "missing")),
            [_, _, _] => return Err(FieldError::new("length", "missing")),
            _ => return Err(too_many(self.version, n)),
        };
        let action = io_action(action)?;
        let volume = self.volumes.intern(&[name], "filename")?;
        let kind = match action {
            Action::Data(kind) => kind,
            Action::Other => return Ok(Outcome::Ignored),
            Action::Wait => {
                if self.version == Some(2) {
                    let us = u64_field(offset, "offset")?;
                    let wait_ns = us.saturating_mul(NS_PER_US);
                    self.clock_ns = self.clock_ns.saturating_add(wait_ns);
                }
                return Ok(Outcome::Ignored);
            }
        };
        let offset = u64_field(offset, "offset")?;
        let length = u64_field(length, "length")?;
        check_extent(offset, length, "offset", "length")?;
        Ok(Outcome::Record(TraceRecord::new(
            time_ns.unwrap_or(self.clock_ns),
            volume,
            offset,
            length,
            kind,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{first_error, reader};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::Fio;

    #[test]
    fn version2() {
        let text = "fio version 2 iolog\n\
                    /dev/sda add\n\
                    /dev/sdb add\n\
                    /dev/sda open\n\
                    /dev/sda read 4096 512\n\
                    /dev/sda wait 1000 0\n\
                    /dev/sdb write 0 8192\n\
                    /dev/sda sync 0 0\n\
                    /dev/sda wait 500 0\n\
                    /dev/sda trim 0 4096\n\
                    /dev/sda write 8192 4096\n\
                    /dev/sda close\n";
        let mut r = reader(F, text, false);
        let records: Vec<TraceRecord> = r.by_ref().map(Result::unwrap).collect();
        assert_eq!(
            records,
            vec![
                TraceRecord::new(0, 0, 4096, 512, IoKind::Read),
                TraceRecord::new(1_000_000, 1, 0, 8192, IoKind::Write),
                TraceRecord::new(1_500_000, 0, 8192, 4096, IoKind::Write),
            ]
        );
        // add, add, open, wait, sync, wait, trim, close
        assert_eq!(r.ignored_records(), 8);
    }

    #[test]
    fn version3() {
        let text = "fio version 3 iolog\n\
                    2 Nvme1n1 add\n\
                    872 Nvme1n1 open\n\
                    878 Nvme1n1 write 0 16384\n\
                    888 Nvme1n1 read 16384 4096\n\
                    890 Nvme1n1 wait 1000 0\n\
                    10001677 Nvme1n1 close\n";
        let mut r = reader(F, text, false);
        let records: Vec<TraceRecord> = r.by_ref().map(Result::unwrap).collect();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].time_ns, 878_000);
        assert_eq!(records[1].time_ns, 888_000);
        assert_eq!((records[1].kind, records[1].volume), (IoKind::Read, 0));
        assert_eq!(r.ignored_records(), 4);
    }

    #[test]
    fn volumes_in_order_of_first_appearance() {
        let text = "fio version 2 iolog\n/b add\n/a add\n/a read 0 1\n/b read 0 1\n/c write 0 1\n";
        let r = super::super::test_util::records(F, text);
        assert_eq!(r.iter().map(|r| r.volume).collect::<Vec<_>>(), [1, 0, 2]);
    }

    #[test]
    fn skip_bad() {
        let text =
            "fio version 3 iolog\n1 f add\n2 f read 0 512\n3 f read x 512\n4 f jump 0 1\n5 f write 0 512\n";
        let (r, skipped, ignored) = super::super::test_util::skipping(F, text);
        assert_eq!((r.len(), skipped, ignored), (2, 2, 1));
    }

    #[test]
    fn errors() {
        for (text, line, field) in [
            ("/dev/sda read 0 512\n", 1, "header"),
            ("fio version 4 iolog\n", 1, "header"),
            ("fio version 2 iolog\n/dev/sda read x 512\n", 2, "offset"),
            ("fio version 2 iolog\n/dev/sda read 0 0\n", 2, "length"),
            ("fio version 2 iolog\n/dev/sda read 0\n", 2, "length"),
            ("fio version 2 iolog\n/dev/sda munch 0 1\n", 2, "action"),
            ("fio version 2 iolog\n/dev/sda munch\n", 2, "action"),
            ("fio version 2 iolog\n/dev/sda wait x 0\n", 2, "offset"),
            ("fio version 2 iolog\n/dev/sda read 1 2 3\n", 2, "line"),
            ("fio version 3 iolog\nx /dev/sda read 0 1\n", 2, "timestamp"),
            ("fio version 3 iolog\n/dev/sda read 0 1\n", 2, "timestamp"),
            ("fio version 3 iolog\n5 /dev/sda\n", 2, "action"),
        ] {
            let (l, f, reason) = first_error(F, text);
            assert_eq!((l, f), (line, field), "{text}: {reason}");
        }
    }
}
