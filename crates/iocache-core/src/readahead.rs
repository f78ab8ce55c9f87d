//! Readahead: a read that continues a sequential stream has the lines after
//! it brought into the cache before they are asked for. This module decides
//! what to fetch; the driver fetches it through [`crate::Cache::access_with`]
//! with [`crate::AccessHints::prefetch`] (the simulator at once, the engine
//! in the background).
//!
//! Streams are found by the sequential cutoff's detector
//! ([`crate::seq_cutoff::StreamTable`]). Each stream's window grows as
//! Linux's readahead does (doubling each time the reads reach the window's
//! second half, from `min` up to a cap), and the cap adapts as AMP does
//! (Gill and Bathen, FAST'07): one line more each time a stream consumes
//! everything fetched for it, one line less for each fetched line evicted
//! or dropped before any use.

use std::fmt;
use std::str::FromStr;

use crate::addr::{IoKind, LineSize, Request};
use crate::error::CoreError;
use crate::seq_cutoff::{parse_streams, StreamTable};
use crate::units::{format_byte_size, parse_byte_size};

/// The readahead knob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readahead {
    Off,
    /// Sequential readahead: windows of `min_bytes` up to an adaptive cap
    /// of at most `max_bytes`, for up to `streams` concurrent streams.
    Sequential {
        min_bytes: u64,
        max_bytes: u64,
        streams: u32,
    },
}

impl Readahead {
    pub const SYNTAX: &'static str =
        "off, or seq with optional min=SIZE, max=SIZE and streams=N: seq:min=64KiB:max=1MiB";

    /// `seq` without parameters.
    pub const SEQUENTIAL: Readahead = Readahead::Sequential {
        min_bytes: 64 << 10,
        max_bytes: 1 << 20,
        streams: 16,
    };
}

impl fmt::Display for Readahead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Readahead::Off => f.write_str("off"),
            Readahead::Sequential {
                min_bytes,
                max_bytes,
                streams,
            } => write!(
                f,
                "seq:min={}:max={}:streams={streams}",
                format_byte_size(min_bytes),
                format_byte_size(max_bytes)
            ),
        }
    }
}

impl FromStr for Readahead {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| CoreError::BadParameter {
            given: s.to_string(),
            reason,
        };
        let t = s.trim();
        if t == "off" {
            return Ok(Readahead::Off);
        }
        let mut parts = t.split(':');
        if parts.next() != Some("seq") {
            return Err(CoreError::UnknownName {
                what: "readahead",
                given: s.to_string(),
                expected: Self::SYNTAX,
            });
        }
        let Readahead::Sequential {
            mut min_bytes,
            mut max_bytes,
            mut streams,
        } = Self::SEQUENTIAL
        else {
            unreachable!("the default is sequential")
        };
        let mut max_given = false;
        for part in parts {
            let size =
                |v: &str| parse_byte_size(v).map_err(|e| bad(format!("{e}; expected {}", Self::SYNTAX)));
            match part.split_once('=') {
                Some(("min", v)) => min_bytes = size(v)?,
                Some(("max", v)) => {
                    max_bytes = size(v)?;
                    max_given = true;
                }
                Some(("streams", n)) => streams = parse_streams(n).map_err(bad)?,
                _ => {
                    return Err(bad(format!(
                        "unknown parameter `{part}`; expected {}",
                        Self::SYNTAX
                    )))
                }
            }
        }
        if min_bytes == 0 {
            return Err(bad("min must be above 0".into()));
        }
        if !max_given {
            max_bytes = max_bytes.max(min_bytes);
        }
        if max_bytes < min_bytes {
            return Err(bad(format!(
                "max ({}) is below min ({})",
                format_byte_size(max_bytes),
                format_byte_size(min_bytes)
            )));
        }
        if max_bytes > 1 << 30 {
            return Err(bad("max must be at most 1GiB".into()));
        }
        Ok(Readahead::Sequential {
            min_bytes,
            max_bytes,
            streams,
        })
    }
}

/// Per stream: how far ahead has been fetched and the current window.
#[derive(Clone, Copy, Debug, Default)]
struct Ahead {
    until_bytes: u64,
    window_bytes: u64,
}

/// What the cache reports back about fetched lines (cumulative, from
/// [`crate::CacheStats`]): the cap adapts to their change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadaheadFeedback {
    /// Fetched lines used (read or written) before they left the cache.
    pub used_lines: u64,
    /// Fetched lines that left the cache unused.
    pub unused_lines: u64,
}

/// The readahead decisions of one driver.
#[derive(Clone, Debug)]
pub struct Readaheader {
    config: Readahead,
    line: LineSize,
    /// The window's bounds in whole lines' bytes (at least one line).
    min_bytes: u64,
    max_bytes: u64,
    table: StreamTable<Ahead>,
    /// The adaptive cap on a window, in bytes (whole lines, `min..=max`).
    cap_bytes: u64,
    seen: ReadaheadFeedback,
}

impl Readaheader {
    pub fn new(config: Readahead, line: LineSize) -> Self {
        let streams = match config {
            Readahead::Off => 1,
            Readahead::Sequential { streams, .. } => streams as usize,
        };
        let (min_bytes, max_bytes) = match config {
            Readahead::Off => (0, 0),
            Readahead::Sequential {
                min_bytes, max_bytes, ..
            } => {
                let up = |b: u64| b.div_ceil(line.bytes()).max(1) * line.bytes();
                (up(min_bytes), up(max_bytes))
            }
        };
        Readaheader {
            config,
            line,
            min_bytes,
            max_bytes,
            table: StreamTable::new(streams),
            cap_bytes: max_bytes,
            seen: ReadaheadFeedback::default(),
        }
    }

    pub fn config(&self) -> Readahead {
        self.config
    }

    /// The line size it fetches whole lines of.
    pub fn line(&self) -> LineSize {
        self.line
    }

    /// The current cap on a window (AMP's degree), in bytes.
    pub fn cap_bytes(&self) -> u64 {
        self.cap_bytes
    }

    /// Records `request` and says what to fetch after it, if anything: a
    /// read of whole lines past what the stream has already had fetched.
    /// `feedback` is the cache's running count of fetched lines used and
    /// unused. Writes and single reads fetch nothing; the caller clamps the
    /// range to the volume's end.
    pub fn on_request(&mut self, request: &Request, feedback: ReadaheadFeedback) -> Option<Request> {
        if self.config == Readahead::Off || request.kind != IoKind::Read || request.length_bytes == 0 {
            return None;
        }
        let (min, max, line) = (self.min_bytes, self.max_bytes, self.line.bytes());
        let unused = feedback.unused_lines.saturating_sub(self.seen.unused_lines);
        if unused > 0 {
            self.cap_bytes = self
                .cap_bytes
                .saturating_sub(unused.saturating_mul(line))
                .max(min);
        }
        self.seen = feedback;
        let stream = self.table.observe(request);
        if stream.requests < 2 {
            return None;
        }
        let end = stream.next_offset_bytes;
        let ahead = &mut stream.state;
        let (from, to) = if ahead.until_bytes <= end {
            if ahead.until_bytes > 0 {
                // Everything fetched was consumed: the stream earns a line
                // of cap, and its window doubles.
                self.cap_bytes = (self.cap_bytes + line).min(max);
                ahead.window_bytes = (ahead.window_bytes * 2).clamp(min, self.cap_bytes);
            } else {
                ahead.window_bytes = min.min(self.cap_bytes);
            }
            let from = end.div_ceil(line) * line;
            (from, from + ahead.window_bytes)
        } else if end + ahead.window_bytes / 2 >= ahead.until_bytes {
            // The reads reached the window's second half: the next window,
            // twice as large, starts where this one ends.
            ahead.window_bytes = (ahead.window_bytes * 2).clamp(min, self.cap_bytes);
            (ahead.until_bytes, ahead.until_bytes + ahead.window_bytes)
        } else {
            return None;
        };
        ahead.until_bytes = to;
        Some(Request {
            volume: request.volume,
            offset_bytes: from,
            length_bytes: to - from,
            kind: IoKind::Read,
            now_ns: request.now_ns,
            process: request.process,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::assert_refuses;

    fn line() -> LineSize {
        LineSize::new(4096).unwrap()
    }

    #[test]
    fn parses_and_prints() {
        assert_eq!("off".parse::<Readahead>().unwrap(), Readahead::Off);
        assert_eq!("seq".parse::<Readahead>().unwrap(), Readahead::SEQUENTIAL);
        let r: Readahead = "seq:min=16KiB:max=256KiB:streams=4".parse().unwrap();
        assert_eq!(r.to_string(), "seq:min=16KiB:max=256KiB:streams=4");
        assert_eq!(r.to_string().parse::<Readahead>().unwrap(), r);
        // A min above the default max raises the max unless one is given.
        assert_eq!(
            "seq:min=4MiB".parse::<Readahead>().unwrap().to_string(),
            "seq:min=4MiB:max=4MiB:streams=16"
        );
        assert_refuses(
            str::parse::<Readahead>,
            &[
                "seq:min=0",
                "seq:min=1MiB:max=64KiB",
                "seq:depth=3",
                "ahead",
                "seq:streams=0",
                "seq:max=2GiB",
            ],
        );
    }

    #[test]
    fn a_stream_gets_windows_that_double_up_to_the_cap() {
        let mut r = Readaheader::new("seq:min=16KiB:max=64KiB".parse().unwrap(), line());
        let none = ReadaheadFeedback::default();
        let read = |i: u64| Request::read(0, i * 4096, 4096, i);
        assert_eq!(r.on_request(&read(0), none), None, "one read is not a stream");
        let first = r.on_request(&read(1), none).unwrap();
        assert_eq!((first.offset_bytes, first.length_bytes), (8192, 16384));
        // Reads inside the first half of the window fetch nothing.
        assert_eq!(r.on_request(&read(2), none), None);
        // Ends at 16 KiB: within half a window (8 KiB) of 24 KiB.
        let second = r.on_request(&read(3), none).unwrap();
        assert_eq!((second.offset_bytes, second.length_bytes), (24576, 32768));
        let mut fetched_until = second.offset_bytes + second.length_bytes;
        let mut largest = 0;
        for i in 4..200 {
            if let Some(f) = r.on_request(&read(i), none) {
                assert_eq!(f.offset_bytes, fetched_until, "windows follow one another");
                fetched_until += f.length_bytes;
                largest = largest.max(f.length_bytes);
            }
            assert!(
                fetched_until > (i + 1) * 4096,
                "the fetch stays ahead of the reads"
            );
        }
        assert_eq!(largest, 65536);
        // Writes are no readahead stream.
        assert_eq!(r.on_request(&Request::write(0, 0, 4096, 0), none), None);
    }

    #[test]
    fn unused_lines_shrink_the_cap_and_consumed_windows_grow_it() {
        let mut r = Readaheader::new("seq:min=8KiB:max=64KiB".parse().unwrap(), line());
        assert_eq!(r.cap_bytes(), 65536);
        let read = |i: u64| Request::read(0, i * 4096, 4096, i);
        r.on_request(&read(0), ReadaheadFeedback::default());
        let wasted = ReadaheadFeedback {
            used_lines: 0,
            unused_lines: 10,
        };
        r.on_request(&read(1), wasted);
        assert_eq!(r.cap_bytes(), 65536 - 10 * 4096);
        r.on_request(&read(2), wasted);
        assert_eq!(r.cap_bytes(), 65536 - 10 * 4096, "only new waste counts");
        let more = ReadaheadFeedback {
            used_lines: 0,
            unused_lines: 1000,
        };
        r.on_request(&read(3), more);
        assert_eq!(r.cap_bytes(), 8192, "never below min");
        // A stream that jumps past its fetched window consumed it: +1 line.
        let mut r = Readaheader::new("seq:min=8KiB:max=64KiB".parse().unwrap(), line());
        r.on_request(&read(0), more);
        r.on_request(&read(1), more);
        let cap = r.cap_bytes();
        assert_eq!(
            r.on_request(&Request::read(0, 8192, 8192, 2), more)
                .map(|f| f.offset_bytes),
            Some(16384)
        );
        assert_eq!(r.cap_bytes(), (cap + 4096).min(65536));
    }
}
