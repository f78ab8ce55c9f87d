//! ReCA's (TPDS'18) Fig. 18, the hit ratio *with*
//! and *without* reconfiguration when the workload changes category (a
//! sequential producer/consumer, then a random producer/consumer), is the
//! one experiment of that paper about reconfiguring online; `lab reproduce
//! reca` runs it in the simulator on the generated phase workload of
//! `examples/workloads/reca-phases.toml` (the phase workload).
//!
//! "Without reconfiguration" is ReCA held to the first phase's category (a
//! table with only `sequential_producer_consumers`: configured for the
//! first workload, as the paper's static cache); "with" is ReCA with its
//! whole table. Both start from LRU with 4 KiB lines and report every
//! window's hit ratio.

use crate::error::{invalid, Result};
use iocache_core::reca::{CategoryTable, RecaControllerParams};
use iocache_core::{LineSize, PolicySpec};
use iocache_report::{Chart, Scale, Ticks};
use iocache_sim::reca::{RecaOptions, RecaRun};
use iocache_sim::{combinations, CacheSettings, CacheSize, SimOptions};

use super::verdict::{Check, Claim, Verdict};
use super::{axis, mean, series, workload, Context};

/// The phase workload: 50,000 sequential producer/consumer requests, then
/// 50,000 random producer/consumer requests.
const WORKLOAD: &str = include_str!("../../../../examples/workloads/reca-phases.toml");
const CHANGE_AT_REQUEST: u64 = 50_000;
const WINDOW_REQUESTS: u64 = 10_000;
const CACHE: &str = "64MiB";
/// The first phase's category: the configuration "without reconfiguration".
const FIRST: &str = "sequential_producer_consumers";
/// The second phase's category.
const SECOND: &str = "random_producer_consumers";
/// The paper: "cache reaches its optimal state in less than five minutes";
/// here, the category must change within this many windows of the change.
const WINDOWS_TO_SETTLE: u64 = 2;

fn run_with(ctx: &Context, table: CategoryTable) -> Result<RecaRun> {
    let spec = workload(WORKLOAD)?;
    let specs = combinations(
        &[PolicySpec::lru()],
        &[CACHE.parse::<CacheSize>()?],
        &[LineSize::new(4096)?],
        &CacheSettings::default(),
    )?;
    let options = SimOptions {
        reca: Some(RecaOptions {
            table,
            params: RecaControllerParams {
                window_requests: WINDOW_REQUESTS,
                ..RecaControllerParams::default()
            },
        }),
        ..SimOptions::default()
    };
    let report = ctx.simulate_gen(&spec, &specs, options)?;
    let run = report.runs.into_iter().next().and_then(|r| r.reca);
    run.ok_or_else(|| invalid!("the ReCA run reported no windows"))
}

pub fn run(ctx: &Context) -> Result<Verdict> {
    let mut verdict = Verdict::new(
        "reca",
        "Salkhordeh, Ebrahimi & Asadi, ReCA (TPDS'18), Fig. 18: hit ratio with and without reconfiguration",
    );
    let full = CategoryTable::builtin();
    let mut held = full.clone();
    held.categories.retain(|c| c.name == FIRST);
    let with = run_with(ctx, full)?;
    let without = run_with(ctx, held)?;
    verdict.setup.push(format!(
        "iocache gen examples/workloads/reca-phases.toml | iocache sim --trace - --format msr --cache-size {CACHE} \
         --policy lru --line-size 4KiB --adapt reca --reca-window {WINDOW_REQUESTS} (and with --reca-table holding \
         only {FIRST}, for \"without\")"
    ));
    verdict.setup.push(format!(
        "the workload changes category at request {CHANGE_AT_REQUEST}; windows of {WINDOW_REQUESTS} requests"
    ));

    let points = |run: &RecaRun| -> Vec<(f64, f64)> {
        run.windows
            .iter()
            .map(|w| (w.requests as f64, w.hit_ratio))
            .collect()
    };
    let chart = Chart {
        title: "Fig. 18: hit ratio with and without reconfiguration (category change at request 50,000)"
            .into(),
        x: axis("requests", Scale::Linear, Ticks::Number),
        y: axis("hit ratio per window", Scale::Linear, Ticks::Percent),
        series: vec![
            series("with reconfiguration (ReCA)", points(&with)),
            series(format!("without (held to {FIRST})"), points(&without)),
        ],
    };
    ctx.figure(&mut verdict, "reca-fig18-hit-ratio", &chart)?;

    // 1. The new category is recognised soon after the change.
    let switched_at = with
        .windows
        .iter()
        .find(|w| w.requests > CHANGE_AT_REQUEST && w.category == SECOND)
        .map(|w| w.requests);
    let within = switched_at.is_some_and(|r| r <= CHANGE_AT_REQUEST + WINDOWS_TO_SETTLE * WINDOW_REQUESTS);
    verdict.push(Claim::new(
        "§6.5",
        format!(
            "after the change the cache reaches its new configuration quickly (\"less than five minutes\"; here: \
             {SECOND} chosen within {WINDOWS_TO_SETTLE} windows)"
        ),
        match switched_at {
            Some(r) => format!("{SECOND} chosen at the end of the window ending at request {r}"),
            None => format!("{SECOND} never chosen"),
        },
        Check::Share {
            held: usize::from(within),
            cases: 1,
            most: 1.0,
            some: 1.0,
        },
    ));

    // 2. After the change, reconfiguring beats the configuration tuned
    // for the first workload, window by window (the windows served with
    // the new category's configuration).
    let after = |run: &RecaRun| -> Vec<f64> {
        run.windows
            .iter()
            .filter(|w| w.requests > CHANGE_AT_REQUEST + WINDOW_REQUESTS)
            .map(|w| w.hit_ratio)
            .collect()
    };
    let (a, b) = (after(&with), after(&without));
    let better = a.iter().zip(&b).filter(|(x, y)| x > y).count();
    verdict.push(Claim::new(
        "§6.5, Fig. 18",
        "after the change the static configuration tuned for the first workload is inefficient: the \
         reconfigured cache's hit ratio is higher",
        format!(
            "higher in {better} of {} windows after the first one of the new phase; mean {:.1} % against {:.1} %",
            a.len().min(b.len()),
            mean(&a) * 100.0,
            mean(&b) * 100.0
        ),
        Check::Share {
            held: better,
            cases: a.len().min(b.len()),
            most: 0.75,
            some: 0.25,
        },
    ));

    // 3. Reconfiguring costs little: no window with reconfiguration falls
    // more than a point below the one without.
    let close = with
        .windows
        .iter()
        .zip(&without.windows)
        .filter(|(x, y)| x.hit_ratio + 0.01 >= y.hit_ratio)
        .count();
    verdict.push(Claim::new(
        "§6.5",
        "the performance overhead of reconfiguring is very small",
        format!(
            "{close} of {} windows with reconfiguration within a point of (or above) the one without; {} rebuilds \
             moved {:.1} MiB, wrote back {:.1} MiB, dropped {:.1} MiB clean",
            with.windows.len().min(without.windows.len()),
            with.relayouts,
            with.moved_bytes as f64 / (1 << 20) as f64,
            with.written_back_bytes as f64 / (1 << 20) as f64,
            with.dropped_clean_bytes as f64 / (1 << 20) as f64
        ),
        Check::Share {
            held: close,
            cases: with.windows.len().min(without.windows.len()),
            most: 1.0,
            some: 0.75,
        },
    ));
    Ok(verdict)
}
