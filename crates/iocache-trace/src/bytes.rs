//! Allocation-free parsing of the byte fields that trace lines are made of.
//!
//! Trace readers must keep up with a simulator consuming millions of records
//! per second, so lines are never turned into `String`s: they are split into
//! borrowed byte slices and numbers are parsed straight from the bytes. Only
//! the error path allocates (to build a readable message).

use crate::error::FieldError;

/// Removes ASCII whitespace (space, tab, CR, LF, ...) from both ends.
#[inline]
pub(crate) fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// Strips a trailing `\n` and then a trailing `\r` (so CRLF files work).
#[inline]
pub(crate) fn strip_eol(mut s: &[u8]) -> &[u8] {
    if let [rest @ .., b'\n'] = s {
        s = rest;
    }
    if let [rest @ .., b'\r'] = s {
        s = rest;
    }
    s
}

/// Parses a non-empty run of ASCII digits into a `u64`; `None` on any other
/// byte or on overflow.
#[inline]
pub(crate) fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    if s.len() <= 19 {
        // 19 decimal digits always fit in a u64: no overflow checks needed.
        for &b in s {
            let digit = b.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value * 10 + u64::from(digit);
        }
    } else {
        for &b in s {
            let digit = b.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value.checked_mul(10)?.checked_add(u64::from(digit))?;
        }
    }
    Some(value)
}

/// Parses a decimal `u32`.
#[inline]
pub(crate) fn parse_u32(s: &[u8]) -> Option<u32> {
    parse_u64(s).and_then(|v| u32::try_from(v).ok())
}

/// Parses a hexadecimal number with an optional `0x`/`0X` prefix.
pub(crate) fn parse_hex_u32(s: &[u8]) -> Option<u32> {
    let digits = match s {
        [b'0', b'x' | b'X', rest @ ..] => rest,
        _ => s,
    };
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let mut value: u32 = 0;
    for &b in digits {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        value = (value << 4) | u32::from(digit);
    }
    Some(value)
}

/// Parses a non-negative decimal number (`12`, `12.5`, `12.`, `.5`) into an
/// integer count of `10^-frac_digits` units, exactly (no floating point).
///
/// Fraction digits beyond `frac_digits` are truncated. `frac_digits` must be
/// at most 18.
pub(crate) fn parse_fixed(s: &[u8], frac_digits: u32) -> Option<u64> {
    debug_assert!(frac_digits <= 18);
    let (int_part, frac_part) = match s.iter().position(|&b| b == b'.') {
        Some(dot) => (&s[..dot], &s[dot + 1..]),
        None => (s, &s[s.len()..]),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let int = if int_part.is_empty() {
        0
    } else {
        parse_u64(int_part)?
    };
    let mut frac: u64 = 0;
    let mut taken = 0;
    for &b in frac_part {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        if taken < frac_digits {
            frac = frac * 10 + u64::from(digit);
            taken += 1;
        }
    }
    frac *= 10u64.pow(frac_digits - taken);
    int.checked_mul(10u64.pow(frac_digits))?.checked_add(frac)
}

/// Splits `line` on `sep`, trimming each field. Returns the first `N` fields
/// and the total number of fields (which may exceed `N`).
#[inline]
pub(crate) fn split_sep<const N: usize>(line: &[u8], sep: u8) -> ([&[u8]; N], usize) {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut count = 0;
    for part in line.split(|&b| b == sep) {
        if count < N {
            out[count] = trim(part);
        }
        count += 1;
    }
    (out, count)
}

/// The `N` comma-separated fields of a line of a CSV format with a header
/// line, or `None` for a header line: one whose first field is `header`
/// (any case), wherever it stands, so concatenated files work. A data line
/// with another number of fields is an error naming the first missing field.
#[inline]
pub(crate) fn csv_fields<'a, const N: usize>(
    line: &'a [u8],
    header: &[u8],
    names: &[&'static str; N],
) -> Result<Option<[&'a [u8]; N]>, FieldError> {
    let (f, n) = split_sep::<N>(line, b',');
    if f[0].eq_ignore_ascii_case(header) {
        return Ok(None);
    }
    if n != N {
        return Err(field_count(names, n, "comma-separated"));
    }
    Ok(Some(f))
}

/// Splits `line` on runs of spaces and tabs. Returns the first `N` fields and
/// the total number of fields (which may exceed `N`).
#[inline]
pub(crate) fn split_ws<const N: usize>(line: &[u8]) -> ([&[u8]; N], usize) {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut count = 0;
    let mut rest = line;
    // Each turn skips separators, then takes one field.
    while let Some(start) = rest.iter().position(|&b| b != b' ' && b != b'\t') {
        rest = &rest[start..];
        let end = rest
            .iter()
            .position(|&b| b == b' ' || b == b'\t')
            .unwrap_or(rest.len());
        if count < N {
            out[count] = &rest[..end];
        }
        count += 1;
        rest = &rest[end..];
    }
    (out, count)
}

/// Renders field bytes for an error message: lossy UTF-8, shortened.
pub(crate) fn show(s: &[u8]) -> String {
    const MAX: usize = 48;
    let text = String::from_utf8_lossy(s);
    if text.chars().count() > MAX {
        let mut short: String = text.chars().take(MAX).collect();
        short.push('…');
        short
    } else {
        text.into_owned()
    }
}

/// `Err` for a field that should be an unsigned integer.
#[cold]
pub(crate) fn not_integer(field: &'static str, s: &[u8]) -> FieldError {
    let reason = if s.is_empty() {
        "expected an unsigned integer, found an empty field".to_string()
    } else if parse_u64(s).is_none() && s.iter().all(u8::is_ascii_digit) {
        format!("number `{}` is too large", show(s))
    } else {
        format!("expected an unsigned integer, found `{}`", show(s))
    };
    FieldError::new(field, reason)
}

/// Parses a field as `u64` or reports it by name.
#[inline]
pub(crate) fn u64_field(s: &[u8], field: &'static str) -> Result<u64, FieldError> {
    parse_u64(s).ok_or_else(|| not_integer(field, s))
}

/// Parses a field as `u32` or reports it by name.
#[inline]
pub(crate) fn u32_field(s: &[u8], field: &'static str) -> Result<u32, FieldError> {
    match parse_u64(s) {
        Some(v) => u32::try_from(v).map_err(|_| {
            FieldError::new(
                field,
                format!("value {v} does not fit in 32 bits (max {})", u32::MAX),
            )
        }),
        None => Err(not_integer(field, s)),
    }
}

/// Parses a decimal number into `10^-frac_digits` units or reports it by name;
/// `unit` names what the number counts (for the message).
#[inline]
pub(crate) fn fixed_field(
    s: &[u8],
    frac_digits: u32,
    field: &'static str,
    unit: &str,
) -> Result<u64, FieldError> {
    parse_fixed(s, frac_digits).ok_or_else(|| {
        FieldError::new(
            field,
            format!(
                "expected a non-negative decimal number of {unit}, found `{}`",
                show(s)
            ),
        )
    })
}

/// Multiplies a count of `unit`-byte units into bytes, reporting overflow.
#[inline]
pub(crate) fn scale(value: u64, unit: u64, field: &'static str) -> Result<u64, FieldError> {
    value.checked_mul(unit).ok_or_else(|| {
        FieldError::new(
            field,
            format!("{value} × {unit} bytes overflows a 64-bit byte count"),
        )
    })
}

/// Checks a request's length is non-zero and `offset + length` fits in u64.
#[inline]
pub(crate) fn check_extent(
    offset: u64,
    length: u64,
    offset_field: &'static str,
    length_field: &'static str,
) -> Result<(), FieldError> {
    if length == 0 {
        return Err(FieldError::new(length_field, "zero-length request"));
    }
    if offset.checked_add(length).is_none() {
        return Err(FieldError::new(
            offset_field,
            format!("offset {offset} + length {length} overflows a 64-bit byte address"),
        ));
    }
    Ok(())
}

/// The error for a line with the wrong number of fields. When fields are
/// missing it names the first missing one.
#[cold]
pub(crate) fn field_count(names: &[&'static str], found: usize, what: &str) -> FieldError {
    let expected = names.len();
    if found < expected {
        FieldError::new(
            names[found],
            format!("missing: expected {expected} {what} fields, found {found}"),
        )
    } else {
        FieldError::new(
            "line",
            format!("expected {expected} {what} fields, found {found}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"99999999999999999999"), None);
        assert_eq!(parse_u64(b"0000000000000000000000012"), Some(12));
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"1a"), None);
        assert_eq!(parse_u64(b" 1"), None);
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), None);
    }

    #[test]
    fn hex() {
        assert_eq!(parse_hex_u32(b"2a"), Some(0x2a));
        assert_eq!(parse_hex_u32(b"0x2A"), Some(0x2a));
        assert_eq!(parse_hex_u32(b"0X88"), Some(0x88));
        assert_eq!(parse_hex_u32(b"0x"), None);
        assert_eq!(parse_hex_u32(b"zz"), None);
        assert_eq!(parse_hex_u32(b""), None);
    }

    #[test]
    fn fixed_point() {
        assert_eq!(parse_fixed(b"1.5", 9), Some(1_500_000_000));
        assert_eq!(
            parse_fixed(b"1456095145.133076000", 9),
            Some(1_456_095_145_133_076_000)
        );
        assert_eq!(parse_fixed(b"0.000000001", 9), Some(1));
        assert_eq!(parse_fixed(b"0.0000000019", 9), Some(1));
        assert_eq!(parse_fixed(b"7", 9), Some(7_000_000_000));
        assert_eq!(parse_fixed(b"7.", 3), Some(7000));
        assert_eq!(parse_fixed(b".25", 2), Some(25));
        assert_eq!(parse_fixed(b".", 2), None);
        assert_eq!(parse_fixed(b"", 2), None);
        assert_eq!(parse_fixed(b"1.2.3", 2), None);
        assert_eq!(parse_fixed(b"1e5", 2), None);
        assert_eq!(parse_fixed(b"-1.0", 2), None);
        assert_eq!(parse_fixed(b"99999999999999999999", 0), None);
        assert_eq!(parse_fixed(b"18446744073.709551616", 9), None);
    }

    #[test]
    fn splitting() {
        let (f, n) = split_sep::<3>(b"a, b ,c,d", b',');
        assert_eq!(n, 4);
        assert_eq!(f, [&b"a"[..], b"b", b"c"]);
        let (f, n) = split_ws::<4>(b"  1\t 2   3 ");
        assert_eq!(n, 3);
        assert_eq!(&f[..3], [&b"1"[..], b"2", b"3"]);
        let (_, n) = split_ws::<4>(b"");
        assert_eq!(n, 0);
    }

    #[test]
    fn trimming() {
        assert_eq!(trim(b" \tx y\r\n"), b"x y");
        assert_eq!(trim(b"   "), b"");
        assert_eq!(strip_eol(b"a\r\n"), b"a");
        assert_eq!(strip_eol(b"a\n"), b"a");
        assert_eq!(strip_eol(b"a"), b"a");
    }

    #[test]
    fn messages() {
        assert_eq!(
            not_integer("Offset", b"abc").reason,
            "expected an unsigned integer, found `abc`"
        );
        assert!(not_integer("Offset", b"99999999999999999999999")
            .reason
            .contains("too large"));
        let long = [b'x'; 100];
        assert!(show(&long).ends_with('…'));
        let e = field_count(&["a", "b", "c"], 1, "comma-separated");
        assert_eq!(e.field, "b");
        let e = field_count(&["a", "b", "c"], 5, "comma-separated");
        assert_eq!(e.field, "line");
    }
}
