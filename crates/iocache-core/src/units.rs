//! Parsing and wording of human-written quantities ("16MiB", "4k", "1 request") shared by every front end.

use crate::error::CoreError;

/// The one size grammar of every front end (flags, TOML, `ctl`), as one
/// line of help text.
pub const SIZE_GRAMMAR: &str = "a number with a unit: B, K/KiB, M/MiB, G/GiB, T/TiB \
(powers of 1024; decimals allowed, e.g. 1.5GiB)";

/// `n` and the noun, singular for one: `count(1, "request")` is
/// "1 request", `count(3, "line")` "3 lines" (nouns here take an `s`), so
/// counts read as English in every command's output and every report.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Parses a byte size: a number (decimals allowed) with a unit.
///
/// `K`, `M`, `G`, `T` and `KiB`..`TiB` are powers of 1024, as in qemu,
/// nbdkit and LVM; `B` is bytes. `KB`..`TB` are refused: they mean powers
/// of 1000 to some and of 1024 to others, and a cache sized a few percent
/// off its intent is a surprise. A bare number is refused too (a size
/// always says its unit); the simulator reads a bare number as a line count
/// before it calls this. A fraction must come to whole bytes (`1.5KiB` is
/// 1536 bytes, `0.3KiB` is refused).
pub fn parse_byte_size(text: &str) -> Result<u64, CoreError> {
    let bad = |reason: String| CoreError::BadParameter {
        given: text.to_string(),
        reason,
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    if number.is_empty() || number == "." {
        return Err(bad(format!("a size is {SIZE_GRAMMAR}")));
    }
    let shift: u32 = match unit.trim().to_ascii_lowercase().as_str() {
        "" => {
            let binary = number
                .parse::<u64>()
                .ok()
                .map(format_byte_size)
                .filter(|b| b.ends_with("iB"))
                .map_or(String::new(), |b| format!(" or {b}"));
            return Err(bad(format!(
                "a size needs a unit: write {number}B for bytes{binary}; a size is {SIZE_GRAMMAR}"
            )));
        }
        "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        decimal @ ("kb" | "mb" | "gb" | "tb") => {
            let letter = decimal[..1].to_ascii_uppercase();
            return Err(bad(format!(
                "`{}` is ambiguous (1000 or 1024?): write {number}{letter}iB for powers of 1024, or the number of bytes with B",
                &unit.trim()
            )));
        }
        other => return Err(bad(format!("unknown unit `{other}`; a size is {SIZE_GRAMMAR}"))),
    };
    let (whole_text, fraction_text) = number.split_once('.').unwrap_or((number, ""));
    if fraction_text.contains('.') {
        return Err(bad("more than one decimal point".into()));
    }
    let overflow = || bad("size overflows 64 bits".into());
    let whole: u64 = if whole_text.is_empty() {
        0
    } else {
        whole_text.parse().map_err(|_| overflow())?
    };
    let mut bytes = whole.checked_mul(1u64 << shift).ok_or_else(overflow)?;
    let fraction_text = fraction_text.trim_end_matches('0');
    if !fraction_text.is_empty() {
        // fraction × 2^shift / 10^digits must be whole: exact in u128.
        if fraction_text.len() > 30 {
            return Err(bad("too many decimals".into()));
        }
        let numerator = fraction_text.parse::<u128>().map_err(|_| overflow())? << shift;
        let denominator = 10u128.pow(fraction_text.len() as u32);
        if !numerator.is_multiple_of(denominator) {
            return Err(bad(format!(
                "{number}{} is not a whole number of bytes",
                unit.trim()
            )));
        }
        let part = u64::try_from(numerator / denominator).map_err(|_| overflow())?;
        bytes = bytes.checked_add(part).ok_or_else(overflow)?;
    }
    Ok(bytes)
}

/// Formats bytes with the largest binary unit that divides them exactly ("16MiB"), else "N B".
pub fn format_byte_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// Bytes as a person reads them: exact ("16MiB", "4100KiB") while that
/// takes at most four digits, else to a tenth of the largest unit
/// ("132.0MiB", not "135176KiB"). For messages, not for values read back.
pub fn format_size_readably(bytes: u64) -> String {
    let exact = format_byte_size(bytes);
    if exact.chars().take_while(char::is_ascii_digit).count() <= 4 {
        return exact;
    }
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift {
            return format!("{:.1}{unit}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    exact
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_as_a_person_reads_them() {
        use super::format_size_readably as f;
        assert_eq!(f(16 << 20), "16MiB");
        assert_eq!(f(4100 << 10), "4100KiB");
        assert_eq!(f(135_176 << 10), "132.0MiB");
        assert_eq!(f(1_000_000_000), "953.7MiB");
        assert_eq!(f(512), "512B");
        assert_eq!(f(12_345), "12.1KiB");
    }

    #[test]
    fn counts_are_singular_for_one_only() {
        assert_eq!(super::count(0, "request"), "0 requests");
        assert_eq!(super::count(1, "request"), "1 request");
        assert_eq!(super::count(2, "malformed line"), "2 malformed lines");
    }

    use super::*;
    use crate::test_util::{assert_refusal_names, assert_refuses};

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_byte_size("4096B").unwrap(), 4096);
        assert_eq!(parse_byte_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_byte_size("4k").unwrap(), 4096);
        assert_eq!(parse_byte_size("4K").unwrap(), 4096);
        assert_eq!(parse_byte_size(" 2 GiB ").unwrap(), 2 << 30);
        assert_eq!(parse_byte_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_byte_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_byte_size("0.5k").unwrap(), 512);
        assert_eq!(parse_byte_size("2.000M").unwrap(), 2 << 20);
        assert_eq!(parse_byte_size(".25MiB").unwrap(), 256 << 10);
        assert_eq!(parse_byte_size("16383.75T").unwrap(), (16383 << 40) + (3 << 38));
        assert_refuses(parse_byte_size, &["MiB", ".", "1.2.3MiB", "16777216T"]);
        assert_refusal_names(parse_byte_size, "3 parsecs", "parsecs");
        assert_refuses(parse_byte_size, &["99999999999T"]);
    }

    #[test]
    fn sizes_refused_say_how_to_write_them() {
        let message = |t: &str| parse_byte_size(t).unwrap_err().to_string();
        let bare = message("4096");
        assert!(
            bare.contains("4096B for bytes or 4KiB") && bare.contains("unit"),
            "{bare}"
        );
        assert!(
            message("3000").contains("write 3000B for bytes;"),
            "{}",
            message("3000")
        );
        let decimal = message("1GB");
        assert!(
            decimal.contains("1GiB") && decimal.contains("ambiguous"),
            "{decimal}"
        );
        assert!(message("10 MB").contains("10MiB"), "{}", message("10 MB"));
        let partial = message("0.3KiB");
        assert!(partial.contains("whole number of bytes"), "{partial}");
    }

    #[test]
    fn sizes_format() {
        assert_eq!(format_byte_size(16 << 20), "16MiB");
        assert_eq!(format_byte_size(1536), "1536B");
        assert_eq!(format_byte_size(2048), "2KiB");
    }
}

/// Parses a duration: a number (decimals allowed) with a unit `ns`, `us`
/// (or `µs`), `ms`, `s`, `m`, `h` or `d`, e.g. `10ms`, `2.5ms`, `75us`, `2m`.
/// The result is rounded to whole nanoseconds.
pub fn parse_duration_ns(text: &str) -> Result<u64, CoreError> {
    let bad = |reason: &str| CoreError::BadParameter {
        given: text.to_string(),
        reason: reason.to_string(),
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    if number.is_empty() {
        return Err(bad(
            "a duration is a number with a unit, e.g. 10ms, 2.5ms, 20s, 2m",
        ));
    }
    let unit_ns: f64 = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3_600e9,
        "d" => 86_400e9,
        "" => return Err(bad("a duration needs a unit: ns, us, ms, s, m, h or d")),
        other => {
            return Err(bad(&format!(
                "unknown unit `{other}`; use ns, us, ms, s, m, h or d"
            )))
        }
    };
    // Whole numbers stay exact; only fractions go through floating point.
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(unit_ns as u64)
            .ok_or_else(|| bad("duration overflows 64 bits"));
    }
    let value: f64 = number.parse().map_err(|_| bad("not a number"))?;
    let nanos = (value * unit_ns).round();
    if !(0.0..=u64::MAX as f64).contains(&nanos) {
        return Err(bad("duration overflows 64 bits"));
    }
    Ok(nanos as u64)
}

/// Formats nanoseconds with the largest unit that divides them exactly ("10ms", "2m").
pub fn format_duration_ns(nanos: u64) -> String {
    for (unit_ns, unit) in [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ] {
        if nanos >= unit_ns && nanos.is_multiple_of(unit_ns) {
            return format!("{}{unit}", nanos / unit_ns);
        }
    }
    format!("{nanos}ns")
}

#[cfg(test)]
mod duration_tests {
    use super::*;
    use crate::test_util::{assert_refusal_names, assert_refuses};

    #[test]
    fn durations_round_trip() {
        for text in ["10ms", "20s", "2m", "1h", "7d", "250us", "3ns"] {
            assert_eq!(format_duration_ns(parse_duration_ns(text).unwrap()), text);
        }
        assert_eq!(parse_duration_ns("1500ms").unwrap(), 1_500_000_000);
        assert_eq!(parse_duration_ns("2.5ms").unwrap(), 2_500_000);
        assert_eq!(parse_duration_ns("75µs").unwrap(), 75_000);
        assert_refuses(parse_duration_ns, &["1.2.3s", "10"]);
        assert_refusal_names(parse_duration_ns, "10 fortnights", "fortnights");
    }
}
