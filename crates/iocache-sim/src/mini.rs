//! Miss-ratio curves of any policy by miniature simulation (Waldspurger et
//! al., ATC'17): the line accesses whose line hashes below `rate` of the
//! hash space (SHARDS's spatial sample, the same lines `shards:RATE`
//! samples) replayed through caches scaled down by the rate, one per
//! policy and size, all fed in one pass. A point costs about `rate` × one
//! full simulation; at rate 1 it is the full simulation, access for access.

use iocache_core::{split_request, AccessHints, Cache, LineSize, PolicySpec, Request, SECTOR_BYTES};
use iocache_trace::TraceReader;

use crate::error::SimError;
use crate::mrc::{is_sampled, line_hash, sample_threshold, MrcCurve, MrcPoint};
use crate::run::request_of;
use crate::spec::{CacheSettings, CacheSize, RunSpec};

/// One miniature cache: a policy at one size, scaled down.
struct Mini {
    cache: Cache,
    /// The full-size cache it stands for, in lines.
    cache_lines: u64,
}

/// The curves of `policies` at `sizes` (lines of `line`; full-size), by
/// miniature simulation at `rate` (0 < rate <= 1) with the sample's hash
/// salted by `seed` (0: SHARDS's default hash). Caches run write-back with
/// promotion `always`, as the exact curve's LRU does. One pass over
/// `reader`; `progress` is told the records read now and then. Returns
/// the curves (in `policies` order) and the data requests read.
pub fn mini_curves(
    reader: &mut TraceReader,
    line: LineSize,
    policies: &[PolicySpec],
    sizes: &[u64],
    rate: f64,
    seed: u64,
    progress: &mut dyn FnMut(&TraceReader, u64),
) -> Result<(Vec<MrcCurve>, u64), SimError> {
    if !(rate > 0.0 && rate <= 1.0) {
        return Err(SimError::Spec(format!(
            "a miniature rate is above 0 and at most 1, not {rate}"
        )));
    }
    let (threshold, salt) = sample_threshold(rate, seed);
    let settings = CacheSettings::default();
    let mut minis: Vec<Vec<Mini>> = Vec::with_capacity(policies.len());
    for policy in policies {
        let mut row = Vec::with_capacity(sizes.len());
        for &cache_lines in sizes {
            let scaled = ((cache_lines as f64 * rate).round() as u64).max(1);
            let spec = RunSpec {
                policy: policy.clone(),
                size: CacheSize::Lines(scaled),
                capacity_lines: scaled,
                line_size: line,
                settings: settings.clone(),
            };
            row.push(Mini {
                cache: Cache::new(spec.cache_config())?,
                cache_lines,
            });
        }
        minis.push(row);
    }
    let sector = SECTOR_BYTES;
    let (mut records, mut accesses, mut sampled) = (0u64, 0u64, 0u64);
    let mut lines = std::collections::HashSet::new();
    while let Some(record) = reader.next() {
        let request = request_of(&record?);
        records += 1;
        if records.is_multiple_of(1 << 16) {
            progress(reader, records);
        }
        if request.length_bytes == 0 {
            continue;
        }
        // Whole sectors, as the cache widens a request.
        let start = request.offset_bytes / sector * sector;
        let end = (request.offset_bytes + request.length_bytes).div_ceil(sector) * sector;
        let widened = Request {
            offset_bytes: start,
            length_bytes: end - start,
            ..request
        };
        for part in split_request(&widened, line) {
            accesses += 1;
            if !is_sampled(line_hash(part.key, salt), threshold) {
                continue;
            }
            sampled += 1;
            lines.insert(part.key);
            let one = Request {
                offset_bytes: (part.key.line_index << line.shift()) + u64::from(part.first_sector) * sector,
                length_bytes: u64::from(part.sectors()) * sector,
                ..widened
            };
            for mini in minis.iter_mut().flatten() {
                mini.cache.access_counted(&one, AccessHints::default())?;
            }
        }
    }
    let curves = policies
        .iter()
        .zip(minis)
        .map(|(policy, row)| MrcCurve {
            method: format!(
                "mini:{rate}{} {policy}",
                if seed == 0 {
                    String::new()
                } else {
                    format!(":{seed}")
                }
            ),
            policy: policy.to_string(),
            accesses: accesses as f64,
            sampled_accesses: sampled,
            sampled_lines: lines.len() as u64,
            final_rate: rate,
            points: row
                .iter()
                .map(|m| {
                    let s = m.cache.stats();
                    MrcPoint {
                        cache_lines: m.cache_lines,
                        cache_bytes: m.cache_lines * line.bytes(),
                        miss_ratio: if s.accesses == 0 {
                            0.0
                        } else {
                            1.0 - s.full_hits as f64 / s.accesses as f64
                        },
                    }
                })
                .collect(),
            max_error_vs_exact: None,
            mean_error_vs_exact: None,
        })
        .collect();
    Ok((curves, records))
}
