//! One cache shared among volumes, split into a partition per volume: the
//! split that minimizes total misses, found from each volume's miss-ratio
//! curve (the question behind SYSTOR'14's shared cache), and a simulation
//! of any split, so that the choice is checked against what really
//! happens rather than against the curves it came from.

use std::collections::HashMap;

use iocache_core::fasthash::FxBuildHasher;
use iocache_core::{AccessHints, Cache, CacheConfig, LineSize, PolicySpec, VolumeId};
use iocache_trace::TraceReader;
use serde::Serialize;

use crate::error::SimError;
use crate::mrc::VolumeCurve;
use crate::run::request_of;

/// One volume's misses at 0, 1, ..., `units` units of cache.
#[derive(Clone, Debug)]
pub struct MissTable {
    pub volume: VolumeId,
    /// `misses[k]`: line accesses that miss with `k` units.
    pub misses: Vec<f64>,
}

impl MissTable {
    /// From a curve given at sizes `unit_lines × 1..=units` (the points
    /// must be those sizes, ascending); no cache misses every access.
    pub fn from_curve(curve: &VolumeCurve, unit_lines: u64, units: usize) -> Result<MissTable, SimError> {
        let accesses = curve.line_accesses as f64;
        let mut misses = Vec::with_capacity(units + 1);
        misses.push(accesses);
        for k in 1..=units {
            let want = unit_lines * k as u64;
            let point = curve
                .curve
                .points
                .iter()
                .find(|p| p.cache_lines == want)
                .ok_or_else(|| {
                    SimError::Spec(format!("volume {}: no curve point at {want} lines", curve.volume))
                })?;
            misses.push(point.miss_ratio * accesses);
        }
        Ok(MissTable {
            volume: curve.volume,
            misses,
        })
    }
}

/// The split of `units` units among the volumes of `tables` that
/// minimizes their total misses (an exact dynamic program over the units:
/// no convexity assumed), as units per volume in `tables`' order, and the
/// total misses the tables predict for it. Of equal totals, the split that
/// gives earlier volumes fewer units.
pub fn best_split(tables: &[MissTable], units: usize) -> (Vec<usize>, f64) {
    // best[k]: least misses of the volumes so far with at most k units.
    let mut best = vec![0.0f64; units + 1];
    let mut choice: Vec<Vec<u16>> = Vec::with_capacity(tables.len());
    for table in tables {
        let mut next = vec![f64::INFINITY; units + 1];
        let mut chose = vec![0u16; units + 1];
        for k in 0..=units {
            for j in 0..=k.min(table.misses.len() - 1) {
                let total = best[k - j] + table.misses[j];
                if total < next[k] - 1e-9 {
                    next[k] = total;
                    chose[k] = j as u16;
                }
            }
        }
        best = next;
        choice.push(chose);
    }
    let mut split = vec![0usize; tables.len()];
    let mut k = units;
    for (v, chose) in choice.iter().enumerate().rev() {
        split[v] = chose[k] as usize;
        k -= split[v];
    }
    (split, best[units])
}

/// The misses `tables` predict for `split` (units per volume).
pub fn predicted_misses(tables: &[MissTable], split: &[usize]) -> f64 {
    tables
        .iter()
        .zip(split)
        .map(|(t, &k)| t.misses[k.min(t.misses.len() - 1)])
        .sum()
}

/// `total_lines` split in proportion to `weights` (largest remainders
/// first, so the parts add up to the total).
pub fn proportional_split(total_lines: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<u128> = weights
        .iter()
        .map(|&w| u128::from(total_lines) * u128::from(w))
        .collect();
    let mut parts: Vec<u64> = exact.iter().map(|e| (e / sum) as u64).collect();
    let mut left = total_lines - parts.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| (exact[b] % sum).cmp(&(exact[a] % sum)).then(a.cmp(&b)));
    for i in order {
        if left == 0 {
            break;
        }
        parts[i] += 1;
        left -= 1;
    }
    parts
}

/// What simulating one split gave.
#[derive(Clone, Debug, Serialize)]
pub struct SimulatedSplit {
    /// Line accesses in all.
    pub accesses: u64,
    /// Of those, misses (not every requested sector cached).
    pub misses: u64,
    /// Misses per volume, in the split's order.
    pub volume_misses: Vec<u64>,
}

/// Simulates each split of `splits` (lines per volume of `volumes`) in one
/// pass over `reader`: every volume its own cache of `policy` at its
/// partition's size, write-back, every miss admitted, as `sim` runs one.
/// A volume not in `volumes`, or given no lines, misses every access.
pub fn simulate_splits(
    reader: &mut TraceReader,
    line: LineSize,
    policy: &PolicySpec,
    volumes: &[VolumeId],
    splits: &[Vec<u64>],
) -> Result<Vec<SimulatedSplit>, SimError> {
    let index: HashMap<VolumeId, usize, FxBuildHasher> =
        volumes.iter().enumerate().map(|(i, &v)| (v, i)).collect();
    let mut caches: Vec<Vec<Option<Cache>>> = splits
        .iter()
        .map(|split| {
            split
                .iter()
                .map(|&lines| {
                    (lines > 0)
                        .then(|| Cache::new(CacheConfig::new(lines, line, policy.clone())))
                        .transpose()
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let mut results: Vec<SimulatedSplit> = splits
        .iter()
        .map(|s| SimulatedSplit {
            accesses: 0,
            misses: 0,
            volume_misses: vec![0; s.len()],
        })
        .collect();
    let mut outside = 0u64;
    for record in reader.by_ref() {
        let request = request_of(&record?);
        if request.length_bytes == 0 {
            continue;
        }
        let lines = iocache_core::addr::request_lines(&request, line);
        let Some(&v) = index.get(&request.volume) else {
            outside += lines;
            continue;
        };
        for (split, result) in caches.iter_mut().zip(&mut results) {
            result.accesses += lines;
            let misses = match &mut split[v] {
                Some(cache) => {
                    let s = cache.access_counted(&request, AccessHints::default())?;
                    u64::from(s.lines - s.full_hits)
                }
                None => lines,
            };
            result.misses += misses;
            result.volume_misses[v] += misses;
        }
    }
    for result in &mut results {
        result.accesses += outside;
        result.misses += outside;
    }
    Ok(results)
}

/// One way of splitting the cache: its lines per volume, what the curves
/// predict and what simulating it gave.
#[derive(Debug, Serialize)]
pub struct SplitReport {
    pub name: &'static str,
    /// Lines per volume, in the report's `volumes` order.
    pub lines: Vec<u64>,
    /// What the curves predict (the best split only: the others' sizes
    /// fall between the curves' points).
    pub predicted_misses: Option<f64>,
    pub simulated: SimulatedSplit,
}

/// A volume of the trace, busiest first.
#[derive(Debug, Serialize)]
pub struct VolumeRow {
    pub volume: VolumeId,
    pub requests: u64,
    pub line_accesses: u64,
    pub footprint_lines: u64,
}

/// What `iocache trace allocate` reports: one cache split among a trace's
/// volumes three ways, each checked by simulation.
#[derive(Debug, Serialize)]
pub struct AllocateReport {
    pub trace: String,
    pub line_size: u64,
    pub cache_lines: u64,
    pub unit_lines: u64,
    pub method: String,
    pub volumes: Vec<VolumeRow>,
    pub splits: Vec<SplitReport>,
}

impl AllocateReport {
    /// Splits a cache of `cache_lines` in `units` equal units among the
    /// volumes of `curves` (given at every multiple of a unit) three ways:
    /// the split the curves predict best, equal shares, and shares in
    /// proportion to line accesses; then simulates each over `reader`, the
    /// trace the curves came from, read again.
    pub fn build(
        reader: &mut TraceReader,
        line: LineSize,
        cache_lines: u64,
        units: usize,
        method: &str,
        curves: &[VolumeCurve],
    ) -> Result<AllocateReport, SimError> {
        let unit_lines = cache_lines / units.max(1) as u64;
        let tables = curves
            .iter()
            .map(|c| MissTable::from_curve(c, unit_lines, units))
            .collect::<Result<Vec<_>, _>>()?;
        let (best, predicted) = best_split(&tables, units);
        let best_lines: Vec<u64> = best.iter().map(|&k| k as u64 * unit_lines).collect();
        let equal = proportional_split(cache_lines, &vec![1; curves.len()]);
        let accesses: Vec<u64> = curves.iter().map(|c| c.line_accesses).collect();
        let proportional = proportional_split(cache_lines, &accesses);
        let volumes: Vec<VolumeId> = curves.iter().map(|c| c.volume).collect();
        let splits = [
            ("best", best_lines, Some(predicted)),
            ("equal", equal, None),
            ("proportional", proportional, None),
        ];
        let lines: Vec<Vec<u64>> = splits.iter().map(|s| s.1.clone()).collect();
        let simulated = simulate_splits(reader, line, &PolicySpec::lru(), &volumes, &lines)?;
        Ok(AllocateReport {
            trace: reader.name().to_string(),
            line_size: line.bytes(),
            cache_lines,
            unit_lines,
            method: method.to_string(),
            volumes: curves
                .iter()
                .map(|c| VolumeRow {
                    volume: c.volume,
                    requests: c.requests,
                    line_accesses: c.line_accesses,
                    footprint_lines: c.footprint_lines,
                })
                .collect(),
            splits: splits
                .into_iter()
                .zip(simulated)
                .map(|((name, lines, predicted_misses), simulated)| SplitReport {
                    name,
                    lines,
                    predicted_misses,
                    simulated,
                })
                .collect(),
        })
    }

    /// The report as `iocache trace allocate` prints it.
    pub fn text(&self) -> String {
        let accesses = self.splits[0].simulated.accesses;
        let mut out = format!(
            "trace {}: {} volumes, {accesses} line accesses; a cache of {} lines of {} B, split in units of {} \
             lines by {} LRU curves\n",
            self.trace,
            self.volumes.len(),
            self.cache_lines,
            self.line_size,
            self.unit_lines,
            self.method
        );
        let rows: Vec<Vec<String>> = self
            .splits
            .iter()
            .map(|s| {
                vec![
                    s.name.to_string(),
                    s.predicted_misses.map_or("-".into(), |p| format!("{p:.0}")),
                    s.simulated.misses.to_string(),
                    format!("{:.4}", s.simulated.misses as f64 / accesses.max(1) as f64),
                ]
            })
            .collect();
        out += &crate::report::table(
            &["split", "predicted misses", "simulated misses", "miss ratio"],
            &rows,
        );
        out += "\nbusiest volumes (lines each split gives, simulated misses):\n";
        let rows: Vec<Vec<String>> = self
            .volumes
            .iter()
            .enumerate()
            .take(10)
            .map(|(i, v)| {
                let mut row = vec![
                    v.volume.to_string(),
                    v.line_accesses.to_string(),
                    v.footprint_lines.to_string(),
                ];
                for s in &self.splits {
                    row.push(format!("{} ({})", s.lines[i], s.simulated.volume_misses[i]));
                }
                row
            })
            .collect();
        out += &crate::report::table(
            &["volume", "accesses", "footprint", "best", "equal", "proportional"],
            &rows,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(volume: VolumeId, misses: &[f64]) -> MissTable {
        MissTable {
            volume,
            misses: misses.to_vec(),
        }
    }

    /// Every split of `units` among `n` volumes.
    fn all_splits(n: usize, units: usize) -> Vec<Vec<usize>> {
        if n == 1 {
            return (0..=units).map(|k| vec![k]).collect();
        }
        let mut out = Vec::new();
        for k in 0..=units {
            for mut rest in all_splits(n - 1, units - k) {
                rest.insert(0, k);
                out.push(rest);
            }
        }
        out
    }

    #[test]
    fn the_best_split_equals_a_brute_force_search() {
        // Non-convex curves (cliffs, as a loop larger than a partition
        // gives), several seeds, against every split.
        let mut state = 17u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as f64 / 2f64.powi(31)
        };
        for round in 0..200 {
            let n = 1 + round % 4;
            let units = 1 + round % 7;
            let tables: Vec<MissTable> = (0..n)
                .map(|v| {
                    let accesses = 100.0 + (next() * 900.0).round();
                    let mut misses = vec![accesses];
                    for _ in 0..units {
                        // Non-increasing, with cliffs.
                        let last = *misses.last().unwrap();
                        let drop = if next() < 0.3 {
                            next() * last
                        } else {
                            next() * last * 0.1
                        };
                        misses.push((last - drop).round());
                    }
                    table(v as VolumeId, &misses)
                })
                .collect();
            let (split, total) = best_split(&tables, units);
            assert!(split.iter().sum::<usize>() <= units);
            assert!((predicted_misses(&tables, &split) - total).abs() < 1e-6);
            let brute = all_splits(n, units)
                .into_iter()
                .map(|s| predicted_misses(&tables, &s))
                .fold(f64::INFINITY, f64::min);
            assert!(
                (total - brute).abs() < 1e-6,
                "round {round}: {total} against brute force {brute}"
            );
        }
    }

    #[test]
    fn proportional_parts_add_up() {
        assert_eq!(proportional_split(10, &[1, 1, 1]), vec![4, 3, 3]);
        assert_eq!(proportional_split(100, &[3, 1]), vec![75, 25]);
        assert_eq!(proportional_split(7, &[0, 0]), vec![0, 0]);
        assert_eq!(proportional_split(5, &[1, 0, 4]).iter().sum::<u64>(), 5);
    }
}
