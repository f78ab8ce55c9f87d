//! What to simulate: the combinations of policy × cache size (× line size) and
//! the settings shared by all of them.

use std::fmt;
use std::str::FromStr;

use iocache_core::units::{format_byte_size, parse_byte_size};
use iocache_core::{
    CacheConfig, CleaningPolicy, Fill, LineSize, PolicySpec, Promotion, Readahead, SeqCutoff, WritePolicy,
};

use crate::error::SimError;

/// A cache size as the user gave it: a number of lines, or bytes with a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheSize {
    Lines(u64),
    Bytes(u64),
}

impl CacheSize {
    /// Lines of `line` bytes; a byte size must hold at least one line.
    pub fn lines(self, line: LineSize) -> Result<u64, SimError> {
        let lines = match self {
            CacheSize::Lines(n) => n,
            CacheSize::Bytes(b) => b / line.bytes(),
        };
        if lines == 0 {
            return Err(SimError::Spec(format!(
                "cache size {self} holds no {}-byte line",
                line.bytes()
            )));
        }
        Ok(lines)
    }
}

impl fmt::Display for CacheSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheSize::Lines(n) => write!(f, "{n}"),
            CacheSize::Bytes(b) => f.write_str(&format_byte_size(*b)),
        }
    }
}

impl FromStr for CacheSize {
    type Err = SimError;
    /// A bare number is a line count; a number with a unit is bytes.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            let n = t
                .parse()
                .map_err(|_| SimError::Spec(format!("cache size `{s}` is too large")))?;
            return Ok(CacheSize::Lines(n));
        }
        parse_byte_size(t)
            .map(CacheSize::Bytes)
            .map_err(|e| SimError::Spec(format!("cache size: {e}")))
    }
}

/// When statistics start counting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Warmup {
    None,
    /// The first N requests only warm the cache.
    Requests(u64),
    /// This fraction of the trace's requests only warms the cache (needs the count first).
    Fraction(f64),
}

impl FromStr for Warmup {
    type Err = SimError;
    /// `0.2` (a fraction below 1) or `100000` (a request count).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Ok(n) = t.parse::<u64>() {
            return Ok(if n == 0 { Warmup::None } else { Warmup::Requests(n) });
        }
        match t.parse::<f64>() {
            Ok(0.0) => Ok(Warmup::None),
            Ok(f) if (0.0..1.0).contains(&f) => Ok(Warmup::Fraction(f)),
            _ => Err(SimError::Spec(format!(
                "warmup `{s}` is neither a fraction in [0, 1) nor a request count"
            ))),
        }
    }
}

/// Settings shared by every simulated cache of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheSettings {
    pub write_policy: WritePolicy,
    pub promotion: Promotion,
    pub cleaning: CleaningPolicy,
    pub write_miss_bypass: bool,
    pub seq_cutoff: SeqCutoff,
    pub readahead: Readahead,
    pub fill: Fill,
}

impl Default for CacheSettings {
    fn default() -> Self {
        CacheSettings {
            write_policy: WritePolicy::WriteBack,
            promotion: Promotion::Always,
            cleaning: CleaningPolicy::Nop,
            write_miss_bypass: false,
            seq_cutoff: SeqCutoff::Off,
            readahead: Readahead::Off,
            fill: Fill::Request,
        }
    }
}

/// One simulated cache.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub policy: PolicySpec,
    pub size: CacheSize,
    pub capacity_lines: u64,
    pub line_size: LineSize,
    pub settings: CacheSettings,
}

impl RunSpec {
    pub fn cache_config(&self) -> CacheConfig {
        let s = &self.settings;
        CacheConfig {
            capacity_lines: self.capacity_lines,
            line_size: self.line_size,
            write_policy: s.write_policy,
            promotion: s.promotion,
            policy: self.policy.clone(),
            cleaning: s.cleaning,
            write_miss_bypass: s.write_miss_bypass,
            seq_cutoff: s.seq_cutoff,
            readahead: s.readahead,
            fill: s.fill,
            // As the papers model it: a miss may evict and write back a dirty line.
            inline_dirty_eviction: true,
            max_dirty_lines: None,
            // Traces carry no FLUSH: every line would be of one epoch.
            ordered_write_back: false,
            lines_in_service: None,
        }
    }
}

/// Every combination of the given policies, sizes and line sizes, in that nesting order.
pub fn combinations(
    policies: &[PolicySpec],
    sizes: &[CacheSize],
    line_sizes: &[LineSize],
    settings: &CacheSettings,
) -> Result<Vec<RunSpec>, SimError> {
    let mut runs = Vec::new();
    for policy in policies {
        for &size in sizes {
            for &line_size in line_sizes {
                runs.push(RunSpec {
                    policy: policy.clone(),
                    size,
                    capacity_lines: size.lines(line_size)?,
                    line_size,
                    settings: settings.clone(),
                });
            }
        }
    }
    if runs.is_empty() {
        return Err(SimError::Spec(
            "nothing to simulate: give at least one policy and size".into(),
        ));
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_lines_or_bytes() {
        let line = LineSize::new(512).unwrap();
        assert_eq!("32768".parse::<CacheSize>().unwrap().lines(line).unwrap(), 32768);
        assert_eq!("16MiB".parse::<CacheSize>().unwrap().lines(line).unwrap(), 32768);
        assert!("100B".parse::<CacheSize>().unwrap().lines(line).is_err());
        assert!("lots".parse::<CacheSize>().is_err());
    }

    #[test]
    fn warmup_parses() {
        assert_eq!("0.25".parse::<Warmup>().unwrap(), Warmup::Fraction(0.25));
        assert_eq!("1000".parse::<Warmup>().unwrap(), Warmup::Requests(1000));
        assert_eq!("0".parse::<Warmup>().unwrap(), Warmup::None);
        assert_eq!("0.0".parse::<Warmup>().unwrap(), Warmup::None);
        assert!("1.5".parse::<Warmup>().is_err());
        assert!("-1".parse::<Warmup>().is_err());
    }
}
