//! Cache configuration: write policy, promotion policy and the settings that shape a cache.

use std::fmt;
use std::str::FromStr;

use crate::addr::LineSize;
use crate::cleaning::CleaningPolicy;
use crate::error::CoreError;
use crate::policy::PolicySpec;
use crate::seq_cutoff::SeqCutoff;

/// What happens to writes (and whether read misses are inserted).
///
/// The names follow Open CAS where they overlap; `wa` is the papers' "read-only"
/// cache (ReCA, TPDS'18), `wi` is the SYSTOR'14 paper's write-invalidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WritePolicy {
    /// Write-back: writes go to the cache only and are written back later.
    WriteBack,
    /// Write-through: writes go to the backend and are also kept in the cache, clean.
    WriteThrough,
    /// Write-invalidate: writes go to the backend and drop the whole cached line
    /// ("the write invalidates the cached block", SYSTOR'14 §3).
    WriteInvalidate,
    /// Write-around (read-only cache): writes go to the backend and invalidate
    /// only the sectors they overwrite; reads are cached.
    WriteAround,
    /// Write-only: writes are cached as in write-back; read misses are not inserted.
    WriteOnly,
    /// Pass-through: nothing is inserted; reads of dirty sectors still come from the cache.
    PassThrough,
}

impl WritePolicy {
    pub const NAMES: &'static str = "wb, wt, wi, wa, wo, pt";

    /// Whether a write under this policy may leave the cache's copy as the
    /// only one (write-back, write-only).
    pub fn keeps_dirty(self) -> bool {
        matches!(self, WritePolicy::WriteBack | WritePolicy::WriteOnly)
    }

    /// Whether a read miss may insert the line (subject to promotion).
    pub fn allocates_on_read(self) -> bool {
        matches!(
            self,
            WritePolicy::WriteBack
                | WritePolicy::WriteThrough
                | WritePolicy::WriteInvalidate
                | WritePolicy::WriteAround
        )
    }

    /// Whether a write miss may insert the line (subject to promotion).
    pub fn allocates_on_write(self) -> bool {
        matches!(
            self,
            WritePolicy::WriteBack | WritePolicy::WriteThrough | WritePolicy::WriteOnly
        )
    }

    pub fn short_name(self) -> &'static str {
        match self {
            WritePolicy::WriteBack => "wb",
            WritePolicy::WriteThrough => "wt",
            WritePolicy::WriteInvalidate => "wi",
            WritePolicy::WriteAround => "wa",
            WritePolicy::WriteOnly => "wo",
            WritePolicy::PassThrough => "pt",
        }
    }
}

impl fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

impl FromStr for WritePolicy {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "wb" | "write-back" => WritePolicy::WriteBack,
            "wt" | "write-through" => WritePolicy::WriteThrough,
            "wi" | "write-invalidate" => WritePolicy::WriteInvalidate,
            "wa" | "write-around" | "read-only" => WritePolicy::WriteAround,
            "wo" | "write-only" => WritePolicy::WriteOnly,
            "pt" | "pass-through" => WritePolicy::PassThrough,
            _ => {
                return Err(CoreError::UnknownName {
                    what: "write policy",
                    given: s.to_string(),
                    expected: Self::NAMES,
                })
            }
        })
    }
}

/// When a missed line is inserted into the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promotion {
    /// Every miss is inserted.
    Always,
    /// A missed line is inserted on its `threshold`-th access, counted in a bounded
    /// history of recently missed lines (Open CAS's `nhit`). Below `trigger_percent`
    /// occupancy every miss is inserted, as OCF's trigger threshold does (OCF's
    /// default is 80; ours is 0, so the threshold always applies unless asked).
    NHit { threshold: u32, trigger_percent: u32 },
}

impl Promotion {
    pub const SYNTAX: &'static str = "always, nhit:N or nhit:N:trigger=PERCENT";
}

impl fmt::Display for Promotion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Promotion::Always => f.write_str("always"),
            Promotion::NHit {
                threshold,
                trigger_percent: 0,
            } => write!(f, "nhit:{threshold}"),
            Promotion::NHit {
                threshold,
                trigger_percent,
            } => write!(f, "nhit:{threshold}:trigger={trigger_percent}"),
        }
    }
}

impl FromStr for Promotion {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| CoreError::BadParameter {
            given: s.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = s.trim();
        if trimmed == "always" {
            return Ok(Promotion::Always);
        }
        let Some(rest) = trimmed
            .strip_prefix("nhit")
            .filter(|rest| rest.is_empty() || rest.starts_with(':'))
        else {
            return Err(CoreError::UnknownName {
                what: "promotion policy",
                given: s.to_string(),
                expected: Self::SYNTAX,
            });
        };
        let mut parts = rest.split(':').skip(1);
        let threshold: u32 = match parts.next() {
            None => 3,
            Some(n) => n.parse().map_err(|_| bad("the hit count N must be an integer"))?,
        };
        if !(1..=1000).contains(&threshold) {
            return Err(bad("the hit count N must be between 1 and 1000"));
        }
        let mut trigger_percent = 0;
        for param in parts {
            match param.split_once('=') {
                Some(("trigger", value)) => {
                    trigger_percent = value
                        .parse()
                        .ok()
                        .filter(|p| *p <= 100)
                        .ok_or_else(|| bad("trigger must be a percentage from 0 to 100"))?;
                }
                _ => return Err(bad(&format!("unknown parameter `{param}`"))),
            }
        }
        Ok(Promotion::NHit {
            threshold,
            trigger_percent,
        })
    }
}

/// How dirty lines are chosen for a flush batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushOrder {
    /// Lines that became dirty earliest first.
    Oldest,
    /// Lines in (volume, address) order, continuing after the last line flushed.
    Address,
    /// Only lines of this volume, in address order (flushing or detaching one
    /// volume of a cache that several share).
    Volume(crate::addr::VolumeId),
}

/// Everything that shapes one cache instance.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    pub capacity_lines: u64,
    pub line_size: LineSize,
    pub write_policy: WritePolicy,
    pub promotion: Promotion,
    pub policy: PolicySpec,
    /// Background write-back of dirty lines.
    pub cleaning: CleaningPolicy,
    /// When no slot is free and every resident line is dirty, send write misses
    /// to the backend instead of evicting (ASPLOS'23 Fig. 11c).
    pub write_miss_bypass: bool,
    /// Large sequential streams bypass the cache.
    pub seq_cutoff: SeqCutoff,
    /// Whether a miss may evict a dirty line, writing it back as part of the
    /// request (true: what the papers model and the simulator does). A
    /// runtime whose backend can fail sets it false: dirty victims stay
    /// resident (the policy gets them back), a clean victim is looked for
    /// instead, and the line bypasses the cache when none is found; the
    /// runtime's cleaner makes lines clean (see
    /// [`AccessSummary::dirty_victims_kept`]). A write-invalidate write then
    /// also keeps a line whose other sectors are dirty, updating the written
    /// sectors as write-through would.
    pub inline_dirty_eviction: bool,
    /// At most this many dirty lines: a write that would make one more line
    /// dirty under wb or wo is handled as write-through instead (counted in
    /// [`CacheStats::dirty_cap_write_throughs`]). Writes to lines already
    /// dirty stay write-back. A cache whose dirty lines need a mirror slot
    /// each (cache RAID) caps them at the mirror slots it has. `None`: no cap.
    pub max_dirty_lines: Option<u64>,
}

/// Upper bound on lines per cache: slot ids are `u32` and one id is reserved.
pub const CAPACITY_LINES_MAX: u64 = (u32::MAX - 1) as u64;

impl CacheConfig {
    pub fn new(capacity_lines: u64, line_size: LineSize, policy: PolicySpec) -> Self {
        CacheConfig {
            capacity_lines,
            line_size,
            write_policy: WritePolicy::WriteBack,
            promotion: Promotion::Always,
            policy,
            cleaning: CleaningPolicy::Nop,
            write_miss_bypass: false,
            seq_cutoff: SeqCutoff::Off,
            inline_dirty_eviction: true,
            max_dirty_lines: None,
        }
    }

    pub fn validate(&self) -> Result<(), CoreError> {
        if self.capacity_lines == 0 || self.capacity_lines > CAPACITY_LINES_MAX {
            return Err(CoreError::BadCapacity {
                lines: self.capacity_lines,
                max: CAPACITY_LINES_MAX,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_policy_names_round_trip() {
        for name in ["wb", "wt", "wi", "wa", "wo", "pt"] {
            assert_eq!(name.parse::<WritePolicy>().unwrap().to_string(), name);
        }
        let err = "wx".parse::<WritePolicy>().unwrap_err().to_string();
        assert!(err.contains("wx") && err.contains("wb, wt"), "{err}");
    }

    #[test]
    fn promotion_parses() {
        assert_eq!("always".parse::<Promotion>().unwrap(), Promotion::Always);
        assert_eq!(
            "nhit:2".parse::<Promotion>().unwrap(),
            Promotion::NHit {
                threshold: 2,
                trigger_percent: 0
            }
        );
        assert_eq!(
            "nhit:4:trigger=80".parse::<Promotion>().unwrap().to_string(),
            "nhit:4:trigger=80"
        );
        assert!("nhit:x".parse::<Promotion>().is_err());
        assert!("nhit:0".parse::<Promotion>().is_err());
        assert!("nhit:3:trigger=101".parse::<Promotion>().is_err());
        assert!("nhit:3:foo=1".parse::<Promotion>().is_err());
        assert!("sometimes".parse::<Promotion>().is_err());
        assert!("nhitbogus".parse::<Promotion>().is_err());
        assert_eq!(
            "nhit".parse::<Promotion>().unwrap(),
            Promotion::NHit {
                threshold: 3,
                trigger_percent: 0
            }
        );
    }
}
