//! The command-line face of ReCA: `iocache sim --adapt reca [--reca-table
//! FILE] [--reca-window N] [--reca-series PATH]`, `iocache trace stats
//! --reca`, and ReCA's status as `iocache stats` and `ctl get` print it
//! (a serving cache runs it through `iocache_serving::reca`). It prints
//! the controller's events and windows and writes the per-window series.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::args::{runs_json, table_of, OutputFile};

use anyhow::{bail, Context, Result};
use clap::Args;
use iocache_core::reca::{CategoryTable, RecaControllerParams, FEATURE_NAMES};

use iocache_sim::reca::{reca_characterize, RecaCharacterization, RecaOptions, RecaWindowRow};
use iocache_sim::report::table;
use iocache_trace::TraceReader;

/// ReCA's options of `iocache sim`.
#[derive(Args)]
pub struct SimRecaArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Write ReCA's per-window series (hit ratios, category, line size,
    /// workload vector) to PATH: CSV if it ends in .csv, else JSON.
    #[arg(long, value_name = "PATH", requires = "adapt")]
    reca_series: Option<String>,
}

/// The category table and window, shared by `sim` and `trace stats`.
#[derive(Args)]
pub struct TableArgs {
    /// ReCA's category table (TOML; default: the built-in
    /// crates/iocache-core/data/reca-categories.toml).
    #[arg(long, value_name = "FILE")]
    reca_table: Option<PathBuf>,
    /// Requests per ReCA window (the paper: 100000).
    #[arg(long, value_name = "REQUESTS", default_value = "100000")]
    reca_window: u64,
    /// Probes per window for the change test: two probes in a row nearer
    /// another category close the window early (0: windows always run
    /// their length).
    #[arg(long, value_name = "N", default_value = "10")]
    reca_probes: u64,
    /// Also characterize each process of the trace apart (the PID that
    /// blkparse and FIU traces record) and give each its category's write
    /// policy, its line size as what its reads fill, and (under `reca`) its
    /// priorities; the cache's line size and eviction rule stay the whole
    /// workload's.
    #[arg(long)]
    reca_per_process: bool,
}

impl TableArgs {
    fn load(&self) -> Result<(CategoryTable, RecaControllerParams)> {
        let options = reca_options(
            self.reca_table.as_deref(),
            self.reca_window,
            "--reca-table",
            "--reca-window",
        )?;
        let params = RecaControllerParams {
            probes_per_window: self.reca_probes,
            per_process: self.reca_per_process,
            ..options.params
        };
        Ok((options.table, params))
    }
}

/// ReCA's options from a category table (the built-in one without a path)
/// and a window in requests; `table_name` and `window_name` name them in errors.
pub fn reca_options(
    table: Option<&Path>,
    window: u64,
    table_name: &str,
    window_name: &str,
) -> Result<RecaOptions> {
    if window == 0 {
        bail!("{window_name} must be at least 1");
    }
    RecaOptions::load(table, window).with_context(|| table_name.to_string())
}

/// `--adapt` names ReCA (the other controllers are the simulator's
/// `AdaptSpec`).
pub fn is_reca(adapt: Option<&str>) -> bool {
    adapt.is_some_and(|a| a.trim() == "reca")
}

/// The simulator's ReCA options, when `--adapt reca` is given.
pub fn sim_options(args: &SimRecaArgs, adapt: Option<&str>) -> Result<Option<RecaOptions>> {
    if !is_reca(adapt) {
        if args.table.reca_table.is_some() {
            // A table alone is still checked, so a typo is not silent.
            args.table.load()?;
        }
        return Ok(None);
    }
    let (table, params) = args.table.load()?;
    Ok(Some(RecaOptions { table, params }))
}

/// The `--reca-series` path, if given.
pub fn series_path(args: &SimRecaArgs) -> Option<&str> {
    args.reca_series.as_deref()
}

/// The `--reca-series` file, opened before the run; refused without
/// `--adapt reca` (there would be no series) and for stdout.
pub fn series_file(args: &SimRecaArgs, adapt: Option<&str>) -> Result<Option<OutputFile>> {
    let Some(path) = args.reca_series.as_deref() else {
        return Ok(None);
    };
    if !is_reca(adapt) {
        bail!(
            "--reca-series {path}: ReCA's series needs --adapt reca (given: --adapt {})",
            adapt.unwrap_or_default()
        );
    }
    crate::args::not_stdout(
        "--reca-series",
        Some(path),
        "stdout carries the run's table or JSON",
    )?;
    OutputFile::check("--reca-series", Some(path))
}

/// Prints each run's category changes and windows (unless stdout carries
/// the JSON: `print` false), and writes the series file opened before the run.
pub fn report(series: Option<OutputFile>, report: &iocache_sim::SimReport, print: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for run in report.runs.iter().filter(|_| print) {
        let Some(reca) = &run.reca else { continue };
        let _ = writeln!(
            out,
            "\nReCA on {} {}: {} windows, {} category changes, {} cache rebuilds ({:.1} MiB moved, {:.1} MiB written back, {:.1} MiB clean dropped)",
            run.spec.policy,
            run.spec.size,
            reca.windows.len(),
            reca.events.len(),
            reca.relayouts,
            reca.moved_bytes as f64 / (1 << 20) as f64,
            reca.written_back_bytes as f64 / (1 << 20) as f64,
            reca.dropped_clean_bytes as f64 / (1 << 20) as f64,
        );
        for event in &reca.events {
            let _ = writeln!(out, "  {event}");
        }
        let header = [
            "window",
            "requests",
            "category (from its end)",
            "line",
            "wp",
            "hit",
            "read hit",
            "write hit",
            "byte hit",
        ];
        let windows = table_of(&header, &reca.windows, |w| {
            vec![
                w.index.to_string(),
                w.requests.to_string(),
                w.category.clone(),
                iocache_core::units::format_byte_size(w.line_bytes),
                w.write_policy.clone(),
                format!("{:.4}", w.hit_ratio),
                format!("{:.4}", w.read_hit_ratio),
                format!("{:.4}", w.write_hit_ratio),
                format!("{:.4}", w.byte_hit_ratio),
            ]
        });
        let _ = write!(out, "{windows}");
    }
    if let Some(file) = series {
        let path = file.path.display().to_string();
        let text = series_text(&file.path, report)?;
        file.write(&text)
            .with_context(|| format!("writing --reca-series {path}"))?;
    }
    Ok(())
}

fn series_text(path: &Path, report: &iocache_sim::SimReport) -> Result<String> {
    let mut out: Vec<u8> = Vec::new();
    if path.extension().is_some_and(|e| e == "csv") {
        writeln!(out, "policy,cache_size,{}", RecaWindowRow::csv_header())?;
        for run in &report.runs {
            for row in run.reca.iter().flat_map(|r| &r.windows) {
                writeln!(out, "{},{},{}", run.spec.policy, run.spec.size, row.csv_record())?;
            }
        }
    } else {
        let runs = runs_json(report, |run| {
            serde_json::json!({
                "windows": run.reca.as_ref().map(|r| &r.windows),
                "events": run.reca.as_ref().map(|r| r.events.iter().map(ToString::to_string).collect::<Vec<_>>()),
            })
        });
        serde_json::to_writer_pretty(&mut out, &runs)?;
        writeln!(out)?;
    }
    Ok(String::from_utf8(out)?)
}

/// ReCA's options of `iocache trace stats`.
#[derive(Args)]
pub struct TraceRecaArgs {
    /// Also classify the requests as ReCA does and report the class shares
    /// and the category, overall and per window (a second pass).
    #[arg(long)]
    pub reca: bool,
    #[command(flatten)]
    table: TableArgs,
}

/// The ReCA section of `trace stats`, when `--reca` is given.
pub fn trace(
    args: &TraceRecaArgs,
    open: impl FnOnce() -> Result<TraceReader>,
) -> Result<Option<RecaCharacterization>> {
    if !args.reca {
        return Ok(None);
    }
    let (table, params) = args.table.load()?;
    let mut reader = open()?;
    Ok(Some(reca_characterize(&mut reader, &table, params)?))
}

/// Prints the section `trace` returned.
pub fn print_trace(c: &RecaCharacterization) {
    let mut out = std::io::stdout().lock();
    let pct = |v: &[f64]| v.iter().map(|x| format!("{:.1}", x * 100.0)).collect::<Vec<_>>();
    let _ = writeln!(
        out,
        "\nReCA classes (TPDS'18 §3.1; {} requests classified), % of requests:",
        c.classified
    );
    let mut row = vec!["all".to_string()];
    row.extend(pct(&c.features));
    row.push(c.category.clone());
    let mut header: Vec<&str> = vec!["window"];
    header.extend(FEATURE_NAMES);
    header.push("category");
    let mut rows = vec![row];
    for w in &c.windows {
        let mut r = vec![w.index.to_string()];
        r.extend(pct(&w.features));
        // A window in which no request left the history queues has no
        // vector to match (the controller keeps its category then).
        r.push(if w.classified == 0 {
            "(none classified)".to_string()
        } else {
            w.category.clone()
        });
        rows.push(r);
    }
    let _ = write!(out, "{}", table(&header, &rows));
    if c.volumes.len() > 1 {
        const SHOWN: usize = 10;
        let processes = c.volumes.iter().any(|v| v.process != 0);
        let what = if processes {
            "stream (volume and process)"
        } else {
            "volume"
        };
        let _ = writeln!(
            out,
            "per {what} (each its own stream; {} streams, the {} with most requests shown):",
            c.volumes.len(),
            SHOWN.min(c.volumes.len())
        );
        let mut header: Vec<&str> = vec!["volume"];
        if processes {
            header.push("process");
        }
        header.extend(FEATURE_NAMES);
        header.push("category");
        let volumes = table_of(&header, c.volumes.iter().take(SHOWN), |v| {
            let mut r = vec![v.volume.to_string()];
            if processes {
                r.push(v.process.to_string());
            }
            r.extend(pct(&v.features));
            r.push(v.category.clone());
            r
        });
        let _ = write!(out, "{volumes}");
    }
    let d: Vec<String> = c.distances.iter().map(|(n, d)| format!("{n} {d:.3}")).collect();
    let _ = writeln!(
        out,
        "distance of the whole trace to each category: {} (windows of {} requests)",
        d.join(", "),
        c.window_requests
    );
}
