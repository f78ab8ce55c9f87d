//! `iocache trace allocate`: one cache split among a trace's volumes by
//! their miss-ratio curves (`iocache_sim::allocate`), and the split checked
//! by simulation against an equal and a proportional one.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};
use clap::Args;
use iocache_sim::allocate::{best_split, proportional_split, simulate_splits, MissTable, SimulatedSplit};
use iocache_sim::mrc::{per_volume_curves, MrcMethod, VolumeCurve, VolumeSizes};
use iocache_sim::CacheSize;
use serde::Serialize;

use crate::args::{parse_line_size, OutputFile, TraceInput};
use crate::progress;

#[derive(Args)]
pub struct TraceAllocateArgs {
    #[command(flatten)]
    input: TraceInput,
    /// The cache to split: a line count, or a size with a unit.
    #[arg(long, value_name = "SIZE")]
    cache_size: String,
    /// Cache line size (a size with a unit, 512B to 32KiB).
    #[arg(long, default_value = "4KiB", value_name = "SIZE")]
    line_size: String,
    /// How each volume's LRU curve is computed: exact, or shards:RATE[:SEED] (sampled).
    #[arg(long, default_value = "exact", value_name = "METHOD")]
    method: String,
    /// The cache is split in this many equal units (the curves are computed at every multiple).
    #[arg(long, default_value = "64", value_name = "N")]
    units: usize,
    /// Write the splits and every volume's part as JSON to PATH, or to stdout with `-`.
    #[arg(long, value_name = "PATH|-")]
    json: Option<String>,
}

#[derive(Serialize)]
struct SplitReport {
    name: &'static str,
    /// Lines per volume, in `volumes` order.
    lines: Vec<u64>,
    /// What the curves predict (the best split only: the others' sizes
    /// fall between the curves' points).
    predicted_misses: Option<f64>,
    simulated: SimulatedSplit,
}

#[derive(Serialize)]
struct VolumeRow {
    volume: u32,
    requests: u64,
    line_accesses: u64,
    footprint_lines: u64,
}

#[derive(Serialize)]
struct AllocateReport {
    trace: String,
    line_size: u64,
    cache_lines: u64,
    unit_lines: u64,
    method: String,
    volumes: Vec<VolumeRow>,
    splits: Vec<SplitReport>,
}

/// `iocache trace allocate`.
pub fn run(args: TraceAllocateArgs) -> Result<()> {
    let line = parse_line_size(&args.line_size)?;
    let cache_lines = match args
        .cache_size
        .parse::<CacheSize>()
        .with_context(|| format!("--cache-size {}", args.cache_size))?
    {
        CacheSize::Lines(n) => n,
        CacheSize::Bytes(b) => b / line.bytes(),
    };
    if !(1..=4096).contains(&args.units) {
        bail!("--units {}: give 1 to 4096 units", args.units);
    }
    let unit_lines = cache_lines / args.units as u64;
    if unit_lines == 0 {
        bail!(
            "--cache-size {}: {cache_lines} lines cannot be split in {} units; give fewer units",
            args.cache_size,
            args.units
        );
    }
    let method: MrcMethod = args.method.parse()?;
    if !matches!(method, MrcMethod::Exact | MrcMethod::Shards { .. }) {
        bail!("--method {}: the curves are exact or shards:RATE", args.method);
    }
    if args.input.is_stdin() {
        bail!("trace allocate reads the trace twice (curves, then the simulation), which stdin cannot give: name the trace file");
    }
    let json_file = OutputFile::check("--json", args.json.as_deref())?;
    let input = &args.input;
    let mut bar = progress::Bar::new(std::io::stdout().is_terminal());
    let sizes: Vec<u64> = (1..=args.units as u64).map(|k| k * unit_lines).collect();
    let mut reader = input.open().map_err(|e| input.explain(e))?;
    let curves: Vec<VolumeCurve> = per_volume_curves(
        &mut reader,
        line,
        method,
        &VolumeSizes::Fixed(sizes),
        &mut |r, n| bar.update(r, n),
    )
    .map_err(|e| input.explain(e.into()))?;
    bar.finish();
    if curves.is_empty() {
        bail!("{}: the trace holds no data requests", reader.name());
    }
    let tables = curves
        .iter()
        .map(|c| MissTable::from_curve(c, unit_lines, args.units))
        .collect::<Result<Vec<_>, _>>()?;
    let (best, predicted) = best_split(&tables, args.units);
    let best_lines: Vec<u64> = best.iter().map(|&k| k as u64 * unit_lines).collect();
    let equal = proportional_split(cache_lines, &vec![1; curves.len()]);
    let accesses: Vec<u64> = curves.iter().map(|c| c.line_accesses).collect();
    let proportional = proportional_split(cache_lines, &accesses);
    let volumes: Vec<u32> = curves.iter().map(|c| c.volume).collect();
    let mut reader = input.open().map_err(|e| input.explain(e))?;
    let simulated = simulate_splits(
        &mut reader,
        line,
        &iocache_core::PolicySpec::lru(),
        &volumes,
        &[best_lines.clone(), equal.clone(), proportional.clone()],
    )
    .map_err(|e| input.explain(e.into()))?;
    let mut simulated = simulated.into_iter();
    let mut split = |name, lines, predicted_misses| SplitReport {
        name,
        lines,
        predicted_misses,
        simulated: simulated.next().expect("one result per split"),
    };
    let report = AllocateReport {
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
        splits: vec![
            split("best", best_lines, Some(predicted)),
            split("equal", equal, None),
            split("proportional", proportional, None),
        ],
    };
    if crate::args::write_json(args.json.as_deref(), json_file, &report)? {
        return Ok(());
    }
    print_report(&report);
    Ok(())
}

fn print_report(r: &AllocateReport) {
    let mut out = std::io::stdout().lock();
    let accesses = r.splits[0].simulated.accesses;
    let _ = writeln!(
        out,
        "trace {}: {} volumes, {accesses} line accesses; a cache of {} lines of {} B, split in units of {} lines \
         by {} LRU curves",
        r.trace,
        r.volumes.len(),
        r.cache_lines,
        r.line_size,
        r.unit_lines,
        r.method
    );
    let rows: Vec<Vec<String>> = r
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
    let _ = write!(
        out,
        "{}",
        iocache_sim::report::table(
            &["split", "predicted misses", "simulated misses", "miss ratio"],
            &rows
        )
    );
    let _ = writeln!(
        out,
        "\nbusiest volumes (lines each split gives, simulated misses):"
    );
    let rows: Vec<Vec<String>> = r
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
            for s in &r.splits {
                row.push(format!("{} ({})", s.lines[i], s.simulated.volume_misses[i]));
            }
            row
        })
        .collect();
    let _ = write!(
        out,
        "{}",
        iocache_sim::report::table(
            &["volume", "accesses", "footprint", "best", "equal", "proportional"],
            &rows
        )
    );
}
