//! Property tests on hostile input, built on the same idea as a fuzzer: whatever
//! the bytes, a reader never panics, never loops, reports errors with a line
//! number inside the input, and in skip mode accounts for every line.

use iocache_trace::{ReaderOptions, TraceError, TraceFormat, TraceReader, FORMAT_NAMES};
use proptest::prelude::*;

/// Every format name, and one with an option.
fn formats() -> impl Iterator<Item = &'static str> {
    FORMAT_NAMES.iter().copied().chain(["lba:block=4096"])
}

fn reader(bytes: &[u8], format: Option<TraceFormat>, skip: bool) -> Result<TraceReader, TraceError> {
    TraceReader::from_bytes("fuzz", bytes, format, ReaderOptions { skip_bad_lines: skip })
}

/// Lines made of the tokens trace formats are built from, so that many are almost valid.
fn tokenish_line() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("0".to_string()),
        Just("512".to_string()),
        Just("18446744073709551615".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("-1".to_string()),
        Just("1.5".to_string()),
        Just("R".to_string()),
        Just("W".to_string()),
        Just("Read".to_string()),
        Just("Write".to_string()),
        Just("2a".to_string()),
        Just("28".to_string()),
        Just("8,0".to_string()),
        Just("Q".to_string()),
        Just("+".to_string()),
        Just("[p]".to_string()),
        Just("/dev/sda".to_string()),
        Just("read".to_string()),
        Just("write".to_string()),
        Just("wait".to_string()),
        Just("fio version 2 iolog".to_string()),
        Just("fio version 3 iolog".to_string()),
        Just("Timestamp,Response,IOType,LUN,Offset,Size".to_string()),
        Just("version,time,op,size,lbn".to_string()),
        "[a-z0-9]{0,6}",
    ];
    let sep = prop_oneof![Just(","), Just(" "), Just("  "), Just("\t")];
    prop::collection::vec((token, sep), 0..10).prop_map(|parts| {
        let mut line = String::new();
        for (token, sep) in parts {
            line.push_str(&token);
            line.push_str(sep);
        }
        line
    })
}

fn drain(reader: &mut TraceReader, input_lines: u64) -> Result<(), TestCaseError> {
    let mut items = 0u64;
    for item in reader.by_ref() {
        items += 1;
        prop_assert!(items <= input_lines + 1, "more items than lines");
        if let Err(TraceError::Parse { line, .. }) = item {
            prop_assert!(
                line >= 1 && line <= input_lines.max(1),
                "line {line} of {input_lines}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), skip in any::<bool>()) {
        let lines = bytes.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
        if let Ok(mut r) = reader(&bytes, None, skip) {
            drain(&mut r, lines)?;
        }
        for name in formats() {
            let format: TraceFormat = name.parse().unwrap();
            if let Ok(mut r) = reader(&bytes, Some(format), skip) {
                drain(&mut r, lines)?;
            }
        }
    }

    #[test]
    fn almost_valid_lines_are_parsed_or_reported(lines in prop::collection::vec(tokenish_line(), 1..30)) {
        let text = lines.join("\n") + "\n";
        let total = lines.len() as u64;
        for name in formats() {
            let format: TraceFormat = name.parse().unwrap();
            // Strict mode: at most one error, and it ends the iteration.
            if let Ok(mut r) = reader(text.as_bytes(), Some(format), false) {
                let items: Vec<_> = r.by_ref().collect();
                let errors = items.iter().filter(|i| i.is_err()).count();
                prop_assert!(errors <= 1);
                if errors == 1 {
                    prop_assert!(items.last().unwrap().is_err(), "iteration continued after an error");
                }
            }
            // Skip mode: every non-empty line is a record, ignored, skipped or a header.
            if let Ok(mut r) = reader(text.as_bytes(), Some(format), true) {
                let mut records = 0u64;
                for item in r.by_ref() {
                    prop_assert!(item.is_ok(), "skip mode yielded an error: {:?}", item);
                    records += 1;
                }
                prop_assert!(records + r.skipped_lines() + r.ignored_records() <= total);
            }
        }
    }
}
