//! Cache configuration: write policy, promotion policy and the settings that shape a cache.

use std::fmt;
use std::str::FromStr;

use crate::addr::LineSize;
use crate::cleaning::CleaningPolicy;
use crate::error::CoreError;
use crate::policy::PolicySpec;
use crate::readahead::Readahead;
use crate::seq_cutoff::SeqCutoff;
use crate::units::{format_byte_size, parse_byte_size};

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

    /// Every write policy, in the order of [`WritePolicy::NAMES`].
    pub const ALL: [WritePolicy; 6] = [
        WritePolicy::WriteBack,
        WritePolicy::WriteThrough,
        WritePolicy::WriteInvalidate,
        WritePolicy::WriteAround,
        WritePolicy::WriteOnly,
        WritePolicy::PassThrough,
    ];

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

display_by_name!(WritePolicy, short_name);

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

/// When a missed line is inserted into the cache: the admission policy.
/// Every variant decides per missed line; a prefetch fill is admitted
/// whatever it says (a prefetch is an admission decision of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promotion {
    /// Every miss is inserted.
    Always,
    /// A missed line is inserted on its `threshold`-th access, counted in a bounded
    /// history of recently missed lines (Open CAS's `nhit`). Below `trigger_percent`
    /// occupancy every miss is inserted, as OCF's trigger threshold does (OCF's
    /// default is 80; ours is 0, so the threshold always applies unless asked).
    NHit { threshold: u32, trigger_percent: u32 },
    /// Each missed line is inserted with probability `per_million` / 10^6,
    /// drawn from a generator seeded with `seed` (the same run decides the
    /// same way).
    Random { per_million: u32, seed: u64 },
    /// A missed line is inserted when it missed before: its second miss
    /// within the memory of a counting Bloom filter of
    /// `counters_per_line` 2-bit counters per cache line, which remembers a
    /// first miss for between one and two times the cache's lines of
    /// misses (so the memory is fixed and old misses fade). False positives admit a first miss now and then; a
    /// line whose earlier miss is still remembered is never refused.
    SecondHit { counters_per_line: u32 },
    /// Only the lines of requests of at most `max_request_bytes` are
    /// inserted (large requests are usually scans).
    RequestSize { max_request_bytes: u64 },
    /// Lines are inserted only while the bytes written to the cache device
    /// (fills and writes alike) stay within `bytes_per_sec` on average, with
    /// a burst of one second's budget: a token bucket refilled by the
    /// caller's clock and drained by the cache's own write counter, checked
    /// once per request.
    WriteRate { bytes_per_sec: u64 },
}

impl Promotion {
    pub const SYNTAX: &'static str =
        "always, nhit:N[:trigger=PERCENT], random:P (a probability, 0 < P <= 1)[:seed=N], \
second-hit[:counters=N], request-size:SIZE or write-rate:SIZE/s";

    /// Counters per cache line of `second-hit` unless given.
    /// (16: 4 bytes per line; 1.1 % false positives with three hash
    /// functions in `tests/admission.rs`.)
    pub const SECOND_HIT_COUNTERS_PER_LINE: u32 = 16;
}

impl fmt::Display for Promotion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Promotion::Always => f.write_str("always"),
            Promotion::NHit {
                threshold,
                trigger_percent: 0,
            } => write!(f, "nhit:{threshold}"),
            Promotion::NHit {
                threshold,
                trigger_percent,
            } => write!(f, "nhit:{threshold}:trigger={trigger_percent}"),
            Promotion::Random { per_million, seed } => {
                let p = format!("{:.6}", per_million as f64 / 1e6);
                let p = p.trim_end_matches('0').trim_end_matches('.');
                match seed {
                    0 => write!(f, "random:{p}"),
                    _ => write!(f, "random:{p}:seed={seed}"),
                }
            }
            Promotion::SecondHit { counters_per_line }
                if counters_per_line == Self::SECOND_HIT_COUNTERS_PER_LINE =>
            {
                f.write_str("second-hit")
            }
            Promotion::SecondHit { counters_per_line } => {
                write!(f, "second-hit:counters={counters_per_line}")
            }
            Promotion::RequestSize { max_request_bytes } => {
                write!(f, "request-size:{}", format_byte_size(max_request_bytes))
            }
            Promotion::WriteRate { bytes_per_sec } => {
                write!(f, "write-rate:{}/s", format_byte_size(bytes_per_sec))
            }
        }
    }
}

/// The value of the one `key=value` parameter a promotion policy takes
/// besides its positional ones, `default` when absent: each value is
/// parsed as it comes (the last one given wins), and any other parameter
/// is refused with `unknown`.
fn keyed_param<'a, T>(
    params: impl Iterator<Item = &'a str>,
    key: &str,
    default: T,
    unknown: &dyn Fn(&str) -> CoreError,
    mut parse: impl FnMut(&'a str) -> Result<T, CoreError>,
) -> Result<T, CoreError> {
    let mut value = default;
    for param in params {
        match param.split_once('=') {
            Some((name, text)) if name == key => value = parse(text)?,
            _ => return Err(unknown(param)),
        }
    }
    Ok(value)
}

impl FromStr for Promotion {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| CoreError::BadParameter {
            given: s.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = s.trim();
        let (name, rest) = trimmed.split_once(':').unwrap_or((trimmed, ""));
        let given: Vec<&str> = rest.split(':').filter(|p| !p.is_empty()).collect();
        let mut params = given.iter().copied();
        let unknown = |param: &str| bad(&format!("unknown parameter `{param}`"));
        // The one parameter of `request-size` and `write-rate`: a size
        // above 0 (a rate may end in `/s`).
        let one_size = |what: &str, example: &str| match given[..] {
            [] => Err(bad(&format!("give {what}: {example}"))),
            [text] => match parse_byte_size(text.strip_suffix("/s").unwrap_or(text)) {
                Ok(0) => Err(bad(&format!("{what} must be above 0"))),
                Ok(bytes) => Ok(bytes),
                Err(e) => Err(bad(&e.to_string())),
            },
            [_, extra, ..] => Err(unknown(extra)),
        };
        match name {
            "always" if rest.is_empty() => Ok(Promotion::Always),
            "nhit" => {
                let threshold: u32 = match rest
                    .split(':')
                    .next()
                    .filter(|n| !n.is_empty() && !n.contains('='))
                {
                    None => 3,
                    Some(n) => {
                        params.next();
                        n.parse().map_err(|_| bad("the hit count N must be an integer"))?
                    }
                };
                if !(1..=1000).contains(&threshold) {
                    return Err(bad("the hit count N must be between 1 and 1000"));
                }
                let trigger_percent = keyed_param(params, "trigger", 0, &unknown, |value| {
                    value
                        .parse()
                        .ok()
                        .filter(|p| *p <= 100)
                        .ok_or_else(|| bad("trigger must be a percentage from 0 to 100"))
                })?;
                Ok(Promotion::NHit {
                    threshold,
                    trigger_percent,
                })
            }
            "random" => {
                let p: f64 = params
                    .next()
                    .and_then(|p| p.parse().ok())
                    .filter(|p: &f64| *p > 0.0 && *p <= 1.0)
                    .ok_or_else(|| {
                        bad("give the probability of admission, above 0 and at most 1: random:0.1")
                    })?;
                let per_million = (p * 1e6).round() as u32;
                if per_million == 0 {
                    return Err(bad("the probability must be at least 0.000001"));
                }
                let seed = keyed_param(params, "seed", 0, &unknown, |n| {
                    n.parse().map_err(|_| bad("the seed must be an integer"))
                })?;
                Ok(Promotion::Random { per_million, seed })
            }
            "second-hit" => {
                let default = Self::SECOND_HIT_COUNTERS_PER_LINE;
                let counters_per_line = keyed_param(params, "counters", default, &unknown, |n| {
                    n.parse()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| bad("counters (per cache line) must be 1 to 64"))
                })?;
                Ok(Promotion::SecondHit { counters_per_line })
            }
            "request-size" => Ok(Promotion::RequestSize {
                max_request_bytes: one_size("the largest request admitted", "request-size:64KiB")?,
            }),
            "write-rate" => Ok(Promotion::WriteRate {
                bytes_per_sec: one_size("the cache device's write budget", "write-rate:100MiB/s")?,
            }),
            _ => Err(CoreError::UnknownName {
                what: "promotion policy",
                given: s.to_string(),
                expected: Self::SYNTAX,
            }),
        }
    }
}

/// What a read miss brings into the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fill {
    /// The sectors the request asked for (a line may be partly valid).
    #[default]
    Request,
    /// The whole line: the sectors asked for and the rest of the line, read
    /// from the backend in the same request (ASPLOS'23's line-sized fill).
    /// Sectors already cached (dirty ones included) are not read again.
    /// The ops of a read then count their buffer offsets from the start of
    /// the request's first line ([`crate::AccessSummary::line_origin`]).
    Line,
}

impl Fill {
    pub const SYNTAX: &'static str = "request or line";
}

impl fmt::Display for Fill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fill::Request => "request",
            Fill::Line => "line",
        })
    }
}

impl FromStr for Fill {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "request" => Ok(Fill::Request),
            "line" => Ok(Fill::Line),
            _ => Err(CoreError::UnknownName {
                what: "fill",
                given: s.to_string(),
                expected: Self::SYNTAX,
            }),
        }
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
    /// Only lines that became dirty in a flush epoch up to `through`, in
    /// address order ([`CacheConfig::ordered_write_back`]).
    Epochs { through: u64 },
    /// Only the dirty lines a resize chose to leave
    /// ([`crate::Cache::resize`]).
    Retiring,
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
    /// Sequential readahead. The cache keeps the setting; its driver owns
    /// the decisions ([`crate::readahead::Readaheader`]), since a driver
    /// may split one stream over several caches.
    pub readahead: Readahead,
    /// What a read miss fills: the sectors asked for or the whole line.
    pub fill: Fill,
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
    /// Ordered write-back: every dirty line belongs to the flush epoch it
    /// became dirty in ([`crate::Cache::set_epoch`]; a runtime starts the
    /// next epoch at each client FLUSH), and dirty data reaches the backend
    /// epoch by epoch, so the backend alone always holds what a client saw
    /// at some FLUSH plus part of the next epoch's writes. A write to a line
    /// dirty from an older epoch, and the inline eviction of a dirty line,
    /// first write back every line of the epochs before it (counted in
    /// [`CacheStats::ordered_drains`]). A runtime with several caches
    /// (shards) orders them itself (the engine waits rather than drains).
    pub ordered_write_back: bool,
    /// Lines in service, when fewer than `capacity_lines` (a cache
    /// resized in place: the others are out of service; see
    /// [`crate::Cache::resize`]). `None`: all of them.
    pub lines_in_service: Option<u64>,
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
            readahead: Readahead::Off,
            fill: Fill::Request,
            inline_dirty_eviction: true,
            max_dirty_lines: None,
            ordered_write_back: false,
            lines_in_service: None,
        }
    }

    /// The lines in service: [`CacheConfig::lines_in_service`], else all.
    pub fn lines_in_service(&self) -> u64 {
        self.lines_in_service.unwrap_or(self.capacity_lines)
    }

    pub fn validate(&self) -> Result<(), CoreError> {
        if self.capacity_lines == 0 || self.capacity_lines > CAPACITY_LINES_MAX {
            return Err(CoreError::BadCapacity {
                lines: self.capacity_lines,
                max: CAPACITY_LINES_MAX,
            });
        }
        if let Some(lines) = self.lines_in_service {
            if lines == 0 || lines > self.capacity_lines {
                return Err(CoreError::BadParameter {
                    given: format!("{lines} lines in service"),
                    reason: format!("a cache of {} lines has 1 to {0} in service", self.capacity_lines),
                });
            }
        }
        if self.ordered_write_back && !self.write_policy.keeps_dirty() {
            return Err(CoreError::BadParameter {
                given: format!("ordered_write_back with write_policy {}", self.write_policy),
                reason: "ordered write-back keeps every write in the cache: use wb or wo".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_refuses, assert_round_trips};

    #[test]
    fn write_policy_names_round_trip() {
        assert_round_trips::<WritePolicy>(&["wb", "wt", "wi", "wa", "wo", "pt"]);
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
        assert_refuses(
            str::parse::<Promotion>,
            &[
                "nhit:x",
                "nhit:0",
                "nhit:3:trigger=101",
                "nhit:3:foo=1",
                "sometimes",
                "nhitbogus",
            ],
        );
        assert_round_trips::<Promotion>(&[
            "nhit:4:trigger=80",
            "random:0.1",
            "random:0.25:seed=7",
            "second-hit",
            "second-hit:counters=8",
            "request-size:64KiB",
            "write-rate:100MiB/s",
        ]);
        assert_eq!(
            "write-rate:1MiB".parse::<Promotion>().unwrap(),
            Promotion::WriteRate {
                bytes_per_sec: 1 << 20
            }
        );
        assert_refuses(
            str::parse::<Promotion>,
            &[
                "random:0",
                "random:1.5",
                "random",
                "request-size",
                "request-size:0",
                "write-rate:x/s",
                "second-hit:counters=0",
                "random:0.1:x=1",
            ],
        );
        assert_eq!(
            "nhit".parse::<Promotion>().unwrap(),
            Promotion::NHit {
                threshold: 3,
                trigger_percent: 0
            }
        );
    }
}
