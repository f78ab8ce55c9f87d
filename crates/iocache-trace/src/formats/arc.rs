//! ARC / UMass `lis` traces (Megiddo & Modha, FAST'03), whitespace
//! separated: `start_sector nsectors ignored request_no`.
//!
//! Sectors are 512 bytes and every request is a read. The traces carry no
//! timestamps, so `time_ns` is the record's index (0, 1, 2, ...), which keeps
//! time monotone. `ignored` and `request_no` are not used and not validated.
//! All records are volume 0.

use super::{Outcome, SECTOR_BYTES};
use crate::bytes::{check_extent, field_count, scale, split_ws, u64_field};
use crate::digits;
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
        match well_formed(line) {
            Some((start_sector, sectors)) => {
                Ok(self.record(start_sector * SECTOR_BYTES, sectors * SECTOR_BYTES))
            }
            None => self.parse_checked(line),
        }
    }

    /// The line at the start of `buf` when it is plain (digits, spaces and
    /// tabs, ended by `\n`) and well formed: its length with the `\n`,
    /// and its record. One pass finds the line's end and parses it; any
    /// other line (a `\r`, a bad field, no `\n` in `buf`) is left to
    /// [`Arc::parse`], which parses a plain well-formed line the same way.
    #[inline]
    pub(crate) fn parse_leading_line(&mut self, buf: &[u8]) -> Option<(usize, Outcome)> {
        let (start_sector, sectors, used) = plain_line(buf)?;
        Some((
            used,
            self.record(start_sector * SECTOR_BYTES, sectors * SECTOR_BYTES),
        ))
    }

    fn record(&mut self, offset: u64, length: u64) -> Outcome {
        let time_ns = self.index;
        self.index += 1;
        Outcome::Record(TraceRecord::new(time_ns, 0, offset, length, IoKind::Read))
    }

    /// The general parse: every check, and the error that names the field.
    #[cold]
    fn parse_checked(&mut self, line: &[u8]) -> Result<Outcome, FieldError> {
        let (f, n) = split_ws::<4>(line);
        if n != 4 {
            return Err(field_count(&FIELDS, n, "whitespace-separated"));
        }
        let offset = scale(u64_field(f[0], "start_sector")?, SECTOR_BYTES, "start_sector")?;
        let length = scale(u64_field(f[1], "nsectors")?, SECTOR_BYTES, "nsectors")?;
        check_extent(offset, length, "start_sector", "nsectors")?;
        Ok(self.record(offset, length))
    }
}

/// Digits a field may have for the fast path: with at most 15, a sector
/// number times 512 and the sum of two such byte counts fit in a u64.
const FAST_DIGITS_MAX: u32 = 15;

/// One pass over a line of exactly four whitespace-separated fields whose
/// first two are short decimal numbers with a non-zero second: returns
/// them (start sector, sector count), or `None` for anything else, which
/// [`Arc::parse_checked`] then parses or reports. Like it, the last two
/// fields are not validated.
#[inline]
fn well_formed(line: &[u8]) -> Option<(u64, u64)> {
    let mut rest = line;
    let start_sector = leading_number(&mut rest)?;
    let sectors = leading_number(&mut rest)?;
    let mut more_fields = 0;
    let mut in_field = false;
    for &b in rest {
        let separator = is_separator(b);
        more_fields += usize::from(!separator && !in_field);
        in_field = !separator;
    }
    (more_fields == 2 && sectors != 0).then_some((start_sector, sectors))
}

/// [`well_formed`] over the line at the start of `buf`, for lines of
/// digits, spaces and tabs ended by `\n` only: (start sector, sector
/// count, bytes up to and including the `\n`), or `None` for anything
/// else, including a line that `well_formed` accepts but that has other
/// bytes (a `\r` before its `\n`, say) or no `\n` within `buf`.
#[inline]
fn plain_line(buf: &[u8]) -> Option<(u64, u64, usize)> {
    word_line(buf).or_else(|| byte_line(buf))
}

/// [`plain_line`] eight bytes at a time, for the usual line: four fields
/// of 1 to 7 digits, each followed by one space, the last by `\n`, with
/// at least 8 bytes of `buf` from each field's start (a field is read as
/// one 8-byte word, which also holds the byte after its digits). Declines
/// anything else (tabs, runs of separators, `\r`, longer fields), which
/// [`byte_line`] then takes or declines. Takes no line that `byte_line`
/// declines, with the same record and length (unit and property tests).
#[inline(always)]
fn word_line(buf: &[u8]) -> Option<(u64, u64, usize)> {
    let mut at = 0;
    let (start_word, start_digits) = word_field(buf, &mut at, b' ')?;
    let (sectors_word, sectors_digits) = word_field(buf, &mut at, b' ')?;
    word_field(buf, &mut at, b' ')?;
    word_field(buf, &mut at, b'\n')?;
    let sectors = digits::value_of_leading(sectors_word, sectors_digits);
    (sectors != 0).then(|| (digits::value_of_leading(start_word, start_digits), sectors, at))
}

/// One field of [`word_line`] at `*at`: 1 to 7 digits followed by `end`.
/// Returns the field's word and digit count, and moves `*at` past `end`.
#[inline(always)]
fn word_field(buf: &[u8], at: &mut usize, end: u8) -> Option<(u64, u32)> {
    let word = digits::word_at(buf, *at)?;
    let digits = digits::leading_digits(word);
    if digits == 0 || digits == digits::WORD_BYTES || (word >> (8 * digits)) as u8 != end {
        return None;
    }
    *at += digits as usize + 1;
    Some((word, digits))
}

/// [`plain_line`] one byte at a time: any line of short enough fields.
#[inline]
fn byte_line(buf: &[u8]) -> Option<(u64, u64, usize)> {
    let mut at = 0;
    let start_sector = plain_number(buf, &mut at)?;
    let sectors = plain_number(buf, &mut at)?;
    // The last two fields, counted and not parsed (as `well_formed`):
    // two runs of digits, each after separators, then separators at most.
    for _ in 0..2 {
        let separators = skip(buf, &mut at, is_separator)?;
        let digits = skip(buf, &mut at, |b| b.is_ascii_digit())?;
        if separators == 0 || digits == 0 {
            return None;
        }
    }
    skip(buf, &mut at, is_separator)?;
    (buf[at] == b'\n' && sectors != 0).then_some((start_sector, sectors, at + 1))
}

/// Moves `*at` past the bytes of `buf` that `class` takes; how many it
/// passed, or `None` when they run to the end of `buf`.
#[inline(always)]
fn skip(buf: &[u8], at: &mut usize, class: impl Fn(u8) -> bool) -> Option<usize> {
    let begin = *at;
    while class(*buf.get(*at)?) {
        *at += 1;
    }
    Some(*at - begin)
}

/// [`leading_number`] for [`plain_line`]: skips separators from `*at`,
/// then takes 1 to [`FAST_DIGITS_MAX`] digits followed by a separator
/// (which is left for the next field).
#[inline(always)]
fn plain_number(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut i = *at;
    while is_separator(*buf.get(i)?) {
        i += 1;
    }
    let begin = i;
    let mut value = 0u64;
    loop {
        let digit = buf.get(i)?.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        // Wrapping: a field of more than FAST_DIGITS_MAX digits is refused
        // below whatever its value became (a plain multiply panicked in
        // debug builds on a field of 20 digits or more).
        value = value.wrapping_mul(10).wrapping_add(u64::from(digit));
        i += 1;
    }
    let digits = i - begin;
    if digits == 0 || digits > FAST_DIGITS_MAX as usize || !is_separator(buf[i]) {
        return None;
    }
    *at = i;
    Some(value)
}

#[inline(always)]
fn is_separator(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Skips separators, then takes a field of 1 to [`FAST_DIGITS_MAX`]
/// digits ending at a separator or the end of the line.
#[inline(always)]
fn leading_number(rest: &mut &[u8]) -> Option<u64> {
    let line = *rest;
    let mut i = 0;
    while i < line.len() && is_separator(line[i]) {
        i += 1;
    }
    let begin = i;
    let mut value = 0u64;
    while i < line.len() {
        let digit = line[i].wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        // Wrapping: a field of more than FAST_DIGITS_MAX digits is refused
        // below whatever its value became (a plain multiply panicked in
        // debug builds on a field of 20 digits or more).
        value = value.wrapping_mul(10).wrapping_add(u64::from(digit));
        i += 1;
    }
    let digits = i - begin;
    if digits == 0 || digits > FAST_DIGITS_MAX as usize || (i < line.len() && !is_separator(line[i])) {
        return None;
    }
    *rest = &line[i..];
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_first_errors, records, skipping};
    use crate::{IoKind, TraceFormat, TraceRecord};

    const F: TraceFormat = TraceFormat::Arc;

    #[test]
    fn valid() {
        let r = records(F, "3050771 25 0 0\n2461851 8 0 1\r\n\n3050771 8 0 2\n");
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[0],
            TraceRecord::new(0, 0, 3050771 * 512, 25 * 512, IoKind::Read)
        );
        assert_eq!(r.iter().map(|r| r.time_ns).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn fast_and_checked_parses_agree() {
        use super::{well_formed, Arc};
        for line in [
            "3050771 25 0 0",
            "  1\t8   0 0 ",
            "0 1 x y",
            "999999999999999 1 0 0",
            "9999999999999999 1 0 0",
            "36028797018963967 1 0 0",
            "1 0 0 0",
            "1 8 0",
            "1 8 0 0 0",
            "1 -8 0 0",
            "1 8a 0 0",
        ] {
            let mut fast = Arc::default();
            let mut checked = Arc::default();
            let checked_result = checked.parse_checked(line.as_bytes());
            assert_eq!(fast.parse(line.as_bytes()), checked_result, "{line}");
            if well_formed(line.as_bytes()).is_some() {
                assert!(checked_result.is_ok(), "{line}");
            }
        }
    }

    /// Lines both fast parses are checked on: usual ones, and ones each
    /// must decline or leave to a slower parse.
    const SAMPLE_LINES: [&str; 28] = [
        "3050771 25 0 0\n",
        "  1\t8   0 0 \n",
        "1 8 0 0\r\n",
        "1 8 0 0",
        "0 1 x y\n",
        "9999999 1 0 0\n",
        "99999999 1 0 0\n",
        "999999999999999 1 0 0\n",
        "9999999999999999 1 0 0\n",
        "1 0 0 0\n",
        "1 8 0\n",
        "1 8 0 0 0\n",
        "1 8\n",
        "1\n",
        "\n",
        "   \n",
        "1 -8 0 0\n",
        "1 8a 0 0\n",
        "1 8 0 0\n2 8 0 1\n",
        "1 8 0 1234567\n",
        "1 8 0 12345678\n",
        "1 8 0:0\n",
        "1/8 0 0\n",
        "1\t8 0 0\n",
        "1 8  0 0\n",
        "1 8 0 0 \n",
        "12345678 8 0 0\n",
        "1 1234567 1234567 1234567\n",
    ];

    #[test]
    fn one_pass_and_line_parses_agree() {
        // Every line the one-pass parse takes is one the line parse takes,
        // with the same record and the line's whole length; the rest it
        // declines (the reader then parses them as before).
        use super::{plain_line, well_formed};
        let mut taken = 0;
        for line in SAMPLE_LINES {
            let bytes = line.as_bytes();
            let Some((start, sectors, used)) = plain_line(bytes) else {
                continue;
            };
            taken += 1;
            let end = bytes.iter().position(|&b| b == b'\n').unwrap();
            assert_eq!(used, end + 1, "{line:?}");
            assert_eq!(well_formed(&bytes[..end]), Some((start, sectors)), "{line:?}");
        }
        assert_eq!(taken, 13);
    }

    #[test]
    fn word_and_byte_line_parses_agree() {
        // The word parse takes usual lines (when 8 bytes follow each field)
        // and declines what the byte parse declines; where both take a
        // line they agree.
        use super::{byte_line, word_line};
        let pad = "0 0 0 0\n".repeat(2);
        let mut taken = 0;
        for line in SAMPLE_LINES {
            let bytes = format!("{line}{pad}").into_bytes();
            let word = word_line(&bytes);
            if word.is_some() {
                taken += 1;
                assert_eq!(word, byte_line(&bytes), "{line:?}");
            }
            if byte_line(&bytes).is_none() {
                assert_eq!(word, None, "{line:?}");
            }
        }
        assert_eq!(taken, 5);
        // Without 8 bytes after a field the word parse declines; the line
        // parse still takes the line (bytewise).
        assert_eq!(word_line(b"1 8 0 0\n"), None);
        assert_eq!(super::plain_line(b"1 8 0 0\n"), Some((1, 8, 8)));
    }

    proptest::proptest! {
        /// Usual lines (four fields of 1 to 9 digits, one space between,
        /// `\n`, then the next line): the word parse takes those whose
        /// fields have at most 7 digits and that leave 8 bytes after each
        /// field's start, and then agrees with the byte parse.
        #[test]
        fn word_line_agrees_with_byte_line_on_usual_lines(
            fields in proptest::collection::vec(0u64..1_000_000_000, 4),
            digits in proptest::collection::vec(1usize..10, 4),
            pad in 0usize..12,
        ) {
            let texts: Vec<String> = fields
                .iter()
                .zip(&digits)
                .map(|(value, &n)| format!("{:0n$}", value % 10u64.pow(n as u32)))
                .collect();
            let line = format!("{}\n{}", texts.join(" "), "1 8 0 0\n".repeat(pad / 4) + &"0".repeat(pad % 4));
            let bytes = line.as_bytes();
            let byte = super::byte_line(bytes);
            let word = super::word_line(bytes);
            let fits = digits.iter().all(|&n| n <= 7) && texts.iter().map(|t| t.len() + 1).sum::<usize>() + 7 <= bytes.len();
            if fits && fields[1] % 10u64.pow(digits[1] as u32) != 0 {
                proptest::prop_assert!(word.is_some(), "{:?}", line);
            }
            if word.is_some() {
                proptest::prop_assert_eq!(word, byte, "{:?}", line);
            }
            proptest::prop_assert_eq!(super::plain_line(bytes), byte, "{:?}", line);
        }

        #[test]
        fn word_line_takes_only_what_byte_line_takes(
            fields in proptest::collection::vec(
                proptest::sample::select(vec!["0", "7", "25", "3050771", "12345678", "", "x", "-1", "8:"]),
                1..6,
            ),
            separators in proptest::collection::vec(
                proptest::sample::select(vec![" ", "\t", "  ", "", " \t"]),
                6,
            ),
            end in proptest::sample::select(vec!["\n", " \n", "\r\n", "", "\n1 8 0 0\n"]),
            pad in 0usize..12,
        ) {
            let mut line = String::new();
            for (field, separator) in fields.iter().zip(&separators) {
                line.push_str(separator);
                line.push_str(field);
            }
            line.push_str(end);
            line.push_str(&"0".repeat(pad));
            let bytes = line.as_bytes();
            if let Some(taken) = super::word_line(bytes) {
                proptest::prop_assert_eq!(Some(taken), super::byte_line(bytes), "{:?}", line);
            }
            proptest::prop_assert_eq!(super::plain_line(bytes), super::byte_line(bytes), "{:?}", line);
        }
    }

    #[test]
    fn errors() {
        assert_first_errors(
            F,
            "1 8 0 0\n",
            2,
            &[
                ("1 0 0 0\n", "nsectors"),
                ("x 8 0 0\n", "start_sector"),
                ("1 8 0\n", "request_no"),
                ("1 8 0 0 0\n", "line"),
            ],
        );
    }

    #[test]
    fn numbers_past_u64_are_errors_not_panics() {
        // Both one-pass parses accumulate up to the field's end before
        // refusing more than 15 digits; this overflowed (a panic in debug
        // builds) for 20 digits or more.
        assert_first_errors(
            F,
            "1 8 0 0\n",
            2,
            &[
                ("99999999999999999999999 8 0 0\n", "start_sector"),
                ("1 99999999999999999999999 0 0\n", "nsectors"),
                // One field: the error names the first one missing.
                ("99999999999999999999999,\n", "nsectors"),
            ],
        );
        assert_eq!(super::plain_line(b"99999999999999999999999 8 0 0\n"), None);
        assert_eq!(super::well_formed(b"1 99999999999999999999999 0 0"), None);
    }

    #[test]
    fn skip_bad_keeps_time_dense() {
        let (r, skipped, _) = skipping(F, "1 8 0 0\nbad\n2 8 0 1\n");
        assert_eq!(skipped, 1);
        assert_eq!(r.iter().map(|r| r.time_ns).collect::<Vec<_>>(), [0, 1]);
    }
}
