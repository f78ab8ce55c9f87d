//! Guessing a trace's format from its first lines.
//!
//! Users should not have to name the format of a well-known trace, but a
//! wrong guess silently produces garbage, so a format is chosen only when the
//! content is unambiguous: a recognised header (SYSTOR, CloudPhysics, fio),
//! or every sampled line having exactly one format's shape. Otherwise the
//! error lists the candidates and asks for `--format`.

use crate::bytes::{parse_fixed, parse_u64, split_sep, split_ws, strip_eol, trim};
use crate::formats::blkparse;
use crate::TraceFormat;

/// How many non-empty lines detection looks at.
pub const DETECT_LINES: usize = 20;

/// How a line fits a format's shape.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fit {
    Yes,
    No,
    /// Says nothing either way (e.g. blkparse's summary lines).
    Neutral,
}

fn fit(ok: bool) -> Fit {
    if ok {
        Fit::Yes
    } else {
        Fit::No
    }
}

fn int(s: &[u8]) -> bool {
    parse_u64(s).is_some()
}

fn number(s: &[u8]) -> bool {
    parse_fixed(s, 9).is_some() || int(s)
}

fn rw_word(s: &[u8]) -> bool {
    s.eq_ignore_ascii_case(b"read") || s.eq_ignore_ascii_case(b"write")
}

fn rw_letter(s: &[u8]) -> bool {
    matches!(s, b"R" | b"W" | b"r" | b"w")
}

fn msr(line: &[u8]) -> Fit {
    let (f, n) = split_sep::<7>(line, b',');
    fit(n == 7 && int(f[0]) && int(f[2]) && rw_word(f[3]) && int(f[4]) && int(f[5]))
}

fn tencent(line: &[u8]) -> Fit {
    let (f, n) = split_sep::<5>(line, b',');
    fit(n == 5 && number(f[0]) && int(f[1]) && int(f[2]) && matches!(f[3], b"0" | b"1") && int(f[4]))
}

fn fiu(line: &[u8]) -> Fit {
    let (f, n) = split_ws::<32>(line);
    fit((9..=32).contains(&n)
        && int(f[0])
        && int(f[1])
        && int(f[n - 6])
        && int(f[n - 5])
        && rw_letter(f[n - 4])
        && int(f[n - 3])
        && int(f[n - 2]))
}

fn disksim(line: &[u8]) -> Fit {
    let (f, n) = split_ws::<5>(line);
    fit(n == 5 && number(f[0]) && int(f[1]) && int(f[2]) && int(f[3]) && matches!(f[4], b"0" | b"1"))
}

fn arc(line: &[u8]) -> Fit {
    let (f, n) = split_ws::<4>(line);
    fit(n == 4 && f.iter().all(|s| int(s)))
}

fn blkparse_shape(line: &[u8]) -> Fit {
    let (f, n) = split_ws::<6>(line);
    if blkparse::device(f[0]).is_none() {
        return if blkparse::is_summary_line(line) || summary_detail(line) {
            Fit::Neutral
        } else {
            Fit::No
        };
    }
    let action = f[5];
    fit(n >= 6
        && int(f[1])
        && number(f[3])
        && (1..=2).contains(&action.len())
        && action.iter().all(u8::is_ascii_alphabetic))
}

/// The indented counter lines of blkparse's summary (` Reads Queued: ...`).
fn summary_detail(line: &[u8]) -> bool {
    line.first().is_some_and(|b| *b == b' ' || *b == b'\t') && line.contains(&b':')
}

fn lba(line: &[u8]) -> Fit {
    let (f, n) = split_ws::<1>(line);
    fit(n == 1 && int(f[0]))
}

fn is_header(line: &[u8], names: &[&str]) -> bool {
    let (f, n) = split_sep::<8>(line, b',');
    n == names.len()
        && f.iter()
            .zip(names)
            .all(|(field, name)| field.eq_ignore_ascii_case(name.as_bytes()))
}

/// The shape tests, one per headerless format, in the order candidates are
/// listed.
/// A shape test: how one line fits a format.
type Shape = fn(&[u8]) -> Fit;

const SHAPES: [(TraceFormat, Shape); 7] = [
    (TraceFormat::Msr, msr),
    (TraceFormat::Tencent, tencent),
    (TraceFormat::Fiu, fiu),
    (TraceFormat::Disksim, disksim),
    (TraceFormat::Arc, arc),
    (TraceFormat::BLKPARSE, blkparse_shape),
    (TraceFormat::LBA, lba),
];

fn hint() -> String {
    format!(
        "pass --format with one of: {}",
        crate::format::FORMAT_NAMES.join(", ")
    )
}

/// Guesses the format of a trace from its first lines (after
/// decompression). Empty lines are ignored and at most [`DETECT_LINES`]
/// non-empty lines are looked at. The error explains which formats could
/// match and suggests `--format`.
pub fn detect_format(first_lines: &[&str]) -> Result<TraceFormat, String> {
    let lines: Vec<&[u8]> = first_lines.iter().map(|l| l.as_bytes()).collect();
    detect_format_bytes(&lines)
}

/// [`detect_format`] on raw lines (which may still end in `\n` or `\r\n`).
pub(crate) fn detect_format_bytes(first_lines: &[&[u8]]) -> Result<TraceFormat, String> {
    let lines: Vec<&[u8]> = first_lines
        .iter()
        .map(|l| strip_eol(l))
        .filter(|l| !trim(l).is_empty())
        .take(DETECT_LINES)
        .collect();
    let Some(first) = lines.first() else {
        return Err(format!("the input has no non-empty lines; {}", hint()));
    };
    let first_trimmed = trim(first);
    if first_trimmed.starts_with(b"fio version ") {
        return Ok(TraceFormat::Fio);
    }
    if is_header(
        first_trimmed,
        &["Timestamp", "Response", "IOType", "LUN", "Offset", "Size"],
    ) {
        return Ok(TraceFormat::Systor);
    }
    if is_header(first_trimmed, &["version", "time", "op", "size", "lbn"]) {
        return Ok(TraceFormat::VscsiCsv);
    }
    if is_header(first_trimmed, &crate::formats::msr::FIELDS) {
        return Ok(TraceFormat::Msr);
    }
    // Comment lines only make sense for the lba format; leave them out.
    let sample: Vec<&[u8]> = lines
        .iter()
        .copied()
        .filter(|l| trim(l).first() != Some(&b'#'))
        .collect();
    if sample.is_empty() {
        return Err(format!("the first lines are all `#` comments; {}", hint()));
    }
    let mut full = Vec::new();
    let mut partial = Vec::new();
    for (format, shape) in SHAPES {
        let mut yes = 0;
        let mut no = 0;
        for line in &sample {
            match shape(line) {
                Fit::Yes => yes += 1,
                Fit::No => no += 1,
                Fit::Neutral => {}
            }
        }
        if yes > 0 && no == 0 {
            full.push(format);
        } else if yes > 0 {
            partial.push((format, yes));
        }
    }
    match full.as_slice() {
        [format] => Ok(*format),
        [] if partial.is_empty() => Err(format!(
            "no known format matches the first line `{}`; {}",
            crate::bytes::show(first_trimmed),
            hint()
        )),
        [] => {
            let counts: Vec<String> = partial
                .iter()
                .map(|(format, yes)| format!("{format} ({yes} of {} lines)", sample.len()))
                .collect();
            Err(format!(
                "the first lines match no single format, only partly: {}; {}",
                counts.join(", "),
                hint()
            ))
        }
        several => {
            let names: Vec<String> = several.iter().map(|f| f.to_string()).collect();
            Err(format!(
                "ambiguous: the first lines could be {}; {}",
                names.join(" or "),
                hint()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case's lines and the format they are detected as.
    fn check_detected(cases: &[(&[&str], TraceFormat)]) {
        for &(lines, expected) in cases {
            assert_eq!(detect_format(lines), Ok(expected), "{lines:?}");
        }
    }

    #[test]
    fn headers() {
        check_detected(&[
            (
                &["Timestamp,Response,IOType,LUN,Offset,Size", "1.0,0.1,R,0,0,512"],
                TraceFormat::Systor,
            ),
            (
                &["version,time,op,size,lbn\r\n", "1,5633898,2a,512,42932745"],
                TraceFormat::VscsiCsv,
            ),
            (&["", "fio version 3 iolog", "1 f add"], TraceFormat::Fio),
        ]);
    }

    #[test]
    fn shapes() {
        check_detected(&[
            (
                &["128166385295514663,hm,0,Write,9056014336,2048,2833"],
                TraceFormat::Msr,
            ),
            (
                &["1538323200,4247200,128,1,1058", "1538323199,13896880,128,0,1063"],
                TraceFormat::Tencent,
            ),
            (
                &["89312454701617 4892 syslogd 904265560 8 W 6 0 531e779e"],
                TraceFormat::Fiu,
            ),
            (
                &["938513000 4 264719034 16 0", "13.19 30 0 5 1"],
                TraceFormat::Disksim,
            ),
            (&["3050771 25 0 0", "2461851 8 0 1"], TraceFormat::Arc),
            (
                &[
                    "  8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kjournald]",
                    "  8,0    3        5     0.000004000   697  UT  N [kjournald] 1",
                    "",
                    "CPU0 (8,0):",
                    " Reads Queued:           0,        0KiB\t Writes Queued:           1,        4KiB",
                ],
                TraceFormat::BLKPARSE,
            ),
            (&["# lbas", "12", "13", "0"], TraceFormat::LBA),
        ]);
    }

    #[test]
    fn mixed_lines_are_not_guessed() {
        let err = detect_format(&["3050771 25 0 0", "938513000 4 264719034 16 0"]).unwrap_err();
        assert!(err.contains("arc (1 of 2 lines)"), "{err}");
        assert!(err.contains("disksim (1 of 2 lines)"), "{err}");
        assert!(err.contains("--format"), "{err}");
    }

    #[test]
    fn unknown() {
        let err = detect_format(&["hello world"]).unwrap_err();
        assert!(err.contains("no known format"), "{err}");
        assert!(err.contains("--format"), "{err}");
        let err = detect_format(&["", "  "]).unwrap_err();
        assert!(err.contains("no non-empty lines"), "{err}");
        // Only the first 20 non-empty lines count.
        let mut lines = vec!["1 2 0 0"; 20];
        lines.push("garbage");
        assert_eq!(detect_format(&lines), Ok(TraceFormat::Arc));
    }
}
