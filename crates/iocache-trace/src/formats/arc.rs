//! ARC / UMass `lis` traces (Megiddo & Modha, FAST'03), whitespace
//! separated: `start_sector nsectors ignored request_no`.
//!
//! Sectors are 512 bytes and every request is a read. The traces carry no
//! timestamps, so `time_ns` is the record's index (0, 1, 2, ...), which keeps
//! time monotone. `ignored` and `request_no` are not used and not validated.
//! All records are volume 0.

use super::{Outcome, SECTOR_BYTES};
use crate::bytes::{check_extent, field_count, scale, split_ws, u64_field};
use crate::error::FieldError;
use crate::{IoKind, TraceRecord};

const FIELDS: [&str; 4] = ["start_sector", "nsectors", "ignored", "request_no"];

#[derive(Debug, Default)]
pub(crate) struct Arc {
    index: u64,
}

impl Arc {
    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let (f, n) = split_ws::<4>(line);
        if n != 4 {
            return Err(field_count(&FIELDS, n, "whitespace-separated"));
        }
        let offset = scale(u64_field(f[0], "start_sector")?, SECTOR_BYTES, "start_sector")?;
        let length = scale(u64_field(f[1], "nsectors")?, SECTOR_BYTES, "nsectors")?;
        check_extent(offset, length, "start_sector", "nsectors")?;
        let time_ns = self.index;
        self.index += 1;
        Ok(Outcome::Record(TraceRecord {
            time_ns,
            volume: 0,
            offset_bytes: offset,
            length_bytes: length,
            kind: IoKind::Read,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{first_error, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::Arc;

    #[test]
    fn valid() {
        let r = records(F, "3050771 25 0 0\n2461851 8 0 1\r\n\n3050771 8 0 2\n");
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[0],
            TraceRecord {
                time_ns: 0,
                volume: 0,
                offset_bytes: 3050771 * 512,
                length_bytes: 25 * 512,
                kind: IoKind::Read,
            }
        );
        assert_eq!(r.iter().map(|r| r.time_ns).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn errors() {
        for (bad, field) in [
            ("1 0 0 0\n", "nsectors"),
            ("x 8 0 0\n", "start_sector"),
            ("1 8 0\n", "request_no"),
            ("1 8 0 0 0\n", "line"),
        ] {
            let (line, f, reason) = first_error(F, &format!("1 8 0 0\n{bad}"));
            assert_eq!((line, f), (2, field), "{bad}: {reason}");
        }
    }

    #[test]
    fn skip_bad_keeps_time_dense() {
        let (r, skipped, _) = skipping(F, "1 8 0 0\nbad\n2 8 0 1\n");
        assert_eq!(skipped, 1);
        assert_eq!(r.iter().map(|r| r.time_ns).collect::<Vec<_>>(), [0, 1]);
    }
}
