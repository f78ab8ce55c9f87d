//! When dirty lines are written back in the background (the ASPLOS'23 paper's
//! flushing logic, §5.3): never (`nop`), only while the cache is idle
//! (`lazy`, like Open CAS's default ALRU cleaner), or periodically whatever
//! the load (`aggressive`, like Open CAS's ACP cleaner).
//!
//! The cache only decides *when* and *what*: [`crate::Cache::next_cleaning_ns`]
//! says when the cleaner should next wake, [`crate::Cache::run_cleaner`] picks
//! the batch and emits its write-back ops. The caller sleeps (engine) or
//! advances trace time (simulator) in between.
//!
//! Defaults follow Open CAS: ACP wakes every 10 ms and flushes up to 128
//! lines (`OCF_ACP_DEFAULT_WAKE_UP`, and the 128-line batch the ASPLOS paper
//! calls "aggr-128"); ALRU waits for 10 s without requests (activity
//! threshold 10000 ms), then wakes every 20 s and flushes up to 100 lines
//! dirty for at least 120 s. OCF's ALRU defaults are for hours-long runs; for
//! short traces pass smaller values.

use std::fmt;
use std::str::FromStr;

use crate::error::CoreError;
use crate::units::{format_duration_ns, parse_duration_ns};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleaningPolicy {
    /// Dirty lines leave only when evicted or invalidated.
    Nop,
    /// Flush only after `idle_ns` without requests; then every `interval_ns`
    /// flush up to `batch_lines` lines, oldest first, that have been dirty for
    /// at least `stale_ns`.
    Lazy {
        idle_ns: u64,
        interval_ns: u64,
        batch_lines: u32,
        stale_ns: u64,
    },
    /// Every `interval_ns`, flush up to `batch_lines` of the oldest dirty lines.
    Aggressive { interval_ns: u64, batch_lines: u32 },
}

impl CleaningPolicy {
    pub const SYNTAX: &'static str = "nop, lazy[:idle=10s:interval=20s:batch=100:stale=120s] \
         or aggressive[:interval=10ms:batch=128]";

    pub fn lazy_default() -> Self {
        CleaningPolicy::Lazy {
            idle_ns: 10_000_000_000,
            interval_ns: 20_000_000_000,
            batch_lines: 100,
            stale_ns: 120_000_000_000,
        }
    }

    pub fn aggressive_default() -> Self {
        CleaningPolicy::Aggressive {
            interval_ns: 10_000_000,
            batch_lines: 128,
        }
    }
}

impl fmt::Display for CleaningPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CleaningPolicy::Nop => f.write_str("nop"),
            CleaningPolicy::Lazy {
                idle_ns,
                interval_ns,
                batch_lines,
                stale_ns,
            } => write!(
                f,
                "lazy:idle={}:interval={}:batch={batch_lines}:stale={}",
                format_duration_ns(idle_ns),
                format_duration_ns(interval_ns),
                format_duration_ns(stale_ns)
            ),
            CleaningPolicy::Aggressive {
                interval_ns,
                batch_lines,
            } => write!(
                f,
                "aggressive:interval={}:batch={batch_lines}",
                format_duration_ns(interval_ns)
            ),
        }
    }
}

impl FromStr for CleaningPolicy {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().split(':');
        let mut policy = match parts.next().unwrap_or("") {
            "nop" => CleaningPolicy::Nop,
            "lazy" => Self::lazy_default(),
            "aggressive" | "acp" => Self::aggressive_default(),
            _ => {
                return Err(CoreError::UnknownName {
                    what: "flushing policy",
                    given: s.to_string(),
                    expected: Self::SYNTAX,
                })
            }
        };
        let bad = |reason: String| CoreError::BadParameter {
            given: s.to_string(),
            reason,
        };
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not key=value")))?;
            let duration = || parse_duration_ns(value).map_err(|e| bad(format!("{key}: {e}")));
            let batch =
                || -> Result<u32, CoreError> {
                    value.parse::<u32>().ok().filter(|b| *b >= 1).ok_or_else(|| {
                        bad(format!("batch must be a line count of at least 1, got `{value}`"))
                    })
                };
            match (&mut policy, key) {
                (CleaningPolicy::Lazy { idle_ns, .. }, "idle") => *idle_ns = duration()?,
                (CleaningPolicy::Lazy { interval_ns, .. }, "interval")
                | (CleaningPolicy::Aggressive { interval_ns, .. }, "interval") => {
                    *interval_ns = duration()?.max(1)
                }
                (CleaningPolicy::Lazy { batch_lines, .. }, "batch")
                | (CleaningPolicy::Aggressive { batch_lines, .. }, "batch") => *batch_lines = batch()?,
                (CleaningPolicy::Lazy { stale_ns, .. }, "stale") => *stale_ns = duration()?,
                _ => {
                    return Err(bad(format!(
                        "unknown parameter `{key}`; expected {}",
                        Self::SYNTAX
                    )))
                }
            }
        }
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::assert_refuses;

    #[test]
    fn cleaning_policies_parse_and_print() {
        assert_eq!("nop".parse::<CleaningPolicy>().unwrap(), CleaningPolicy::Nop);
        assert_eq!(
            "aggressive".parse::<CleaningPolicy>().unwrap().to_string(),
            "aggressive:interval=10ms:batch=128"
        );
        let lazy: CleaningPolicy = "lazy:idle=1s:batch=8".parse().unwrap();
        assert_eq!(lazy.to_string(), "lazy:idle=1s:interval=20s:batch=8:stale=2m");
        assert_eq!(lazy.to_string().parse::<CleaningPolicy>().unwrap(), lazy);
        assert_refuses(
            str::parse::<CleaningPolicy>,
            &["lazy:batch=0", "aggressive:stale=1s", "eager"],
        );
    }
}
