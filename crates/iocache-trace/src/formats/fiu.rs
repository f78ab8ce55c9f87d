//! FIU SRCMap / IODedup block traces (SNIA IOTTA), whitespace separated:
//! `ts pid process lba size op major minor md5`.
//!
//! Per the FIU trace README: `ts` is in nanoseconds, `lba` and `size` are in
//! 512-byte blocks, `op` is `R` or `W`, and the volume is the (major, minor)
//! device pair, interned; `pid` is the record's process. A process name may
//! contain spaces, so the fields after it are taken from the end of the
//! line. `md5` is not used and not validated.

use super::{read_write, Outcome, SECTOR_BYTES};
use crate::bytes::{check_extent, field_count, scale, split_ws, u32_field, u64_field};
use crate::error::FieldError;
use crate::intern::Interner;
use crate::TraceRecord;

const FIELDS: [&str; 9] = [
    "ts", "pid", "process", "lba", "size", "op", "major", "minor", "md5",
];

/// Most fields a line may have (a process name with many spaces).
const MAX_FIELDS: usize = 32;

#[derive(Debug, Default)]
pub(crate) struct Fiu {
    volumes: Interner,
}

impl Fiu {
    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let (f, n) = split_ws::<MAX_FIELDS>(line);
        if n < FIELDS.len() {
            return Err(field_count(&FIELDS, n, "whitespace-separated"));
        }
        if n > MAX_FIELDS {
            return Err(FieldError::new(
                "line",
                format!("expected 9 whitespace-separated fields, found {n}"),
            ));
        }
        let time_ns = u64_field(f[0], "ts")?;
        let process = u32_field(f[1], "pid")?;
        let offset = scale(u64_field(f[n - 6], "lba")?, SECTOR_BYTES, "lba")?;
        let length = scale(u64_field(f[n - 5], "size")?, SECTOR_BYTES, "size")?;
        check_extent(offset, length, "lba", "size")?;
        let kind = read_write(f[n - 4], "op")?;
        let major = u32_field(f[n - 3], "major")?;
        let minor = u32_field(f[n - 2], "minor")?;
        let volume = self.volumes.device(major, minor, "major")?;
        Ok(Outcome::Record(
            TraceRecord::new(time_ns, volume, offset, length, kind).by_process(process),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_first_errors, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::Fiu;

    #[test]
    fn valid() {
        let text = "89312454701617 4892 syslogd 904265560 8 W 6 0 531e779e4ec1ae9ad2fb3ebfa7f4dd1b\n\
                    89312454801617 4893 kworker/0:1 100 16 R 8 16 0123456789abcdef0123456789abcdef\n\
                    89312454901617 4894 Web Content 200 8 r 6 0 0123456789abcdef0123456789abcdef\n";
        let r = records(F, text);
        assert_eq!(
            r[0],
            TraceRecord::new(89312454701617, 0, 904265560 * 512, 4096, IoKind::Write).by_process(4892)
        );
        assert_eq!(
            (r[1].volume, r[1].kind, r[1].offset_bytes),
            (1, IoKind::Read, 51200)
        );
        assert_eq!((r[2].volume, r[2].offset_bytes), (0, 200 * 512));
    }

    #[test]
    fn errors() {
        let good = "1 2 p 3 8 W 6 0 md5\n";
        assert_first_errors(
            F,
            good,
            2,
            &[
                ("1 2 p 3 8 X 6 0 md5\n", "op"),
                ("1 2 p 3 0 W 6 0 md5\n", "size"),
                ("1 2 p x 8 W 6 0 md5\n", "lba"),
                ("t 2 p 3 8 W 6 0 md5\n", "ts"),
                ("1 -2 p 3 8 W 6 0 md5\n", "pid"),
                ("1 2 p 3 8 W 6 m md5\n", "minor"),
                ("1 2 p 3 8 W\n", "major"),
            ],
        );
    }

    #[test]
    fn skip_bad() {
        let (r, skipped, _) = skipping(F, "1 2 p 3 8 W 6 0 m\nfoo\n1 2 p 3 8 R 6 0 m\n");
        assert_eq!((r.len(), skipped), (2, 1));
    }
}
