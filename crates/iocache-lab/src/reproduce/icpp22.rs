//! ICPP'22 (Req-block, an SSD's internal DRAM write
//! buffer managed by request blocks) claims more hits, fewer flash writes
//! and lower response time than LRU, BPLRU and VBBMS, evictions sized
//! between VBBMS's and BPLRU's (Figs. 8-11), and δ = 5 as the best size
//! limit (Fig. 7). This reproduction runs the four policies in
//! write-buffer mode (`wo`, 4 KiB lines = flash pages) on the trace samples
//! and on generated workloads with Table 2's write ratios and mean write
//! sizes, with the `flash` timing preset (Table 1's SSDsim settings) as
//! the backend, and compares averages as the paper does. Figs. 2-3, 12
//! and 13 are measured page by page (`icpp22_pages.rs`).

use std::collections::BTreeMap;

use crate::error::Result;
use iocache_core::units::format_byte_size;
use iocache_core::{LineSize, PolicySpec, WritePolicy};
use iocache_report::{Scale, Ticks};
use iocache_sim::timing::{preset, ArrivalMode};
use iocache_sim::{CacheSettings, CacheSize, RunResult, RunSpec, SimOptions, SimReport, TimingSetup};

use super::icpp22_pages::{page_run, push_claims};
use super::verdict::{Check, Claim, Tally, Tolerance, Verdict};
use super::{axis, chart, gen_reader, mean, series, workload, Context};
use crate::error::Within;
use iocache_trace::{ReaderOptions, TraceReader};

const POLICIES: [&str; 4] = ["reqblock", "lru", "bplru", "vbbms"];
const SAMPLES: [&str; 6] = [
    "msr-hm0-sample.csv",
    "systor17-sample.csv.gz",
    "tencent-cbs-sample.csv.bz2",
    "tpcc-small.disksim",
    "wsrch-small.disksim",
    "cloudphysics-w106-sample.csv",
];
/// Table 2: name, write ratio (%), mean write size (KB).
const MIXES: [(&str, f64, f64); 4] = [
    ("usr_0-like", 59.6, 10.3),
    ("src1_2-like", 74.6, 32.5),
    ("ts_0-like", 82.4, 8.0),
    ("proj_0-like", 87.5, 40.9),
];
const DELTAS: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
/// The small requests' sizes (mean 6.8 KiB) and the large ones'.
const SMALL_SIZES: &str = "4KiB:60,8KiB:25,16KiB:15";
const SMALL_MEAN_KIB: f64 = 6.8;
const LARGE_KIB: f64 = 64.0;
const OUTSTANDING: u32 = 8;

/// Hit ratios below this (1 %) are a handful of hits on the short
/// samples: relative changes of them are noise, so they are left out.
const HIT_FLOOR: f64 = 0.01;

/// One workload of Fig. 7's "δ = 5 gives the best hit ratio".
#[derive(Debug, PartialEq)]
enum DeltaCase {
    /// δ matters: whether δ = 5 is within 1 % of the best δ.
    Counted(bool),
    /// The best hit ratio is under [`HIT_FLOOR`]: a handful of hits, as
    /// Fig. 9 leaves out.
    FewHits,
    /// Every δ tried gives hit ratios within 1 % of each other: δ = 5
    /// would hold for nothing.
    Flat,
}

/// Fig. 7's rule for one workload, from the hit ratio at each δ tried and
/// at δ = 5.
fn delta_case(hit_ratios: &[f64], at_five: f64) -> DeltaCase {
    let best = hit_ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let worst = hit_ratios.iter().copied().fold(f64::INFINITY, f64::min);
    if best < HIT_FLOOR {
        DeltaCase::FewHits
    } else if best <= worst * 1.01 {
        DeltaCase::Flat
    } else {
        DeltaCase::Counted(at_five >= best * 0.99)
    }
}

/// One number of a run, compared between the policies.
type Metric = fn(&RunResult) -> f64;

/// A mean relative change, over every case and over the generated ones.
struct Relative {
    mean: f64,
    n: usize,
    generated: f64,
    n_generated: usize,
}

impl Relative {
    /// The check of the mean against the paper's `paper` %, within a
    /// factor of 2 or `points` points.
    fn against(&self, paper: f64, points: f64) -> Check {
        Check::effect(paper, self.mean, 0.0, 0.1, Tolerance::either(2.0, points))
    }

    fn text(&self, word: &str) -> String {
        let samples = self.n - self.n_generated;
        format!(
            "{:+.2} % {word} on average over {} cases (generated workloads: {:+.2} % over {}; samples: {} case{})",
            self.mean,
            self.n,
            self.generated,
            self.n_generated,
            samples,
            if samples == 1 { "" } else { "s" }
        )
    }
}

/// One workload's results: by (policy as given, cache lines).
struct Results {
    name: String,
    runs: BTreeMap<(String, u64), RunResult>,
}

impl Results {
    fn new(name: &str, report: SimReport) -> Results {
        Results {
            name: name.into(),
            runs: report
                .runs
                .into_iter()
                .map(|r| ((r.spec.policy.to_string(), r.spec.capacity_lines), r))
                .collect(),
        }
    }
    fn get(&self, policy: &str, lines: u64) -> Option<&RunResult> {
        self.runs.get(&(policy.to_string(), lines))
    }
}

/// A generated workload in the spirit of one Table 2 trace: small
/// requests (Zipf over the first fifth of the volume, where re-access is
/// likely) alternate with runs of large sequential ones over the rest, in
/// a share that gives the trace's mean write size, reads and writes mixed
/// at its write ratio.
fn mix_spec(write_pct: f64, mean_kb: f64, requests: u64) -> String {
    let large = ((mean_kb - SMALL_MEAN_KIB) / (LARGE_KIB - SMALL_MEAN_KIB)).clamp(0.0, 1.0);
    let rounds = 40;
    let per_round = requests / rounds;
    let n_large = ((per_round as f64 * large).round() as u64).max(1);
    let n_small = per_round.saturating_sub(n_large).max(1);
    let read = 100.0 - write_pct;
    let mut text = String::from("seed = 22\nvolume_size = \"8GiB\"\nblock_size = \"4KiB\"\n");
    for _ in 0..rounds {
        text += &format!(
            "[[phase]]\nrequests = {n_small}\nread_percent = {read}\ndistribution = \"zipf:1.0\"\n\
             sizes = \"{SMALL_SIZES}\"\nrange = \"0-20\"\n\
             [[phase]]\nrequests = {n_large}\nread_percent = {read}\ndistribution = \"sequential\"\n\
             sizes = \"64KiB\"\nstreams = 4\nrange = \"20-100\"\n"
        );
    }
    text
}

pub fn run(ctx: &Context) -> Result<Verdict> {
    let mut verdict = Verdict::new(
        "icpp22",
        "Req-block: request-granularity SSD DRAM cache management (ICPP'22), Figs. 2-3 and 7-13",
    );
    let requests: u64 = if ctx.quick { 20_000 } else { 400_000 };
    let mut policies: Vec<String> = POLICIES.iter().map(|p| p.to_string()).collect();
    policies.extend(DELTAS.iter().map(|d| format!("reqblock:delta={d}")));
    let settings = CacheSettings {
        write_policy: WritePolicy::WriteOnly,
        ..CacheSettings::default()
    };
    let page = LineSize::new(4096)?;
    let specs_for = |sizes: &[u64]| -> Result<Vec<RunSpec>> {
        let mut specs = Vec::new();
        for p in &policies {
            for &lines in sizes {
                specs.push(RunSpec {
                    policy: p.parse::<PolicySpec>()?,
                    size: CacheSize::Lines(lines),
                    capacity_lines: lines,
                    line_size: page,
                    settings: settings.clone(),
                });
            }
        }
        Ok(specs)
    };
    let options = || SimOptions {
        timing: Some(TimingSetup {
            cache: preset("ramdisk").expect("a preset"),
            backend: preset("flash").expect("a preset"),
            arrivals: ArrivalMode::Closed {
                outstanding: OUTSTANDING,
            },
            series_interval_ns: None,
        }),
        ..SimOptions::default()
    };
    // The paper's 16 and 32 MiB buffers; for the short samples 0.5 and 4 MiB.
    let gen_sizes: Vec<u64> = if ctx.quick { vec![1024] } else { vec![4096, 8192] };
    let sample_sizes: Vec<u64> = vec![128, 1024];
    let mut all: Vec<(Results, Vec<u64>)> = Vec::new();
    for (name, write_pct, mean_kb) in MIXES {
        let spec = workload(&mix_spec(write_pct, mean_kb, requests))?;
        let report = ctx.simulate_gen(&spec, &specs_for(&gen_sizes)?, options())?;
        all.push((Results::new(name, report), gen_sizes.clone()));
    }
    let samples: &[&str] = if ctx.quick { &SAMPLES[..2] } else { &SAMPLES };
    let mut sample_paths = Vec::new();
    for file in samples {
        if let Some(path) = ctx.trace(file, &mut verdict, &format!("sample {file}")) {
            let report = ctx.simulate_file(&path, &specs_for(&sample_sizes)?, options())?;
            all.push((Results::new(file, report), sample_sizes.clone()));
            sample_paths.push((file, path));
        }
    }
    verdict.setup.push(format!(
        "generated workloads ({requests} requests each, 8 GiB volume): small requests ({SMALL_SIZES}, Zipf 1.0 over the first 20 %) alternate in 40 rounds with sequential 64 KiB requests (4 streams over the rest), in the share that gives each Table 2 trace's mean write size, at its write ratio: {}",
        MIXES.iter().map(|(n, w, s)| format!("{n} {w} % writes, {s} KB")).collect::<Vec<_>>().join("; ")
    ));
    verdict.setup.push(format!(
        "iocache sim --trace T --policy reqblock,lru,bplru,vbbms,reqblock:delta=1..8 --cache-size {} (generated) / {} (samples) --line-size 4KiB --write-policy wo --cache-device ramdisk --backend-device flash --closed-loop {OUTSTANDING}",
        gen_sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
        sample_sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
    ));
    verdict.setup.push(
        "flash page writes count the dirty pages written back during the run and those still buffered at its end (writes still to come); before, only the pages written back during the run were counted"
            .into(),
    );
    verdict.setup.push(
        "cases are (workload, cache size) pairs where Req-block evicted at least once; averages are over those cases, as the paper averages over traces; for hit ratios, only cases where the other policy's hit ratio is at least 1 % (below that, a relative change is a handful of hits)"
            .into(),
    );

    // The cases that say something: Req-block had to evict.
    let cases: Vec<(&Results, u64)> = all
        .iter()
        .flat_map(|(r, sizes)| sizes.iter().map(move |&s| (r, s)))
        .filter(|(r, s)| r.get("reqblock", *s).is_some_and(|x| x.stats.evictions > 0))
        .collect();
    let hit = |r: &RunResult| r.stats.hit_ratio();
    // Flash page writes: dirty pages written back during the run, and the
    // dirty pages still buffered at its end (each is a flash write still
    // to come, so a policy that holds more back is not counted as writing
    // less).
    let writes = |r: &RunResult| (r.stats.dirty_writebacks + r.dirty_lines_at_end) as f64;
    let resp = |r: &RunResult| r.timing.as_ref().map_or(f64::NAN, |t| t.all.mean_ns);
    // Mean relative change of Req-block against `other` (percent; `more`:
    // improvement means higher), over the cases where `other`'s value is
    // at least `floor`: all, the generated workloads, the samples.
    let relative = |other: &str, metric: &dyn Fn(&RunResult) -> f64, more: bool, floor: f64| -> Relative {
        let mut all = Vec::new();
        let mut generated = Vec::new();
        for (r, s) in &cases {
            let (Some(a), Some(b)) = (r.get("reqblock", *s), r.get(other, *s)) else {
                continue;
            };
            let (a, b) = (metric(a), metric(b));
            if b > 0.0 && b >= floor && a.is_finite() && b.is_finite() {
                let v = if more {
                    (a / b - 1.0) * 100.0
                } else {
                    (1.0 - a / b) * 100.0
                };
                all.push(v);
                if r.name.ends_with("-like") {
                    generated.push(v);
                }
            }
        }
        Relative {
            mean: mean(&all),
            n: all.len(),
            generated: mean(&generated),
            n_generated: generated.len(),
        }
    };
    for (other, paper) in [("lru", 42.9), ("bplru", 23.6), ("vbbms", 4.1)] {
        let rel = relative(other, &hit, true, HIT_FLOOR);
        verdict.push(Claim::new(
            "Fig. 9",
            format!(
                "Req-block's hit ratio is {paper} % higher than {} on average",
                other.to_uppercase()
            ),
            rel.text("higher"),
            rel.against(paper, 3.0),
        ));
    }
    let mut between = Tally::default();
    for (r, s) in &cases {
        let ppe = |p: &str| {
            r.get(p, *s)
                .map_or(f64::NAN, |x| x.stats.lines_per_eviction_batch())
        };
        between.count(ppe("vbbms") < ppe("reqblock") && ppe("reqblock") < ppe("bplru"));
    }
    verdict.push(Claim::new(
        "Fig. 10",
        "Req-block evicts more pages per eviction than VBBMS and fewer than BPLRU",
        format!("VBBMS < Req-block < BPLRU in {between} cases"),
        between.most(),
    ));
    for (other, paper) in [("lru", 8.6), ("bplru", 4.3), ("vbbms", 1.1)] {
        let rel = relative(other, &writes, false, 0.0);
        verdict.push(Claim::new(
            "Fig. 11",
            format!(
                "Req-block writes {paper} % fewer pages to flash than {} on average",
                other.to_uppercase()
            ),
            rel.text("fewer"),
            rel.against(paper, 3.0),
        ));
    }
    for (other, paper) in [("lru", 23.8), ("bplru", 11.3), ("vbbms", 7.7)] {
        let rel = relative(other, &resp, false, 0.0);
        verdict.push(Claim::new(
            "Fig. 8",
            format!(
                "Req-block's mean response time is {paper} % lower than {}'s",
                other.to_uppercase()
            ),
            format!(
                "{} (timing model, closed loop of {OUTSTANDING})",
                rel.text("lower")
            ),
            rel.against(paper, 5.0),
        ));
    }
    // Fig. 7: δ = 5 best or within 1 % of the best δ, over the workloads
    // where δ matters (see `delta_case`).
    let mut near_best = Tally::default();
    let mut best_deltas = Vec::new();
    let mut left_out = Vec::new();
    let delta_size = *gen_sizes.last().expect("a size");
    let mut fig7 = chart(
        format!(
            "Fig. 7: hit ratio against δ, normalised to δ = 1 ({} buffer; samples {})",
            format_byte_size(delta_size * 4096),
            format_byte_size(sample_sizes.last().expect("a size") * 4096)
        ),
        axis("δ (pages)", Scale::Linear, Ticks::Number),
        axis("hit ratio / hit ratio at δ = 1", Scale::Linear, Ticks::Number),
    );
    for (r, sizes) in &all {
        let s = *sizes.last().expect("a size");
        let h = |d: u32| r.get(&format!("reqblock:delta={d}"), s).map_or(f64::NAN, hit);
        if r.get("reqblock", s).is_none_or(|x| x.stats.evictions == 0) || h(1) <= 0.0 {
            continue;
        }
        let ratios: Vec<f64> = DELTAS.iter().map(|&d| h(d)).collect();
        let best = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let best_d = DELTAS.iter().copied().find(|&d| h(d) == best).unwrap_or(0);
        match delta_case(&ratios, h(5)) {
            DeltaCase::Counted(held) => {
                best_deltas.push(format!("{}: δ={best_d}", r.name));
                near_best.count(held);
            }
            DeltaCase::FewHits => {
                left_out.push(format!("{} (hit ratio under {:.0} %)", r.name, HIT_FLOOR * 100.0))
            }
            DeltaCase::Flat => left_out.push(format!("{} (every δ within 1 %)", r.name)),
        }
        fig7.series.push(series(
            r.name.clone(),
            DELTAS.iter().map(|&d| (d as f64, h(d) / h(1))).collect(),
        ));
    }
    verdict.push(Claim::new(
        "Fig. 7",
        "δ = 5 gives the best hit ratio for most workloads",
        format!(
            "δ = 5 within 1 % of the best δ in {near_best} workloads where δ matters (best: {}); left out: {}",
            best_deltas.join(", "),
            if left_out.is_empty() { "none".to_string() } else { left_out.join(", ") }
        ),
        near_best.most(),
    ));
    ctx.figure(&mut verdict, "icpp22-fig7-delta", &fig7)?;

    // Figs. 9-11 as one chart each: x = case number (listed in the setup).
    let mut names = Vec::new();
    for (i, (r, s)) in cases.iter().enumerate() {
        names.push(format!("{}: {} ({})", i + 1, r.name, format_byte_size(s * 4096)));
    }
    verdict
        .setup
        .push(format!("cases in the figures: {}", names.join("; ")));
    let metric_chart = |title: &str, y: iocache_report::Axis, metric: &dyn Fn(&RunResult) -> f64| {
        let mut chart = chart(
            title,
            axis("case (see the list)", Scale::Linear, Ticks::Number),
            y,
        );
        for p in POLICIES {
            chart.series.push(series(
                p,
                cases
                    .iter()
                    .enumerate()
                    .map(|(i, (r, s))| ((i + 1) as f64, r.get(p, *s).map_or(f64::NAN, metric)))
                    .collect(),
            ));
        }
        chart
    };
    let ppe = |r: &RunResult| r.stats.lines_per_eviction_batch();
    let charts: [(&str, &str, &str, Scale, Ticks, Metric); 4] = [
        (
            "icpp22-fig9-hit-ratio",
            "Fig. 9: hit ratio",
            "hit ratio",
            Scale::Linear,
            Ticks::Percent,
            hit,
        ),
        (
            "icpp22-fig10-pages-per-eviction",
            "Fig. 10: pages per eviction",
            "pages per eviction",
            Scale::Log,
            Ticks::Number,
            ppe,
        ),
        (
            "icpp22-fig11-flash-writes",
            "Fig. 11: flash page writes",
            "pages written to flash",
            Scale::Log,
            Ticks::Number,
            writes,
        ),
        (
            "icpp22-fig8-response-time",
            "Fig. 8: mean response time",
            "mean response time",
            Scale::Log,
            Ticks::Nanoseconds,
            resp,
        ),
    ];
    for (name, title, label, scale, ticks, metric) in charts {
        let chart = metric_chart(title, axis(label, scale, ticks), &metric);
        ctx.figure(&mut verdict, name, &chart)?;
    }

    // Figs. 2-3, 12-13, page by page: the paper's 16 MiB buffer (and 32
    // and 64 MiB for Fig. 12) on the generated workloads, the samples'
    // sizes on the samples.
    let (gen_pages, gen_fig12): (u64, Vec<u64>) = if ctx.quick {
        (1024, vec![1024, 2048])
    } else {
        (4096, vec![4096, 8192, 16384])
    };
    let mut pages = Vec::new();
    for (name, write_pct, mean_kb) in MIXES {
        let spec = workload(&mix_spec(write_pct, mean_kb, requests))?;
        pages.push(page_run(name, &mut gen_reader(&spec)?, gen_pages, &gen_fig12)?);
    }
    for (file, path) in &sample_paths {
        let mut reader = TraceReader::open(path, None, ReaderOptions::default()).at_file(path)?;
        pages.push(
            page_run(
                file,
                &mut reader,
                *sample_sizes.last().expect("a size"),
                &sample_sizes,
            )
            .at_file(path)?,
        );
    }
    push_claims(
        ctx,
        &mut verdict,
        &pages,
        gen_pages,
        *sample_sizes.last().expect("a size"),
    )?;
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workload where δ changes nothing, or with a handful of hits, is
    /// not a case of δ = 5 being best.
    #[test]
    fn flat_and_hitless_workloads_are_left_out() {
        assert_eq!(delta_case(&[0.3, 0.301, 0.302], 0.301), DeltaCase::Flat);
        assert_eq!(delta_case(&[0.002, 0.004, 0.003], 0.003), DeltaCase::FewHits);
        assert_eq!(delta_case(&[0.3, 0.4, 0.35], 0.399), DeltaCase::Counted(true));
        assert_eq!(delta_case(&[0.3, 0.4, 0.35], 0.35), DeltaCase::Counted(false));
    }
}
