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
        Ok(Outcome::Record(TraceRecord {
            time_ns,
            volume: 0,
            offset_bytes: offset,
            length_bytes: self.block_bytes,
            kind: IoKind::Read,
            process: 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{first_error, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    #[test]
    fn valid() {
        let r = records(TraceFormat::LBA, "# comment\n5\n  7 \r\n\n0\n");
        assert_eq!(
            r,
            vec![
                TraceRecord {
                    time_ns: 0,
                    volume: 0,
                    offset_bytes: 2560,
                    length_bytes: 512,
                    kind: IoKind::Read,
                    process: 0,
                },
                TraceRecord {
                    time_ns: 1,
                    volume: 0,
                    offset_bytes: 3584,
                    length_bytes: 512,
                    kind: IoKind::Read,
                    process: 0,
                },
                TraceRecord {
                    time_ns: 2,
                    volume: 0,
                    offset_bytes: 0,
                    length_bytes: 512,
                    kind: IoKind::Read,
                    process: 0,
                },
            ]
        );
        let r = records(TraceFormat::Lba { block_bytes: 4096 }, "3\n");
        assert_eq!((r[0].offset_bytes, r[0].length_bytes), (12288, 4096));
    }

    #[test]
    fn errors() {
        for (bad, field) in [
            ("x\n", "lba"),
            ("1 2\n", "line"),
            ("18446744073709551615\n", "lba"),
        ] {
            let (line, f, reason) = first_error(TraceFormat::LBA, &format!("# c\n1\n{bad}"));
            assert_eq!((line, f), (3, field), "{bad}: {reason}");
        }
    }

    #[test]
    fn skip_bad() {
        let (r, skipped, _) = skipping(TraceFormat::LBA, "1\n-1\n2\n");
        assert_eq!((r.len(), skipped), (2, 1));
    }
}
