//! Why this file exists: `iocache lab`, experiments over a grid of knobs.
//! An experiment file (TOML, docs/lab.md) names workloads (trace files or
//! `iocache gen` specs) and a list of values per knob; `lab run` simulates
//! every point of the grid on every workload, one pass over each workload
//! for all its points, and appends one JSON line per point to the results.
//! A rerun skips the points already there (resumable); `--shard I/N` runs a
//! deterministic slice, and `lab merge` joins slices, so any scheduler can
//! spread an experiment over machines.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use iocache_core::{LineSize, PolicySpec};
use iocache_sim::workload::WorkloadSpec;
use iocache_sim::{simulate, CacheSettings, CacheSize, RunSpec, SimOptions};
use iocache_trace::{ReaderOptions, TraceFormat, TraceReader};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum LabCommand {
    /// Run an experiment file's grid in the simulator (resumable; --shard I/N for a slice).
    Run(RunArgs),
    /// Join result files (slices of one experiment) into one, each point once, in grid order.
    Merge(MergeArgs),
    /// Write results as one HTML page: plots against cache size per workload, and the tables.
    Report(ReportArgs),
    /// Re-run a seed paper's key findings (arc-p2, asplos23, icpp22, systor14, all; list): figures and a verdict.
    Reproduce(crate::reproduce::ReproduceArgs),
}

#[derive(Args)]
pub struct ReportArgs {
    /// Result files (JSON lines of `lab run` or `lab merge`; several are joined as by merge).
    #[arg(value_name = "RESULTS", required = true)]
    results: Vec<PathBuf>,
    /// The page [default: the first RESULTS with the extension .html].
    #[arg(long, value_name = "FILE.html")]
    out: Option<PathBuf>,
}

#[derive(Args)]
pub struct RunArgs {
    /// The experiment file (TOML; docs/lab.md).
    #[arg(value_name = "FILE")]
    experiment: PathBuf,
    /// Results, one JSON object per line [default: FILE with the extension .results.jsonl].
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Run only the points whose index modulo N is I (0-based), e.g. 2/8.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Also write every result (old and new) as CSV, one row per point, every knob a column.
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,
    /// Worker threads per workload pass (default: the number of cores).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Args)]
pub struct MergeArgs {
    /// Result files to join.
    #[arg(value_name = "RESULTS", required = true)]
    parts: Vec<PathBuf>,
    /// The joined results (JSON lines).
    #[arg(short, long, value_name = "PATH")]
    output: PathBuf,
    /// Also write them as CSV.
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Experiment {
    #[serde(rename = "workload")]
    workloads: Vec<WorkloadEntry>,
    #[serde(default)]
    grid: Grid,
    /// `["sim"]` (default), `["live"]` or both (src/lab_live.rs).
    target: Option<Vec<String>>,
    /// How live points run (`[live]`; docs/lab.md).
    live: Option<crate::lab_live::LiveSettings>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadEntry {
    name: String,
    /// A trace file (relative to the experiment file).
    trace: Option<PathBuf>,
    format: Option<String>,
    /// An `iocache gen` spec (relative to the experiment file).
    spec: Option<PathBuf>,
}

/// A list of values per knob; every combination is a point.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Grid {
    #[serde(default = "one_lru")]
    policy: Vec<String>,
    /// `sim --cache-size`'s grammar: a bare number is lines.
    #[serde(default = "one_size")]
    cache_size: Vec<String>,
    #[serde(default = "one_line")]
    line_size: Vec<String>,
    #[serde(default = "one_wb")]
    write_policy: Vec<String>,
    #[serde(default = "one_always")]
    promotion: Vec<String>,
    #[serde(default = "one_nop")]
    flush: Vec<String>,
    #[serde(default = "one_false")]
    write_miss_bypass: Vec<bool>,
    #[serde(default = "one_off")]
    seq_cutoff: Vec<String>,
}

impl Default for Grid {
    fn default() -> Self {
        toml::from_str("").expect("every key has a default")
    }
}

fn one_lru() -> Vec<String> {
    vec!["lru".into()]
}
fn one_size() -> Vec<String> {
    vec!["16MiB".into()]
}
fn one_line() -> Vec<String> {
    vec!["4KiB".into()]
}
fn one_wb() -> Vec<String> {
    vec!["wb".into()]
}
fn one_always() -> Vec<String> {
    vec!["always".into()]
}
fn one_nop() -> Vec<String> {
    vec!["nop".into()]
}
fn one_false() -> Vec<bool> {
    vec![false]
}
fn one_off() -> Vec<String> {
    vec!["off".into()]
}

/// One point: its index in the grid, its knobs as text, its run.
struct Point {
    index: usize,
    workload: usize,
    /// `cache_size = "10%"`: this share of the workload's footprint, in
    /// lines, set when the workload is read (libCacheSim's cachesim sizes
    /// caches this way).
    footprint_share: Option<f64>,
    knobs: BTreeMap<&'static str, String>,
    spec: RunSpec,
}

impl Point {
    /// Names the point in results: the workload and every knob.
    fn id(&self, workloads: &[WorkloadEntry]) -> String {
        let knobs: Vec<String> = self.knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}|{}", workloads[self.workload].name, knobs.join("|"))
    }
}

fn points(experiment: &Experiment, file: &str) -> Result<Vec<Point>> {
    let g = &experiment.grid;
    let at = |key: &str, e: String| anyhow!("{file}: grid.{key}: {e}");
    let mut points = Vec::new();
    for workload in 0..experiment.workloads.len() {
        for policy in &g.policy {
            let policy_spec: PolicySpec = policy
                .parse()
                .map_err(|e: iocache_core::CoreError| at("policy", e.to_string()))?;
            for size in &g.cache_size {
                let footprint_share = match size.trim().strip_suffix('%') {
                    None => None,
                    Some(pct) => Some(
                        pct.trim()
                            .parse::<f64>()
                            .ok()
                            .filter(|p| *p > 0.0 && *p <= 100.0)
                            .ok_or_else(|| {
                                at(
                                    "cache_size",
                                    format!(
                                        "`{size}`: a share of the footprint is above 0 % and at most 100 %"
                                    ),
                                )
                            })?
                            / 100.0,
                    ),
                };
                // A share is sized per workload when it is read.
                let cache_size: CacheSize = if footprint_share.is_some() {
                    CacheSize::Lines(1)
                } else {
                    size.parse()
                        .map_err(|e: iocache_sim::SimError| at("cache_size", e.to_string()))?
                };
                for line in &g.line_size {
                    let bytes = iocache_core::units::parse_byte_size(line)
                        .map_err(|e| at("line_size", e.to_string()))?;
                    let line_size = LineSize::new(bytes).map_err(|e| at("line_size", e.to_string()))?;
                    for wp in &g.write_policy {
                        for promotion in &g.promotion {
                            for flush in &g.flush {
                                for &bypass in &g.write_miss_bypass {
                                    for cutoff in &g.seq_cutoff {
                                        let settings = CacheSettings {
                                            write_policy: wp.parse().map_err(
                                                |e: iocache_core::CoreError| {
                                                    at("write_policy", e.to_string())
                                                },
                                            )?,
                                            promotion: promotion.parse().map_err(
                                                |e: iocache_core::CoreError| at("promotion", e.to_string()),
                                            )?,
                                            cleaning: flush.parse().map_err(
                                                |e: iocache_core::CoreError| at("flush", e.to_string()),
                                            )?,
                                            write_miss_bypass: bypass,
                                            seq_cutoff: cutoff.parse().map_err(
                                                |e: iocache_core::CoreError| at("seq_cutoff", e.to_string()),
                                            )?,
                                        };
                                        let capacity_lines = cache_size
                                            .lines(line_size)
                                            .map_err(|e| at("cache_size", e.to_string()))?;
                                        let knobs = BTreeMap::from([
                                            ("policy", policy.clone()),
                                            ("cache_size", size.clone()),
                                            ("line_size", line.clone()),
                                            ("write_policy", wp.clone()),
                                            ("promotion", promotion.clone()),
                                            ("flush", flush.clone()),
                                            ("write_miss_bypass", bypass.to_string()),
                                            ("seq_cutoff", cutoff.clone()),
                                        ]);
                                        points.push(Point {
                                            index: points.len(),
                                            workload,
                                            footprint_share,
                                            knobs,
                                            spec: RunSpec {
                                                policy: policy_spec.clone(),
                                                size: cache_size,
                                                capacity_lines,
                                                line_size,
                                                settings,
                                            },
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(points)
}

fn parse_shard(text: &str) -> Result<(usize, usize)> {
    let (i, n) = text
        .split_once('/')
        .ok_or_else(|| anyhow!("--shard {text}: expected I/N, e.g. 0/4"))?;
    let (i, n): (usize, usize) = (
        i.trim()
            .parse()
            .map_err(|_| anyhow!("--shard {text}: I is not a number"))?,
        n.trim()
            .parse()
            .map_err(|_| anyhow!("--shard {text}: N is not a number"))?,
    );
    if n == 0 || i >= n {
        bail!("--shard {text}: need 0 <= I < N");
    }
    Ok((i, n))
}

/// The ids of the points a results file holds.
fn done_ids(path: &Path) -> Result<BTreeSet<String>> {
    let mut ids = BTreeSet::new();
    let Ok(file) = std::fs::File::open(path) else {
        return Ok(ids);
    };
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let row: Value = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}:{}: not a JSON object (a run cut short? remove that line)",
                path.display(),
                n + 1
            )
        })?;
        if let Some(key) = crate::lab_live::row_key(&row) {
            ids.insert(key);
        }
    }
    Ok(ids)
}

fn open_workload(entry: &WorkloadEntry, dir: &Path, file: &str) -> Result<TraceReader> {
    let format = entry
        .format
        .as_deref()
        .map(|f| f.parse::<TraceFormat>())
        .transpose()
        .map_err(|e| anyhow!("{file}: workload `{}`: format: {e}", entry.name))?;
    match (&entry.trace, &entry.spec) {
        (Some(trace), None) => Ok(TraceReader::open(
            &dir.join(trace),
            format,
            ReaderOptions::default(),
        )?),
        (None, Some(spec)) => {
            let path = dir.join(spec);
            let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
            let spec: WorkloadSpec = toml::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let generator = spec.generator().map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let mut csv = Vec::new();
            crate::gen_cli::write_msr(generator, &mut csv)?;
            Ok(TraceReader::from_reader(
                &format!("gen:{}", path.display()),
                Box::new(std::io::Cursor::new(csv)),
                Some(TraceFormat::Msr),
                ReaderOptions::default(),
            )?)
        }
        _ => bail!("{file}: workload `{}`: give one of trace and spec", entry.name),
    }
}

/// `iocache lab run`.
pub fn run(args: RunArgs) -> Result<()> {
    let file = args.experiment.display().to_string();
    let text = std::fs::read_to_string(&args.experiment).with_context(|| file.clone())?;
    let experiment: Experiment = toml::from_str(&text).map_err(|e| anyhow!("{file}: {e}"))?;
    if experiment.workloads.is_empty() {
        bail!("{file}: no [[workload]]");
    }
    let dir = args.experiment.parent().unwrap_or(Path::new(".")).to_path_buf();
    let all = points(&experiment, &file)?;
    let (shard, shards) = args
        .shard
        .as_deref()
        .map(parse_shard)
        .transpose()?
        .unwrap_or((0, 1));
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.experiment.with_extension("results.jsonl"));
    let done = done_ids(&out)?;
    let targets = crate::lab_live::targets(experiment.target.as_deref(), &file)?;
    let live_settings = experiment.live.clone().unwrap_or_default();
    live_settings.check(&file)?;
    let live_todo: Vec<&Point> = all
        .iter()
        .filter(|p| {
            targets.live
                && p.index % shards == shard
                && !done.contains(&format!("{}@live", p.id(&experiment.workloads)))
        })
        .collect();
    let todo: Vec<&Point> = all
        .iter()
        .filter(|p| targets.sim && p.index % shards == shard && !done.contains(&p.id(&experiment.workloads)))
        .collect();
    let in_shard = all.iter().filter(|p| p.index % shards == shard).count();
    if targets.live {
        log::info!(
            "{file}: {} points in the grid, {in_shard} in this shard; to run: {} simulated, {} live (the others are in {})",
            all.len(),
            todo.len(),
            live_todo.len(),
            out.display()
        );
    } else {
        log::info!(
            "{file}: {} points in the grid, {in_shard} in this shard, {} already in {}, {} to run",
            all.len(),
            in_shard - todo.len(),
            out.display(),
            todo.len()
        );
    }
    let mut results = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&out)
        .with_context(|| format!("--out {}", out.display()))?;
    let started = std::time::Instant::now();
    for (w, entry) in experiment.workloads.iter().enumerate() {
        let points: Vec<&&Point> = todo.iter().filter(|p| p.workload == w).collect();
        if points.is_empty() {
            continue;
        }
        // Shares of the footprint: one counting pass per line size asked.
        let mut footprints: BTreeMap<u64, u64> = BTreeMap::new();
        for p in points.iter().filter(|p| p.footprint_share.is_some()) {
            let line = p.spec.line_size;
            if let std::collections::btree_map::Entry::Vacant(slot) = footprints.entry(line.bytes()) {
                slot.insert(footprint_lines(open_workload(entry, &dir, &file)?, line)?);
            }
        }
        let specs: Vec<RunSpec> = points
            .iter()
            .map(|p| {
                let mut spec = p.spec.clone();
                if let Some(share) = p.footprint_share {
                    let lines = ((footprints[&spec.line_size.bytes()] as f64 * share).ceil() as u64).max(1);
                    spec.size = CacheSize::Lines(lines);
                    spec.capacity_lines = lines;
                }
                spec
            })
            .collect();
        let mut reader = open_workload(entry, &dir, &file)?;
        let options = SimOptions {
            threads: args.threads.unwrap_or(SimOptions::default().threads).max(1),
            ..SimOptions::default()
        };
        let mut bar = crate::progress::Bar::new(std::io::stderr().is_terminal());
        let report = simulate(&mut reader, &specs, &options, &mut |r, n| bar.update(r, n))
            .with_context(|| format!("workload `{}`", entry.name))?;
        bar.finish();
        for (point, run) in points.iter().zip(&report.runs) {
            let footprint = footprints.get(&run.spec.line_size.bytes()).copied();
            let s = &run.stats;
            let mut row = json!({
                "point": point.index,
                "point_id": point.id(&experiment.workloads),
                "target": "sim",
                "workload": entry.name,
                "requests": report.trace_records,
                "accesses": s.accesses,
                "hits": s.full_hits,
                "hit_ratio": s.hit_ratio(),
                "byte_hit_ratio": s.byte_hit_ratio(),
                "read_hits": s.read_hits,
                "write_hits": s.write_hits,
                "promotions": s.promotions,
                "evictions": s.evictions,
                "write_backs": s.dirty_writebacks + s.flushed_lines,
                "cache_lines": run.spec.capacity_lines,
                "footprint_lines": footprint,
                "seconds": run.wall_seconds,
            });
            if let Some(map) = row.as_object_mut() {
                for (k, v) in &point.knobs {
                    map.insert((*k).to_string(), Value::String(v.clone()));
                }
            }
            // One line per point, written as soon as its workload's pass
            // ends: an interrupted run keeps what it finished.
            writeln!(results, "{row}")?;
        }
        results.flush()?;
        log::info!(
            "workload `{}`: {} in {:.1} s",
            entry.name,
            crate::text::count(points.len() as u64, "point"),
            started.elapsed().as_secs_f64()
        );
    }
    run_live(&experiment, &dir, &file, &live_settings, &live_todo, &mut results)?;
    if let Some(csv) = &args.csv {
        write_csv(&read_rows(std::slice::from_ref(&out))?, csv)?;
    }
    Ok(())
}

/// The live target's points (src/lab_live.rs), sized as the simulator sizes them.
fn run_live(
    experiment: &Experiment,
    dir: &Path,
    file: &str,
    settings: &crate::lab_live::LiveSettings,
    todo: &[&Point],
    results: &mut std::fs::File,
) -> Result<()> {
    let mut footprints: BTreeMap<(usize, u64), u64> = BTreeMap::new();
    let mut live = Vec::new();
    for p in todo {
        let entry = &experiment.workloads[p.workload];
        let line = p.spec.line_size;
        let cache_lines = match p.footprint_share {
            None => p.spec.capacity_lines,
            Some(share) => {
                let lines = match footprints.entry((p.workload, line.bytes())) {
                    std::collections::btree_map::Entry::Occupied(e) => *e.get(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        *e.insert(footprint_lines(open_workload(entry, dir, file)?, line)?)
                    }
                };
                ((lines as f64 * share).ceil() as u64).max(1)
            }
        };
        live.push(crate::lab_live::LivePoint {
            index: p.index,
            id: p.id(&experiment.workloads),
            workload: &entry.name,
            spec: entry.spec.as_ref().map(|s| dir.join(s)),
            knobs: &p.knobs,
            cache_lines,
            line_bytes: line.bytes(),
        });
    }
    crate::lab_live::run(settings, &live, results)
}

/// Distinct lines of `line` bytes a workload touches.
fn footprint_lines(mut reader: TraceReader, line: LineSize) -> Result<u64> {
    let mut lines = std::collections::HashSet::new();
    for record in reader.by_ref() {
        let request = iocache_sim::request_of(&record?);
        if request.length_bytes == 0 {
            continue;
        }
        for part in iocache_core::split_request(&request, line) {
            lines.insert(part.key);
        }
    }
    Ok(lines.len() as u64)
}

fn read_rows(paths: &[PathBuf]) -> Result<Vec<Value>> {
    let mut rows: BTreeMap<String, Value> = BTreeMap::new();
    for path in paths {
        let file = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
        for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let row: Value = serde_json::from_str(&line)
                .with_context(|| format!("{}:{}: not a JSON object", path.display(), n + 1))?;
            let id = crate::lab_live::row_key(&row)
                .ok_or_else(|| anyhow!("{}:{}: no point_id", path.display(), n + 1))?;
            rows.entry(id).or_insert(row);
        }
    }
    let mut rows: Vec<Value> = rows.into_values().collect();
    rows.sort_by_key(|r| r["point"].as_u64().unwrap_or(u64::MAX));
    Ok(rows)
}

fn write_csv(rows: &[Value], path: &Path) -> Result<()> {
    let mut columns: Vec<String> = Vec::new();
    for row in rows {
        for key in row.as_object().into_iter().flat_map(|m| m.keys()) {
            if !columns.contains(key) {
                columns.push(key.clone());
            }
        }
    }
    let mut out = columns.join(",") + "\n";
    for row in rows {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| match &row[c] {
                Value::String(s) if s.contains([',', '"']) => format!("\"{}\"", s.replace('"', "\"\"")),
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            })
            .collect();
        out += &(cells.join(",") + "\n");
    }
    std::fs::write(path, out).with_context(|| format!("--csv {}", path.display()))
}

/// `iocache lab merge`.
pub fn merge(args: MergeArgs) -> Result<()> {
    let rows = read_rows(&args.parts)?;
    let mut out = String::new();
    for row in &rows {
        out += &(row.to_string() + "\n");
    }
    std::fs::write(&args.output, out).with_context(|| format!("--output {}", args.output.display()))?;
    if let Some(csv) = &args.csv {
        write_csv(&rows, csv)?;
    }
    log::info!(
        "{} in {}",
        crate::text::count(rows.len() as u64, "point"),
        args.output.display()
    );
    Ok(())
}

/// `iocache lab report`.
pub fn report(args: ReportArgs) -> Result<()> {
    let rows = read_rows(&args.results)?;
    if rows.is_empty() {
        bail!("{}: no results", args.results[0].display());
    }
    let out = args.out.unwrap_or_else(|| args.results[0].with_extension("html"));
    let file = crate::OutputFile::check_path("--out", Some(&out))?.expect("a path");
    let sources: Vec<String> = args.results.iter().map(|p| p.display().to_string()).collect();
    crate::reports::write(file, &crate::reports::lab(&rows, &sources.join(", "))?)
}
