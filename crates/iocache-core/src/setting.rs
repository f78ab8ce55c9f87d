//! The knobs an operator (`iocache ctl set`), an
//! experiment (`iocache sim --reconfigure`) or a controller changes while a
//! cache serves must be named, parsed and applied the same way everywhere,
//! with the names and value syntax of the configuration file's volume table
//! (docs/config.md). A [`Setting`] is one `key=value`; [`Cache::apply`]
//! applies it to a running cache; [`Cache::settings`] lists the current
//! values in the same syntax.

use std::fmt;
use std::str::FromStr;

use crate::cache::Cache;
use crate::cleaning::CleaningPolicy;
use crate::config::{CacheConfig, Fill, Promotion, WritePolicy};
use crate::error::CoreError;
use crate::policy::PolicySpec;
use crate::readahead::Readahead;
use crate::seq_cutoff::SeqCutoff;

/// One knob and its new value.
#[derive(Clone, Debug, PartialEq)]
pub enum Setting {
    /// `write_policy`: `wb wt wi wa wo pt`.
    WritePolicy(WritePolicy),
    /// `promotion`: `always`, `nhit:N[:trigger=P]`.
    Promotion(Promotion),
    /// `policy`: a replacement policy with parameters (`iocache policies`).
    Policy(PolicySpec),
    /// `flush`: `nop`, `lazy[:...]`, `aggressive[:...]`.
    Flush(CleaningPolicy),
    /// `write_miss_bypass`: `true` or `false`.
    WriteMissBypass(bool),
    /// `seq_cutoff`: `off` or `BYTES[:streams=N]`.
    SeqCutoff(SeqCutoff),
    /// `max_dirty_lines`: a number of lines, or `off`.
    MaxDirtyLines(Option<u64>),
    /// `readahead`: `off` or `seq[:min=SIZE][:max=SIZE][:streams=N]`.
    Readahead(Readahead),
    /// `fill`: `request` or `line`.
    Fill(Fill),
    /// `cache_size`: the bytes of lines in service (whole lines; at most
    /// the capacity the cache was built with). See [`Cache::resize`].
    CacheSize(u64),
}

impl Setting {
    /// Every key, in the order [`Cache::settings`] lists them.
    pub const KEYS: [&'static str; 10] = [
        "write_policy",
        "promotion",
        "policy",
        "flush",
        "write_miss_bypass",
        "seq_cutoff",
        "max_dirty_lines",
        "readahead",
        "fill",
        "cache_size",
    ];

    /// Parses `value` for `key`; the error names the key, the value and
    /// what is expected.
    pub fn parse(key: &str, value: &str) -> Result<Setting, CoreError> {
        let bad = |why: String| CoreError::BadSetting(format!("{key}=`{value}`: {why}"));
        let value = value.trim();
        Ok(match key {
            "write_policy" => Setting::WritePolicy(value.parse().map_err(|e: CoreError| bad(e.to_string()))?),
            "promotion" => Setting::Promotion(value.parse().map_err(|e: CoreError| bad(e.to_string()))?),
            "policy" => Setting::Policy(value.parse().map_err(|e: CoreError| bad(e.to_string()))?),
            "flush" => Setting::Flush(value.parse().map_err(|e: CoreError| bad(e.to_string()))?),
            "seq_cutoff" => Setting::SeqCutoff(value.parse().map_err(|e: CoreError| bad(e.to_string()))?),
            "readahead" => Setting::Readahead(value.parse().map_err(|e: CoreError| bad(e.to_string()))?),
            "fill" => Setting::Fill(value.parse().map_err(|e: CoreError| bad(e.to_string()))?),
            "write_miss_bypass" => Setting::WriteMissBypass(match value {
                "true" | "on" => true,
                "false" | "off" => false,
                _ => return Err(bad("expected true or false".into())),
            }),
            "max_dirty_lines" => Setting::MaxDirtyLines(match value {
                "off" | "none" => None,
                n => Some(
                    n.parse::<u64>()
                        .map_err(|_| bad("expected a number of lines or off".into()))?,
                ),
            }),
            "cache_size" => {
                Setting::CacheSize(crate::units::parse_byte_size(value).map_err(|e| bad(e.to_string()))?)
            }
            other => {
                return Err(CoreError::BadSetting(format!(
                    "unknown setting `{other}`: the settings are {}",
                    Setting::KEYS.join(", ")
                )))
            }
        })
    }

    /// The key it sets.
    pub fn key(&self) -> &'static str {
        match self {
            Setting::WritePolicy(_) => "write_policy",
            Setting::Promotion(_) => "promotion",
            Setting::Policy(_) => "policy",
            Setting::Flush(_) => "flush",
            Setting::WriteMissBypass(_) => "write_miss_bypass",
            Setting::SeqCutoff(_) => "seq_cutoff",
            Setting::MaxDirtyLines(_) => "max_dirty_lines",
            Setting::Readahead(_) => "readahead",
            Setting::Fill(_) => "fill",
            Setting::CacheSize(_) => "cache_size",
        }
    }

    /// The value in the syntax [`Setting::parse`] reads.
    pub fn value_text(&self) -> String {
        match self {
            Setting::WritePolicy(p) => p.to_string(),
            Setting::Promotion(p) => p.to_string(),
            Setting::Policy(p) => p.to_string(),
            Setting::Flush(c) => c.to_string(),
            Setting::WriteMissBypass(b) => b.to_string(),
            Setting::SeqCutoff(s) => s.to_string(),
            Setting::MaxDirtyLines(None) => "off".into(),
            Setting::MaxDirtyLines(Some(n)) => n.to_string(),
            Setting::Readahead(r) => r.to_string(),
            Setting::Fill(f) => f.to_string(),
            Setting::CacheSize(bytes) => crate::units::format_byte_size(*bytes),
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key(), self.value_text())
    }
}

impl FromStr for Setting {
    type Err = CoreError;
    /// `key=value`.
    fn from_str(s: &str) -> Result<Setting, CoreError> {
        let (key, value) = s
            .split_once('=')
            .ok_or_else(|| CoreError::BadSetting(format!("`{s}`: expected KEY=VALUE")))?;
        Setting::parse(key.trim(), value)
    }
}

impl Cache {
    /// Applies one setting at `now_ns`, without dropping a cached or dirty
    /// line: a write policy that keeps no dirty data leaves existing dirty
    /// lines dirty (served, and written back by cleaning or a flush); a new
    /// replacement policy is built from the cached lines
    /// ([`Cache::set_replacement_policy`]).
    pub fn apply(&mut self, setting: &Setting, now_ns: u64) -> Result<(), CoreError> {
        match setting {
            Setting::WritePolicy(p) if self.config().ordered_write_back && !p.keeps_dirty() => {
                return Err(CoreError::BadSetting(format!(
                    "write_policy={p}: ordered write-back keeps writes in the cache (wb or wo)"
                )));
            }
            Setting::WritePolicy(p) => self.set_write_policy(*p),
            Setting::Promotion(p) => self.set_promotion(*p),
            Setting::Policy(spec) => self.set_replacement_policy(spec.clone(), now_ns)?,
            Setting::Flush(c) => self.set_cleaning(*c),
            Setting::WriteMissBypass(b) => self.set_write_miss_bypass(*b),
            Setting::SeqCutoff(s) => self.set_seq_cutoff(*s),
            Setting::MaxDirtyLines(cap) => self.set_max_dirty_lines(*cap),
            Setting::Readahead(r) => self.set_readahead(*r),
            Setting::Fill(f) => self.set_fill(*f),
            Setting::CacheSize(bytes) => self.resize_counted(bytes / self.line_size().bytes(), now_ns)?,
        }
        Ok(())
    }

    /// The current value of every setting, in [`Setting::KEYS`] order.
    pub fn settings(&self) -> Vec<Setting> {
        Setting::all_of(self.config())
    }
}

impl Setting {
    /// The value of every setting in `c`, in [`Setting::KEYS`] order.
    pub fn all_of(c: &CacheConfig) -> Vec<Setting> {
        vec![
            Setting::WritePolicy(c.write_policy),
            Setting::Promotion(c.promotion),
            Setting::Policy(c.policy.clone()),
            Setting::Flush(c.cleaning),
            Setting::WriteMissBypass(c.write_miss_bypass),
            Setting::SeqCutoff(c.seq_cutoff),
            Setting::MaxDirtyLines(c.max_dirty_lines),
            Setting::Readahead(c.readahead),
            Setting::Fill(c.fill),
            Setting::CacheSize(c.lines_in_service() * c.line_size.bytes()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LineSize;

    #[test]
    fn every_setting_round_trips_through_its_text() {
        for text in [
            "write_policy=wt",
            "promotion=nhit:2",
            "policy=s3fifo:small=0.2",
            "flush=aggressive",
            "write_miss_bypass=true",
            "seq_cutoff=1MiB:streams=4",
            "max_dirty_lines=100",
            "max_dirty_lines=off",
            "readahead=seq:min=64KiB:max=1MiB:streams=16",
            "fill=line",
            "promotion=second-hit",
            "promotion=write-rate:10MiB/s",
        ] {
            let s: Setting = text.parse().unwrap();
            let again: Setting = s.to_string().parse().unwrap();
            assert_eq!(s, again, "{text}");
        }
        let err = "colour=blue".parse::<Setting>().unwrap_err().to_string();
        assert!(
            err.contains("unknown setting `colour`") && err.contains("write_policy"),
            "{err}"
        );
        let err = "write_policy=wz".parse::<Setting>().unwrap_err().to_string();
        assert!(err.contains("write_policy=`wz`"), "{err}");
        let err = "max_dirty_lines=lots".parse::<Setting>().unwrap_err().to_string();
        assert!(err.contains("a number of lines or off"), "{err}");
    }

    #[test]
    fn applied_settings_are_listed() {
        let mut c = Cache::new(CacheConfig::new(
            16,
            LineSize::new(4096).unwrap(),
            PolicySpec::lru(),
        ))
        .unwrap();
        for text in [
            "write_policy=wa",
            "policy=arc",
            "max_dirty_lines=3",
            "seq_cutoff=64KiB",
        ] {
            c.apply(&text.parse().unwrap(), 0).unwrap();
        }
        let listed: Vec<String> = c.settings().iter().map(ToString::to_string).collect();
        assert!(listed.contains(&"write_policy=wa".to_string()), "{listed:?}");
        assert!(listed.contains(&"policy=arc".to_string()), "{listed:?}");
        assert!(listed.contains(&"max_dirty_lines=3".to_string()), "{listed:?}");
        assert_eq!(listed.len(), Setting::KEYS.len());
    }
}
