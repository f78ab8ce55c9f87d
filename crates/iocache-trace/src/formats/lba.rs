//! Plain LBA lists: one logical block address per line, each a read of one
//! block of `block_bytes` (512 by default) at `lba × block_bytes`.
//!
//! Lines starting with `#` are comments. There are no timestamps, so
//! `time_ns` is the record's index (0, 1, 2, ...). All records are volume 0.

use super::Outcome;
use crate::bytes::{check_extent, field_count, scale, split_ws, u64_field};
use crate::error::FieldError;
use crate::{IoKind, TraceRecord};

#[derive(Debug)]
pub(crate) struct Lba {
    block_bytes: u64,
    index: u64,
}

impl Lba {
    pub(crate) fn new(block_bytes: u64) -> Self {
        Lba {
            block_bytes,
            index: 0,
        }
    }

    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let trimmed = crate::bytes::trim(line);
        if trimmed.first() == Some(&b'#') {
            return Ok(Outcome::Skip);
        }
        let (f, n) = split_ws::<1>(trimmed);
        if n != 1 {
            return Err(field_count(&["lba"], n, "whitespace-separated"));
        }
        let offset = scale(u64_field(f[0], "lba")?, self.block_bytes, "lba")?;
        check_extent(offset, self.block_bytes, "lba", "lba")?;
        let time_ns = self.index;
        self.index += 1;
        Ok(Outcome::Record(TraceRecord::new(
            time_ns,
            0,
            offset,
            self.block_bytes,
            IoKind::Read,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_first_errors, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    #[test]
    fn valid() {
        let r = records(TraceFormat::LBA, "# comment\n5\n  7 \r\n\n0\n");
        assert_eq!(
            r,
            vec![
                TraceRecord::new(0, 0, 2560, 512, IoKind::Read),
                TraceRecord::new(1, 0, 3584, 512, IoKind::Read),
                TraceRecord::new(2, 0, 0, 512, IoKind::Read),
            ]
        );
        let r = records(TraceFormat::Lba { block_bytes: 4096 }, "3\n");
        assert_eq!((r[0].offset_bytes, r[0].length_bytes), (12288, 4096));
    }

    #[test]
    fn errors() {
        assert_first_errors(
            TraceFormat::LBA,
            "# c\n1\n",
            3,
            &[
                ("x\n", "lba"),
                ("1 2\n", "line"),
                ("18446744073709551615\n", "lba"),
            ],
        );
    }

    #[test]
    fn skip_bad() {
        let (r, skipped, _) = skipping(TraceFormat::LBA, "1\n-1\n2\n");
        assert_eq!((r.len(), skipped), (2, 1));
    }
}
