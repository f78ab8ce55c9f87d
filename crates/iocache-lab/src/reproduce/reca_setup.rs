//! The setting ReCA's per-category reproductions (`reca-policies`,
//! `reca-priorities`) share, so that their numbers are comparable: an SSD
//! cache over a hard disk in the timing model, as the paper's testbed, a
//! cache of a fifth of the workload's footprint (§6.1), a closed loop, the
//! first half as warm-up, a miss filling its whole line; and the category
//! the classifier gives a whole trace.

use std::path::Path;

use crate::error::{invalid, Result, Within};
use iocache_core::reca::{Category, CategoryTable, RecaControllerParams};
use iocache_core::{Fill, LineSize, PolicySpec, WritePolicy};
use iocache_sim::reca::{reca_characterize, RecaCharacterization};
use iocache_sim::{CacheSettings, CacheSize, RunSpec, SimOptions};
use iocache_trace::{ReaderOptions, TraceReader};

use super::{closed_loop, workload, Context};

pub const OUTSTANDING: u32 = 16;
pub const CACHE_DEVICE: &str = "ssd";
pub const BACKEND_DEVICE: &str = "hdd";

/// One configuration: an architecture, its line size and write policy.
#[derive(Clone, PartialEq)]
pub struct Config {
    pub arch: String,
    pub policy: PolicySpec,
    pub line: u64,
    pub write_policy: WritePolicy,
}

impl Config {
    pub fn baseline(name: &str, line: u64, write_policy: WritePolicy) -> Result<Config> {
        Ok(Config {
            arch: name.to_string(),
            policy: name.parse::<PolicySpec>()?,
            line,
            write_policy,
        })
    }

    /// ReCA as `category` configures it, with the line size or the write
    /// policy changed when given.
    pub fn reca(category: &Category, line: Option<u64>, write_policy: Option<WritePolicy>) -> Config {
        Config {
            arch: "reca".into(),
            policy: category.policy_spec(None),
            line: line.unwrap_or(category.line_size.bytes()),
            write_policy: write_policy.unwrap_or(category.write_policy),
        }
    }
}

/// Mean response times (µs) of `configs` on one workload, in their order.
pub struct Measured {
    pub configs: Vec<Config>,
    pub mean_us: Vec<f64>,
}

impl Measured {
    pub fn of(&self, arch: &str, line: u64, write_policy: WritePolicy) -> f64 {
        (self.configs.iter().zip(&self.mean_us))
            .find(|(c, _)| c.arch == arch && c.line == line && c.write_policy == write_policy)
            .map_or(f64::NAN, |(_, &m)| m)
    }
}

/// Runs every configuration over the trace `open` reads (opened afresh
/// for each pass: footprint, length, the runs) in one pass, with a cache
/// of a fifth of the footprint in 4 KiB lines, in whole 128 KiB.
pub fn measure(
    ctx: &Context,
    open: &dyn Fn() -> Result<TraceReader>,
    configs: Vec<Config>,
) -> Result<(Measured, u64)> {
    let cache_bytes = cache_bytes_for(open()?)?;
    let requests = open()?.count() as u64;
    let specs = (configs.iter())
        .map(|c| run_spec(c, cache_bytes))
        .collect::<Result<Vec<_>>>()?;
    let options = SimOptions {
        warmup_requests: requests / 2,
        timing: Some(closed_loop(CACHE_DEVICE, BACKEND_DEVICE, OUTSTANDING, None)),
        ..SimOptions::default()
    };
    let report = ctx.simulate(&mut open()?, &specs, options)?;
    let mean_us = report
        .runs
        .iter()
        .map(|run| run.timing.as_ref().map_or(f64::NAN, |t| t.all.mean_ns / 1e3))
        .collect();
    Ok((Measured { configs, mean_us }, cache_bytes))
}

/// A fifth of the footprint of the trace `reader` reads, in 4 KiB lines,
/// rounded up to whole 128 KiB: the cache size of every ReCA reproduction.
pub fn cache_bytes_for(reader: TraceReader) -> Result<u64> {
    let footprint = crate::experiment::footprint_lines(reader, LineSize::new(4096)?)?;
    Ok((footprint * 4096 / 5).next_multiple_of(128 << 10))
}

/// One configuration's run with a cache of `cache_bytes`.
pub fn run_spec(c: &Config, cache_bytes: u64) -> Result<RunSpec> {
    let line_size = LineSize::new(c.line)?;
    let size = CacheSize::Bytes(cache_bytes);
    Ok(RunSpec {
        policy: c.policy.clone(),
        size,
        capacity_lines: size.lines(line_size)?.max(1),
        line_size,
        settings: CacheSettings {
            write_policy: c.write_policy,
            // A miss brings its whole line in, as the paper's cache
            // (EnhanceIO's) does: what makes large lines pay on
            // sequential categories.
            fill: Fill::Line,
            ..CacheSettings::default()
        },
    })
}

/// A trace file as a reader.
pub fn open_trace(path: &Path) -> Result<TraceReader> {
    TraceReader::open(path, None, ReaderOptions::default()).at_file(path)
}

/// What the classifier makes of the whole trace `open` reads (one window
/// over all of it), and the category of `table` it is nearest to.
pub fn whole_trace_category<'t>(
    open: &dyn Fn() -> Result<TraceReader>,
    table: &'t CategoryTable,
    name: &str,
) -> Result<(RecaCharacterization, &'t Category)> {
    let requests = open()?.count() as u64;
    let params = RecaControllerParams {
        window_requests: requests.max(1),
        ..RecaControllerParams::default()
    };
    let seen = reca_characterize(&mut open()?, table, params).within(|| name.to_string())?;
    let category = table
        .categories
        .iter()
        .find(|c| c.name == seen.category)
        .ok_or_else(|| invalid!("{name}: classified as `{}`, not in the table", seen.category))?;
    Ok((seen, category))
}

/// The built-in table's category `name` and its reference workload (the
/// TOML `text`), a fifth as long with `quick`.
pub fn reference<'t>(
    table: &'t CategoryTable,
    name: &str,
    text: &str,
    quick: bool,
) -> Result<(&'t Category, iocache_sim::workload::WorkloadSpec)> {
    let category = (table.categories.iter())
        .find(|c| c.name == name)
        .ok_or_else(|| invalid!("the built-in category table has no `{name}`"))?;
    let mut spec = workload(text)?;
    if quick {
        for phase in &mut spec.phases {
            phase.requests /= 5;
        }
    }
    Ok((category, spec))
}
