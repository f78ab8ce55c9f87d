//! The `iocache` binary: a thin command-line front end over the library crates.

mod admin;
mod allocate_cli;
mod args;
mod config;
mod exit;
mod gen_cli;
mod lab_cli;
mod logging;
mod mrc_cli;
mod progress;
mod reca_cli;
mod serve;
mod signals;

use iocache_core::units::count;

#[global_allocator]
static GLOBAL: iocache_sim::huge_alloc::HugeTableAlloc = iocache_sim::huge_alloc::HugeTableAlloc;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use args::{parse_line_size, print_stdout, runs_json, table_of, OutputFile, TraceFormatArgs, TraceInput};
use clap::{Args, Parser, Subcommand};
use iocache_core::{PolicySpec, Promotion, WritePolicy};
use iocache_sim::report::{render_table, render_timing_table, render_volume_table, JsonReport};
use iocache_sim::timing::{parse_device, parse_duration_ns, ArrivalMode, SeriesRow};
use iocache_sim::trace_stats::{trace_stats, Window};
use iocache_sim::{
    combinations, simulate, AdaptRow, CacheSettings, CacheSize, SimOptions, TimingSetup, Warmup,
};
use iocache_trace::TraceReader;

#[derive(Parser)]
#[command(
    name = "iocache",
    version,
    about = "A block I/O cache and its trace-driven simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log more: -v debug, -vv trace (RUST_LOG=LEVEL[,TARGET=LEVEL] when neither -v nor -q).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log less: -q warnings and errors only, -qq errors only.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    quiet: u8,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a cache device in front of a backend over NBD (defaults to ./iocache-data).
    Serve(Box<serve::ServeArgs>),
    /// Show the statistics of a running `iocache serve`.
    Stats(admin::StatsArgs),
    /// Change or show the volumes of a running `iocache serve`: attach, detach, flush, replace-member, warm, set, get, reca-reload, stats.
    Ctl(admin::CtlArgs),
    /// Simulate caches over a block I/O trace (every policy × size in one pass).
    Sim(Box<SimArgs>),
    /// Experiments over a grid of knobs (docs/lab.md): run, resume, shard and merge.
    Lab {
        #[command(subcommand)]
        command: lab_cli::LabCommand,
    },
    /// Generate a synthetic workload from a TOML spec: a trace (and the equivalent fio job).
    Gen(gen_cli::GenArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout, e.g.
    /// `iocache completions bash > /etc/bash_completion.d/iocache`.
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (iocache.1, iocache-serve.1, ...) into DIR.
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// List the replacement policies, their parameters and sources.
    Policies,
    /// Work with trace files.
    Trace {
        #[command(subcommand)]
        command: TraceCommand,
    },
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Characterize a trace: mix, sizes, footprint and working-set size.
    Stats(TraceStatsArgs),
    /// Miss-ratio curves of LRU at every cache size in one pass: exact (stack distances) or
    /// sampled (SHARDS); each exact point equals `iocache sim --policy lru` at that size.
    Mrc(mrc_cli::TraceMrcArgs),
    /// Split one cache among a trace's volumes: the split that minimizes total misses by each
    /// volume's LRU curve, simulated beside an equal and a proportional split.
    Allocate(allocate_cli::TraceAllocateArgs),
}

#[derive(Args)]
struct SimArgs {
    #[command(flatten)]
    input: TraceInput,
    /// Replacement policies, comma separated, with parameters as name:key=value
    /// (`iocache policies` lists them).
    #[arg(long, default_value = "lru", value_delimiter = ',', value_name = "NAMES")]
    policy: Vec<String>,
    /// Cache sizes, comma separated: a bare number is a line count (32768); a size with a unit
    /// is bytes (16MiB, 1.5GiB; K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024); a percentage
    /// is that share of the trace's footprint in lines (10%; a first pass counts it).
    #[arg(long, default_value = "32768", value_delimiter = ',', value_name = "SIZES")]
    cache_size: Vec<String>,
    /// Cache line sizes (power of two, 512B to 1MiB; a size takes a unit), comma separated.
    #[arg(long, default_value = "4KiB", value_delimiter = ',', value_name = "SIZES")]
    line_size: Vec<String>,
    /// Promotion: always, nhit:N or nhit:N:trigger=PERCENT.
    #[arg(long, default_value = "always")]
    promotion: String,
    /// Write policy: wb, wt, wi, wa, wo, pt.
    #[arg(long, default_value = "wb")]
    write_policy: String,
    /// Background flushing of dirty lines: nop, lazy[:idle=10s:interval=20s:batch=100:stale=120s]
    /// or aggressive[:interval=10ms:batch=128] (run at trace time).
    #[arg(long, default_value = "nop", value_name = "POLICY")]
    flush: String,
    /// Send write misses to the backend when every cache line is dirty.
    #[arg(long)]
    write_miss_bypass: bool,
    /// Sequential cutoff: off, or a stream length after which requests bypass (1MiB[:streams=16]).
    #[arg(long, default_value = "off", value_name = "BYTES|off")]
    seq_cutoff: String,
    /// Sequential readahead: off, or seq[:min=64KiB][:max=1MiB][:streams=16] (a read that
    /// continues a stream has the lines after it fetched into the cache).
    #[arg(long, default_value = "off", value_name = "off|seq[:...]")]
    readahead: String,
    /// What a read miss fills: request (the sectors asked for) or line (the whole line).
    #[arg(long, default_value = "request", value_name = "request|line")]
    fill: String,
    /// Requests that only warm the cache: a fraction of the trace (0.2) or a count (100000).
    #[arg(long, value_name = "FRACTION|REQUESTS")]
    warmup: Option<String>,
    /// Change knobs during the replay (repeatable), as `iocache ctl set` does on a server:
    /// REQUEST:KEY=VALUE[,KEY=VALUE...] applies before that request (0-based),
    /// TIME:KEY=VALUE[,...] from that trace time on (30s, 500ms). Keys: write_policy,
    /// promotion, policy, flush, write_miss_bypass, seq_cutoff, max_dirty_lines, readahead, fill, cache_size (a shrink writes back the dirty lines leaving at once).
    #[arg(long, value_name = "AT:KEY=VALUE,...")]
    reconfigure: Vec<String>,
    /// Restart every cache every DURATION of trace time (1h, 30m), or at the given trace times
    /// (at=1h/2h30m/3h, from the first request), keeping what the persistence mode keeps: all
    /// (every line; the default), dirty (dirty lines only), none (dirty lines written back, the
    /// cache empty): DURATION|at=T/T/...[:persistence=all|dirty|none] (SYSTOR'14 Fig. 19).
    #[arg(long, value_name = "DURATION|at=T/T/...[:persistence=MODE]")]
    restart_every: Option<String>,
    /// Adaptive controller beside every simulated cache: reca (workload categories per window,
    /// --reca-table; docs/results/reca.md), or, driven by the simulated device queues (needs
    /// timing), lbica[:interval=100ms:...], sib[:margin=1] or observe (measure only;
    /// docs/results/lbica.md).
    #[arg(long, value_name = "NAME[:KEY=VALUE...]")]
    adapt: Option<String>,
    /// Write results as JSON to PATH, or to stdout with `-` (the table is then not printed).
    #[arg(long, value_name = "PATH|-")]
    json: Option<String>,
    /// Also write one CSV row per run to PATH, with the columns of `lab run --csv` (the trace as
    /// the workload, the configuration, the results).
    #[arg(long, value_name = "PATH")]
    csv: Option<String>,
    /// Also write an HTML report (tables; hit ratio against size when sizes were swept; latency
    /// CDFs with timing; time series with --series-interval): one file, readable offline.
    #[arg(long, value_name = "FILE.html")]
    report: Option<PathBuf>,
    /// Worker threads (default: the number of cores).
    #[arg(long)]
    threads: Option<usize>,
    /// A per-window series without the timing model: hit ratios, backend traffic, dirty and
    /// resident lines per window of trace time (1s, 500ms, 1h) or of requests (10000, 10000req);
    /// per volume too with --per-volume. Into --json (`cache_series`), --series and --report.
    #[arg(long, value_name = "WINDOW")]
    series_every: Option<String>,
    /// Results per volume of a shared cache (requests, hits, backend traffic, lines held at the
    /// end): the N busiest in the table (default 10; `all` for every one), all in --json.
    #[arg(long, value_name = "N|all", num_args = 0..=1, default_missing_value = "10")]
    per_volume: Option<String>,
    #[command(flatten)]
    timing: TimingArgs,
    #[command(flatten)]
    reca: reca_cli::SimRecaArgs,
}

/// Device timing (docs/timing-model.md). Any of these turns it on.
#[derive(Args)]
struct TimingArgs {
    /// Model device time: latency percentiles, IOPS, device utilization.
    #[arg(long)]
    timing: bool,
    /// Cache device: a preset (ramdisk, nvdimm, optane, nvme, sata-ssd, ...) with
    /// optional overrides, e.g. `optane:servers=4` [default: ramdisk].
    #[arg(long, value_name = "DEVICE")]
    cache_device: Option<String>,
    /// Backend device preset [default: ssd-raid5].
    #[arg(long, value_name = "DEVICE")]
    backend_device: Option<String>,
    /// Open-loop replay at trace time divided by this factor (20 = 20x faster) [default: 1].
    #[arg(long, value_name = "FACTOR", conflicts_with = "closed_loop")]
    speed: Option<f64>,
    /// Closed loop: keep N requests outstanding, ignoring trace times.
    #[arg(long, value_name = "N")]
    closed_loop: Option<u32>,
    /// Bounded clients: trace times (divided by --speed), but at most N requests outstanding; a
    /// request whose time has come waits for one to complete.
    #[arg(long, value_name = "N", conflicts_with = "closed_loop")]
    clients: Option<u32>,
    /// Time-series interval (e.g. 100ms, 1s).
    #[arg(long, value_name = "DURATION")]
    series_interval: Option<String>,
    /// Write the time series of every run to PATH (CSV if it ends in .csv, else JSON): the timing
    /// series of --series-interval, or the cache series of --series-every.
    #[arg(long, value_name = "PATH")]
    series: Option<String>,
}

impl TimingArgs {
    fn setup(&self) -> Result<Option<TimingSetup>> {
        let wanted = self.timing
            || self.cache_device.is_some()
            || self.backend_device.is_some()
            || self.speed.is_some()
            || self.closed_loop.is_some()
            || self.clients.is_some()
            || self.series_interval.is_some();
        if !wanted {
            return Ok(None);
        }
        let device = |flag: &str, given: &Option<String>, default: &str| {
            parse_device(given.as_deref().unwrap_or(default)).map_err(|e| anyhow::anyhow!("--{flag}: {e}"))
        };
        let arrivals = match (self.closed_loop, self.clients, self.speed) {
            (Some(n), _, _) => ArrivalMode::Closed { outstanding: n },
            (None, Some(n), speed) => ArrivalMode::Clients {
                speed: speed.unwrap_or(1.0),
                outstanding: n,
            },
            (None, None, speed) => ArrivalMode::Open {
                speed: speed.unwrap_or(1.0),
            },
        };
        let series_interval_ns = self
            .series_interval
            .as_deref()
            .map(|text| parse_duration_ns(text).map_err(|e| anyhow::anyhow!("--series-interval: {e}")))
            .transpose()?;
        Ok(Some(TimingSetup {
            cache: device("cache-device", &self.cache_device, "ramdisk")?,
            backend: device("backend-device", &self.backend_device, "ssd-raid5")?,
            arrivals,
            series_interval_ns,
        }))
    }
}

#[derive(Args)]
struct TraceStatsArgs {
    /// Trace file.
    #[arg(value_name = "PATH")]
    trace: PathBuf,
    #[command(flatten)]
    reading: TraceFormatArgs,
    /// Line size for footprint and working-set size (a size with a unit: 4KiB, 512B).
    #[arg(long, default_value = "4KiB", value_name = "SIZE")]
    line_size: String,
    /// Working-set window: trace time (30s, 15m, 6h, 1d, 1w) or requests (100000req).
    #[arg(long)]
    window: Option<String>,
    /// Write the statistics as JSON to PATH, or to stdout with `-`.
    #[arg(long, value_name = "PATH|-")]
    json: Option<String>,
    #[command(flatten)]
    reca: reca_cli::TraceRecaArgs,
}

fn main() {
    let cli = Cli::parse();
    // The offline commands' tables on huge pages; the server's memory
    // stays as the system allocator gives it (iocache_sim::huge_alloc). Nothing of
    // 1 MiB or more has been allocated yet.
    if matches!(
        cli.command,
        Command::Sim(_) | Command::Lab { .. } | Command::Trace { .. }
    ) {
        iocache_sim::huge_alloc::enable();
    }
    if let Err(e) = logging::init(cli.verbose, cli.quiet) {
        eprintln!("iocache: error: {e}");
        std::process::exit(2);
    }
    if !matches!(
        cli.command,
        Command::Serve(_)
            | Command::Lab {
                command: lab_cli::LabCommand::Run(_)
            }
    ) {
        signals::die_quietly_on_closed_pipes();
    }
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Stats(args) => admin::stats(args),
        Command::Ctl(args) => admin::ctl(args),
        Command::Sim(args) => run_sim(*args),
        Command::Policies => list_policies(),
        Command::Gen(args) => gen_cli::run(args),
        Command::Lab { command } => match command {
            lab_cli::LabCommand::Run(args) => lab_cli::run(args),
            lab_cli::LabCommand::Merge(args) => lab_cli::merge(args),
            lab_cli::LabCommand::Report(args) => lab_cli::report(args),
            lab_cli::LabCommand::Reproduce(args) => lab_cli::reproduce(args),
            lab_cli::LabCommand::RecaTable(args) => lab_cli::reca_table(args),
        },
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "iocache", &mut script);
            print_stdout(String::from_utf8_lossy(&script).trim_end())
        }
        Command::Man { dir } => write_man_pages(&dir),
        Command::Trace {
            command: TraceCommand::Stats(args),
        } => run_trace_stats(args),
        Command::Trace {
            command: TraceCommand::Mrc(args),
        } => mrc_cli::run(args),
        Command::Trace {
            command: TraceCommand::Allocate(args),
        } => allocate_cli::run(args),
    };
    if let Err(e) = result {
        eprintln!(
            "iocache: error: {}",
            iocache_serving::error_chain_text(e.as_ref())
        );
        std::process::exit(exit::status_of(&e));
    }
}

/// Writes a man page for the command and for each subcommand (`iocache-serve.1`, ...).
fn write_man_pages(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let command = <Cli as clap::CommandFactory>::command();
    let mut written = Vec::new();
    let mut pages = vec![("iocache".to_string(), command.clone())];
    for sub in command.get_subcommands() {
        pages.push((format!("iocache-{}", sub.get_name()), sub.clone()));
        for nested in sub.get_subcommands() {
            pages.push((
                format!("iocache-{}-{}", sub.get_name(), nested.get_name()),
                nested.clone(),
            ));
        }
    }
    for (name, page) in pages {
        // clap names are 'static without its `string` feature; a few
        // short names for a command that exits next is no leak to mind.
        let page = page.name(&*Box::leak(name.clone().into_boxed_str()));
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
        written.push(path.display().to_string());
    }
    println!("wrote {}", written.join(", "));
    Ok(())
}

fn list_policies() -> Result<()> {
    let header = ["policy", "parameters", "what it is"];
    let policies = table_of(&header, iocache_core::policy::POLICIES.iter(), |e| {
        let params = if e.params.is_empty() {
            "-".to_string()
        } else {
            e.params.join(", ")
        };
        vec![e.name.to_string(), params, e.summary.to_string()]
    });
    print_stdout(policies.trim_end())
}

fn parse_list<T: std::str::FromStr>(what: &str, items: &[String]) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    items
        .iter()
        .map(|s| s.parse::<T>().map_err(|e| anyhow::anyhow!("--{what}: {e}")))
        .collect()
}

/// `10%`: a share of the footprint (above 0 and at most 100 %), else `None`.
fn footprint_share(size: &str) -> Result<Option<f64>> {
    let Some(number) = size.trim().strip_suffix('%') else {
        return Ok(None);
    };
    match number.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(Some(p / 100.0)),
        _ => bail!("--cache-size {size}: a share of the footprint is above 0 % and at most 100 %"),
    }
}

/// Sizes the runs given a share of the footprint (`shares`, by the index
/// of `--cache-size`, in the order `combinations` makes them): that share
/// of the distinct lines the trace touches at the run's line size,
/// rounded up, as `lab run` sizes `cache_size = "10%"`.
fn size_shares(
    specs: &mut [iocache_sim::RunSpec],
    shares: &[Option<f64>],
    line_sizes: &[iocache_core::LineSize],
    input: &TraceInput,
) -> Result<()> {
    if input.is_stdin() {
        bail!(
            "--cache-size as a share of the footprint needs the footprint first, and stdin can be read \
             only once: name the trace file, or give sizes in lines or bytes"
        );
    }
    let mut footprints = std::collections::BTreeMap::new();
    for (i, spec) in specs.iter_mut().enumerate() {
        let Some(share) = shares[(i / line_sizes.len()) % shares.len()] else {
            continue;
        };
        let line = spec.line_size;
        let footprint = match footprints.get(&line.bytes()) {
            Some(&n) => n,
            None => {
                let reader = input.open().map_err(|e| input.explain(e))?;
                let n = iocache_lab::experiment::footprint_lines(reader, line)?;
                log::info!(
                    "footprint: {} of {}",
                    count(n, "line"),
                    iocache_core::units::format_byte_size(line.bytes())
                );
                footprints.insert(line.bytes(), n);
                n
            }
        };
        let lines = ((footprint as f64 * share).ceil() as u64).max(1);
        spec.size = CacheSize::Lines(lines);
        spec.capacity_lines = lines;
    }
    Ok(())
}

/// Counts the trace's data records (for a warmup given as a fraction).
fn count_records(input: &TraceInput) -> Result<u64> {
    let mut reader = input.open()?;
    let mut n = 0u64;
    for record in reader.by_ref() {
        record?;
        n += 1;
    }
    Ok(n)
}

fn run_sim(args: SimArgs) -> Result<()> {
    let policies: Vec<PolicySpec> = parse_list("policy", &args.policy)?;
    // A share of the footprint is sized once the footprint is counted
    // (below); a one-line placeholder until then.
    let shares: Vec<Option<f64>> = args
        .cache_size
        .iter()
        .map(|s| footprint_share(s))
        .collect::<Result<_>>()?;
    let sizes: Vec<CacheSize> = args
        .cache_size
        .iter()
        .zip(&shares)
        .map(|(s, share)| match share {
            Some(_) => Ok(CacheSize::Lines(1)),
            None => s
                .parse::<CacheSize>()
                .map_err(|e| anyhow::anyhow!("--cache-size: {e}")),
        })
        .collect::<Result<_>>()?;
    let line_sizes = args
        .line_size
        .iter()
        .map(|s| parse_line_size(s))
        .collect::<Result<Vec<_>>>()?;
    let promotion: Promotion = args
        .promotion
        .parse()
        .map_err(|e| anyhow::anyhow!("--promotion: {e}"))?;
    let write_policy: WritePolicy = args
        .write_policy
        .parse()
        .map_err(|e| anyhow::anyhow!("--write-policy: {e}"))?;
    let settings = CacheSettings {
        write_policy,
        promotion,
        cleaning: args.flush.parse().map_err(|e| anyhow::anyhow!("--flush: {e}"))?,
        write_miss_bypass: args.write_miss_bypass,
        seq_cutoff: args
            .seq_cutoff
            .parse()
            .map_err(|e| anyhow::anyhow!("--seq-cutoff: {e}"))?,
        readahead: args
            .readahead
            .parse()
            .map_err(|e| anyhow::anyhow!("--readahead: {e}"))?,
        fill: args.fill.parse().map_err(|e| anyhow::anyhow!("--fill: {e}"))?,
    };
    let mut specs = combinations(&policies, &sizes, &line_sizes, &settings)?;
    if shares.iter().any(Option::is_some) {
        size_shares(&mut specs, &shares, &line_sizes, &args.input)?;
    }
    let warmup_requests = match args.warmup.as_deref().map(str::parse::<Warmup>).transpose()? {
        None | Some(Warmup::None) => 0,
        Some(Warmup::Requests(n)) => n,
        Some(Warmup::Fraction(_)) if args.input.is_stdin() => bail!(
            "--warmup {}: a fraction needs the trace's length, and stdin can be read only once; \
             give a request count instead (e.g. --warmup 100000)",
            args.warmup.as_deref().unwrap_or_default()
        ),
        Some(Warmup::Fraction(f)) => {
            (count_records(&args.input).map_err(|e| args.input.explain(e))? as f64 * f).round() as u64
        }
    };
    let series_every = args
        .series_every
        .as_deref()
        .map(iocache_sim::tally::parse_every)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--series-every: {e}"))?;
    let volumes_shown = match args.per_volume.as_deref().map(str::trim) {
        None => None,
        Some("all") => Some(None),
        Some(n) => Some(Some(n.parse::<usize>().map_err(|_| {
            anyhow::anyhow!("--per-volume {n}: expected a number of volumes to show, or all")
        })?)),
    };
    if let Some(path) = args.timing.series.as_deref() {
        match (args.timing.series_interval.is_some(), series_every.is_some()) {
            (false, false) => bail!(
                "--series {path}: there is no series to write: add --series-every WINDOW (hit ratios \
                 per window) or --series-interval DURATION (the timing model's series)"
            ),
            (true, true) if path.ends_with(".csv") => bail!(
                "--series {path}: with both --series-interval and --series-every the two series have \
                 different rows; write them as JSON (a path not ending in .csv)"
            ),
            _ => {}
        }
    }
    args::not_stdout(
        "--series",
        args.timing.series.as_deref(),
        "stdout carries the run's table or JSON",
    )?;
    args::not_stdout(
        "--csv",
        args.csv.as_deref(),
        "stdout carries the run's table or JSON",
    )?;
    let report_path = args.report.as_deref().map(|p| p.to_string_lossy());
    args::distinct_outputs(&[
        ("--json", args.json.as_deref()),
        ("--csv", args.csv.as_deref()),
        ("--series", args.timing.series.as_deref()),
        ("--reca-series", reca_cli::series_path(&args.reca)),
        ("--report", report_path.as_deref()),
    ])?;
    let json_file = OutputFile::check("--json", args.json.as_deref())?;
    let series_file = OutputFile::check("--series", args.timing.series.as_deref())?;
    let reca_series_file = reca_cli::series_file(&args.reca, args.adapt.as_deref())?;
    let csv_file = OutputFile::check("--csv", args.csv.as_deref())?;
    let report_file = OutputFile::check_path("--report", args.report.as_deref())?;
    let options = SimOptions {
        warmup_requests,
        threads: args.threads.unwrap_or(SimOptions::default().threads).max(1),
        timing: args.timing.setup()?,
        reconfigure: args
            .reconfigure
            .iter()
            .map(|r| r.parse::<iocache_sim::Reconfigure>())
            .collect::<Result<Vec<_>, _>>()?,
        reca: reca_cli::sim_options(&args.reca, args.adapt.as_deref())?,
        adapt: args
            .adapt
            .as_deref()
            .filter(|a| !reca_cli::is_reca(Some(a)))
            .map(str::parse)
            .transpose()?,
        restarts: args.restart_every.as_deref().map(str::parse).transpose()?,
        tally: iocache_sim::TallyOptions {
            series: series_every,
            per_volume: volumes_shown.is_some(),
        },
    };
    let mut reader = args.input.open().map_err(|e| args.input.explain(e))?;
    let mut bar = progress::Bar::new(std::io::stdout().is_terminal());
    let report = simulate(&mut reader, &specs, &options, &mut |r, records| {
        bar.update(r, records)
    })
    .map_err(|e| args.input.explain(e.into()))?;
    bar.finish();
    if report.trace_records == 0 {
        bail!("{}: the trace holds no data requests", args.input.trace.display());
    }
    if let (Some(path), Some(file)) = (args.timing.series.as_deref(), series_file) {
        file.write(&series_text(path, &report)?)
            .with_context(|| format!("writing --series {path}"))?;
    }
    let trace_name = reader.name().to_string();
    if let Some(file) = csv_file {
        let rows = iocache_lab::experiment::sim_rows(&trace_name, &report);
        file.write(&iocache_lab::results::csv_text(&rows))
            .with_context(|| format!("writing --csv {}", args.csv.as_deref().unwrap_or_default()))?;
    }
    if let Some(file) = report_file {
        let format = reader.format().to_string();
        lab_cli::write_report(file, &iocache_lab::reports::sim(&trace_name, &format, &report)?)?;
    }
    if warmup_requests > 0 && warmup_requests >= report.trace_records {
        log::warn!(
            "the warmup ({warmup_requests} requests) covers the whole trace ({} requests): nothing was counted",
            report.trace_records
        );
    }
    match args.json.as_deref() {
        Some(path) => {
            let json = JsonReport::new(&trace_name, reader.format().to_string(), &report);
            let text = serde_json::to_string_pretty(&json)?;
            match json_file {
                None => {
                    // The table (which says it) is not printed: say it here.
                    if reader.skips_bad_lines() {
                        log::info!(
                            "{}: {} skipped",
                            trace_name,
                            count(reader.skipped_lines(), "malformed line")
                        );
                    }
                    print_stdout(&text)?
                }
                Some(file) => {
                    file.write(&(text + "\n"))
                        .with_context(|| format!("writing {path}"))?;
                    print_sim_table(&trace_name, &reader, &report, volumes_shown);
                }
            }
        }
        None => print_sim_table(&trace_name, &reader, &report, volumes_shown),
    }
    // The series file is written with any output; the text only where
    // stdout is not the JSON.
    reca_cli::report(reca_series_file, &report, args.json.as_deref() != Some("-"))?;
    Ok(())
}

/// The malformed lines skipped, said whenever --skip-bad-lines was given
/// (without it the first one stops the run), as ", N malformed lines
/// skipped".
fn skipped_text(reader: &TraceReader) -> String {
    if reader.skips_bad_lines() {
        format!(", {} skipped", count(reader.skipped_lines(), "malformed line"))
    } else {
        String::new()
    }
}

/// The run table, the timing table, and the `volumes` busiest volumes per
/// run with `--per-volume` (`Some(None)`: every one).
fn print_sim_table(
    trace: &str,
    reader: &TraceReader,
    report: &iocache_sim::SimReport,
    volumes: Option<Option<usize>>,
) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "trace {trace} ({}): {}{}, {} warmup, {} on {} in {:.2} s",
        reader.format(),
        count(report.trace_records, "request"),
        skipped_text(reader),
        report.warmup_requests,
        count(report.runs.len() as u64, "run"),
        count(report.threads as u64, "thread"),
        report.wall_seconds
    );
    let _ = write!(out, "{}", render_table(report));
    if let Some(timing) = render_timing_table(report) {
        let _ = writeln!(out, "\ntiming (latencies in microseconds):");
        let _ = write!(out, "{timing}");
    }
    if let Some(table) = volumes.and_then(|limit| render_volume_table(report, limit)) {
        let _ = writeln!(out, "\nper volume (busiest first):");
        let _ = write!(out, "{table}");
    }
    for run in report.runs.iter().filter(|r| r.adapt.is_some()) {
        let adapt = run.adapt.as_ref().map(|a| a.summary()).unwrap_or_default();
        let _ = writeln!(out, "adapt {} {}: {adapt}", run.spec.policy, run.spec.size);
    }
}

/// The time series of every run: CSV (`path` ending in .csv) with the
/// run's policy and size first, or JSON.
fn series_text(path: &str, report: &iocache_sim::SimReport) -> Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    let timed = report
        .runs
        .iter()
        .any(|r| r.timing.as_ref().is_some_and(|t| t.series_interval_ns.is_some()));
    if path.ends_with(".csv") && !timed {
        // The cache series (--series-every) alone.
        writeln!(out, "policy,cache_size,{}", iocache_sim::SeriesWindow::CSV_HEADER)?;
        for run in &report.runs {
            for row in &run.series {
                writeln!(out, "{},{},{}", run.spec.policy, run.spec.size, row.csv_record())?;
            }
        }
    } else if path.ends_with(".csv") {
        // With a controller, its interval of the same start joins each row.
        let adapt = report.runs.iter().any(|r| r.adapt.is_some());
        let adapt_header = if adapt {
            format!(",{}", AdaptRow::CSV_HEADER)
        } else {
            String::new()
        };
        writeln!(out, "policy,cache_size,{}{adapt_header}", SeriesRow::CSV_HEADER)?;
        for run in &report.runs {
            let rows: std::collections::HashMap<u64, &AdaptRow> = run
                .adapt
                .iter()
                .flat_map(|a| &a.rows)
                .map(|r| (r.start_ns, r))
                .collect();
            for row in run.timing.iter().flat_map(|t| &t.series) {
                let extra = match (adapt, rows.get(&row.start_ns)) {
                    (false, _) => String::new(),
                    (true, Some(a)) => format!(",{}", a.csv_record()),
                    (true, None) => format!(",{}", AdaptRow::csv_empty()),
                };
                writeln!(
                    out,
                    "{},{},{}{extra}",
                    run.spec.policy,
                    run.spec.size,
                    row.csv_record()
                )?;
            }
        }
    } else {
        let runs = runs_json(report, |run| {
            serde_json::json!({
                "series": run.timing.as_ref().map(|t| &t.series),
                "adapt": run.adapt.as_ref(),
                "cache_series": &run.series,
            })
        });
        out = serde_json::to_string_pretty(&runs)?;
        out.push('\n');
    }
    Ok(out)
}

fn run_trace_stats(args: TraceStatsArgs) -> Result<()> {
    let input = args.reading.input(args.trace);
    let line = parse_line_size(&args.line_size)?;
    let window = args.window.as_deref().map(str::parse::<Window>).transpose()?;
    if args.reca.reca && input.is_stdin() {
        bail!("--reca reads the trace a second time, which stdin cannot give: name the trace file");
    }
    let json_file = OutputFile::check("--json", args.json.as_deref())?;
    let mut reader = input.open().map_err(|e| input.explain(e))?;
    let mut bar = progress::Bar::new(std::io::stdout().is_terminal());
    let stats = trace_stats(&mut reader, line, window, &mut |r, n| bar.update(r, n))
        .map_err(|e| input.explain(e.into()))?;
    bar.finish();
    if stats.requests == 0 {
        bail!("{}: the trace holds no data requests", input.trace.display());
    }
    let reca = reca_cli::trace(&args.reca, || input.open())?;
    if let Some(path) = args.json.as_deref() {
        let mut value = serde_json::to_value(&stats)?;
        if let (Some(reca), Some(map)) = (&reca, value.as_object_mut()) {
            map.insert("reca".into(), serde_json::to_value(reca)?);
        }
        let text = serde_json::to_string_pretty(&value)?;
        match json_file {
            None => return print_stdout(&text),
            Some(file) => file
                .write(&(text + "\n"))
                .with_context(|| format!("writing {path}"))?,
        }
    }
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "trace            {} ({})", stats.trace, stats.format);
    let _ = writeln!(
        out,
        "requests         {} ({} reads, {} writes, {:.1} % reads)",
        stats.requests,
        stats.read_requests,
        stats.write_requests,
        stats.read_fraction * 100.0
    );
    let _ = writeln!(
        out,
        "bytes            {} read, {} written",
        mib(stats.read_bytes),
        mib(stats.write_bytes)
    );
    let _ = writeln!(out, "volumes          {}", stats.volumes);
    if reader.format().has_timestamps() {
        let _ = writeln!(
            out,
            "time span        {:.3} s",
            (stats.last_time_ns - stats.first_time_ns) as f64 / 1e9
        );
    } else {
        let _ = writeln!(
            out,
            "time span        none: the {} format has no timestamps",
            reader.format()
        );
    }
    let _ = writeln!(
        out,
        "request size     min {} B, mean {:.0} B, max {} B",
        stats.min_request_bytes, stats.mean_request_bytes, stats.max_request_bytes
    );
    let _ = writeln!(
        out,
        "footprint        {} lines of {} B = {} ({} read lines, {} written lines)",
        stats.footprint_lines,
        stats.line_size,
        mib(stats.footprint_bytes),
        stats.read_footprint_lines,
        stats.write_footprint_lines
    );
    if input.skip_bad_lines || stats.ignored_records > 0 {
        let _ = writeln!(
            out,
            "skipped          {}, {}",
            count(stats.skipped_lines, "malformed line"),
            count(stats.ignored_records, "non-data record")
        );
    }
    let _ = writeln!(out, "\nrequest sizes:");
    let sizes = table_of(&["size", "requests", "%"], &stats.request_sizes, |b| {
        vec![
            format!("<= {}", iocache_core::units::format_byte_size(b.max_bytes)),
            b.requests.to_string(),
            format!("{:.2}", b.requests as f64 * 100.0 / stats.requests as f64),
        ]
    });
    let _ = write!(out, "{sizes}");
    if let Some(window) = &stats.window {
        let _ = writeln!(out, "\nworking set per window of {window}:");
        let header = ["window", "requests", "lines", "MiB", "lines so far", "MiB so far"];
        let windows = table_of(&header, &stats.windows, |w| {
            vec![
                w.index.to_string(),
                w.requests.to_string(),
                w.unique_lines.to_string(),
                format!("{:.1}", w.unique_bytes as f64 / (1 << 20) as f64),
                w.cumulative_lines.to_string(),
                format!(
                    "{:.1}",
                    (w.cumulative_lines * stats.line_size) as f64 / (1 << 20) as f64
                ),
            ]
        });
        let _ = write!(out, "{windows}");
    }
    drop(out);
    if let Some(reca) = &reca {
        reca_cli::print_trace(reca);
    }
    Ok(())
}

#[cfg(test)]
mod error_text_tests {
    use iocache_serving::error_chain_text;

    /// A library error as thiserror writes `#[error("reading trace: {0}")]`
    /// with `#[source]`: its message already holds its source's.
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "reading trace: {}", self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let e = anyhow::Error::new(Wrapping(io)).context("--trace t.csv");
        let text = error_chain_text(e.as_ref());
        assert_eq!(text.matches("No such file or directory").count(), 1, "{text}");
        assert!(text.starts_with("--trace t.csv: reading trace: "), "{text}");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain_text(plain.as_ref()), "outer: inner");
    }
}
