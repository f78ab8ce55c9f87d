//! Typed errors for opening, detecting and parsing traces.
//!
//! Every error names the input it came from; parse errors also give the
//! 1-based line number (of the decompressed text) and the field, using the
//! trace format's own field names, so a user can find and fix the line.

use std::fmt;

/// An error while opening or reading a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading or decompressing the input failed.
    #[error("{path}: {source}")]
    Io {
        /// The file name (or the name given to [`crate::TraceReader::from_reader`]).
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Reading stopped part-way: a compressed input that ends inside a
    /// frame (a copy cut short), or a read error after some requests.
    #[error("{path}: {} after {records} requests (line {line}): {source}", stop_word(*.truncated))]
    Interrupted {
        /// The file name.
        path: String,
        /// Whether the input looks cut short (rather than unreadable).
        truncated: bool,
        /// Requests read before the error.
        records: u64,
        /// Lines read before the error.
        line: u64,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A malformed line.
    #[error("{path}:{line}: field `{field}`: {reason}")]
    Parse {
        /// The file name.
        path: String,
        /// 1-based line number in the decompressed text.
        line: u64,
        /// The field at fault, named as in the format's documentation
        /// (`line` when the whole line is at fault, e.g. too many fields).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The format could not be determined from the content.
    #[error("{path}: cannot determine the trace format: {reason}")]
    UnknownFormat {
        /// The file name.
        path: String,
        /// Which formats could match (if any) and a hint to pass `--format`.
        reason: String,
    },
}

/// The error from parsing a format name (see [`crate::TraceFormat`]'s
/// `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FormatNameError(pub(crate) String);

/// A problem with one field of one line, before the reader adds the path and
/// line number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub(crate) field: &'static str,
    pub(crate) reason: String,
}

impl FieldError {
    #[cold]
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        FieldError {
            field,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field `{}`: {}", self.field, self.reason)
    }
}

/// How [`TraceError::Interrupted`] names its stop.
fn stop_word(truncated: bool) -> &'static str {
    if truncated {
        "truncated"
    } else {
        "read failed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        let e = TraceError::Parse {
            path: "t.csv".into(),
            line: 3,
            field: "Offset",
            reason: "expected an unsigned integer, found `abc`".into(),
        };
        assert_eq!(
            e.to_string(),
            "t.csv:3: field `Offset`: expected an unsigned integer, found `abc`"
        );
        let e = TraceError::UnknownFormat {
            path: "x".into(),
            reason: "why".into(),
        };
        assert_eq!(e.to_string(), "x: cannot determine the trace format: why");
    }
}
