//! Experiments over a grid of knobs (docs/lab.md). An experiment file
//! (TOML) names workloads (trace files or `iocache gen` specs) and a list
//! of values per knob; [`run`] simulates every point of the grid on every
//! workload, one pass over each workload for all its points, and appends
//! one JSON line per point to the results. A rerun skips the points
//! already there (resumable); a [`Shard`] runs a deterministic slice, and
//! [`crate::results::merge`] joins slices, so any scheduler can spread an
//! experiment over machines.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use iocache_core::{LineSize, PolicySpec};
use iocache_sim::timing::{parse_device, ArrivalMode};
use iocache_sim::workload::WorkloadSpec;
use iocache_sim::{
    simulate_each, AdaptSpec, CacheSettings, CacheSize, Restarts, RunSpec, SimOptions, TallyOptions,
    TimingSetup, Warmup,
};
use iocache_trace::{ReaderOptions, TraceFormat, TraceReader};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{invalid, LabError, Result, Within};
use crate::live::{LivePoint, LiveSettings};
use crate::results::{done_ids, read_rows, side_file, to_object, write_csv, DECISIONS, SERIES, VOLUMES};
use crate::Progress;

/// One deterministic slice of a grid: the points whose index modulo
/// `count` is `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// The whole grid.
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// The shard a cluster scheduler gave this process, read through `env`
    /// (a variable's value, if set): a Slurm job array task
    /// (`SLURM_ARRAY_TASK_ID` less `SLURM_ARRAY_TASK_MIN`, over
    /// `SLURM_ARRAY_TASK_STEP`, of `SLURM_ARRAY_TASK_COUNT` tasks), or a
    /// Kubernetes Indexed Job's pod (`JOB_COMPLETION_INDEX` of `count`
    /// completions, which the job knows and its pods are not told).
    /// `count`, when given, must also match a Slurm array's. Returns the
    /// shard and which scheduler gave it.
    pub fn from_environment(
        count: Option<usize>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(Shard, &'static str)> {
        let number = |name: &str| -> Result<Option<usize>> {
            env(name)
                .map(|v| {
                    v.trim()
                        .parse::<usize>()
                        .map_err(|_| invalid!("{name}=`{v}` is not a whole number"))
                })
                .transpose()
        };
        let slurm = number("SLURM_ARRAY_TASK_ID")?;
        let kubernetes = number("JOB_COMPLETION_INDEX")?;
        let (shard, scheduler) = match (slurm, kubernetes) {
            (Some(_), Some(_)) => {
                return Err(invalid!(
                    "both SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX are set: give the shard as I/N"
                ))
            }
            (Some(id), None) => {
                let tasks = number("SLURM_ARRAY_TASK_COUNT")?.ok_or_else(|| {
                    invalid!("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not")
                })?;
                let min = number("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
                let step = number("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
                if id < min || (id - min) % step != 0 {
                    return Err(invalid!(
                        "SLURM_ARRAY_TASK_ID={id} is not in the array from {min} in steps of {step}"
                    ));
                }
                if count.is_some_and(|n| n != tasks) {
                    return Err(invalid!(
                        "the shard count {} differs from the array's {tasks} tasks (SLURM_ARRAY_TASK_COUNT)",
                        count.unwrap_or_default()
                    ));
                }
                (
                    Shard {
                        index: (id - min) / step,
                        count: tasks,
                    },
                    "a Slurm array task",
                )
            }
            (None, Some(index)) => {
                let count = count.ok_or_else(|| {
                    invalid!(
                        "JOB_COMPLETION_INDEX={index} is set, but a pod is not told how many completions its \
                         Indexed Job has: give them as auto:N"
                    )
                })?;
                (Shard { index, count }, "a Kubernetes Indexed Job")
            }
            (None, None) => {
                return Err(invalid!(
                    "neither a Slurm array task (SLURM_ARRAY_TASK_ID) nor a Kubernetes Indexed Job \
                     (JOB_COMPLETION_INDEX) is in the environment: give the shard as I/N"
                ))
            }
        };
        if shard.count == 0 || shard.index >= shard.count {
            return Err(invalid!(
                "shard {} of {} from {scheduler}: need an index below the count",
                shard.index,
                shard.count
            ));
        }
        Ok((shard, scheduler))
    }
}

impl std::str::FromStr for Shard {
    type Err = LabError;

    /// `I/N`, e.g. `2/8` (0-based).
    fn from_str(text: &str) -> Result<Shard> {
        let (i, n) = text
            .split_once('/')
            .ok_or_else(|| invalid!("`{text}`: expected I/N, e.g. 0/4"))?;
        let index: usize = i
            .trim()
            .parse()
            .map_err(|_| invalid!("`{text}`: I is not a number"))?;
        let count: usize = n
            .trim()
            .parse()
            .map_err(|_| invalid!("`{text}`: N is not a number"))?;
        if count == 0 || index >= count {
            return Err(invalid!("`{text}`: need 0 <= I < N"));
        }
        Ok(Shard { index, count })
    }
}

/// What [`run`] is asked to do.
pub struct RunRequest<'a> {
    /// The experiment file (TOML; docs/lab.md).
    pub experiment: PathBuf,
    /// Results, one JSON object per line (appended to).
    pub out: PathBuf,
    pub shard: Shard,
    /// Also write every result (old and new) here as CSV.
    pub csv: Option<PathBuf>,
    /// Worker threads per workload pass.
    pub threads: usize,
    /// The server live points start, and the flag that stops them.
    pub server: crate::live::Server<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Experiment {
    /// Per-volume results (`FILE.volumes.jsonl`), and per volume in the series.
    #[serde(default)]
    per_volume: bool,
    #[serde(rename = "workload")]
    workloads: Vec<WorkloadEntry>,
    #[serde(default)]
    grid: Grid,
    /// A per-window series of every point (`FILE.series.jsonl`).
    series: Option<SeriesSection>,
    /// `["sim"]` (default), `["live"]` or both (`crate::live`).
    target: Option<Vec<String>>,
    /// How live points run (`[live]`; docs/lab.md).
    live: Option<LiveSettings>,
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

/// The knobs of a grid, in the order points are enumerated (the last
/// varies fastest), each with its default: one value, as `iocache sim`
/// takes it. A `[grid]` key names a knob and lists its values.
const KNOBS: [(&str, &str); 20] = [
    ("policy", "lru"),
    ("cache_size", "16MiB"),
    ("line_size", "4KiB"),
    ("write_policy", "wb"),
    ("promotion", "always"),
    ("flush", "nop"),
    ("write_miss_bypass", "false"),
    ("seq_cutoff", "off"),
    ("warmup", "0"),
    ("timing", "false"),
    ("cache_device", "ramdisk"),
    ("backend_device", "ssd-raid5"),
    ("speed", "1"),
    ("closed_loop", "off"),
    ("adapt", "none"),
    ("reca_window", "100000"),
    ("reca_table", iocache_core::reca::BUILTIN_TABLE_SOURCE),
    ("restart_every", "off"),
    ("readahead", "off"),
    ("fill", "request"),
];

/// Where `name` is among the knobs (grid order), if it is one.
pub(crate) fn knob_rank(name: &str) -> Option<usize> {
    KNOBS.iter().position(|(knob, _)| *knob == name)
}

/// Knobs from this index on came after results files existed: a point's
/// id names one only when it is not at its default, so the ids of older
/// results (and so their resumption) stay as they were.
const FIRST_LATER_KNOB: usize = 8;

/// The device knobs: any of them in the grid turns timing on (as any
/// device option does in `sim`); without timing they do not apply.
const TIMING_KNOBS: [&str; 4] = ["cache_device", "backend_device", "speed", "closed_loop"];

/// What the results record beside each point's totals.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SeriesSection {
    /// A window of trace time (`1s`) or of requests (`10000`, `10000req`).
    every: String,
}

/// The `[grid]` table: knob name to its list of values.
type Grid = BTreeMap<String, toml::Value>;

/// A knob value as text: strings as they are, numbers and booleans as TOML writes them.
fn knob_text(file: &str, key: &str, value: &toml::Value) -> Result<String> {
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => {
            return Err(invalid!(
                "{file}: grid.{key}: `{other:?}` is not a knob value (a string, number or boolean)"
            ))
        }
    })
}

/// Each knob's values, in [`KNOBS`] order, defaults filled in.
fn grid_values(grid: &Grid, file: &str) -> Result<Vec<(&'static str, Vec<String>)>> {
    for key in grid.keys() {
        if key == "per_volume" {
            return Err(invalid!("{file}: grid.per_volume: not a knob; `per_volume = true` goes at the top of the file, before the first [[workload]]"));
        }
        if !KNOBS.iter().any(|(k, _)| k == key) {
            let known: Vec<&str> = KNOBS.iter().map(|(k, _)| *k).collect();
            return Err(invalid!(
                "{file}: grid.{key}: not a knob; the knobs are {}",
                known.join(", ")
            ));
        }
    }
    let timed_by_default = TIMING_KNOBS.iter().any(|k| grid.contains_key(*k));
    KNOBS
        .iter()
        .map(|&(key, default)| {
            let values = match grid.get(key) {
                None if key == "timing" => vec![timed_by_default.to_string()],
                None => vec![default.to_string()],
                Some(toml::Value::Array(list)) if list.is_empty() => {
                    return Err(invalid!(
                        "{file}: grid.{key}: an empty list has no point; leave the key out for the default"
                    ))
                }
                Some(toml::Value::Array(list)) => list
                    .iter()
                    .map(|v| knob_text(file, key, v))
                    .collect::<Result<Vec<_>>>()?,
                Some(_) => {
                    return Err(invalid!(
                        "{file}: grid.{key}: expected a list of values, e.g. {key} = [\"{default}\"]"
                    ))
                }
            };
            Ok((key, values))
        })
        .collect()
}

/// One point: its index in the grid, its knobs as text, its run.
struct Point {
    index: usize,
    workload: usize,
    /// `cache_size = "10%"`: this share of the workload's footprint, in
    /// lines, set when the workload is read (libCacheSim's cachesim sizes
    /// caches this way).
    footprint_share: Option<f64>,
    /// The knobs that apply to this point (device knobs only with timing,
    /// ReCA's only with `adapt = "reca"`).
    knobs: BTreeMap<&'static str, String>,
    spec: RunSpec,
    /// Everything but the warmup, which a fraction sets per workload.
    options: SimOptions,
    warmup: Warmup,
}

impl Point {
    /// Names the point in results: the workload and every knob (the later
    /// knobs only when not at their default).
    fn id(&self, workloads: &[WorkloadEntry]) -> String {
        let knobs: Vec<String> = self
            .knobs
            .iter()
            .filter(|(k, v)| match KNOBS.iter().position(|(name, _)| name == *k) {
                Some(i) if i >= FIRST_LATER_KNOB => KNOBS[i].1 != v.as_str(),
                _ => true,
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("{}|{}", workloads[self.workload].name, knobs.join("|"))
    }
}

/// Every point of the grid, each checked: values that do not parse, and
/// combinations that cannot run together, are refused here, before any
/// workload is read.
fn points(experiment: &Experiment, file: &str, dir: &Path) -> Result<Vec<Point>> {
    let values = grid_values(&experiment.grid, file)?;
    let tally = tally_options(experiment, file)?;
    let mut combos: Vec<BTreeMap<&'static str, String>> = Vec::new();
    // An odometer over the lists, the last knob turning fastest.
    let mut at = vec![0usize; values.len()];
    'combos: loop {
        combos.push(
            values
                .iter()
                .zip(&at)
                .map(|((k, list), &i)| (*k, list[i].clone()))
                .collect(),
        );
        for digit in (0..at.len()).rev() {
            at[digit] += 1;
            if at[digit] < values[digit].1.len() {
                continue 'combos;
            }
            at[digit] = 0;
        }
        break;
    }
    let mut reca_tables: BTreeMap<(String, u64), iocache_sim::reca::RecaOptions> = BTreeMap::new();
    let mut resolved: Vec<(BTreeMap<&'static str, String>, Resolved)> = Vec::new();
    let mut seen: BTreeSet<Vec<(&'static str, String)>> = BTreeSet::new();
    for mut knobs in combos {
        let point = resolve(&mut knobs, file, dir, tally, &mut reca_tables)?;
        // Knobs that do not apply were dropped: points that then coincide are one.
        if seen.insert(knobs.iter().map(|(k, v)| (*k, v.clone())).collect()) {
            resolved.push((knobs, point));
        }
    }
    let mut points = Vec::new();
    for workload in 0..experiment.workloads.len() {
        for (knobs, r) in &resolved {
            points.push(Point {
                index: points.len(),
                workload,
                footprint_share: r.footprint_share,
                knobs: knobs.clone(),
                spec: r.spec.clone(),
                options: r.options.clone(),
                warmup: r.warmup,
            });
        }
    }
    Ok(points)
}

/// The `[series]` and `per_volume` settings, as the simulator takes them.
fn tally_options(experiment: &Experiment, file: &str) -> Result<TallyOptions> {
    Ok(TallyOptions {
        series: experiment
            .series
            .as_ref()
            .map(|s| iocache_sim::tally::parse_every(&s.every))
            .transpose()
            .map_err(|e| invalid!("{file}: series.every: {e}"))?,
        per_volume: experiment.per_volume,
    })
}

/// What one combination of knob values runs (see [`Point`]).
struct Resolved {
    footprint_share: Option<f64>,
    spec: RunSpec,
    options: SimOptions,
    warmup: Warmup,
}

/// One combination's run: its spec, options and warmup, with the knobs
/// that do not apply to it removed from `knobs`.
fn resolve(
    knobs: &mut BTreeMap<&'static str, String>,
    file: &str,
    dir: &Path,
    tally: TallyOptions,
    reca_tables: &mut BTreeMap<(String, u64), iocache_sim::reca::RecaOptions>,
) -> Result<Resolved> {
    let at = |key: &str, e: String| invalid!("{file}: grid.{key}: {e}");
    let given = knobs.clone();
    let k = |key: &str| given[key].clone();
    let policy = k("policy");
    let policy_spec: PolicySpec = policy
        .parse()
        .map_err(|e: iocache_core::CoreError| at("policy", e.to_string()))?;
    let size = k("cache_size");
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
                        format!("`{size}`: a share of the footprint is above 0 % and at most 100 %"),
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
    let bytes =
        iocache_core::units::parse_byte_size(&k("line_size")).map_err(|e| at("line_size", e.to_string()))?;
    let line_size = LineSize::new(bytes).map_err(|e| at("line_size", e.to_string()))?;
    let core = |key: &str, e: iocache_core::CoreError| at(key, e.to_string());
    let bypass = match k("write_miss_bypass").as_str() {
        "true" => true,
        "false" => false,
        other => return Err(at("write_miss_bypass", format!("`{other}` is not true or false"))),
    };
    let settings = CacheSettings {
        write_policy: k("write_policy").parse().map_err(|e| core("write_policy", e))?,
        promotion: k("promotion").parse().map_err(|e| core("promotion", e))?,
        cleaning: k("flush").parse().map_err(|e| core("flush", e))?,
        write_miss_bypass: bypass,
        seq_cutoff: k("seq_cutoff").parse().map_err(|e| core("seq_cutoff", e))?,
        readahead: k("readahead").parse().map_err(|e| core("readahead", e))?,
        fill: k("fill").parse().map_err(|e| core("fill", e))?,
    };
    let capacity_lines = cache_size
        .lines(line_size)
        .map_err(|e| at("cache_size", e.to_string()))?;
    let spec = RunSpec {
        policy: policy_spec,
        size: cache_size,
        capacity_lines,
        line_size,
        settings,
    };
    let warmup: Warmup = k("warmup")
        .parse()
        .map_err(|e: iocache_sim::SimError| at("warmup", e.to_string()))?;

    // Timing: on with `timing = true`; the device knobs apply only then.
    let timed = match k("timing").as_str() {
        "true" => true,
        "false" => false,
        other => return Err(at("timing", format!("`{other}` is not true or false"))),
    };
    let timing = if timed {
        let device = |key: &str| parse_device(&given[key]).map_err(|e| at(key, e.to_string()));
        let speed = k("speed");
        let closed = k("closed_loop");
        let arrivals = match closed.as_str() {
            "off" => ArrivalMode::Open {
                speed: speed
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| at("speed", format!("`{speed}` is not a factor above 0")))?,
            },
            n => {
                if speed != "1" {
                    return Err(invalid!(
                        "{file}: grid: speed = {speed} with closed_loop = {n}: a replay is open loop at a speed \
                         or closed loop, not both (give closed_loop = \"off\" with a speed, or speed = 1 with a loop)"
                    ));
                }
                ArrivalMode::Closed {
                    outstanding: n.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        at("closed_loop", format!("`{n}` is neither off nor a count above 0"))
                    })?,
                }
            }
        };
        Some(TimingSetup {
            cache: device("cache_device")?,
            backend: device("backend_device")?,
            arrivals,
            series_interval_ns: None,
        })
    } else {
        for key in TIMING_KNOBS {
            knobs.remove(key);
        }
        None
    };

    let adapt_text = k("adapt");
    let (reca, adapt) = match adapt_text.trim() {
        "none" => (None, None),
        "reca" => {
            let window_text = k("reca_window");
            let window: u64 = window_text
                .parse()
                .map_err(|_| at("reca_window", format!("`{window_text}` is not a request count")))?;
            let table = k("reca_table");
            let key = (table.clone(), window);
            if !reca_tables.contains_key(&key) {
                let path = (table != iocache_core::reca::BUILTIN_TABLE_SOURCE).then(|| dir.join(&table));
                if window == 0 {
                    return Err(invalid!("{file}: grid.reca_window must be at least 1"));
                }
                let options = iocache_sim::reca::RecaOptions::load(path.as_deref(), window)
                    .within(|| format!("{file}: grid.reca_table `{table}`"))?;
                reca_tables.insert(key.clone(), options);
            }
            (Some(reca_tables[&key].clone()), None)
        }
        other => {
            let spec: AdaptSpec = other
                .parse()
                .map_err(|e: iocache_sim::SimError| at("adapt", format!("{e}; or none, reca")))?;
            if timing.is_none() {
                return Err(invalid!(
                    "{file}: grid: adapt = {other} with timing = false: the controller reads the simulated \
                     device queues; give the grid a device knob (cache_device, backend_device, speed, \
                     closed_loop) or timing = [true]"
                ));
            }
            (None, Some(spec))
        }
    };
    if reca.is_none() {
        knobs.remove("reca_window");
        knobs.remove("reca_table");
    }
    let restarts_text = k("restart_every");
    let restarts: Option<Restarts> = match restarts_text.trim() {
        "off" => None,
        text => Some(
            text.parse()
                .map_err(|e: iocache_sim::SimError| at("restart_every", e.to_string()))?,
        ),
    };
    let options = SimOptions {
        timing,
        reca,
        adapt,
        restarts,
        tally,
        ..SimOptions::default()
    };
    Ok(Resolved {
        footprint_share,
        spec,
        options,
        warmup,
    })
}

fn open_workload(entry: &WorkloadEntry, dir: &Path, file: &str) -> Result<TraceReader> {
    let format = entry
        .format
        .as_deref()
        .map(|f| f.parse::<TraceFormat>())
        .transpose()
        .map_err(|e| invalid!("{file}: workload `{}`: format: {e}", entry.name))?;
    match (&entry.trace, &entry.spec) {
        (Some(trace), None) => Ok(TraceReader::open(
            &dir.join(trace),
            format,
            ReaderOptions::default(),
        )?),
        (None, Some(spec)) => {
            let path = dir.join(spec);
            let text = std::fs::read_to_string(&path).at_file(&path)?;
            let spec: WorkloadSpec =
                toml::from_str(&text).map_err(|e| invalid!("{}: {e}", path.display()))?;
            let generator = spec
                .generator()
                .map_err(|e| invalid!("{}: {e}", path.display()))?;
            Ok(generator.into_reader(&format!("gen:{}", path.display()))?)
        }
        _ => Err(invalid!(
            "{file}: workload `{}`: give one of trace and spec",
            entry.name
        )),
    }
}

/// Runs the points of an experiment's grid that its results do not hold
/// yet (in the request's shard), appending a line per point to the
/// results as each workload's pass ends.
pub fn run(args: &RunRequest, progress: &mut dyn Progress) -> Result<()> {
    let file = args.experiment.display().to_string();
    let text = std::fs::read_to_string(&args.experiment).within(|| file.clone())?;
    let experiment: Experiment = toml::from_str(&text).map_err(|e| invalid!("{file}: {e}"))?;
    if experiment.workloads.is_empty() {
        return Err(invalid!("{file}: no [[workload]]"));
    }
    let dir = args.experiment.parent().unwrap_or(Path::new(".")).to_path_buf();
    let all = points(&experiment, &file, &dir)?;
    let (shard, shards) = (args.shard.index, args.shard.count);
    let out = args.out.clone();
    let done = done_ids(&out)?;
    let targets = crate::live::targets(experiment.target.as_deref(), &file)?;
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
        .at_file(&out)?;
    let mut side_files: BTreeMap<&'static str, std::fs::File> = BTreeMap::new();
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
        // Warmups given as a fraction: one counting pass.
        let records = if points.iter().any(|p| matches!(p.warmup, Warmup::Fraction(_))) {
            Some(
                open_workload(entry, &dir, &file)?
                    .by_ref()
                    .try_fold(0u64, |n, r| r.map(|_| n + 1))?,
            )
        } else {
            None
        };
        let threads = args.threads.max(1);
        let runs: Vec<(RunSpec, SimOptions)> = points
            .iter()
            .map(|p| {
                let mut spec = p.spec.clone();
                if let Some(share) = p.footprint_share {
                    let lines = ((footprints[&spec.line_size.bytes()] as f64 * share).ceil() as u64).max(1);
                    spec.size = CacheSize::Lines(lines);
                    spec.capacity_lines = lines;
                }
                let mut options = p.options.clone();
                options.threads = threads;
                options.warmup_requests = match p.warmup {
                    Warmup::None => 0,
                    Warmup::Requests(n) => n,
                    Warmup::Fraction(f) => (records.unwrap_or(0) as f64 * f).round() as u64,
                };
                (spec, options)
            })
            .collect();
        let mut reader = open_workload(entry, &dir, &file)?;
        progress.start(&format!(
            "workload {}/{} `{}` ",
            w + 1,
            experiment.workloads.len(),
            entry.name
        ));
        let report = simulate_each(&mut reader, &runs, threads, &mut |r, n| progress.update(r, n))
            .within(|| format!("workload `{}`", entry.name))?;
        progress.finish();
        let mut main_rows = String::new();
        for ((point, run), (_, options)) in points.iter().zip(&report.runs).zip(&runs) {
            let footprint = footprints.get(&run.spec.line_size.bytes()).copied();
            let id = point.id(&experiment.workloads);
            let head = |map: &mut serde_json::Map<String, Value>| {
                map.insert("point".into(), json!(point.index));
                map.insert("point_id".into(), json!(id));
                map.insert("workload".into(), json!(entry.name));
                for (k, v) in &point.knobs {
                    map.insert((*k).to_string(), Value::String(v.clone()));
                }
            };
            let mut row = result_row(run, report.trace_records, footprint, options.warmup_requests);
            head(&mut row);
            row.insert("target".into(), json!("sim"));
            // Series and per-volume rows go first: a point in the results
            // has its side rows (a rerun after a cut may repeat some, which
            // readers take once).
            for window in &run.series {
                let mut side = to_object(window)?;
                head(&mut side);
                let by_requests = matches!(
                    run.series_every,
                    Some(iocache_sim::trace_stats::Window::Requests { .. })
                );
                side.insert("by_requests".into(), json!(by_requests));
                writeln!(
                    side_file(&mut side_files, &out, SERIES)?,
                    "{}",
                    Value::Object(side)
                )?;
            }
            // In volume order, as `lab merge` joins them.
            let mut volumes: Vec<&iocache_sim::VolumeResult> = run.volumes.iter().collect();
            volumes.sort_by_key(|v| v.volume);
            for volume in volumes {
                let mut side = to_object(volume)?;
                head(&mut side);
                writeln!(
                    side_file(&mut side_files, &out, VOLUMES)?,
                    "{}",
                    Value::Object(side)
                )?;
            }
            // The controller's windows or intervals, numbered per point;
            // each decision nested, so its fields (`policy`, ...) keep
            // their meaning beside the point's knobs of the same names.
            for (index, (controller, kind, decision)) in decision_rows(run)?.into_iter().enumerate() {
                let mut side = serde_json::Map::new();
                head(&mut side);
                side.insert("index".into(), json!(index));
                side.insert("controller".into(), json!(controller));
                side.insert(kind.into(), decision);
                writeln!(
                    side_file(&mut side_files, &out, DECISIONS)?,
                    "{}",
                    Value::Object(side)
                )?;
            }
            main_rows += &(Value::Object(row).to_string() + "\n");
        }
        for file in side_files.values_mut() {
            file.flush()?;
        }
        // One line per point, written as soon as its workload's pass
        // ends: an interrupted run keeps what it finished.
        results.write_all(main_rows.as_bytes())?;
        results.flush()?;
        log::info!(
            "workload `{}`: {} in {:.1} s",
            entry.name,
            iocache_core::units::count(points.len() as u64, "point"),
            started.elapsed().as_secs_f64()
        );
    }
    run_live(
        &experiment,
        &dir,
        &file,
        &live_settings,
        args.server,
        &live_todo,
        &mut results,
    )?;
    if let Some(csv) = &args.csv {
        write_csv(&read_rows(std::slice::from_ref(&out))?, csv)?;
    }
    Ok(())
}

/// The live target's points (`crate::live`), sized as the simulator sizes them.
fn run_live(
    experiment: &Experiment,
    dir: &Path,
    file: &str,
    settings: &LiveSettings,
    server: crate::live::Server,
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
        live.push(LivePoint {
            index: p.index,
            id: p.id(&experiment.workloads),
            workload: &entry.name,
            spec: entry.spec.as_ref().map(|s| dir.join(s)),
            knobs: &p.knobs,
            cache_lines,
            line_bytes: line.bytes(),
            dir,
        });
    }
    crate::live::run(settings, server, &live, results)
}

/// A point's results: the totals, and the timing, restart and controller
/// figures when the point had them.
fn result_row(
    run: &iocache_sim::RunResult,
    trace_records: u64,
    footprint: Option<u64>,
    warmup: u64,
) -> serde_json::Map<String, Value> {
    let s = &run.stats;
    let mut row = json!({
        "requests": trace_records,
        "accesses": s.accesses,
        "hits": s.full_hits,
        "hit_ratio": s.hit_ratio(),
        "byte_hit_ratio": s.byte_hit_ratio(),
        "read_hits": s.read_hits,
        "write_hits": s.write_hits,
        "promotions": s.promotions,
        "evictions": s.evictions,
        "write_backs": s.dirty_writebacks + s.flushed_lines,
        "backend_read_bytes": s.backend_read_bytes,
        "backend_write_bytes": s.backend_write_bytes,
        "cache_write_bytes": s.cache_write_bytes,
        "cache_lines": run.spec.capacity_lines,
        "footprint_lines": footprint,
        "seconds": run.wall_seconds,
    });
    let map = row.as_object_mut().expect("an object");
    if warmup > 0 {
        map.insert("warmup_requests".into(), json!(warmup));
        map.insert("counted_requests".into(), json!(s.requests));
    }
    if let Some(t) = &run.timing {
        map.insert("iops".into(), json!(t.iops));
        for (prefix, l) in [("latency", &t.all), ("read", &t.read), ("write", &t.write)] {
            map.insert(format!("{prefix}_mean_ns"), json!(l.mean_ns));
            map.insert(format!("{prefix}_p50_ns"), json!(l.p50_ns));
            map.insert(format!("{prefix}_p99_ns"), json!(l.p99_ns));
            map.insert(format!("{prefix}_p999_ns"), json!(l.p999_ns));
            map.insert(format!("{prefix}_p9999_ns"), json!(l.p9999_ns));
        }
        map.insert("cache_utilization".into(), json!(t.cache_device.utilization));
        map.insert("backend_utilization".into(), json!(t.backend_device.utilization));
    }
    if run.restarts > 0 {
        map.insert("restarts".into(), json!(run.restarts));
    }
    if run.spec.settings.readahead != iocache_core::Readahead::Off {
        map.insert("prefetch_requests".into(), json!(s.prefetch_requests));
        map.insert("prefetched_lines".into(), json!(s.prefetched_lines));
        map.insert("prefetch_used_lines".into(), json!(s.prefetch_used_lines));
        map.insert("prefetch_unused_lines".into(), json!(s.prefetch_unused_lines));
    }
    if let Some(a) = &run.adapt {
        map.insert("adapt_intervals".into(), json!(a.rows.len()));
        map.insert("adapt_switches".into(), json!(a.switches));
        map.insert("adapt_bypassed".into(), json!(a.bypassed));
        map.insert("adapt_bottleneck_intervals".into(), json!(a.bottleneck_intervals));
    }
    if let Some(r) = &run.reca {
        map.insert("reca_windows".into(), json!(r.windows.len()));
        map.insert("reca_changes".into(), json!(r.category_changes));
        map.insert("reca_relayouts".into(), json!(r.relayouts));
        map.insert("reca_moved_bytes".into(), json!(r.moved_bytes));
        map.insert("reca_written_back_bytes".into(), json!(r.written_back_bytes));
        map.insert("reca_dropped_clean_bytes".into(), json!(r.dropped_clean_bytes));
    }
    row.as_object().cloned().unwrap_or_default()
}

/// A run's controller decisions: ReCA's windows (`window`) or a load
/// balancer's intervals (`interval`), each with its controller's name.
fn decision_rows(run: &iocache_sim::RunResult) -> Result<Vec<(String, &'static str, Value)>> {
    let mut rows = Vec::new();
    for window in run.reca.iter().flat_map(|r| &r.windows) {
        rows.push(("reca".to_string(), "window", serde_json::to_value(window)?));
    }
    if let Some(adapt) = &run.adapt {
        for interval in &adapt.rows {
            rows.push((
                adapt.controller.clone(),
                "interval",
                serde_json::to_value(interval)?,
            ));
        }
    }
    Ok(rows)
}

/// One row per run of an `iocache sim` report, with the columns a lab
/// point has: the trace as its workload, the run's configuration under
/// the knobs' names, and the results (`sim --csv`).
pub fn sim_rows(trace: &str, report: &iocache_sim::SimReport) -> Vec<Value> {
    report
        .runs
        .iter()
        .map(|run| {
            let mut row = result_row(run, report.trace_records, None, report.warmup_requests);
            row.remove("footprint_lines");
            let settings = &run.spec.settings;
            for (knob, value) in [
                ("workload", trace.to_string()),
                ("target", "sim".to_string()),
                ("policy", run.spec.policy.to_string()),
                ("cache_size", run.spec.size.to_string()),
                (
                    "line_size",
                    iocache_core::units::format_byte_size(run.spec.line_size.bytes()),
                ),
                ("write_policy", settings.write_policy.to_string()),
                ("promotion", settings.promotion.to_string()),
                ("flush", settings.cleaning.to_string()),
                ("write_miss_bypass", settings.write_miss_bypass.to_string()),
                ("seq_cutoff", settings.seq_cutoff.to_string()),
                ("readahead", settings.readahead.to_string()),
                ("fill", settings.fill.to_string()),
            ] {
                row.insert(knob.into(), Value::String(value));
            }
            Value::Object(row)
        })
        .collect()
}

/// Distinct lines of `line` bytes a workload touches.
pub fn footprint_lines(mut reader: TraceReader, line: LineSize) -> Result<u64> {
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

#[cfg(test)]
mod tests {
    use super::Shard;

    #[test]
    fn a_shard_comes_from_a_slurm_array_or_an_indexed_job() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        // Slurm: --array=4-10:3 is tasks 4, 7, 10.
        let slurm = env(&[
            ("SLURM_ARRAY_TASK_ID", "7"),
            ("SLURM_ARRAY_TASK_MIN", "4"),
            ("SLURM_ARRAY_TASK_STEP", "3"),
            ("SLURM_ARRAY_TASK_COUNT", "3"),
        ]);
        let (shard, from) = Shard::from_environment(None, slurm).unwrap();
        assert_eq!(shard, Shard { index: 1, count: 3 });
        assert!(from.contains("Slurm"));
        assert!(Shard::from_environment(Some(3), slurm).is_ok());
        let e = Shard::from_environment(Some(4), slurm).unwrap_err().to_string();
        assert!(e.contains("SLURM_ARRAY_TASK_COUNT"), "{e}");
        let off = env(&[
            ("SLURM_ARRAY_TASK_ID", "5"),
            ("SLURM_ARRAY_TASK_MIN", "4"),
            ("SLURM_ARRAY_TASK_STEP", "3"),
            ("SLURM_ARRAY_TASK_COUNT", "3"),
        ]);
        assert!(Shard::from_environment(None, off).is_err());
        // Kubernetes: the index, and the count given.
        let k8s = env(&[("JOB_COMPLETION_INDEX", "2")]);
        assert_eq!(
            Shard::from_environment(Some(4), k8s).unwrap().0,
            Shard { index: 2, count: 4 }
        );
        let e = Shard::from_environment(None, k8s).unwrap_err().to_string();
        assert!(e.contains("auto:N"), "{e}");
        assert!(Shard::from_environment(Some(2), k8s).is_err(), "index 2 of 2");
        // Neither, both, garbage.
        let e = Shard::from_environment(Some(2), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SLURM_ARRAY_TASK_ID") && e.contains("JOB_COMPLETION_INDEX"),
            "{e}"
        );
        let both = env(&[
            ("JOB_COMPLETION_INDEX", "0"),
            ("SLURM_ARRAY_TASK_ID", "0"),
            ("SLURM_ARRAY_TASK_COUNT", "1"),
        ]);
        assert!(Shard::from_environment(Some(1), both).is_err());
        let bad = env(&[("JOB_COMPLETION_INDEX", "x")]);
        assert!(Shard::from_environment(Some(1), bad)
            .unwrap_err()
            .to_string()
            .contains("`x`"));
    }

    #[test]
    fn a_shard_is_i_of_n_with_i_below_n() {
        assert_eq!("2/8".parse::<Shard>().unwrap(), Shard { index: 2, count: 8 });
        assert_eq!(" 0 / 1 ".parse::<Shard>().unwrap(), Shard::ALL);
        for bad in ["8/8", "1/0", "x/2", "1/y", "3"] {
            let e = bad.parse::<Shard>().unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
    }
}
