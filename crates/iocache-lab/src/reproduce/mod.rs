//! The papers' reproductions (`iocache lab reproduce NAME`). Each
//! seed paper's key findings are re-run in the simulator, in process,
//! through the library (`iocache_sim::simulate`, or `iocache_core::Cache`
//! directly where a per-interval count is needed), and each reproduction
//! writes its figures (SVG, drawn by `iocache-report`), a `verdict.json`
//! and a `verdict.md` into its own directory and prints the verdict. The
//! verdicts come from the numbers through `verdict.rs`, with the
//! tolerances stated there and in each claim. A reproduction that needs
//! the shared traces says which parts it skipped when they are absent.
//!
//! Adding one: a module with `run(&Context) -> Result<Verdict>`, an entry
//! in [`REPRODUCTIONS`].

mod arc_p2;
mod asplos23;
mod asplos23_flush;
mod asplos23_live;
mod asplos23_lookup;
mod asplos23_real;
mod icpp22;
mod icpp22_pages;
mod lbica;
mod reca;
mod reca_policies;
mod reca_priorities;
mod reca_processes;
mod reca_setup;
mod systor14;
pub mod verdict;

use std::io::Write;
use std::path::{Path, PathBuf};

use iocache_report::{Axis, Chart, Scale, Series, Ticks};
use iocache_sim::workload::WorkloadSpec;
use iocache_sim::{simulate, RunSpec, SimOptions, SimReport, TimingSetup};
use iocache_trace::{ReaderOptions, TraceReader};

use crate::error::{invalid, Result, Within};
use verdict::Verdict;

/// One reproduction.
pub struct Reproduction {
    pub name: &'static str,
    pub summary: &'static str,
    run: fn(&Context) -> Result<Verdict>,
    /// Run by `all` (the live one is not: it needs fio and minutes of a quiet machine).
    pub in_all: bool,
}

/// Every reproduction, in the order `all` runs them.
/// The real traces of the shared traces directory (scripts/get-traces.sh)
/// that reproductions run on, the full ARC P2 first.
pub const SAMPLE_TRACES: [&str; 7] = [
    "arc-P2.lis.zst",
    "cloudphysics-w106-sample.csv",
    "msr-hm0-sample.csv",
    "systor17-sample.csv.gz",
    "tencent-cbs-sample.csv.bz2",
    "tpcc-small.disksim",
    "wsrch-small.disksim",
];

pub const REPRODUCTIONS: &[Reproduction] = &[
    Reproduction {
        name: "arc-p2",
        summary: "ARC paper (FAST'03) Table IV on trace P2: LRU and ARC hit ratios at 32,768 pages (fidelity check)",
        run: arc_p2::run,
        in_all: true,
    },
    Reproduction {
        name: "asplos23",
        summary: "ASPLOS'23 Figs. 8-10: promotion always vs nhit and line sizes on fio-zoned workloads, Optane/NVMe timing: IOPS, p99/p99.99",
        run: asplos23::run,
        in_all: true,
    },
    Reproduction {
        name: "asplos23-flush",
        summary: "ASPLOS'23 Figs. 13-14: lazy vs aggressive flushing once write bursts fill the cache with dirty lines, Optane/NVMe timing: IOPS over time, p99.99",
        run: asplos23_flush::run,
        in_all: true,
    },
    Reproduction {
        name: "asplos23-lookup",
        summary: "ASPLOS'23 Fig. 6: the engine's lookup designs (single, coarse, fine) from 1 to 8 threads in process, with a fitted prediction beyond the cores",
        run: asplos23_lookup::run,
        in_all: true,
    },
    Reproduction {
        name: "asplos23-real",
        summary: "ASPLOS'23 Fig. 15: every sample trace through promotion x line size x flushing on Optane timing: the best, the default and the worst configuration",
        run: asplos23_real::run,
        in_all: true,
    },
    Reproduction {
        name: "asplos23-live",
        summary: "ASPLOS'23 Figs. 8-10 in the live engine: iocache serve on /dev/shm driven by fio zoned jobs over NBD (needs fio; not in `all`)",
        run: asplos23_live::run,
        in_all: false,
    },
    Reproduction {
        name: "icpp22",
        summary: "ICPP'22 Req-block vs LRU, BPLRU, VBBMS: hit ratio, pages per eviction, flash writes, response time, delta sensitivity (Fig. 7)",
        run: icpp22::run,
        in_all: true,
    },
    Reproduction {
        name: "systor14",
        summary: "SYSTOR'14: WT vs WB server load over time, hit ratio vs reboot frequency (persistence all vs dirty), working-set curves",
        run: systor14::run,
        in_all: true,
    },
    Reproduction {
        name: "reca",
        summary: "ReCA (TPDS'18) Fig. 18: hit ratio with and without reconfiguration when the workload changes category",
        run: reca::run,
        in_all: true,
    },
    Reproduction {
        name: "reca-policies",
        summary: "ReCA (TPDS'18) Figs. 13-15: per category's reference workload, write policies, 4/8 KiB lines and ReCA against LRU, LARC and Access, SSD over HDD timing: mean response time",
        run: reca_policies::run,
        in_all: true,
    },
    Reproduction {
        name: "reca-priorities",
        summary: "ReCA (TPDS'18) Fig. 16: each category's priority weights, one at a time over negative and positive values, on its reference workload and the samples, SSD over HDD timing: mean response time",
        run: reca_priorities::run,
        in_all: true,
    },
    Reproduction {
        name: "reca-processes",
        summary: "ReCA (TPDS'18) Fig. 17: mixes of two categories' reference workloads as two processes, global against per-process characterization, normalized to LARC, SSD over HDD timing",
        run: reca_processes::run,
        in_all: true,
    },
    Reproduction {
        name: "lbica",
        summary: "LBICA (DATE'19) Figs. 4, 5, 7: WB vs SIB vs LBICA under bursts: mean latency, cache and backend queue time over time",
        run: lbica::run,
        in_all: true,
    },
    Reproduction {
        name: "lbica-setting",
        summary: "LBICA (DATE'19) Figs. 4, 5, 7 in the paper's setting: one SSD over one disk, open loop and with 32 clients, and 128 disks with 32 clients",
        run: lbica::run_settings,
        in_all: true,
    },
];

/// What a reproduction gets: where to write, how long to run, the traces.
pub struct Context<'a> {
    /// Its own directory (figures, verdict.md, verdict.json).
    pub dir: PathBuf,
    /// Shorter workloads (for tests): the same claims, less confidence.
    pub quick: bool,
    /// The shared traces, when present.
    pub traces: Option<PathBuf>,
    pub threads: usize,
    /// The server the live reproductions start.
    pub server: crate::live::Server<'a>,
}

impl Context<'_> {
    /// A shared trace, or `None` (and a note in `skipped`) when absent.
    pub fn trace(&self, file: &str, verdict: &mut Verdict, what: &str) -> Option<PathBuf> {
        match &self.traces {
            Some(dir) if dir.join(file).is_file() => Some(dir.join(file)),
            Some(dir) => {
                verdict
                    .skipped
                    .push(format!("{what}: {} is missing", dir.join(file).display()));
                None
            }
            None => {
                verdict.skipped.push(format!(
                    "{what}: the shared traces (../shared/traces or --traces DIR) are absent; scripts/get-traces.sh fetches them"
                ));
                None
            }
        }
    }

    /// The shared traces a reproduction's real-trace part runs on, by
    /// name: all of [`SAMPLE_TRACES`], or two small ones with `--quick`;
    /// each missing one is noted in `skipped` under `what`.
    pub fn sample_traces(&self, verdict: &mut Verdict, what: &str) -> Vec<(&'static str, PathBuf)> {
        let names = if self.quick {
            &SAMPLE_TRACES[2..4]
        } else {
            &SAMPLE_TRACES[..]
        };
        names
            .iter()
            .filter_map(|t| self.trace(t, verdict, what).map(|p| (*t, p)))
            .collect()
    }

    /// Runs `specs` over a trace file in one pass.
    pub fn simulate_file(&self, path: &Path, specs: &[RunSpec], options: SimOptions) -> Result<SimReport> {
        let mut reader = TraceReader::open(path, None, ReaderOptions::default()).at_file(path)?;
        self.simulate(&mut reader, specs, options).at_file(path)
    }

    /// Runs `specs` over a generated workload in one pass.
    pub fn simulate_gen(
        &self,
        spec: &WorkloadSpec,
        specs: &[RunSpec],
        options: SimOptions,
    ) -> Result<SimReport> {
        self.simulate(&mut gen_reader(spec)?, specs, options)
    }

    /// Runs `specs` over any trace reader in one pass.
    pub fn simulate(
        &self,
        reader: &mut TraceReader,
        specs: &[RunSpec],
        options: SimOptions,
    ) -> Result<SimReport> {
        let options = SimOptions {
            threads: self.threads,
            ..options
        };
        Ok(simulate(reader, specs, &options, &mut |_, _| {})?)
    }

    /// Writes a chart as `NAME.svg` in the output directory and lists it.
    pub fn figure(&self, verdict: &mut Verdict, name: &str, chart: &Chart) -> Result<()> {
        let svg = iocache_report::render_svg(chart)?;
        let file = format!("{name}.svg");
        std::fs::write(self.dir.join(&file), svg).within(|| format!("{}", self.dir.join(&file).display()))?;
        verdict.figures.push(file);
        Ok(())
    }
}

/// A generated workload as a trace reader (MSR CSV in memory, as `lab run` does).
pub fn gen_reader(spec: &WorkloadSpec) -> Result<TraceReader> {
    Ok(spec.generator()?.into_reader("generated")?)
}

/// A workload spec from TOML text.
/// A timing setup of preset devices (`cache` over `backend`) driven by a
/// closed loop of `outstanding` requests, with a series every
/// `series_interval_ns` if given.
pub fn closed_loop(
    cache: &str,
    backend: &str,
    outstanding: u32,
    series_interval_ns: Option<u64>,
) -> TimingSetup {
    TimingSetup {
        cache: iocache_sim::timing::preset(cache).expect("a preset"),
        backend: iocache_sim::timing::preset(backend).expect("a preset"),
        arrivals: iocache_sim::timing::ArrivalMode::Closed { outstanding },
        series_interval_ns,
    }
}

pub fn workload(text: &str) -> Result<WorkloadSpec> {
    toml::from_str(text).map_err(|e| invalid!("built-in workload: {e}"))
}

/// ASPLOS'23's kind of workload: one phase `name` of `requests` 4 KiB
/// requests at 50,000 per second over 1 GiB, `read_percent` reads, spread
/// by `distribution` (fio's zoned ones), generated with `seed`.
pub fn one_phase_workload(
    seed: u64,
    name: &str,
    requests: u64,
    read_percent: u32,
    distribution: &str,
) -> Result<WorkloadSpec> {
    workload(&format!(
        "seed = {seed}\nvolume_size = \"1GiB\"\nblock_size = \"4KiB\"\n\
         [[phase]]\nname = \"{name}\"\nrequests = {requests}\nrate = 50000\nread_percent = {read_percent}\n\
         distribution = \"{distribution}\"\n"
    ))
}

/// An axis with a label.
pub fn axis(label: &str, scale: Scale, ticks: Ticks) -> Axis {
    Axis {
        label: label.into(),
        scale,
        ticks,
        range: None,
    }
}

/// A chart with its axes and no series yet (they are pushed one by one).
pub fn chart(title: impl Into<String>, x: Axis, y: Axis) -> Chart {
    Chart {
        title: title.into(),
        x,
        y,
        series: Vec::new(),
    }
}

pub fn series(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
    Series {
        name: name.into(),
        points,
    }
}

/// The shared traces: `given`, else `../shared/traces` from the current
/// directory, else beside the source tree this was built from (so tests
/// find it from any directory); `None` when absent.
pub fn find_traces(given: Option<&Path>) -> Result<Option<PathBuf>> {
    if let Some(dir) = given {
        if !dir.is_dir() {
            return Err(invalid!("{}: not a directory", dir.display()));
        }
        return Ok(Some(dir.to_path_buf()));
    }
    let candidates = [
        PathBuf::from("../shared/traces"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces"),
    ];
    Ok(candidates.into_iter().find(|d| d.join("README.md").is_file()))
}

/// The reproductions `name` asks for: one by its name, or `all`.
pub fn chosen(name: &str) -> Result<Vec<&'static Reproduction>> {
    if name == "all" {
        return Ok(REPRODUCTIONS.iter().filter(|e| e.in_all).collect());
    }
    let found = REPRODUCTIONS.iter().find(|e| e.name == name).ok_or_else(|| {
        invalid!(
            "unknown reproduction `{name}`; known: {}, all, list",
            REPRODUCTIONS
                .iter()
                .map(|e| e.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    Ok(vec![found])
}

impl Reproduction {
    /// Runs it and writes its figures, `verdict.json` and `verdict.md`
    /// into `ctx.dir` (created if missing).
    pub fn run(&self, ctx: &Context) -> Result<Verdict> {
        std::fs::create_dir_all(&ctx.dir).at_file(&ctx.dir)?;
        let verdict = (self.run)(ctx).within(|| format!("reproduction `{}`", self.name))?;
        let json = ctx.dir.join("verdict.json");
        std::fs::write(&json, serde_json::to_string_pretty(&verdict)? + "\n").at_file(&json)?;
        let md = ctx.dir.join("verdict.md");
        std::fs::write(&md, verdict.markdown()).at_file(&md)?;
        Ok(verdict)
    }
}

/// What a real-trace part needs to know about a trace before running it
/// (one pass of `trace stats`): its length, its writes, whether it has
/// timestamps, and its footprint, from which cache sizes are chosen.
pub struct TraceFacts {
    /// Requests replayed (the first ones when capped).
    pub requests: u64,
    /// Requests in the whole trace.
    pub whole_requests: u64,
    pub writes: u64,
    /// Whether records carry real times (ARC's and LBA's number them).
    pub timestamps: bool,
    /// The format's name, for messages.
    pub format: String,
    /// Distinct 4 KiB lines touched by the requests replayed.
    pub footprint_lines: u64,
}

/// A real trace to replay: the whole file, or its first requests, held in
/// memory as DiskSim text (which keeps all the simulator reads of a
/// request: time, volume, its sectors, read or write).
pub struct TraceInput {
    pub path: PathBuf,
    first: Option<Vec<u8>>,
    pub facts: TraceFacts,
}

impl TraceInput {
    /// The trace at `path`, or its first `cap` requests when it has more.
    pub fn open(path: &Path, cap: Option<u64>) -> Result<TraceInput> {
        let open = || TraceReader::open(path, None, ReaderOptions::default()).at_file(path);
        let stats = |reader: &mut TraceReader| {
            iocache_sim::trace_stats::trace_stats(
                reader,
                iocache_core::LineSize::new(4096)?,
                None,
                &mut |_, _| {},
            )
            .at_file(path)
        };
        let mut reader = open()?;
        let (timestamps, format) = (reader.format().has_timestamps(), reader.format().to_string());
        let whole = stats(&mut reader)?;
        let mut input = TraceInput {
            path: path.to_path_buf(),
            first: None,
            facts: TraceFacts {
                requests: whole.requests,
                whole_requests: whole.requests,
                writes: whole.write_requests,
                timestamps,
                format,
                footprint_lines: whole.footprint_lines,
            },
        };
        if let Some(cap) = cap.filter(|&c| c < whole.requests) {
            let mut text = Vec::new();
            for record in open()?.take(cap as usize) {
                let r = iocache_sim::request_of(&record.at_file(path)?);
                let kind = u8::from(r.kind == iocache_core::IoKind::Read);
                writeln!(
                    text,
                    "{} {} {} {} {kind}",
                    r.now_ns,
                    r.volume,
                    r.offset_bytes / 512,
                    r.length_bytes / 512
                )?;
            }
            input.first = Some(text);
            let first = stats(&mut input.reader()?)?;
            input.facts.requests = first.requests;
            input.facts.writes = first.write_requests;
            input.facts.footprint_lines = first.footprint_lines;
        }
        Ok(input)
    }

    /// A reader of the requests replayed.
    pub fn reader(&self) -> Result<TraceReader> {
        match &self.first {
            None => TraceReader::open(&self.path, None, ReaderOptions::default()).at_file(&self.path),
            Some(text) => TraceReader::from_bytes(
                &self.path.display().to_string(),
                text.clone(),
                Some(iocache_trace::TraceFormat::Disksim),
                ReaderOptions::default(),
            )
            .at_file(&self.path),
        }
    }

    /// "N requests", or "the first N of M requests" when capped.
    pub fn describe(&self) -> String {
        if self.facts.requests < self.facts.whole_requests {
            format!(
                "the first {} of {} requests",
                self.facts.requests, self.facts.whole_requests
            )
        } else {
            format!("{} requests", self.facts.requests)
        }
    }
}

/// Mean of a list (0 when empty).
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A capped trace replays exactly what the simulator reads of the
    /// whole trace's first requests, and its facts are those requests'.
    #[test]
    fn a_capped_trace_keeps_its_first_requests() {
        let dir = std::env::temp_dir().join(format!("iocache-capped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.csv");
        std::fs::write(
            &path,
            "128166372003061629,hm,0,Read,7014609920,24576,41286\n\
             128166372016382155,hm,0,Write,1317441536,8192,1963\n\
             128166372026382245,hm,0,Write,3501,100,1000\n\
             128166372036382245,hm,0,Read,7014609920,4096,1000\n",
        )
        .unwrap();
        let whole = TraceInput::open(&path, None).unwrap();
        assert_eq!((whole.facts.requests, whole.facts.whole_requests), (4, 4));
        assert!(whole.facts.timestamps);
        assert_eq!(whole.describe(), "4 requests");
        let first = TraceInput::open(&path, Some(3)).unwrap();
        assert_eq!((first.facts.requests, first.facts.whole_requests), (3, 4));
        assert_eq!(first.facts.writes, 2);
        // 24 KiB not on a 4 KiB boundary (7 lines), 8 KiB (2), one sector (1).
        assert_eq!(first.facts.footprint_lines, 7 + 2 + 1);
        assert_eq!(first.facts.format, "msr", "the trace's own format is named");
        assert_eq!(first.describe(), "the first 3 of 4 requests");
        let requests = |input: &TraceInput| -> Vec<_> {
            input
                .reader()
                .unwrap()
                .map(|r| iocache_sim::request_of(&r.unwrap()))
                .collect()
        };
        assert_eq!(requests(&first), requests(&whole)[..3]);
        // A cap above the length replays the file itself.
        assert_eq!(TraceInput::open(&path, Some(10)).unwrap().facts.requests, 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
