//! Every volume's miss-ratio curve in one pass over a trace shared by many
//! volumes: one accumulator per volume, so memory grows with the volumes
//! and their footprints, never with the trace's length.

use std::collections::HashMap;

use iocache_core::bitmap::single_word_mask;
use iocache_core::fasthash::FxBuildHasher;
use iocache_core::{split_request, LineKey, LineSize, VolumeId};
use iocache_trace::TraceReader;
use serde::Serialize;

use super::{Accumulator, MrcCurve, MrcMethod, BATCH, MAX_LINE_BYTES};
use crate::error::SimError;
use crate::run::request_of;

/// Times an accumulator holds before its first compaction, per volume
/// (small: a trace may have thousands of volumes).
const VOLUME_MIN_TIMES: usize = 1 << 12;

/// Which sizes each volume's curve is given at.
#[derive(Clone, Debug)]
pub enum VolumeSizes {
    /// Powers of two up to each volume's footprint ([`super::default_sizes`]).
    Footprint,
    /// These sizes (in lines, ascending) for every volume.
    Fixed(Vec<u64>),
}

/// One volume's curve.
#[derive(Clone, Debug, Serialize)]
pub struct VolumeCurve {
    pub volume: VolumeId,
    pub requests: u64,
    pub line_accesses: u64,
    /// Distinct lines (estimated from the sample for SHARDS).
    pub footprint_lines: u64,
    pub curve: MrcCurve,
}

/// Every volume's curve by `method` (exact or a SHARDS variant), in one
/// pass over `reader`, busiest volume (most line accesses) first.
pub fn per_volume_curves(
    reader: &mut TraceReader,
    line: LineSize,
    method: MrcMethod,
    sizes: &VolumeSizes,
    progress: &mut dyn FnMut(&TraceReader, u64),
) -> Result<Vec<VolumeCurve>, SimError> {
    if method == MrcMethod::Opt {
        return Err(SimError::Spec(
            "per-volume curves are exact or sampled (shards); opt is computed for the whole trace only"
                .into(),
        ));
    }
    if line.bytes() > MAX_LINE_BYTES {
        return Err(SimError::Spec(format!(
            "miss-ratio curves track the sectors of lines up to {MAX_LINE_BYTES} B; {} B lines are not supported",
            line.bytes()
        )));
    }
    let full_mask = single_word_mask(0, line.sectors());
    struct Volume {
        accumulator: Accumulator,
        batch: Vec<(LineKey, u64)>,
        requests: u64,
        line_accesses: u64,
    }
    let mut volumes: HashMap<VolumeId, Volume, FxBuildHasher> = HashMap::default();
    let mut requests = 0u64;
    while let Some(record) = reader.next() {
        let request = request_of(&record?);
        if request.length_bytes == 0 {
            continue;
        }
        requests += 1;
        let v = volumes.entry(request.volume).or_insert_with(|| Volume {
            accumulator: Accumulator::with_min_times(method, VOLUME_MIN_TIMES),
            batch: Vec::new(),
            requests: 0,
            line_accesses: 0,
        });
        v.requests += 1;
        for part in split_request(&request, line) {
            v.line_accesses += 1;
            let mask = single_word_mask(part.first_sector, part.end_sector);
            v.batch.push((part.key, mask));
        }
        if v.batch.len() >= BATCH {
            v.accumulator.access_batch(&v.batch, full_mask);
            v.batch.clear();
        }
        if requests.is_multiple_of(65_536) {
            progress(reader, requests);
        }
    }
    let mut curves: Vec<VolumeCurve> = volumes
        .into_iter()
        .map(|(volume, mut v)| {
            v.accumulator.access_batch(&v.batch, full_mask);
            let footprint_lines = match method {
                MrcMethod::Exact => v.accumulator.lines_tracked as u64,
                _ => (v.accumulator.lines_tracked as f64 / v.accumulator.rate()).round() as u64,
            };
            let sizes = match sizes {
                VolumeSizes::Footprint => super::default_sizes(footprint_lines),
                VolumeSizes::Fixed(s) => s.clone(),
            };
            VolumeCurve {
                volume,
                requests: v.requests,
                line_accesses: v.line_accesses,
                footprint_lines,
                curve: v.accumulator.finish(v.line_accesses, &sizes, line.bytes()),
            }
        })
        .collect();
    curves.sort_by(|a, b| {
        b.line_accesses
            .cmp(&a.line_accesses)
            .then(a.volume.cmp(&b.volume))
    });
    Ok(curves)
}

/// Every volume's curve of one trace, as `iocache trace mrc --per-volume`
/// reports it.
#[derive(Debug, Serialize)]
pub struct PerVolumeReport<'a> {
    pub trace: String,
    pub format: String,
    pub line_size: u64,
    pub method: String,
    pub volumes: &'a [VolumeCurve],
}

impl PerVolumeReport<'_> {
    /// The report as text: the ten busiest volumes' curves.
    pub fn text(&self) -> String {
        let mut out = format!(
            "trace {} ({}): {} volumes, {} curves of {} B lines; the {} busiest:\n",
            self.trace,
            self.format,
            self.volumes.len(),
            self.method,
            self.line_size,
            self.volumes.len().min(10)
        );
        for v in self.volumes.iter().take(10) {
            let points: Vec<String> = v
                .curve
                .points
                .iter()
                .map(|p| format!("{}:{:.3}", p.cache_lines, p.miss_ratio))
                .collect();
            out += &format!(
                "volume {}: {} line accesses, footprint {} lines; miss ratio at lines {}\n",
                v.volume,
                v.line_accesses,
                v.footprint_lines,
                points.join(" ")
            );
        }
        out
    }
}
