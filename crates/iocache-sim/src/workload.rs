//! Cache studies need workloads with known
//! properties (a Zipf skew, fio's zoned hit rates, a sequential share, a
//! size mix, phases and bursts), reproducible from a seed, both for the
//! simulator and, as the equivalent fio job, for a live server. A
//! [`WorkloadSpec`] (read from TOML by the binary, docs/workloads.md)
//! describes phases; [`Generator`] yields their requests as trace records;
//! [`WorkloadSpec::fio_job`] writes the fio job file with the same mix.

use std::fmt::Write as _;

use iocache_core::units::{format_byte_size, parse_byte_size, parse_duration_ns};
use iocache_trace::{IoKind, TraceRecord};
use serde::Deserialize;

use crate::error::SimError;
use crate::timing::rng::SplitMix64;

/// A whole workload: phases run one after another.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Seed of every random choice (same seed, same trace).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The address space requests fall in (a size with a unit).
    pub volume_size: String,
    /// Offsets are multiples of this (a size with a unit; default 4KiB).
    #[serde(default = "default_block")]
    pub block_size: String,
    #[serde(rename = "phase")]
    pub phases: Vec<PhaseSpec>,
}

/// One phase.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSpec {
    /// A name for reports.
    #[serde(default)]
    pub name: Option<String>,
    /// Requests in this phase.
    pub requests: u64,
    /// Requests per second (sets the timestamps; default 1000).
    #[serde(default = "default_rate")]
    pub rate: f64,
    /// Share of reads, 0 to 100.
    #[serde(default = "default_read_percent")]
    pub read_percent: f64,
    /// `uniform`, `zipf:THETA`, `zoned:PCT/PCT:PCT/PCT...` (fio's
    /// `random_distribution=zoned`), `hotcold:HOT_SPACE_PCT/HOT_ACCESS_PCT`,
    /// `sequential` or `strided:SIZE`.
    #[serde(default = "default_distribution")]
    pub distribution: String,
    /// Request sizes: `4KiB`, or a weighted mix `4KiB:70,64KiB:30`.
    #[serde(default = "default_sizes")]
    pub sizes: String,
    /// Interleaved streams (for sequential and strided: each has its own
    /// position; requests alternate among them at random).
    #[serde(default = "default_streams")]
    pub streams: u32,
    /// Bursts: requests arrive at `rate` for `on`, then none for `off`.
    #[serde(default)]
    pub burst: Option<BurstSpec>,
    /// The part of the volume this phase uses, as `START_PCT-END_PCT`
    /// (default `0-100`).
    #[serde(default)]
    pub range: Option<String>,
    /// Volumes the requests go to (each `volume_size`, addressed alike;
    /// default 1). Random distributions draw a volume per request by
    /// `volume_distribution`; sequential and strided stream `i` stays in
    /// volume `i mod volumes`.
    #[serde(default = "default_volumes")]
    pub volumes: u32,
    /// How requests spread over the volumes: `uniform` (the default) or
    /// `zipf:THETA` (volume `v` weighted 1/(v+1)^θ).
    #[serde(default)]
    pub volume_distribution: Option<String>,
}

/// On/off arrivals within a phase.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurstSpec {
    /// A duration: `1s`, `250ms`.
    pub on: String,
    pub off: String,
}

fn default_seed() -> u64 {
    1
}
fn default_block() -> String {
    "4KiB".into()
}
fn default_rate() -> f64 {
    1000.0
}
fn default_read_percent() -> f64 {
    70.0
}
fn default_distribution() -> String {
    "uniform".into()
}
fn default_sizes() -> String {
    "4KiB".into()
}
fn default_streams() -> u32 {
    1
}
fn default_volumes() -> u32 {
    1
}

/// The most volumes a phase may spread over.
pub const MAX_VOLUMES: u32 = 1 << 20;

/// Where offsets come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Distribution {
    Uniform,
    /// Rank r (0-based) has weight 1 / (r+1)^theta; ranks are scattered
    /// over the blocks by a fixed permutation, as fio does.
    Zipf {
        theta: f64,
    },
    /// (share of accesses %, share of the space %) per zone, in order.
    Zoned(Vec<(f64, f64)>),
    Sequential,
    Strided {
        stride_bytes: u64,
    },
}

impl Distribution {
    fn parse(text: &str) -> Result<Distribution, String> {
        let t = text.trim();
        let (name, arg) = t.split_once(':').unwrap_or((t, ""));
        match name {
            "uniform" => Ok(Distribution::Uniform),
            "sequential" => Ok(Distribution::Sequential),
            "zipf" => {
                let theta: f64 = arg.parse().map_err(|_| format!("zipf:THETA needs a number, got `{arg}`"))?;
                if !(theta > 0.0 && theta < 10.0) {
                    return Err(format!("zipf theta {theta} is outside 0 to 10"));
                }
                Ok(Distribution::Zipf { theta })
            }
            "strided" => {
                let stride_bytes = parse_byte_size(arg).map_err(|e| e.to_string())?;
                Ok(Distribution::Strided { stride_bytes })
            }
            "zoned" | "hotcold" => {
                let mut zones = Vec::new();
                for zone in arg.split(':') {
                    let (a, b) = zone
                        .split_once('/')
                        .ok_or_else(|| format!("zone `{zone}`: expected ACCESS_PCT/SPACE_PCT"))?;
                    let num = |s: &str| {
                        s.trim()
                            .parse::<f64>()
                            .ok()
                            .filter(|v| (0.0..=100.0).contains(v))
                            .ok_or_else(|| format!("`{s}` is not a percentage"))
                    };
                    zones.push((num(a)?, num(b)?));
                }
                if name == "hotcold" {
                    // hotcold:HOT_SPACE/HOT_ACCESS, the rest to the rest.
                    let [(space, access)] = zones[..] else {
                        return Err("hotcold takes HOT_SPACE_PCT/HOT_ACCESS_PCT".into());
                    };
                    zones = vec![(access, space), (100.0 - access, 100.0 - space)];
                }
                let (access, space): (f64, f64) =
                    zones.iter().fold((0.0, 0.0), |(a, s), (za, zs)| (a + za, s + zs));
                if (access - 100.0).abs() > 1e-6 || (space - 100.0).abs() > 1e-6 {
                    return Err(format!(
                        "zones must add up to 100 % of accesses and of space, got {access} % and {space} %"
                    ));
                }
                Ok(Distribution::Zoned(zones))
            }
            other => Err(format!(
                "unknown distribution `{other}`: uniform, zipf:THETA, zoned:A/S:A/S..., hotcold:SPACE/ACCESS, sequential or strided:SIZE"
            )),
        }
    }
}

/// A phase, validated.
struct Phase {
    requests: u64,
    interval_ns: f64,
    read_share: f64,
    distribution: Distribution,
    /// (bytes, cumulative weight).
    sizes: Vec<(u64, f64)>,
    streams: u32,
    burst: Option<(u64, u64)>,
    first_block: u64,
    blocks: u64,
    /// Zipf: the cumulative weights of ranks.
    zipf_cdf: Vec<f64>,
    volumes: u32,
    /// Zipf over volumes: their cumulative weights (empty: uniform).
    volume_cdf: Vec<f64>,
}

/// The most blocks a Zipf phase may range over (its table of cumulative
/// weights is 8 bytes per block).
pub const MAX_ZIPF_BLOCKS: u64 = 1 << 26;

impl WorkloadSpec {
    /// Checks the spec; errors name the phase and the key.
    fn phases(&self) -> Result<(u64, Vec<Phase>), SimError> {
        let bad = |what: String| SimError::Spec(what);
        let volume_bytes =
            parse_byte_size(&self.volume_size).map_err(|e| bad(format!("volume_size: {e}")))?;
        let block_bytes = parse_byte_size(&self.block_size).map_err(|e| bad(format!("block_size: {e}")))?;
        if block_bytes == 0 || block_bytes % 512 != 0 || volume_bytes < block_bytes {
            return Err(bad(format!(
                "block_size {} must be a multiple of 512 B and at most volume_size {}",
                format_byte_size(block_bytes),
                format_byte_size(volume_bytes)
            )));
        }
        if self.phases.is_empty() {
            return Err(bad("a workload needs at least one [[phase]]".into()));
        }
        let volume_blocks = volume_bytes / block_bytes;
        let mut phases = Vec::new();
        for (i, p) in self.phases.iter().enumerate() {
            let who = format!("phase {} ({})", i + 1, p.name.as_deref().unwrap_or("unnamed"));
            let key = |k: &str, e: String| bad(format!("{who}: {k}: {e}"));
            if !(p.rate > 0.0 && p.rate.is_finite()) {
                return Err(key("rate", format!("{} is not a positive number", p.rate)));
            }
            if !(0.0..=100.0).contains(&p.read_percent) {
                return Err(key(
                    "read_percent",
                    format!("{} is outside 0 to 100", p.read_percent),
                ));
            }
            let distribution = Distribution::parse(&p.distribution).map_err(|e| key("distribution", e))?;
            let mut sizes = Vec::new();
            let mut total = 0.0;
            for part in p.sizes.split(',') {
                let (size, weight) = part.split_once(':').unwrap_or((part, "1"));
                let bytes = parse_byte_size(size).map_err(|e| key("sizes", e.to_string()))?;
                if bytes == 0 || bytes % 512 != 0 {
                    return Err(key(
                        "sizes",
                        format!("{} is not a positive multiple of 512 B", size.trim()),
                    ));
                }
                let weight: f64 = weight
                    .trim()
                    .parse()
                    .ok()
                    .filter(|w: &f64| *w > 0.0)
                    .ok_or_else(|| key("sizes", format!("weight `{weight}` is not a positive number")))?;
                total += weight;
                sizes.push((bytes, total));
            }
            for s in &mut sizes {
                s.1 /= total;
            }
            let (start_pct, end_pct) = match &p.range {
                None => (0.0, 100.0),
                Some(r) => {
                    let (a, b) = r
                        .split_once('-')
                        .ok_or_else(|| key("range", format!("`{r}`: expected START_PCT-END_PCT")))?;
                    let a: f64 = a
                        .trim()
                        .parse()
                        .map_err(|_| key("range", format!("`{a}` is not a number")))?;
                    let b: f64 = b
                        .trim()
                        .parse()
                        .map_err(|_| key("range", format!("`{b}` is not a number")))?;
                    if !(0.0 <= a && a < b && b <= 100.0) {
                        return Err(key("range", format!("`{r}`: need 0 <= START < END <= 100")));
                    }
                    (a, b)
                }
            };
            let first_block = (volume_blocks as f64 * start_pct / 100.0) as u64;
            let end_block = ((volume_blocks as f64 * end_pct / 100.0) as u64).max(first_block + 1);
            let blocks = end_block - first_block;
            let largest = sizes.iter().map(|s| s.0).max().unwrap_or(block_bytes);
            if largest > blocks * block_bytes {
                return Err(key("sizes", "a request is larger than the phase's range".into()));
            }
            let zipf_cdf = match distribution {
                Distribution::Zipf { theta } => {
                    if blocks > MAX_ZIPF_BLOCKS {
                        return Err(key(
                            "distribution",
                            format!("zipf over {blocks} blocks: at most {MAX_ZIPF_BLOCKS} (use a larger block_size)"),
                        ));
                    }
                    let mut cdf = Vec::with_capacity(blocks as usize);
                    let mut sum = 0.0;
                    for r in 0..blocks {
                        sum += 1.0 / ((r + 1) as f64).powf(theta);
                        cdf.push(sum);
                    }
                    for c in &mut cdf {
                        *c /= sum;
                    }
                    cdf
                }
                _ => Vec::new(),
            };
            let burst = match &p.burst {
                None => None,
                Some(b) => {
                    let on = parse_duration_ns(&b.on).map_err(|e| key("burst.on", e.to_string()))?;
                    let off = parse_duration_ns(&b.off).map_err(|e| key("burst.off", e.to_string()))?;
                    if on == 0 {
                        return Err(key("burst.on", "must be above 0".into()));
                    }
                    Some((on, off))
                }
            };
            if p.streams == 0 || p.streams > 4096 {
                return Err(key("streams", format!("{} is outside 1 to 4096", p.streams)));
            }
            if p.volumes == 0 || p.volumes > MAX_VOLUMES {
                return Err(key(
                    "volumes",
                    format!("{} is outside 1 to {MAX_VOLUMES}", p.volumes),
                ));
            }
            let volume_cdf = match p.volume_distribution.as_deref().map(str::trim) {
                None | Some("uniform") => Vec::new(),
                Some(text) => {
                    let theta: f64 = text
                        .strip_prefix("zipf:")
                        .and_then(|t| t.parse().ok())
                        .filter(|t: &f64| t.is_finite() && *t >= 0.0)
                        .ok_or_else(|| {
                            key(
                                "volume_distribution",
                                format!("`{text}`: expected uniform or zipf:THETA (THETA >= 0)"),
                            )
                        })?;
                    let mut cdf: Vec<f64> = Vec::with_capacity(p.volumes as usize);
                    let mut sum = 0.0;
                    for v in 0..p.volumes {
                        sum += 1.0 / ((v + 1) as f64).powf(theta);
                        cdf.push(sum);
                    }
                    for c in &mut cdf {
                        *c /= sum;
                    }
                    cdf
                }
            };
            phases.push(Phase {
                requests: p.requests,
                interval_ns: 1e9 / p.rate,
                read_share: p.read_percent / 100.0,
                distribution,
                sizes,
                streams: p.streams,
                burst,
                first_block,
                blocks,
                zipf_cdf,
                volumes: p.volumes,
                volume_cdf,
            });
        }
        Ok((block_bytes, phases))
    }

    /// A generator of this workload's requests.
    pub fn generator(&self) -> Result<Generator, SimError> {
        let (block_bytes, phases) = self.phases()?;
        Ok(Generator {
            rng: SplitMix64::new(self.seed),
            block_bytes,
            phases,
            phase: 0,
            in_phase: 0,
            phase_start_ns: 0,
            time_ns: 0.0,
            stream_positions: Vec::new(),
        })
    }

    /// The fio job file with the same mix, phase by phase (fio runs jobs
    /// in order with `stonewall`), against `target` (fio's nbd engine
    /// `uri`, or a file). What fio cannot say (interleaved streams,
    /// bursts) is written as a comment.
    pub fn fio_job(&self, target: &str) -> Result<String, SimError> {
        let (block_bytes, phases) = self.phases()?;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Written by `iocache gen --fio` from a workload spec (seed {}).",
            self.seed
        );
        let nbd = target.starts_with("nbd://") || target.starts_with("nbd+unix://");
        let _ = writeln!(out, "[global]");
        if nbd {
            let _ = writeln!(out, "ioengine=nbd\nuri={target}");
        } else {
            let _ = writeln!(out, "ioengine=psync\nfilename={target}");
        }
        let _ = writeln!(
            out,
            "randseed={}\nblockalign={block_bytes}\ntime_based=0",
            self.seed
        );
        for (i, (p, spec)) in phases.iter().zip(&self.phases).enumerate() {
            let _ = writeln!(
                out,
                "\n[{}]",
                spec.name.clone().unwrap_or_else(|| format!("phase{}", i + 1))
            );
            let _ = writeln!(out, "stonewall");
            let sequential = matches!(
                p.distribution,
                Distribution::Sequential | Distribution::Strided { .. }
            );
            let rw = match (sequential, p.read_share) {
                (false, r) if r >= 1.0 => "randread",
                (false, r) if r <= 0.0 => "randwrite",
                (false, _) => "randrw",
                (true, r) if r >= 1.0 => "read",
                (true, r) if r <= 0.0 => "write",
                (true, _) => "rw",
            };
            // fio's `rw=read:SIZE` skips SIZE after each request: a stride.
            let skip = match p.distribution {
                Distribution::Strided { stride_bytes } => format!(":{stride_bytes}"),
                _ => String::new(),
            };
            let _ = writeln!(out, "rw={rw}{skip}\nrwmixread={}", (p.read_share * 100.0).round());
            match &p.distribution {
                Distribution::Zipf { theta } => {
                    let _ = writeln!(out, "random_distribution=zipf:{theta}");
                }
                Distribution::Zoned(zones) => {
                    let zones: Vec<String> = zones.iter().map(|(a, s)| format!("{a}/{s}")).collect();
                    let _ = writeln!(out, "random_distribution=zoned:{}", zones.join(":"));
                }
                Distribution::Uniform | Distribution::Sequential | Distribution::Strided { .. } => {}
            }
            if p.sizes.len() == 1 {
                let _ = writeln!(out, "bs={}", p.sizes[0].0);
            } else {
                let mut previous = 0.0;
                let parts: Vec<String> = p
                    .sizes
                    .iter()
                    .map(|(b, c)| {
                        let pct = ((c - previous) * 100.0).round();
                        previous = *c;
                        format!("{b}/{pct}")
                    })
                    .collect();
                let _ = writeln!(out, "bssplit={}", parts.join(":"));
            }
            let _ = writeln!(
                out,
                "offset={}\nsize={}\nnumber_ios={}\nrate_iops={}",
                p.first_block * block_bytes,
                p.blocks * block_bytes,
                p.requests,
                (1e9 / p.interval_ns).round()
            );
            if p.streams > 1 {
                let _ = writeln!(
                    out,
                    "# {} interleaved streams: fio runs one (numjobs would split them)",
                    p.streams
                );
            }
            if p.volumes > 1 {
                let _ = writeln!(out, "# {} volumes: fio runs the mix on one target", p.volumes);
            }
            if let Some((on, off)) = p.burst {
                let _ = writeln!(
                    out,
                    "# bursts: {on} ns on, {off} ns off (fio has no on/off arrivals; iocache gen does)"
                );
            }
        }
        Ok(out)
    }
}

/// Yields the workload's requests, in time order.
pub struct Generator {
    rng: SplitMix64,
    block_bytes: u64,
    phases: Vec<Phase>,
    phase: usize,
    in_phase: u64,
    phase_start_ns: u64,
    time_ns: f64,
    stream_positions: Vec<u64>,
}

impl Generator {
    /// Writes the requests as MSR Cambridge CSV (what `iocache gen`
    /// writes); returns how many. Timestamps are relative 100 ns ticks and
    /// the disk number is the volume.
    pub fn write_msr(self, out: &mut dyn std::io::Write) -> std::io::Result<u64> {
        use std::io::Write as _;
        let mut buffered = std::io::BufWriter::with_capacity(1 << 16, out);
        let mut written = 0u64;
        for r in self {
            let kind = match r.kind {
                IoKind::Read => "Read",
                IoKind::Write => "Write",
            };
            writeln!(
                buffered,
                "{},gen,{},{kind},{},{},0",
                r.time_ns / 100,
                r.volume,
                r.offset_bytes,
                r.length_bytes
            )?;
            written += 1;
        }
        buffered.flush()?;
        Ok(written)
    }

    /// The requests as a trace reader named `name` (MSR CSV in memory), so
    /// a generated workload runs where a trace file would.
    pub fn into_reader(self, name: &str) -> Result<iocache_trace::TraceReader, SimError> {
        let mut csv = Vec::new();
        self.write_msr(&mut csv)
            .map_err(|e| SimError::Spec(format!("{name}: {e}")))?;
        Ok(iocache_trace::TraceReader::from_bytes(
            name,
            csv,
            Some(iocache_trace::TraceFormat::Msr),
            iocache_trace::ReaderOptions::default(),
        )?)
    }
}

impl Iterator for Generator {
    type Item = TraceRecord;

    fn next(&mut self) -> Option<TraceRecord> {
        while self.phase < self.phases.len() && self.in_phase >= self.phases[self.phase].requests {
            self.phase += 1;
            self.in_phase = 0;
            self.phase_start_ns = self.time_ns as u64;
            self.stream_positions.clear();
        }
        let p = self.phases.get(self.phase)?;
        let rng = &mut self.rng;
        // Time: evenly spaced at the rate; with bursts, the off periods
        // are skipped over.
        let mut elapsed = self.in_phase as f64 * p.interval_ns;
        if let Some((on, off)) = p.burst {
            let cycles = (elapsed / on as f64).floor();
            elapsed += cycles * off as f64;
        }
        let time_ns = self.phase_start_ns + elapsed as u64;
        self.time_ns = self.time_ns.max(time_ns as f64 + p.interval_ns);
        let u = rng.next_f64();
        let length_bytes = p
            .sizes
            .iter()
            .find(|(_, c)| u < *c)
            .unwrap_or(&p.sizes[p.sizes.len() - 1])
            .0;
        let length_blocks = length_bytes.div_ceil(self.block_bytes);
        let span = p.blocks.saturating_sub(length_blocks) + 1;
        let mut volume = 0;
        let block = match &p.distribution {
            Distribution::Uniform => rng.below(span),
            Distribution::Zipf { .. } => {
                let u = rng.next_f64();
                let rank = p.zipf_cdf.partition_point(|c| *c <= u) as u64;
                // Scatter ranks over the blocks (a fixed permutation: an
                // odd multiplier modulo a power of two, folded into span).
                scatter(rank.min(p.blocks - 1), p.blocks) % span
            }
            Distribution::Zoned(zones) => {
                let u = rng.next_f64() * 100.0;
                let (mut access, mut space_start) = (0.0, 0.0);
                let mut chosen = (0.0, 100.0);
                for (a, s) in zones {
                    access += a;
                    if u < access {
                        chosen = (space_start, *s);
                        break;
                    }
                    space_start += s;
                }
                let start = (p.blocks as f64 * chosen.0 / 100.0) as u64;
                let len = ((p.blocks as f64 * chosen.1 / 100.0) as u64).max(1);
                (start + rng.below(len)).min(span - 1)
            }
            Distribution::Sequential | Distribution::Strided { .. } => {
                let streams = p.streams as usize;
                if self.stream_positions.len() != streams {
                    self.stream_positions = (0..streams as u64).map(|s| s * span / streams as u64).collect();
                }
                let s = rng.below(streams as u64) as usize;
                volume = s as u32 % p.volumes;
                let position = self.stream_positions[s] % span;
                let step = match p.distribution {
                    Distribution::Strided { stride_bytes } => {
                        length_blocks + stride_bytes.div_ceil(self.block_bytes)
                    }
                    _ => length_blocks,
                };
                self.stream_positions[s] = (position + step) % span;
                position
            }
        };
        let kind = if rng.next_f64() < p.read_share {
            IoKind::Read
        } else {
            IoKind::Write
        };
        let random = !matches!(
            p.distribution,
            Distribution::Sequential | Distribution::Strided { .. }
        );
        if random && p.volumes > 1 {
            volume = if p.volume_cdf.is_empty() {
                rng.below(u64::from(p.volumes)) as u32
            } else {
                let u = rng.next_f64();
                (p.volume_cdf.partition_point(|c| *c <= u) as u32).min(p.volumes - 1)
            };
        }
        self.in_phase += 1;
        Some(TraceRecord {
            time_ns,
            volume,
            offset_bytes: (p.first_block + block) * self.block_bytes,
            length_bytes,
            kind,
            process: 0,
        })
    }
}

/// A fixed permutation of `0..n`: multiply by an odd constant modulo the
/// next power of two, walking until the value falls below `n` (a cycle
/// walk, so every rank maps to a distinct block).
fn scatter(rank: u64, n: u64) -> u64 {
    let bits = 64 - (n.max(2) - 1).leading_zeros();
    let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let mut x = rank;
    loop {
        x = (x
            .wrapping_mul(0x9e37_79b9_7f4a_7c15 | 1)
            .wrapping_add(0x632b_e59b_d9b4_e019))
            & mask;
        if x < n {
            return x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_is_a_permutation() {
        for n in [1u64, 2, 3, 10, 1000, 4096] {
            let mut seen: Vec<u64> = (0..n).map(|r| scatter(r, n)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn distributions_parse_and_refuse() {
        assert_eq!(
            Distribution::parse("zoned:85/10:15/90").unwrap(),
            Distribution::Zoned(vec![(85.0, 10.0), (15.0, 90.0)])
        );
        assert_eq!(
            Distribution::parse("hotcold:20/80").unwrap(),
            Distribution::Zoned(vec![(80.0, 20.0), (20.0, 80.0)])
        );
        for bad in ["zoned:85/10:10/90", "zipf:x", "zipf:0", "strided:7", "pareto:1"] {
            assert!(Distribution::parse(bad).is_err(), "{bad}");
        }
    }
}
