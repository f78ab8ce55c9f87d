//! Tencent Cloud Block Storage traces (SNIA IOTTA), CSV without a header:
//! `timestamp_s,offset_sectors,size_sectors,io_type,volume_id`.
//!
//! `timestamp_s` is seconds since the Unix epoch (a fraction is accepted
//! too); offsets and sizes are 512-byte sectors; `io_type` is 0 = read,
//! 1 = write; `volume_id` is the volume.

use super::{zero_one, Outcome, NS_PER_S, SECTOR_BYTES};
use crate::bytes::{check_extent, field_count, fixed_field, scale, split_sep, u32_field, u64_field};
use crate::error::FieldError;
use crate::{IoKind, TraceRecord};

const FIELDS: [&str; 5] = [
    "timestamp_s",
    "offset_sectors",
    "size_sectors",
    "io_type",
    "volume_id",
];

#[derive(Debug)]
pub(crate) struct Tencent;

impl Tencent {
    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let (f, n) = split_sep::<5>(line, b',');
        if n != 5 {
            return Err(field_count(&FIELDS, n, "comma-separated"));
        }
        if f[0].eq_ignore_ascii_case(b"timestamp") || f[0].eq_ignore_ascii_case(b"timestamp_s") {
            return Ok(Outcome::Skip);
        }
        let time_ns = match crate::bytes::parse_u64(f[0]) {
            Some(s) => s.checked_mul(NS_PER_S).ok_or_else(|| {
                FieldError::new("timestamp_s", format!("{s} s overflows 64-bit nanoseconds"))
            })?,
            None => fixed_field(f[0], 9, "timestamp_s", "seconds")?,
        };
        let offset = scale(u64_field(f[1], "offset_sectors")?, SECTOR_BYTES, "offset_sectors")?;
        let length = scale(u64_field(f[2], "size_sectors")?, SECTOR_BYTES, "size_sectors")?;
        check_extent(offset, length, "offset_sectors", "size_sectors")?;
        let kind = zero_one(f[3], "io_type", IoKind::Write)?;
        let volume = u32_field(f[4], "volume_id")?;
        Ok(Outcome::Record(TraceRecord::new(
            time_ns, volume, offset, length, kind,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_first_errors, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::Tencent;

    #[test]
    fn valid() {
        let r = records(F, "1538323200,4247200,128,1,1058\n1538323199,13896880,8,0,1063\n");
        assert_eq!(
            r,
            vec![
                TraceRecord::new(
                    1_538_323_200_000_000_000,
                    1058,
                    4247200 * 512,
                    128 * 512,
                    IoKind::Write
                ),
                TraceRecord::new(
                    1_538_323_199_000_000_000,
                    1063,
                    13896880 * 512,
                    8 * 512,
                    IoKind::Read
                ),
            ]
        );
        let r = records(F, "1.5,0,1,0,0\n");
        assert_eq!(r[0].time_ns, 1_500_000_000);
    }

    #[test]
    fn errors() {
        assert_first_errors(
            F,
            "1,0,8,1,5\n",
            2,
            &[
                ("1,0,8,2,5\n", "io_type"),
                ("1,0,0,1,5\n", "size_sectors"),
                ("1,zz,8,1,5\n", "offset_sectors"),
                ("1,36028797018963968,8,1,5\n", "offset_sectors"),
                ("1,0,8,1,-5\n", "volume_id"),
                ("1,0,8,1\n", "volume_id"),
                ("1,0,8,1,5,6\n", "line"),
                ("99999999999999999999,0,8,1,5\n", "timestamp_s"),
            ],
        );
    }

    #[test]
    fn skip_bad() {
        let (r, skipped, _) = skipping(F, "1,0,8,1,5\n1,0,8,7,5\n\n1,0,8,0,5\n");
        assert_eq!((r.len(), skipped), (2, 1));
    }
}
