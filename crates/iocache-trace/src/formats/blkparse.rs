//! blkparse's default text output (blktrace), e.g.
//! `  8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kjournald]`:
//! `device cpu sequence time pid action rwbs sector + nsectors [process]`.
//!
//! Only lines whose action equals the configured one (default `Q`, queued)
//! become records; lines with other actions (`G`, `I`, `D`, `C`, `M`, `m`,
//! `UT`, ...) are ignored records. Within the chosen action, the RWBS field
//! decides: containing `D` (discard) → ignored; else `R` → read, `W` → write;
//! else (`N`, flush-only `F...`) → ignored. A flush without a sector range
//! (`Q FWS [proc]`) or with zero sectors is ignored too. `time` is seconds
//! with nanoseconds since the start of the trace; `sector` and `nsectors` are
//! 512-byte sectors; the volume is the (major, minor) device, interned;
//! `pid` is the record's process.
//!
//! The summary blkparse prints at the end (`CPU0 (8,0):`, `Total (8,0):`,
//! ` Reads Queued: ...`, `Throughput (R/W): ...`, `Events (8,0): ...`,
//! `Skips: ...`) is recognised and skipped.

use super::{Outcome, SECTOR_BYTES};
use crate::bytes::{check_extent, fixed_field, parse_u32, scale, show, split_ws, u32_field, u64_field};
use crate::error::FieldError;
use crate::intern::Interner;
use crate::{IoKind, TraceRecord};

#[derive(Debug)]
pub(crate) struct Blkparse {
    action: u8,
    in_summary: bool,
    volumes: Interner,
}

/// Parses `major,minor`.
pub(crate) fn device(s: &[u8]) -> Option<(u32, u32)> {
    let comma = s.iter().position(|&b| b == b',')?;
    Some((parse_u32(&s[..comma])?, parse_u32(&s[comma + 1..])?))
}

/// Whether a line (not starting with a device) opens blkparse's summary.
pub(crate) fn starts_summary(line: &[u8]) -> bool {
    let t = crate::bytes::trim(line);
    let cpu = t.starts_with(b"CPU") && t.get(3).is_some_and(u8::is_ascii_digit);
    cpu || t.starts_with(b"Total (")
}

/// Whether a line is one of the summary lines that can stand on its own.
pub(crate) fn is_summary_line(line: &[u8]) -> bool {
    let t = crate::bytes::trim(line);
    starts_summary(t)
        || t.starts_with(b"Throughput")
        || t.starts_with(b"Events (")
        || t.starts_with(b"Skips:")
}

impl Blkparse {
    pub(crate) fn new(action: u8) -> Self {
        Blkparse {
            action,
            in_summary: false,
            volumes: Interner::default(),
        }
    }

    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        if self.in_summary {
            return Ok(Outcome::Skip);
        }
        let (f, n) = split_ws::<11>(line);
        let Some((major, minor)) = device(f[0]) else {
            if starts_summary(line) {
                self.in_summary = true;
                return Ok(Outcome::Skip);
            }
            if is_summary_line(line) {
                return Ok(Outcome::Skip);
            }
            return Err(FieldError::new(
                "device",
                format!("expected `major,minor`, found `{}`", show(f[0])),
            ));
        };
        if n < 6 {
            const NAMES: [&str; 6] = ["device", "cpu", "sequence", "time", "pid", "action"];
            return Err(FieldError::new(
                NAMES[n],
                format!("missing: expected at least 6 whitespace-separated fields, found {n}"),
            ));
        }
        if f[5] != [self.action] {
            return Ok(Outcome::Ignored);
        }
        if n < 7 {
            return Err(FieldError::new("rwbs", "missing RWBS field"));
        }
        let rwbs = f[6];
        let is_flush = rwbs.contains(&b'F');
        let kind = if rwbs.contains(&b'D') {
            return Ok(Outcome::Ignored);
        } else if rwbs.contains(&b'R') {
            IoKind::Read
        } else if rwbs.contains(&b'W') {
            IoKind::Write
        } else {
            return Ok(Outcome::Ignored);
        };
        if n < 10 || f[8] != b"+" {
            if is_flush {
                return Ok(Outcome::Ignored);
            }
            return Err(FieldError::new(
                "sector",
                format!("expected `sector + nsectors` after RWBS `{}`", show(rwbs)),
            ));
        }
        let time_ns = fixed_field(f[3], 9, "time", "seconds")?;
        let process = u32_field(f[4], "pid")?;
        let offset = scale(u64_field(f[7], "sector")?, SECTOR_BYTES, "sector")?;
        let sectors = u64_field(f[9], "nsectors")?;
        if sectors == 0 && is_flush {
            return Ok(Outcome::Ignored);
        }
        let length = scale(sectors, SECTOR_BYTES, "nsectors")?;
        check_extent(offset, length, "sector", "nsectors")?;
        let volume = self.volumes.device(major, minor, "device")?;
        Ok(Outcome::Record(
            TraceRecord::new(time_ns, volume, offset, length, kind).by_process(process),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_first_errors, reader, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const SAMPLE: &str = "\
  8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kjournald]
  8,0    3        2     0.000001000   697  G  WS 3417048 + 8 [kjournald]
  8,0    3        3     0.000002000   697  P   N [kjournald]
  8,0    3        4     0.000003000   697  I  WS 3417048 + 8 [kjournald]
  8,0    3        5     0.000004000   697  UT  N [kjournald] 1
  8,0    3        6     0.000005000   697  D  WS 3417048 + 8 [kjournald]
  8,0    0        0     0.000006000     0  m   N cfq697 alloced
  8,16   1        1     1.500000001  1234  Q   R 100 + 16 [dd]
  8,16   1        2     1.600000000  1234  Q  RA 200 + 8 [dd]
  8,0    1        3     1.700000000   321  Q FWS [jbd2/sda1-8]
  8,0    1        4     1.800000000   321  Q  DS 5000 + 2048 [fstrim]
  8,0    1        5     1.900000000     0  C  WS 3417048 + 8 [0]
  8,0    1        6     2.000000000   321  Q  FN [sync]
  8,0    1        7     2.100000000   321  A  WS 900 + 8 <- (8,1) 836

CPU0 (8,0):
 Reads Queued:           0,        0KiB\t Writes Queued:           1,        4KiB
 Read Dispatches:        0,        0KiB\t Write Dispatches:        1,        4KiB
Total (8,0):
 Reads Queued:           0,        0KiB\t Writes Queued:           1,        4KiB

Throughput (R/W): 0KiB/s / 4KiB/s
Events (8,0): 14 entries
Skips: 0 forward (0 -   0.0%)
";

    #[test]
    fn queued_records() {
        let mut r = reader(TraceFormat::BLKPARSE, SAMPLE, false);
        let records: Vec<TraceRecord> = r.by_ref().map(Result::unwrap).collect();
        assert_eq!(
            records,
            vec![
                TraceRecord::new(0, 0, 3417048 * 512, 4096, IoKind::Write).by_process(697),
                TraceRecord::new(1_500_000_001, 1, 100 * 512, 16 * 512, IoKind::Read).by_process(1234),
                TraceRecord::new(1_600_000_000, 1, 200 * 512, 8 * 512, IoKind::Read).by_process(1234),
            ]
        );
        // 14 event lines: 3 records + 11 ignored (other actions, flush,
        // discard, N); summary lines are not counted.
        assert_eq!(r.ignored_records(), 11);
        assert_eq!(r.skipped_lines(), 0);
    }

    #[test]
    fn other_action() {
        let mut r = reader(TraceFormat::Blkparse { action: b'D' }, SAMPLE, false);
        let records: Vec<TraceRecord> = r.by_ref().map(Result::unwrap).collect();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].time_ns, 5_000);
        let mut r = reader(TraceFormat::Blkparse { action: b'C' }, SAMPLE, false);
        assert_eq!(r.by_ref().map(Result::unwrap).count(), 1);
    }

    #[test]
    fn errors() {
        let good = "  8,0 3 1 0.000000000 697 Q WS 3417048 + 8 [kjournald]\n";
        assert_first_errors(
            TraceFormat::BLKPARSE,
            good,
            2,
            &[
                ("8;0 3 1 0.0 697 Q WS 1 + 8 [x]\n", "device"),
                ("garbage\n", "device"),
                ("8,0 3 1 0.0 697 Q WS x + 8 [x]\n", "sector"),
                ("8,0 3 1 0.0 697 Q WS 1 + y [x]\n", "nsectors"),
                ("8,0 3 1 0.0 697 Q WS 1 + 0 [x]\n", "nsectors"),
                ("8,0 3 1 zero 697 Q WS 1 + 8 [x]\n", "time"),
                ("8,0 3 1 0.0 697 Q WS [x]\n", "sector"),
                ("8,0 3 1 0.0\n", "pid"),
                ("8,0 3 1 0.0 p697 Q WS 1 + 8 [x]\n", "pid"),
                ("8,0 3 1 0.0 697 Q\n", "rwbs"),
            ],
        );
    }

    #[test]
    fn skip_bad() {
        let text =
            "8,0 3 1 0.0 697 Q W 1 + 8 [x]\n8,0 3 1 0.0 697 Q W 1 + z [x]\n8,0 3 1 0.0 697 C W 1 + 8 [x]\n";
        let (r, skipped, ignored) = skipping(TraceFormat::BLKPARSE, text);
        assert_eq!((r.len(), skipped, ignored), (1, 1, 1));
    }
}
