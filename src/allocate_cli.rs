//! `iocache trace allocate`: one cache split among a trace's volumes by
//! their miss-ratio curves (`iocache_sim::allocate`), and the split checked
//! by simulation against an equal and a proportional one.

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use clap::Args;
use iocache_sim::allocate::AllocateReport;
use iocache_sim::mrc::{per_volume_curves, MrcMethod, VolumeCurve, VolumeSizes};
use iocache_sim::CacheSize;

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
    let mut reader = input.open().map_err(|e| input.explain(e))?;
    let report = AllocateReport::build(
        &mut reader,
        line,
        cache_lines,
        args.units,
        &method.to_string(),
        &curves,
    )
    .map_err(|e| input.explain(e.into()))?;
    if crate::args::write_json(args.json.as_deref(), json_file, &report)? {
        return Ok(());
    }
    print!("{}", report.text());
    Ok(())
}
