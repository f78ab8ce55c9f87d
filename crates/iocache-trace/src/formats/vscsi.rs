//! CloudPhysics VMware vscsi traces as CSV (libCacheSim's
//! `cloudPhysicsIO.csv`): header `version,time,op,size,lbn`.
//!
//! `time` is whole seconds: libCacheSim converts the original vscsi
//! microsecond timestamps to seconds (`ts / 1000000` in its vscsi reader) and
//! its FAQ states the time unit of `cloudPhysicsIO.csv` is seconds; a fraction
//! is accepted. `op` is the SCSI opcode in hex, with or without `0x`: READ(6/10/12/16) =
//! 08/28/a8/88 are reads, WRITE(6/10/12/16) = 0a/2a/aa/8a and WRITE AND
//! VERIFY(10/12/16) = 2e/ae/8e are writes; any other opcode is a well-formed
//! non-data command and is counted as ignored. `size` is bytes, `lbn` is
//! 512-byte sectors. `version` is not used. All records are volume 0.

use super::{Outcome, SECTOR_BYTES};
use crate::bytes::{check_extent, csv_fields, fixed_field, parse_hex_u32, scale, show, u64_field};
use crate::error::FieldError;
use crate::{IoKind, TraceRecord};

const FIELDS: [&str; 5] = ["version", "time", "op", "size", "lbn"];

/// Classifies a SCSI opcode: `Some(kind)` for data reads and writes.
pub(crate) fn scsi_kind(op: u32) -> Option<IoKind> {
    match op {
        0x08 | 0x28 | 0xa8 | 0x88 => Some(IoKind::Read),
        0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e => Some(IoKind::Write),
        _ => None,
    }
}

#[derive(Debug)]
pub(crate) struct Vscsi;

impl Vscsi {
    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let Some(f) = csv_fields(line, b"version", &FIELDS)? else {
            return Ok(Outcome::Skip);
        };
        let op = parse_hex_u32(f[2]).ok_or_else(|| {
            FieldError::new(
                "op",
                format!("expected a hexadecimal SCSI opcode, found `{}`", show(f[2])),
            )
        })?;
        let Some(kind) = scsi_kind(op) else {
            return Ok(Outcome::Ignored);
        };
        let time_ns = fixed_field(f[1], 9, "time", "seconds")?;
        let length = u64_field(f[3], "size")?;
        let offset = scale(u64_field(f[4], "lbn")?, SECTOR_BYTES, "lbn")?;
        check_extent(offset, length, "lbn", "size")?;
        Ok(Outcome::Record(TraceRecord::new(
            time_ns, 0, offset, length, kind,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_first_errors, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::VscsiCsv;

    #[test]
    fn valid() {
        let text = "version,time,op,size,lbn\n\
                    1,5633898,2a,512,42932745\n\
                    1,5633899,0x28,6656,40409911\n\
                    1,5633899,12,36,0\n\
                    1,5633900,88,4096,8\n";
        let mut reader = super::super::test_util::reader(F, text, false);
        let r: Vec<_> = reader.by_ref().map(Result::unwrap).collect();
        assert_eq!(reader.ignored_records(), 1);
        assert_eq!(
            r[0],
            TraceRecord::new(5_633_898_000_000_000, 0, 42932745 * 512, 512, IoKind::Write)
        );
        assert_eq!((r[1].kind, r[1].length_bytes), (IoKind::Read, 6656));
        assert_eq!((r[2].kind, r[2].offset_bytes), (IoKind::Read, 4096));
        assert_eq!(r.len(), 3);
        assert_eq!(records(F, "1,1,2E,512,1\n")[0].kind, IoKind::Write);
    }

    #[test]
    fn errors() {
        let head = "version,time,op,size,lbn\n1,1,28,512,1\n";
        assert_first_errors(
            F,
            head,
            3,
            &[
                ("1,1,zz,512,1\n", "op"),
                ("1,1,28,0,1\n", "size"),
                ("1,1,28,512,x\n", "lbn"),
                ("1,x,28,512,1\n", "time"),
                ("1,1,28,512\n", "lbn"),
            ],
        );
    }

    #[test]
    fn skip_bad() {
        let (r, skipped, ignored) = skipping(F, "1,1,28,512,1\n1,1,q,1,1\n1,1,35,0,0\n");
        assert_eq!((r.len(), skipped, ignored), (1, 1, 1));
    }
}
