//! Typed errors of the policy core: bad configuration and malformed requests.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CoreError {
    #[error("line size {line_bytes} B is not a power of two between 512 B and 1 MiB")]
    BadLineSize { line_bytes: u64 },
    #[error("cache capacity must be at least one line and at most {max} lines, got {lines}")]
    BadCapacity { lines: u64, max: u64 },
    #[error("request at offset {offset_bytes} has length 0")]
    EmptyRequest { offset_bytes: u64 },
    #[error("request offset {offset_bytes} and length {length_bytes} are not multiples of 512 bytes")]
    Unaligned { offset_bytes: u64, length_bytes: u64 },
    #[error("request offset {offset_bytes} + length {length_bytes} overflows")]
    OutOfRange { offset_bytes: u64, length_bytes: u64 },
    #[error("unknown {what} `{given}`; expected one of: {expected}")]
    UnknownName {
        what: &'static str,
        given: String,
        expected: &'static str,
    },
    #[error("unknown replacement policy `{given}`; expected one of: {expected}")]
    UnknownPolicy { given: String, expected: String },
    #[error("bad parameter in `{given}`: {reason}")]
    BadParameter { given: String, reason: String },
    #[error("cannot restore slot {slot}: {reason}")]
    BadRestore { slot: u64, reason: String },
    /// A run-time setting that cannot be parsed or applied.
    #[error("{0}")]
    BadSetting(String),
}
