//! Parsing of human-written sizes ("16MiB", "4k", "32768") shared by every front end.

use crate::error::CoreError;

/// Parses a byte size: a plain number of bytes, or a number with a unit.
/// `K`, `M`, `G`, `T` and `KiB`..`TiB` are powers of 1024; `KB`..`TB` are powers of 1000.
pub fn parse_byte_size(text: &str) -> Result<u64, CoreError> {
    let bad = |reason: &str| CoreError::BadParameter {
        given: text.to_string(),
        reason: reason.to_string(),
    };
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(bad("a size starts with a number, e.g. 4096, 64KiB or 16MiB"));
    }
    let number: u64 = digits.parse().map_err(|_| bad("number too large"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(bad(&format!(
                "unknown unit `{other}`; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"
            )))
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| bad("size overflows 64 bits"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_byte_size("4096").unwrap(), 4096);
        assert_eq!(parse_byte_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_byte_size("4k").unwrap(), 4096);
        assert_eq!(parse_byte_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_byte_size(" 2 GiB ").unwrap(), 2 << 30);
        assert!(parse_byte_size("MiB").is_err());
        assert!(parse_byte_size("3 parsecs")
            .unwrap_err()
            .to_string()
            .contains("parsecs"));
        assert!(parse_byte_size("99999999999T").is_err());
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

    #[test]
    fn durations_round_trip() {
        for text in ["10ms", "20s", "2m", "1h", "7d", "250us", "3ns"] {
            assert_eq!(format_duration_ns(parse_duration_ns(text).unwrap()), text);
        }
        assert_eq!(parse_duration_ns("1500ms").unwrap(), 1_500_000_000);
        assert_eq!(parse_duration_ns("2.5ms").unwrap(), 2_500_000);
        assert_eq!(parse_duration_ns("75µs").unwrap(), 75_000);
        assert!(parse_duration_ns("1.2.3s").is_err());
        assert!(parse_duration_ns("10").is_err());
        assert!(parse_duration_ns("10 fortnights")
            .unwrap_err()
            .to_string()
            .contains("fortnights"));
    }
}
