//! A daemon's log is how an operator learns what
//! changed and when, so every message goes through one logger with levels
//! (`-v`/`-q`, `RUST_LOG`) and UTC timestamps, and the libraries report
//! state changes through the `log` facade instead of printing. Under
//! systemd (`JOURNAL_STREAM` set) the journal adds its own timestamps, so
//! lines carry the kernel-style `<N>` priority prefix instead.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// What to log: a default level and per-target overrides (`RUST_LOG`
/// syntax, `LEVEL` or `TARGET=LEVEL`, comma separated; the longest
/// matching target prefix wins).
#[derive(Debug, PartialEq)]
pub struct LogFilter {
    default: LevelFilter,
    targets: Vec<(String, LevelFilter)>,
}

impl LogFilter {
    /// The level `-v` (`verbose` times) and `-q` (`quiet` times) give,
    /// from `info`.
    pub fn from_flags(verbose: u8, quiet: u8) -> LogFilter {
        const LEVELS: [LevelFilter; 6] = [
            LevelFilter::Off,
            LevelFilter::Error,
            LevelFilter::Warn,
            LevelFilter::Info,
            LevelFilter::Debug,
            LevelFilter::Trace,
        ];
        let index = (3 + i32::from(verbose) - i32::from(quiet)).clamp(0, 5) as usize;
        LogFilter {
            default: LEVELS[index],
            targets: Vec::new(),
        }
    }

    /// Parses `RUST_LOG`: `debug`, `iocache_engine=trace`, `warn,iocache_nbd=debug`.
    pub fn parse(text: &str) -> Result<LogFilter, String> {
        let mut filter = LogFilter {
            default: LevelFilter::Info,
            targets: Vec::new(),
        };
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let level = |t: &str| {
                t.parse::<LevelFilter>().map_err(|_| {
                    format!("RUST_LOG: `{t}` is not a level (off, error, warn, info, debug, trace)")
                })
            };
            match part.split_once('=') {
                Some((target, l)) => filter
                    .targets
                    .push((target.trim().replace('-', "_"), level(l.trim())?)),
                None => match level(part) {
                    Ok(l) => filter.default = l,
                    // A bare target name means "everything from it".
                    Err(_)
                        if part
                            .chars()
                            .all(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '-') =>
                    {
                        filter.targets.push((part.replace('-', "_"), LevelFilter::Trace))
                    }
                    Err(e) => return Err(e),
                },
            }
        }
        Ok(filter)
    }

    fn level_for(&self, target: &str) -> LevelFilter {
        self.targets
            .iter()
            .filter(|(prefix, _)| target.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or(self.default, |(_, l)| *l)
    }

    fn max(&self) -> LevelFilter {
        self.targets.iter().map(|(_, l)| *l).fold(self.default, Ord::max)
    }
}

struct StderrLogger {
    filter: LogFilter,
    journal: bool,
}

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.filter.level_for(metadata.target())
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = if self.journal {
            // sd-daemon(3) priorities: 3 error, 4 warning, 6 info, 7 debug.
            let priority = match record.level() {
                Level::Error => 3,
                Level::Warn => 4,
                Level::Info => 6,
                Level::Debug | Level::Trace => 7,
            };
            format!("<{priority}>iocache: {}\n", record.args())
        } else {
            format!(
                "{} {:<5} iocache: {}\n",
                utc_timestamp(SystemTime::now()),
                record.level(),
                record.args()
            )
        };
        // One write per line, so lines from threads do not interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// Installs the logger: `RUST_LOG` when set, else the flags' level.
pub fn init(verbose: u8, quiet: u8) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() && verbose == 0 && quiet == 0 => LogFilter::parse(&text)?,
        _ => LogFilter::from_flags(verbose, quiet),
    };
    let max = filter.max();
    let logger = StderrLogger {
        filter,
        journal: std::env::var_os("JOURNAL_STREAM").is_some(),
    };
    log::set_boxed_logger(Box::new(logger)).map_err(|e| e.to_string())?;
    log::set_max_level(max);
    Ok(())
}

/// `2026-11-24T09:30:01.123Z`.
fn utc_timestamp(now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs();
    let (days, second_of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (the era-based
/// method: 400-year eras of 146,097 days, years starting in March).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_utc_dates() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day of a century year) 12:34:56.789.
        let leap = UNIX_EPOCH + Duration::from_millis(951_827_696_789);
        assert_eq!(utc_timestamp(leap), "2000-02-29T12:34:56.789Z");
        let later = UNIX_EPOCH + Duration::from_secs(1_795_478_400);
        assert_eq!(utc_timestamp(later), "2026-11-24T00:00:00.000Z");
    }

    #[test]
    fn flags_and_rust_log_choose_levels() {
        assert_eq!(LogFilter::from_flags(0, 0).default, LevelFilter::Info);
        assert_eq!(LogFilter::from_flags(1, 0).default, LevelFilter::Debug);
        assert_eq!(LogFilter::from_flags(0, 1).default, LevelFilter::Warn);
        assert_eq!(LogFilter::from_flags(0, 9).default, LevelFilter::Off);
        let f = LogFilter::parse("warn,iocache_engine=debug,iocache_engine::raid=error").unwrap();
        assert_eq!(f.level_for("iocache"), LevelFilter::Warn);
        assert_eq!(f.level_for("iocache_engine::engine"), LevelFilter::Debug);
        assert_eq!(f.level_for("iocache_engine::raid"), LevelFilter::Error);
        assert_eq!(f.max(), LevelFilter::Debug);
        assert!(LogFilter::parse("loud=verbose").unwrap_err().contains("verbose"));
    }
}
