//! `iocache trace mrc`, the command line of the
//! simulator's miss-ratio curves (`iocache_sim::mrc`), kept out of main.rs
//! so that each command's options and output live in one place.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use iocache_sim::mini::mini_curves;
use iocache_sim::mrc::{miss_ratio_curves, MrcMethod, MrcReport};
use iocache_sim::CacheSize;

use crate::args::{parse_line_size, OutputFile, TraceFormatArgs, TraceInput};
use crate::progress;

#[derive(Args)]
pub struct TraceMrcArgs {
    /// Trace file, or `-` for stdin.
    #[arg(value_name = "PATH")]
    trace: PathBuf,
    #[command(flatten)]
    reading: TraceFormatArgs,
    /// Cache line size (a size with a unit, 512B to 1MiB; above 32KiB the exact curve is
    /// computed by simulating every size, and SHARDS and OPT are not offered).
    #[arg(long, default_value = "4KiB", value_name = "SIZE")]
    line_size: String,
    /// Cache sizes of the curve's points, comma separated: a bare number is a line count, a size
    /// with a unit is bytes (default: powers of two up to the footprint).
    #[arg(long, value_delimiter = ',', value_name = "SIZES")]
    sizes: Vec<String>,
    /// Methods, comma separated: exact (stack distances, every access), shards:RATE[:SEED] (spatial
    /// sampling at RATE, e.g. shards:0.01; a SEED changes which lines are sampled),
    /// shards-fixed:LINES (at most LINES sampled lines), opt
    /// (Belady: the bound no policy beats; computed per size), mini:RATE[:SEED] (miniature
    /// simulation of every --policy: SHARDS's sample through caches scaled down by RATE).
    #[arg(long, default_value = "exact", value_delimiter = ',', value_name = "METHODS")]
    method: Vec<String>,
    /// The policies of the miniature curves (mini:RATE), comma separated (`iocache policies`).
    #[arg(long, default_value = "lru", value_delimiter = ',', value_name = "NAMES")]
    policy: Vec<String>,
    /// Write the curves as JSON to PATH, or to stdout with `-` (docs/sim-json.md).
    #[arg(long, value_name = "PATH|-")]
    json: Option<String>,
    /// Also write an HTML report (the curves, their table and each sampled curve's difference
    /// from exact): one file, readable offline.
    #[arg(long, value_name = "FILE.html")]
    report: Option<PathBuf>,
    /// Every volume's curve, in one pass (one method: exact or shards:RATE): the 10 busiest in
    /// the table, all in --json.
    #[arg(long, conflicts_with = "report")]
    per_volume: bool,
}

/// `iocache trace mrc`.
pub fn run(args: TraceMrcArgs) -> Result<()> {
    let input = args.reading.input(args.trace.clone());
    let line = parse_line_size(&args.line_size)?;
    if args.per_volume {
        return run_per_volume(&args, &input, line);
    }
    let mut methods = Vec::new();
    let mut minis = Vec::new();
    for m in &args.method {
        match m.trim().strip_prefix("mini:") {
            Some(rest) => minis.push(mini_method(m, rest)?),
            None => methods.push(m.parse::<MrcMethod>()?),
        }
    }
    // Above 32 KiB lines the stack-distance pass cannot track a line's
    // sectors (one 64-bit mask): the exact curve is then a full
    // simulation at every size (a miniature at rate 1, which is one).
    let mut exact_by_simulation = false;
    if line.bytes() > iocache_sim::mrc::MAX_LINE_BYTES {
        if let Some(m) = methods.iter().find(|m| **m != MrcMethod::Exact) {
            bail!(
                "--method {m} tracks the sectors of lines up to {} B; with {} B lines use exact \
                 (every size simulated) or mini:RATE",
                iocache_sim::mrc::MAX_LINE_BYTES,
                line.bytes()
            );
        }
        exact_by_simulation = !methods.is_empty();
        methods.clear();
    }
    let policies = args
        .policy
        .iter()
        .map(|p| {
            p.parse::<iocache_core::PolicySpec>()
                .map_err(|e| anyhow::anyhow!("--policy {p}: {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    // Miniature curves read the trace again (after the other curves, or
    // after counting the footprint for their sizes).
    if (!minis.is_empty() || exact_by_simulation)
        && (!methods.is_empty() || args.sizes.is_empty() || exact_by_simulation)
        && input.is_stdin()
    {
        bail!("mini:RATE reads the trace a second time, which stdin cannot give: name the trace file");
    }
    let sizes = parse_sizes(&args.sizes, line)?;
    let report_path = args.report.as_deref().map(|p| p.to_string_lossy());
    crate::args::distinct_outputs(&[
        ("--json", args.json.as_deref()),
        ("--report", report_path.as_deref()),
    ])?;
    let json_file = OutputFile::check("--json", args.json.as_deref())?;
    let report_file = OutputFile::check_path("--report", args.report.as_deref())?;
    let mut reader = input.open().map_err(|e| input.explain(e))?;
    let mut bar = progress::Bar::new(std::io::stdout().is_terminal());
    let mut report = if methods.is_empty() {
        MrcReport {
            trace: reader.name().to_string(),
            format: reader.format().to_string(),
            line_size: line.bytes(),
            requests: 0,
            line_accesses: 0,
            footprint_lines: 0,
            seconds: 0.0,
            curves: Vec::new(),
        }
    } else {
        miss_ratio_curves(
            &mut reader,
            line,
            &methods,
            (!sizes.is_empty()).then_some(sizes.as_slice()),
            &mut |r, n| bar.update(r, n),
        )
        .map_err(|e| input.explain(e.into()))?
    };
    bar.finish();
    if exact_by_simulation {
        let sizes = if sizes.is_empty() {
            let reader = input.open().map_err(|e| input.explain(e))?;
            report.footprint_lines = iocache_lab::experiment::footprint_lines(reader, line)?;
            iocache_sim::mrc::default_sizes(report.footprint_lines)
        } else {
            sizes.clone()
        };
        let started = std::time::Instant::now();
        let mut reader = input.open().map_err(|e| input.explain(e))?;
        let (mut curves, requests) = mini_curves(
            &mut reader,
            line,
            &[iocache_core::PolicySpec::lru()],
            &sizes,
            1.0,
            0,
            &mut |r, n| bar.update(r, n),
        )
        .map_err(|e| input.explain(e.into()))?;
        bar.finish();
        let mut exact = curves.remove(0);
        exact.method = "exact".into();
        report.requests = requests;
        report.line_accesses = exact.accesses as u64;
        report.seconds += started.elapsed().as_secs_f64();
        report.curves.insert(0, exact);
    }
    if !minis.is_empty() {
        let started = std::time::Instant::now();
        let mini_sizes = if !sizes.is_empty() {
            sizes.clone()
        } else if let Some(curve) = report.curves.first() {
            curve.points.iter().map(|p| p.cache_lines).collect()
        } else {
            let reader = input.open().map_err(|e| input.explain(e))?;
            report.footprint_lines = iocache_lab::experiment::footprint_lines(reader, line)?;
            iocache_sim::mrc::default_sizes(report.footprint_lines)
        };
        for &(rate, seed) in &minis {
            let mut reader = input.open().map_err(|e| input.explain(e))?;
            let (curves, requests) = mini_curves(
                &mut reader,
                line,
                &policies,
                &mini_sizes,
                rate,
                seed,
                &mut |r, n| bar.update(r, n),
            )
            .map_err(|e| input.explain(e.into()))?;
            bar.finish();
            if report.requests == 0 {
                report.requests = requests;
                report.line_accesses = curves.first().map_or(0, |c| c.accesses as u64);
            }
            if report.footprint_lines == 0 {
                // Only sizes were given: the sample's estimate.
                report.footprint_lines = curves
                    .first()
                    .map_or(0, |c| (c.sampled_lines as f64 / rate).round() as u64);
            }
            report.curves.extend(curves);
        }
        iocache_sim::mrc::compare_with_exact(&mut report.curves);
        report.seconds += started.elapsed().as_secs_f64();
    }
    if report.requests == 0 {
        bail!("{}: the trace holds no data requests", reader.name());
    }
    if let Some(file) = report_file {
        crate::lab_cli::write_report(file, &iocache_lab::reports::mrc(&report))?;
    }
    if crate::args::write_json(args.json.as_deref(), json_file, &report)? {
        return Ok(());
    }
    print!("{}", report.text());
    Ok(())
}

/// `--sizes` in lines (a bare number is lines, a size with a unit bytes),
/// ascending, each once; a size under one line is refused.
fn parse_sizes(texts: &[String], line: iocache_core::LineSize) -> Result<Vec<u64>> {
    let mut sizes = texts
        .iter()
        .map(|s| {
            let lines = match s.parse::<CacheSize>().with_context(|| format!("--sizes {s}"))? {
                CacheSize::Lines(n) => n,
                CacheSize::Bytes(b) => b / line.bytes(),
            };
            if lines == 0 {
                bail!("--sizes {s}: less than one line of {}", line.bytes());
            }
            Ok(lines)
        })
        .collect::<Result<Vec<u64>>>()?;
    sizes.sort_unstable();
    sizes.dedup();
    Ok(sizes)
}

/// `iocache trace mrc --per-volume`.
fn run_per_volume(args: &TraceMrcArgs, input: &TraceInput, line: iocache_core::LineSize) -> Result<()> {
    let [method] = args.method.as_slice() else {
        bail!("--per-volume: give one --method (exact or shards:RATE)");
    };
    let method: MrcMethod = method.parse()?;
    if !matches!(
        method,
        MrcMethod::Exact | MrcMethod::Shards { .. } | MrcMethod::ShardsFixed { .. }
    ) {
        bail!(
            "--per-volume: --method {method} is computed for the whole trace only; use exact or shards:RATE"
        );
    }
    let sizes = parse_sizes(&args.sizes, line)?;
    let json_file = OutputFile::check("--json", args.json.as_deref())?;
    let mut reader = input.open().map_err(|e| input.explain(e))?;
    let mut bar = progress::Bar::new(std::io::stdout().is_terminal());
    let volume_sizes = match sizes.is_empty() {
        true => iocache_sim::mrc::VolumeSizes::Footprint,
        false => iocache_sim::mrc::VolumeSizes::Fixed(sizes),
    };
    let volumes =
        iocache_sim::mrc::per_volume_curves(&mut reader, line, method, &volume_sizes, &mut |r, n| {
            bar.update(r, n)
        })
        .map_err(|e| input.explain(e.into()))?;
    bar.finish();
    if volumes.is_empty() {
        bail!("{}: the trace holds no data requests", reader.name());
    }
    let report = iocache_sim::mrc::PerVolumeReport {
        trace: reader.name().to_string(),
        format: reader.format().to_string(),
        line_size: line.bytes(),
        method: method.to_string(),
        volumes: &volumes,
    };
    if crate::args::write_json(args.json.as_deref(), json_file, &report)? {
        return Ok(());
    }
    print!("{}", report.text());
    Ok(())
}

/// `mini:RATE[:SEED]`'s rate and seed (`text` is the whole method).
fn mini_method(text: &str, rest: &str) -> Result<(f64, u64)> {
    let (rate, seed) = match rest.split_once(':') {
        Some((rate, seed)) => (
            rate,
            seed.trim()
                .parse::<u64>()
                .map_err(|_| anyhow::anyhow!("--method {text}: the seed is not a whole number"))?,
        ),
        None => (rest, 0),
    };
    match rate.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok((r, seed)),
        _ => bail!("--method {text}: the rate of mini:RATE is above 0 and at most 1 (e.g. mini:0.01)"),
    }
}
