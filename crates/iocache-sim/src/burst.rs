//! Load balancers such as LBICA act on bursts, and the
//! public trace samples have few that a chosen pair of devices would feel.
//! A [`BurstSpec`] generates a workload with on/off phases of chosen
//! intensity and mix, written in the DiskSim text format the trace readers
//! know (`arrival_ns device lba_sectors size_sectors type`, 1 = read), so it
//! runs through `iocache sim` like any trace
//! (`cargo run -p iocache-sim --example burst_trace`).
//!
//! The address space is a *hot* set of `hot_lines` lines, read once in
//! large requests at the start (`warm_requests` of them: exclude them with
//! `--warmup`) so it is cached when the phases begin, followed by a *cold*
//! range of `cold_lines` lines. Each request of a phase picks the hot set
//! with probability `hot`, then a uniform line of the chosen range; it is a
//! read with probability `read`; arrivals are Poisson at the phase's rate.
//! So hot reads are cache hits (R), cold reads misses and promotions (P),
//! writes W, and cold traffic evicts lines (E, when they are dirty).

use std::fmt;
use std::io::Write;
use std::str::FromStr;

use iocache_core::units::{format_duration_ns, parse_duration_ns};
use iocache_core::IoKind;

use crate::error::SimError;
use crate::timing::rng::SplitMix64;

/// One phase: how long, how many requests per second, and what kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Phase {
    pub duration_ns: u64,
    pub iops: f64,
    /// Probability that a request is a read.
    pub read: f64,
    /// Probability that a request goes to the hot set.
    pub hot: f64,
}

impl FromStr for Phase {
    type Err = SimError;
    /// `DURATION@IOPS[:read=F][:hot=F]`, e.g. `500ms@20000:read=0.9:hot=0.95`.
    fn from_str(text: &str) -> Result<Phase, SimError> {
        let bad = |why: String| {
            SimError::Spec(format!(
                "phase `{text}`: {why} (expected DURATION@IOPS[:read=F][:hot=F])"
            ))
        };
        let mut parts = text.split(':');
        let head = parts.next().unwrap_or("");
        let (duration, iops) = head.split_once('@').ok_or_else(|| bad("no @IOPS".into()))?;
        let duration_ns = parse_duration_ns(duration).map_err(|e| bad(e.to_string()))?;
        let number = |what: &str, v: &str, max: f64| {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0 && *x <= max)
                .ok_or_else(|| bad(format!("{what} `{v}` is not a number in [0, {max}]")))
        };
        let mut phase = Phase {
            duration_ns,
            iops: number("iops", iops, 1e9)?,
            read: 1.0,
            hot: 1.0,
        };
        for part in parts {
            match part.split_once('=') {
                Some(("read", v)) => phase.read = number("read", v, 1.0)?,
                Some(("hot", v)) => phase.hot = number("hot", v, 1.0)?,
                _ => return Err(bad(format!("unknown part `{part}`"))),
            }
        }
        Ok(phase)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}@{}:read={}:hot={}",
            format_duration_ns(self.duration_ns),
            self.iops,
            self.read,
            self.hot
        )
    }
}

/// A generated workload (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct BurstSpec {
    /// Played in order, `repeat` times.
    pub phases: Vec<Phase>,
    pub repeat: u32,
    pub hot_lines: u64,
    pub cold_lines: u64,
    pub line_bytes: u64,
    /// Lines per request of the warm-up read of the hot set.
    pub warm_lines_per_request: u64,
    /// Time between two warm-up requests.
    pub warm_gap_ns: u64,
    pub seed: u64,
}

impl BurstSpec {
    /// Requests of the warm-up read of the hot set (to pass to `--warmup`).
    pub fn warm_requests(&self) -> u64 {
        self.hot_lines.div_ceil(self.warm_lines_per_request.max(1))
    }

    /// Every request: `(arrival_ns, kind, offset_bytes, length_bytes)`, in
    /// arrival order, handed to `emit`.
    pub fn generate(&self, mut emit: impl FnMut(u64, IoKind, u64, u64)) {
        let line = self.line_bytes;
        let chunk = self.warm_lines_per_request.max(1);
        let mut t = 0u64;
        let mut first = 0;
        while first < self.hot_lines {
            let lines = chunk.min(self.hot_lines - first);
            emit(t, IoKind::Read, first * line, lines * line);
            first += lines;
            t += self.warm_gap_ns;
        }
        let mut rng = SplitMix64::new(self.seed);
        for _ in 0..self.repeat {
            for phase in &self.phases {
                let end = t + phase.duration_ns;
                if phase.iops <= 0.0 {
                    t = end;
                    continue;
                }
                let mean_gap_ns = 1e9 / phase.iops;
                let mut at = t as f64 + rng.exponential(mean_gap_ns);
                while (at as u64) < end {
                    let hot = rng.next_f64() < phase.hot && self.hot_lines > 0;
                    let line_index = if hot || self.cold_lines == 0 {
                        rng.below(self.hot_lines.max(1))
                    } else {
                        self.hot_lines + rng.below(self.cold_lines)
                    };
                    let kind = if rng.next_f64() < phase.read {
                        IoKind::Read
                    } else {
                        IoKind::Write
                    };
                    emit(at as u64, kind, line_index * line, line);
                    at += rng.exponential(mean_gap_ns);
                }
                t = end;
            }
        }
    }

    /// Writes the workload as a DiskSim trace (volume 0).
    pub fn write_disksim(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut result = Ok(());
        self.generate(|at, kind, offset, length| {
            if result.is_ok() {
                let kind = match kind {
                    IoKind::Read => 1,
                    IoKind::Write => 0,
                };
                result = writeln!(out, "{at} 0 {} {} {kind}", offset / 512, length / 512);
            }
        });
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_parse_and_print() {
        let p: Phase = "500ms@20000:read=0.9:hot=0.95".parse().unwrap();
        assert_eq!(
            p,
            Phase {
                duration_ns: 500_000_000,
                iops: 20000.0,
                read: 0.9,
                hot: 0.95
            }
        );
        assert_eq!(p.to_string().parse::<Phase>().unwrap(), p);
        for bad in ["500ms", "1s@x", "1s@10:read=2", "1s@10:colour=red"] {
            assert!(bad.parse::<Phase>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_workload_has_the_phases_rates_and_mix() {
        let spec = BurstSpec {
            phases: vec![
                "1s@1000:read=1:hot=1".parse().unwrap(),
                "1s@10000:read=0.5:hot=0.5".parse().unwrap(),
            ],
            repeat: 2,
            hot_lines: 1000,
            cold_lines: 100_000,
            line_bytes: 4096,
            warm_lines_per_request: 64,
            warm_gap_ns: 1_000_000,
            seed: 1,
        };
        let mut all = Vec::new();
        spec.generate(|t, k, o, l| all.push((t, k, o, l)));
        let warm = spec.warm_requests() as usize;
        assert_eq!(warm, 16);
        assert!(all.windows(2).all(|w| w[0].0 <= w[1].0), "arrivals in order");
        assert_eq!(all[..warm].iter().map(|r| r.3).sum::<u64>(), 1000 * 4096);
        let start = all[warm - 1].0 + spec.warm_gap_ns;
        let in_phase = |k: u64| {
            all[warm..]
                .iter()
                .filter(|r| (r.0 - start) / 1_000_000_000 == k)
                .collect::<Vec<_>>()
        };
        let (off, on) = (in_phase(0), in_phase(1));
        assert!((900..1100).contains(&off.len()), "{}", off.len());
        assert!((9500..10500).contains(&on.len()), "{}", on.len());
        assert!(off.iter().all(|r| r.1 == IoKind::Read && r.2 < 1000 * 4096));
        let reads = on.iter().filter(|r| r.1 == IoKind::Read).count() as f64 / on.len() as f64;
        let hot = on.iter().filter(|r| r.2 < 1000 * 4096).count() as f64 / on.len() as f64;
        assert!(
            (reads - 0.5).abs() < 0.03 && (hot - 0.5).abs() < 0.03,
            "{reads} {hot}"
        );
        let mut text = Vec::new();
        spec.write_disksim(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert_eq!(text.lines().count(), all.len());
        assert_eq!(text.lines().next(), Some("0 0 0 512 1"));
    }
}
