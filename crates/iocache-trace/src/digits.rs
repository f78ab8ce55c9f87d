//! Decimal digits eight bytes at a time, for the fast paths of line parsers.
//!
//! A trace line is mostly short decimal numbers. Reading them a byte at a
//! time costs a compare, a multiply-add and a branch per digit; reading the
//! field as one little-endian word finds where its digits end with a few
//! mask operations and converts up to eight of them with three multiplies
//! (each step joins neighbouring digits, then pairs, then quads). Callers
//! fall back to their bytewise parse for anything these do not take.

/// Bytes in a word.
pub(crate) const WORD_BYTES: u32 = 8;

const LOW_NIBBLES: u64 = 0x0f0f_0f0f_0f0f_0f0f;
const HIGH_NIBBLES: u64 = 0xf0f0_f0f0_f0f0_f0f0;
const ASCII_ZEROS: u64 = 0x3030_3030_3030_3030;
const SIXES: u64 = 0x0606_0606_0606_0606;
const LOW_SEVEN_BITS: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const TOP_BITS: u64 = 0x8080_8080_8080_8080;

/// The 8 bytes of `buf` from `at` as a little-endian word (its first byte
/// lowest), or `None` when fewer than 8 bytes are left.
#[inline(always)]
pub(crate) fn word_at(buf: &[u8], at: usize) -> Option<u64> {
    let bytes: [u8; 8] = buf.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// How many of `word`'s bytes, from its first (lowest), are ASCII digits
/// before the first that is not: 0 to [`WORD_BYTES`].
#[inline(always)]
pub(crate) fn leading_digits(word: u64) -> u32 {
    // A byte is a digit when its high nibble is 3 and its low nibble plus
    // 6 stays below 16; neither test carries into the next byte.
    let high_not_three = (word & HIGH_NIBBLES) ^ ASCII_ZEROS;
    let low_above_nine = ((word & LOW_NIBBLES) + SIXES) & HIGH_NIBBLES;
    let not_digit = high_not_three | low_above_nine;
    // The top bit of every byte that is not zero (no carry between bytes:
    // the low seven bits plus 0x7f fit in a byte).
    let flags = (((not_digit & LOW_SEVEN_BITS) + LOW_SEVEN_BITS) | not_digit) & TOP_BITS;
    flags.trailing_zeros() / 8
}

/// The number that `word`'s first `digits` bytes spell, when they are ASCII
/// digits (see [`leading_digits`]); `digits` is 1 to [`WORD_BYTES`].
#[inline(always)]
pub(crate) fn value_of_leading(word: u64, digits: u32) -> u64 {
    debug_assert!((1..=WORD_BYTES).contains(&digits));
    // The digits' values moved to the word's top bytes, behind zeros: as if
    // the field had leading zeros to eight digits, the first byte the most
    // significant.
    let v = (word & LOW_NIBBLES) << (8 * (WORD_BYTES - digits));
    // Each step: every lane times ten to the digits of its neighbour, plus
    // that neighbour, keeping every other lane (no lane's value overflows:
    // 99, 9,999, 99,999,999; the top lane's product spills past the word,
    // hence wrapping, and the masks drop what spilled into the next lane).
    let v = (v.wrapping_mul(10) + (v >> 8)) & 0x00ff_00ff_00ff_00ff;
    let v = (v.wrapping_mul(100) + (v >> 16)) & 0x0000_ffff_0000_ffff;
    (v.wrapping_mul(10_000) + (v >> 32)) & 0xffff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(text: &[u8]) -> u64 {
        let mut bytes = [b' '; 8];
        bytes[..text.len()].copy_from_slice(text);
        u64::from_le_bytes(bytes)
    }

    #[test]
    fn counts_and_converts_every_prefix() {
        // Every prefix of a few digit strings, followed by each kind of byte
        // a line has (and two that no digit test may take).
        for digits in ["3050771", "99999999", "12345678", "00000001", "90000009"] {
            for n in 1..=digits.len() {
                let text = &digits[..n];
                for after in [b' ', b'\t', b'\n', b'x', 0xff, b'/', b':'] {
                    let mut bytes = [after; 8];
                    bytes[..n].copy_from_slice(text.as_bytes());
                    let w = u64::from_le_bytes(bytes);
                    assert_eq!(leading_digits(w), n as u32, "{text} then {after:#04x}");
                    assert_eq!(
                        value_of_leading(w, n as u32),
                        text.parse::<u64>().unwrap(),
                        "{text} then {after:#04x}"
                    );
                }
            }
        }
    }

    #[test]
    fn stops_at_every_byte_that_is_not_a_digit() {
        // Every byte value in every position of a word of digits: the count
        // is that position exactly when the byte is not a digit (the bytes
        // after it are digits, so only it can stop the run), else 8.
        for b in 0..=255u8 {
            for at in 0..8 {
                let mut bytes = *b"12345678";
                bytes[at] = b;
                let expected = if b.is_ascii_digit() { 8 } else { at as u32 };
                let w = u64::from_le_bytes(bytes);
                assert_eq!(leading_digits(w), expected, "byte {b:#04x} at {at}");
                if at > 0 {
                    let prefix = std::str::from_utf8(&bytes[..at]).unwrap().parse::<u64>().unwrap();
                    assert_eq!(value_of_leading(w, at as u32), prefix, "byte {b:#04x} at {at}");
                }
            }
        }
    }

    #[test]
    fn words_need_eight_bytes() {
        assert_eq!(word_at(b"1234567", 0), None);
        assert_eq!(word_at(b"12345678", 0), Some(word(b"12345678")));
        assert_eq!(word_at(b"12345678", 1), None);
        assert_eq!(word_at(b"x", usize::MAX), None);
    }
}
