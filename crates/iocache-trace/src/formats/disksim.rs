//! DiskSim ASCII traces as used by MQSim, whitespace separated:
//! `arrival_time device lba_sectors size_sectors type`.
//!
//! MQSim's traces give `arrival_time` as an integer number of nanoseconds
//! (its workload XML sets `Time_Unit` to nanoseconds), and integers are read
//! that way. DiskSim's own ASCII format prints the arrival time as a decimal
//! number of milliseconds (e.g. `13.191135`), so a value with a decimal point
//! is read as milliseconds and converted exactly (fraction digits past the
//! nanosecond are truncated). `device` is the volume; `lba_sectors` and
//! `size_sectors` are 512-byte sectors; `type` is 1 = read, 0 = write.

use super::{zero_one, Outcome, SECTOR_BYTES};
use crate::bytes::{
    check_extent, field_count, fixed_field, parse_u64, scale, split_ws, u32_field, u64_field,
};
use crate::error::FieldError;
use crate::{IoKind, TraceRecord};

const FIELDS: [&str; 5] = ["arrival_time", "device", "lba_sectors", "size_sectors", "type"];

#[derive(Debug)]
pub(crate) struct Disksim;

impl Disksim {
    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let (f, n) = split_ws::<5>(line);
        if n != 5 {
            return Err(field_count(&FIELDS, n, "whitespace-separated"));
        }
        let time_ns = match parse_u64(f[0]) {
            Some(ns) => ns,
            None => fixed_field(
                f[0],
                6,
                "arrival_time",
                "nanoseconds (integer) or milliseconds (decimal)",
            )?,
        };
        let volume = u32_field(f[1], "device")?;
        let offset = scale(u64_field(f[2], "lba_sectors")?, SECTOR_BYTES, "lba_sectors")?;
        let length = scale(u64_field(f[3], "size_sectors")?, SECTOR_BYTES, "size_sectors")?;
        check_extent(offset, length, "lba_sectors", "size_sectors")?;
        let kind = zero_one(f[4], "type", IoKind::Read)?;
        Ok(Outcome::Record(TraceRecord::new(
            time_ns, volume, offset, length, kind,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_first_errors, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::Disksim;

    #[test]
    fn valid() {
        let r = records(
            F,
            "938513000 4 264719034 16 0\n11413000\t0 657728 64 1\n13.191135 30 0 5 1\n",
        );
        assert_eq!(
            r[0],
            TraceRecord::new(938513000, 4, 264719034 * 512, 16 * 512, IoKind::Write)
        );
        assert_eq!((r[1].kind, r[1].volume), (IoKind::Read, 0));
        assert_eq!(r[2].time_ns, 13_191_135);
    }

    #[test]
    fn errors() {
        assert_first_errors(
            F,
            "1 0 0 8 1\n\n",
            3,
            &[
                ("1 0 0 8 2\n", "type"),
                ("1 0 0 0 1\n", "size_sectors"),
                ("1 x 0 8 1\n", "device"),
                ("1.2.3 0 0 8 1\n", "arrival_time"),
                ("1 0 0 8\n", "type"),
                ("1 0 0 8 1 9\n", "line"),
            ],
        );
    }

    #[test]
    fn skip_bad() {
        let (r, skipped, _) = skipping(F, "1 0 0 8 1\n1 0 0 8 5\n1 0 0 8 0\n");
        assert_eq!((r.len(), skipped), (2, 1));
    }
}
