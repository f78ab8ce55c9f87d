//! MSR Cambridge block traces (SNIA IOTTA), CSV without a header:
//! `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`.
//!
//! `Timestamp` is a Windows FILETIME (100 ns ticks since 1601-01-01); it is
//! converted to nanoseconds since the Unix epoch. Values below the Unix epoch
//! (relative tick counts, as some derived traces use) are kept as `ticks × 100`.
//! `Type` is `Read`/`Write` (any case); `Offset` and `Size` are bytes. The
//! volume is (Hostname, DiskNumber), interned. `ResponseTime` is not used and
//! not validated. A header line starting with `Timestamp` is skipped.

use super::{read_write, Outcome};
use crate::bytes::{check_extent, csv_fields, u64_field};
use crate::error::FieldError;
use crate::intern::Interner;
use crate::TraceRecord;

pub(crate) const FIELDS: [&str; 7] = [
    "Timestamp",
    "Hostname",
    "DiskNumber",
    "Type",
    "Offset",
    "Size",
    "ResponseTime",
];

/// FILETIME ticks from 1601-01-01 to 1970-01-01.
const FILETIME_UNIX_EPOCH_TICKS: u64 = 116_444_736_000_000_000;

#[derive(Debug, Default)]
pub(crate) struct Msr {
    volumes: Interner,
}

impl Msr {
    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let Some(f) = csv_fields(line, b"timestamp", &FIELDS)? else {
            return Ok(Outcome::Skip);
        };
        let ticks = u64_field(f[0], "Timestamp")?;
        let kind = read_write(f[3], "Type")?;
        let offset = u64_field(f[4], "Offset")?;
        let length = u64_field(f[5], "Size")?;
        check_extent(offset, length, "Offset", "Size")?;
        if f[1].is_empty() {
            return Err(FieldError::new("Hostname", "empty host name"));
        }
        let disk = u64_field(f[2], "DiskNumber")?;
        let key = self.volumes.start();
        key.extend_from_slice(f[1]);
        key.push(0);
        key.extend_from_slice(&disk.to_le_bytes());
        let volume = self.volumes.finish("Hostname")?;
        let unix_ticks = ticks.checked_sub(FILETIME_UNIX_EPOCH_TICKS).unwrap_or(ticks);
        let time_ns = unix_ticks.checked_mul(100).ok_or_else(|| {
            FieldError::new("Timestamp", format!("{ticks} ticks overflow 64-bit nanoseconds"))
        })?;
        Ok(Outcome::Record(TraceRecord::new(
            time_ns, volume, offset, length, kind,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{first_error, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::Msr;

    #[test]
    fn valid() {
        let text = "128166385295514663,hm,0,Write,9056014336,2048,2833\r\n\
                    128166385295514878,hm,1,read,4096,512,2617\n\
                    \n\
                    128166385295515175,web,0,Read,0,4096,2320\n\
                    128166385295515175,hm,0,WRITE,8192,4096,2320\n";
        let r = records(F, text);
        assert_eq!(r.len(), 4);
        assert_eq!(
            r[0],
            TraceRecord::new(
                (128166385295514663 - 116444736000000000) * 100,
                0,
                9056014336,
                2048,
                IoKind::Write
            )
        );
        assert_eq!((r[1].volume, r[1].kind), (1, IoKind::Read));
        assert_eq!((r[2].volume, r[2].offset_bytes), (2, 0));
        assert_eq!((r[3].volume, r[3].kind), (0, IoKind::Write));
    }

    #[test]
    fn relative_ticks_and_header() {
        let r = records(
            F,
            "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n5,h,0,Read,0,1,0\n",
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].time_ns, 500);
    }

    #[test]
    fn errors() {
        let good = "128166385295514663,hm,0,Write,9056014336,2048,2833\n";
        let cases = [
            ("1,hm,0,Write,abc,2048,1\n", "Offset"),
            ("1,hm,0,Delete,0,2048,1\n", "Type"),
            ("1,hm,0,Write,0,0,1\n", "Size"),
            ("1,hm,0,Write,0\n", "Size"),
            ("1,hm,0,Write,0,1,1,1\n", "line"),
            ("x,hm,0,Write,0,1,1\n", "Timestamp"),
            ("1,hm,x,Write,0,1,1\n", "DiskNumber"),
            ("1,,0,Write,0,1,1\n", "Hostname"),
            ("1,hm,0,Write,18446744073709551615,2,1\n", "Offset"),
        ];
        for (bad, field) in cases {
            let text = format!("{good}\n{bad}{good}");
            let (line, f, reason) = first_error(F, &text);
            assert_eq!((line, f), (3, field), "{bad}: {reason}");
        }
        let (_, _, reason) = first_error(F, "1,hm,0,Write,abc,2048,1\n");
        assert_eq!(reason, "expected an unsigned integer, found `abc`");
    }

    #[test]
    fn skip_bad() {
        let text = "1,hm,0,Write,0,512,1\nbad\n2,hm,0,Read,0,512,1\n1,hm,0,Write,x,1,1\n";
        let (r, skipped, ignored) = skipping(F, text);
        assert_eq!((r.len(), skipped, ignored), (2, 2, 0));
    }
}
