//! SNIA SYSTOR'17 traces: CSV `Timestamp,Response,IOType,LUN,Offset,Size`
//! with a header line.
//!
//! `Timestamp` is seconds since the Unix epoch with a fraction; it is parsed
//! as a decimal straight to nanoseconds (no floating point). `IOType` is
//! `R`/`W`, `LUN` is the volume, `Offset` and `Size` are bytes. `Response`
//! (seconds) is not used and not validated (the published traces leave it
//! empty on some lines). Header lines are recognised by their first field
//! (`Timestamp`) wherever they appear, so concatenated files work.

use super::{read_write, Outcome};
use crate::bytes::{check_extent, csv_fields, fixed_field, u32_field, u64_field};
use crate::error::FieldError;
use crate::TraceRecord;

const FIELDS: [&str; 6] = ["Timestamp", "Response", "IOType", "LUN", "Offset", "Size"];

#[derive(Debug)]
pub(crate) struct Systor;

impl Systor {
    #[inline]
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let Some(f) = csv_fields(line, b"timestamp", &FIELDS)? else {
            return Ok(Outcome::Skip);
        };
        let time_ns = fixed_field(f[0], 9, "Timestamp", "seconds")?;
        let kind = read_write(f[2], "IOType")?;
        let volume = u32_field(f[3], "LUN")?;
        let offset = u64_field(f[4], "Offset")?;
        let length = u64_field(f[5], "Size")?;
        check_extent(offset, length, "Offset", "Size")?;
        Ok(Outcome::Record(TraceRecord::new(
            time_ns, volume, offset, length, kind,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_first_errors, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::Systor;

    #[test]
    fn valid() {
        let text = "Timestamp,Response,IOType,LUN,Offset,Size\n\
                    1456095145.133076000,0.000806000,R,0,899056122368,131072\n\
                    1456095145.126285,,W,3,4256049987072,122880\r\n\
                    7,0.1,w,1,0,512\n";
        let r = records(F, text);
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[0],
            TraceRecord::new(1_456_095_145_133_076_000, 0, 899056122368, 131072, IoKind::Read)
        );
        assert_eq!(r[1].time_ns, 1_456_095_145_126_285_000);
        assert_eq!((r[1].volume, r[1].kind), (3, IoKind::Write));
        assert_eq!(r[2].time_ns, 7_000_000_000);
    }

    #[test]
    fn errors() {
        let head = "Timestamp,Response,IOType,LUN,Offset,Size\n1.0,0.1,R,0,0,512\n";
        assert_first_errors(
            F,
            head,
            3,
            &[
                ("1.0,0.1,X,0,0,512\n", "IOType"),
                ("1.0,0.1,R,0,0,0\n", "Size"),
                ("1.0,0.1,R,x,0,512\n", "LUN"),
                ("1.0,0.1,R,99999999999,0,512\n", "LUN"),
                ("1.0.0,0.1,R,0,0,512\n", "Timestamp"),
                ("-1.0,0.1,R,0,0,512\n", "Timestamp"),
                ("1.0,0.1,R,0,-5,512\n", "Offset"),
                ("1.0,0.1,R,0\n", "Offset"),
            ],
        );
    }

    #[test]
    fn skip_bad() {
        let text = "Timestamp,Response,IOType,LUN,Offset,Size\n1,0,R,0,0,512\n1,0,Q,0,0,512\n";
        let (r, skipped, ignored) = skipping(F, text);
        assert_eq!((r.len(), skipped, ignored), (1, 1, 0));
    }
}
