//! `iocache lab`: the command line of the experiment lab (`iocache_lab`).
//! It parses the arguments, shows progress and prints; the grid, the
//! results, the live target and the reproductions are the library's.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use iocache_lab::experiment::{RunRequest, Shard};
use iocache_lab::live::Server;
use iocache_sim::SimOptions;

#[derive(Subcommand)]
pub enum LabCommand {
    /// Run an experiment file's grid in the simulator, or live (`target`) (resumable; --shard I/N).
    Run(RunArgs),
    /// Join result files (slices of one experiment) into one, each point once, in grid order.
    Merge(MergeArgs),
    /// Write results as one HTML page: plots against cache size per workload, and the tables.
    Report(ReportArgs),
    /// Re-run a seed paper's key findings (`lab reproduce list` names them): figures and a verdict.
    Reproduce(ReproduceArgs),
    /// Measure ReCA's category vectors on one generated reference workload per category
    /// (examples/workloads/reca-reference/) and print them beside the table's.
    RecaTable(RecaTableArgs),
}

#[derive(Args)]
pub struct RecaTableArgs {
    /// Requests per reference workload.
    #[arg(long, value_name = "N", default_value_t = iocache_lab::reca_table::REFERENCE_REQUESTS)]
    requests: u64,
    /// The category table to compare with (TOML; default: the built-in one).
    #[arg(long, value_name = "FILE")]
    reca_table: Option<PathBuf>,
    /// Print the measured vectors as the table's TOML keys instead.
    #[arg(long)]
    toml: bool,
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
    /// Run only the points whose index modulo N is I (0-based), e.g. 2/8; `auto` takes I and N
    /// from a Slurm array task, `auto:N` the index from a Kubernetes Indexed Job of N
    /// completions (examples/cluster/).
    #[arg(long, value_name = "I/N|auto[:N]")]
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

#[derive(Args)]
pub struct ReproduceArgs {
    /// arc-p2, asplos23, asplos23-flush, asplos23-lookup, asplos23-real, asplos23-live, icpp22, systor14, reca, reca-policies, reca-priorities, reca-processes, lbica, lbica-setting, all; `list` prints them.
    #[arg(value_name = "NAME")]
    name: String,
    /// Where to write each reproduction's directory (figures, verdict.md, verdict.json).
    #[arg(long, value_name = "DIR", default_value = "reproductions")]
    out: PathBuf,
    /// Shorter workloads (for tests): the same claims, less confidence.
    #[arg(long)]
    quick: bool,
    /// The shared trace samples [default: ../shared/traces beside the current directory].
    #[arg(long, value_name = "DIR")]
    traces: Option<PathBuf>,
    /// Worker threads per simulation pass (default: the number of cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// The terminal's progress bar as the lab's progress.
struct BarProgress(crate::progress::Bar);

impl iocache_lab::Progress for BarProgress {
    fn start(&mut self, label: &str) {
        self.0 = crate::progress::Bar::labelled(std::io::stderr().is_terminal(), label.to_string());
    }

    fn update(&mut self, reader: &iocache_trace::TraceReader, records: u64) {
        self.0.update(reader, records);
    }

    fn finish(&mut self) {
        self.0.finish();
    }
}

/// The server live points start: this very program, stopped by Ctrl-C
/// (the signal handlers are installed here).
fn server(program: &std::path::Path) -> Server<'_> {
    crate::signals::install_handlers();
    Server {
        program,
        stop: &crate::signals::STOP,
    }
}

/// `iocache lab run`.
pub fn run(args: RunArgs) -> Result<()> {
    let shard = match args.shard.as_deref().map(str::trim) {
        Some(text) if text == "auto" || text.starts_with("auto:") => {
            let count = match text.strip_prefix("auto:") {
                Some(n) => Some(
                    n.trim()
                        .parse::<usize>()
                        .map_err(|_| anyhow::anyhow!("--shard {text}: N is not a number"))?,
                ),
                None => None,
            };
            let (shard, from) = Shard::from_environment(count, |name| std::env::var(name).ok())
                .with_context(|| format!("--shard {text}"))?;
            log::info!("shard {}/{} from {from}", shard.index, shard.count);
            shard
        }
        Some(text) => text.parse::<Shard>().context("--shard")?,
        None => Shard::ALL,
    };
    let program = std::env::current_exe().context("this program's path")?;
    let request = RunRequest {
        out: args
            .out
            .clone()
            .unwrap_or_else(|| args.experiment.with_extension("results.jsonl")),
        experiment: args.experiment,
        shard,
        csv: args.csv,
        threads: args.threads.unwrap_or(SimOptions::default().threads),
        server: server(&program),
    };
    let mut progress = BarProgress(crate::progress::Bar::new(false));
    Ok(iocache_lab::experiment::run(&request, &mut progress)?)
}

/// `iocache lab merge`.
pub fn merge(args: MergeArgs) -> Result<()> {
    let points = iocache_lab::results::merge(&args.parts, &args.output, args.csv.as_deref())?;
    log::info!(
        "{} in {}",
        iocache_core::units::count(points as u64, "point"),
        args.output.display()
    );
    Ok(())
}

/// `iocache lab report`.
pub fn report(args: ReportArgs) -> Result<()> {
    let out = args.out.unwrap_or_else(|| args.results[0].with_extension("html"));
    let file = crate::args::OutputFile::check_path("--out", Some(&out))?.expect("a path");
    write_report(file, &iocache_lab::results::report(&args.results)?)
}

/// `iocache lab reca-table`.
pub fn reca_table(args: RecaTableArgs) -> Result<()> {
    use iocache_lab::reca_table::{derive, render, render_toml};
    if args.requests == 0 {
        bail!("--requests must be at least 1");
    }
    let (table, _) = iocache_sim::reca::read_table(args.reca_table.as_deref()).context("--reca-table")?;
    let rows = derive(&table, args.requests)?;
    print!(
        "{}",
        if args.toml {
            render_toml(&rows)
        } else {
            render(&rows)
        }
    );
    Ok(())
}

/// `iocache lab reproduce`.
pub fn reproduce(args: ReproduceArgs) -> Result<()> {
    use iocache_lab::reproduce::{self, Context as Run, REPRODUCTIONS};
    if args.name == "list" {
        for e in REPRODUCTIONS {
            println!("{:<13} {}", e.name, e.summary);
        }
        println!(
            "{:<13} every one above marked for it (all but the live ones), in turn",
            "all"
        );
        return Ok(());
    }
    let chosen = reproduce::chosen(&args.name)?;
    let traces = reproduce::find_traces(args.traces.as_deref()).context("--traces")?;
    match &traces {
        Some(dir) => log::info!("shared traces: {}", dir.display()),
        None => log::warn!(
            "shared traces not found (../shared/traces or --traces DIR; scripts/get-traces.sh fetches them): the parts that need them are skipped"
        ),
    }
    let threads = args.threads.unwrap_or(SimOptions::default().threads).max(1);
    let program = std::env::current_exe().context("this program's path")?;
    let server = server(&program);
    let mut unchecked = Vec::new();
    for entry in chosen {
        let dir = args.out.join(entry.name);
        let context = Run {
            dir: dir.clone(),
            quick: args.quick,
            traces: traces.clone(),
            threads,
            server,
        };
        let started = std::time::Instant::now();
        let verdict = entry.run(&context)?;
        print!("{}", verdict.text());
        println!(
            "  wrote {} ({:.1} s)\n",
            dir.display(),
            started.elapsed().as_secs_f64()
        );
        if verdict.outcome.is_none() {
            unchecked.push(entry.name);
        }
    }
    // A script reads the exit status: a reproduction that checked
    // nothing (its traces missing) is not a pass.
    if !unchecked.is_empty() {
        bail!(
            "checked nothing: {} (see what was skipped above; --traces DIR, or scripts/get-traces.sh)",
            unchecked.join(", ")
        );
    }
    Ok(())
}

/// Renders `report` into `file` (opened before the run, as
/// `crate::args::OutputFile` does for every output); says where and how large.
pub fn write_report(file: crate::args::OutputFile, report: &iocache_report::Report) -> Result<()> {
    let html = iocache_report::render(report)?;
    let path = file.path.display().to_string();
    file.write(&html)
        .with_context(|| format!("writing --report {path}"))?;
    log::info!("report: {path} ({} KiB)", html.len().div_ceil(1024));
    Ok(())
}
