//! Checks that the unit tests of the text forms (write and promotion
//! policies, cutoffs, sizes, durations) share: each form is parsed from what
//! an operator types and printed back the same way, so the tests state texts
//! that must round-trip or be refused rather than repeat the calls.

use std::fmt::Display;
use std::str::FromStr;

/// Asserts each text parses as a `T` that prints back as the same text.
pub(crate) fn assert_round_trips<T>(texts: &[&str])
where
    T: FromStr + Display,
    T::Err: Display,
{
    for text in texts {
        match text.parse::<T>() {
            Ok(value) => assert_eq!(value.to_string(), *text),
            Err(e) => panic!("{text}: {e}"),
        }
    }
}

/// Asserts `parse` refuses each text.
pub(crate) fn assert_refuses<T, E>(parse: impl Fn(&str) -> Result<T, E>, texts: &[&str]) {
    for text in texts {
        assert!(parse(text).is_err(), "{text}");
    }
}

/// Asserts `parse` refuses `text` with a message that quotes `quoted`.
pub(crate) fn assert_refusal_names<T, E: Display>(
    parse: impl Fn(&str) -> Result<T, E>,
    text: &str,
    quoted: &str,
) {
    match parse(text) {
        Ok(_) => panic!("{text} was accepted"),
        Err(e) => assert!(e.to_string().contains(quoted), "{text}: {e}"),
    }
}
