//! ReCA (TPDS'18) §6.3, Fig. 16: the paper chose each category's priority
//! weights by trying positive and negative values of every parameter and
//! keeping the fastest. The built-in category table's weights are ours,
//! chosen from the prose, so this reproduction runs that search: on each
//! category's reference workload (and on the real traces, for the category
//! the classifier gives each), one parameter at a time over a few values,
//! the others held at the table's, in `reca-policies`' setting (SSD over
//! HDD timing, a fifth of the footprint). It reports whether the table's
//! value is the fastest and whether the choice matters at all.

use std::io::Write as _;
use std::path::Path;

use crate::error::{Result, Within};
use iocache_core::reca::{Category, CategoryTable, EvictionRule};
use iocache_report::{Scale, Ticks};
use iocache_trace::{IoKind, ReaderOptions, TraceFormat, TraceReader};

use super::reca_setup::{
    measure, open_trace, whole_trace_category, Config, BACKEND_DEVICE, CACHE_DEVICE, OUTSTANDING,
};
use super::verdict::{Claim, Tally, Verdict};
use super::{axis, chart, gen_reader, series, Context, SAMPLE_TRACES};
use crate::reca_table::REFERENCES;

/// The values a priority weight is tried at (the table's own is added):
/// negative and positive, as §6.3 says.
const WEIGHTS: [f64; 6] = [-2.0, -1.0, 0.0, 1.0, 2.0, 4.0];
const QUICK_WEIGHTS: [f64; 3] = [-1.0, 0.0, 2.0];
/// The values `neighbours` is tried at (a number of lines: never negative).
const NEIGHBOURS: [f64; 5] = [0.0, 2.0, 4.0, 8.0, 16.0];
const QUICK_NEIGHBOURS: [f64; 2] = [0.0, 4.0];
/// The table's value counts as the best when its performance is within
/// this share of the best value's.
const NEAR_BEST: f64 = 0.01;
/// A parameter matters when its best and worst value differ by more than
/// this share.
const SENSITIVE: f64 = 0.05;
/// Requests of a real trace swept at most (its first ones), so that the
/// full run stays around a minute.
const TRACE_CAP: u64 = 100_000;
const QUICK_TRACE_CAP: u64 = 20_000;
/// A weight is swept when the requests it weighs are at least this share
/// of the workload's: below, it acts on the lines of a few requests only,
/// and its flat line would count for the table's value for nothing.
const MIN_SHARE: f64 = 0.01;
const CLASSES: [&str; 3] = ["sequential", "strided", "random"];

/// One parameter of a category's row in the table.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Param {
    Overlapped,
    Access(usize),
    Read(usize),
    Write(usize),
    Neighbours,
}

impl Param {
    fn all() -> Vec<Param> {
        let mut all = vec![Param::Overlapped];
        all.extend((0..3).map(Param::Access));
        all.extend((0..3).map(Param::Read));
        all.extend((0..3).map(Param::Write));
        all.push(Param::Neighbours);
        all
    }

    /// As the table names it.
    fn name(self) -> String {
        match self {
            Param::Overlapped => "overlapped_priority".into(),
            Param::Access(a) => format!("access_priority[{}]", CLASSES[a]),
            Param::Read(a) => format!("read_priority[{}]", CLASSES[a]),
            Param::Write(a) => format!("write_priority[{}]", CLASSES[a]),
            Param::Neighbours => "neighbours".into(),
        }
    }

    fn get(self, c: &Category) -> f64 {
        let p = &c.priorities;
        match self {
            Param::Overlapped => p.overlapped,
            Param::Access(a) => p.access[a],
            Param::Read(a) => p.read[a],
            Param::Write(a) => p.write[a],
            Param::Neighbours => f64::from(c.neighbours),
        }
    }

    fn set(self, c: &mut Category, v: f64) {
        let p = &mut c.priorities;
        match self {
            Param::Overlapped => p.overlapped = v,
            Param::Access(a) => p.access[a] = v,
            Param::Read(a) => p.read[a] = v,
            Param::Write(a) => p.write[a] = v,
            Param::Neighbours => c.neighbours = v as u32,
        }
    }

    /// Why the parameter cannot act (or only on under [`MIN_SHARE`] of the
    /// requests) on a workload whose class shares (in `FEATURE_NAMES`
    /// order) are `shares` under `c`'s eviction rule; `None` when it can.
    fn idle(self, c: &Category, shares: &[f64; 7]) -> Option<String> {
        if self != Param::Neighbours && c.eviction == EvictionRule::Lru {
            return Some("lru eviction reads no priority".into());
        }
        let (share, class) = match self {
            Param::Neighbours => return None,
            Param::Overlapped => (shares[6], "overlapped".to_string()),
            Param::Access(a) => (shares[2 * a] + shares[2 * a + 1], CLASSES[a].to_string()),
            Param::Read(a) => (shares[2 * a], format!("{} read", CLASSES[a])),
            Param::Write(a) => (shares[2 * a + 1], format!("{} write", CLASSES[a])),
        };
        (share < MIN_SHARE).then(|| format!("{:.1} % {class} requests", share * 100.0))
    }

    /// The values tried, the table's `own` among them, ascending.
    fn values(self, own: f64, quick: bool) -> Vec<f64> {
        let base: &[f64] = match (self, quick) {
            (Param::Neighbours, false) => &NEIGHBOURS,
            (Param::Neighbours, true) => &QUICK_NEIGHBOURS,
            (_, false) => &WEIGHTS,
            (_, true) => &QUICK_WEIGHTS,
        };
        let mut values = base.to_vec();
        if !values.contains(&own) {
            values.push(own);
        }
        values.sort_by(f64::total_cmp);
        values
    }
}

/// One parameter tried at several values.
#[derive(Clone, Debug)]
struct Sweep {
    param: Param,
    /// The table's value.
    own: f64,
    /// (value, performance: the table configuration's mean response time
    /// over this value's; above 1 is faster than the table's).
    points: Vec<(f64, f64)>,
}

impl Sweep {
    /// The value with the highest performance (the table's among equals).
    fn best(&self) -> (f64, f64) {
        let top = self.points.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        let tied = |p: &&(f64, f64)| p.1 == top;
        self.points
            .iter()
            .filter(tied)
            .find(|p| p.0 == self.own)
            .or_else(|| self.points.iter().find(tied))
            .copied()
            .unwrap_or((f64::NAN, f64::NAN))
    }

    fn worst(&self) -> f64 {
        self.points.iter().map(|p| p.1).fold(f64::MAX, f64::min)
    }

    /// The table's performance (1 by construction) within [`NEAR_BEST`] of the best.
    fn own_near_best(&self) -> bool {
        let own = self
            .points
            .iter()
            .find(|p| p.0 == self.own)
            .map_or(f64::NAN, |p| p.1);
        own >= self.best().1 * (1.0 - NEAR_BEST)
    }

    /// Best over worst performance.
    fn spread(&self) -> f64 {
        self.best().1 / self.worst()
    }

    fn sensitive(&self) -> bool {
        self.spread() > 1.0 + SENSITIVE
    }

    /// No value tried changes performance by more than [`NEAR_BEST`].
    fn flat(&self) -> bool {
        self.spread() <= 1.0 + NEAR_BEST
    }
}

/// A category's sweeps on one workload.
struct Swept {
    /// The workload (a category's reference workload or a trace).
    workload: String,
    category: Category,
    sweeps: Vec<Sweep>,
    /// Parameters not swept, and why.
    idle: Vec<(Param, String)>,
    own_us: f64,
    cache_bytes: u64,
}

/// Every configuration the sweeps of `category` need on a workload with
/// class shares `shares`: the table's first, then one per parameter and
/// value, each run once.
fn sweep(
    ctx: &Context,
    open: &dyn Fn() -> Result<TraceReader>,
    workload: &str,
    category: &Category,
    shares: &[f64; 7],
) -> Result<Swept> {
    let mut configs = vec![Config::reca(category, None, None)];
    let mut planned = Vec::new();
    let mut idle = Vec::new();
    for param in Param::all() {
        if let Some(why) = param.idle(category, shares) {
            idle.push((param, why));
            continue;
        }
        let own = param.get(category);
        let mut at = Vec::new();
        for v in param.values(own, ctx.quick) {
            let mut changed = category.clone();
            param.set(&mut changed, v);
            let config = Config::reca(&changed, None, None);
            let i = configs.iter().position(|c| *c == config).unwrap_or_else(|| {
                configs.push(config);
                configs.len() - 1
            });
            at.push((v, i));
        }
        planned.push((param, own, at));
    }
    let (m, cache_bytes) = measure(ctx, open, configs)?;
    let own_us = m.mean_us[0];
    let sweeps = planned
        .into_iter()
        .map(|(param, own, at)| Sweep {
            param,
            own,
            points: at.into_iter().map(|(v, i)| (v, own_us / m.mean_us[i])).collect(),
        })
        .collect();
    Ok(Swept {
        workload: workload.to_string(),
        category: category.clone(),
        sweeps,
        idle,
        own_us,
        cache_bytes,
    })
}

/// The first `cap` requests of the trace at `path` as MSR CSV text, for
/// an in-memory reader; `None` when the trace is not longer (it is read
/// as it is).
fn capped(path: &Path, cap: u64) -> Result<Option<Vec<u8>>> {
    if open_trace(path)?.count() as u64 <= cap {
        return Ok(None);
    }
    let mut csv = Vec::new();
    for record in open_trace(path)?.take(cap as usize) {
        let r = record.at_file(path)?;
        let kind = match r.kind {
            IoKind::Read => "Read",
            IoKind::Write => "Write",
        };
        writeln!(
            csv,
            "{},trace,{},{kind},{},{},0",
            r.time_ns / 100,
            r.volume,
            r.offset_bytes,
            r.length_bytes
        )
        .at_file(path)?;
    }
    Ok(Some(csv))
}

fn num(v: f64) -> String {
    format!("{v}")
}

/// A case's line in a claim: the table's value, the best one, the spread.
fn case_line(s: &Swept, w: &Sweep) -> String {
    let (best, perf) = w.best();
    format!(
        "{} {}: table {}, best {} ({:+.2} %), best/worst {:.3}x",
        s.workload,
        w.param.name(),
        num(w.own),
        num(best),
        (perf - 1.0) * 100.0,
        w.spread()
    )
}

/// The parameters of each workload not swept, one line per workload.
fn idle_lines(verdict: &mut Verdict, swept: &[Swept]) {
    for s in swept.iter().filter(|s| !s.idle.is_empty()) {
        // Parameters idle for the same reason (lru eviction) named once.
        let mut what: Vec<(String, &str)> = Vec::new();
        for (p, why) in &s.idle {
            match what.iter_mut().find(|w| w.1 == why) {
                Some(w) => w.0 += &format!(", {}", p.name()),
                None => what.push((p.name(), why)),
            }
        }
        let what: Vec<String> = what
            .into_iter()
            .map(|(names, why)| format!("{names} ({why})"))
            .collect();
        verdict.skipped.push(format!(
            "{} ({}): not swept: {}",
            s.workload,
            s.category.name,
            what.join(", ")
        ));
    }
}

/// The two claims (the table's value near the best; the choice matters)
/// over `swept`.
fn claims(verdict: &mut Verdict, swept: &[Swept], source: &str, scope: &str) {
    let (mut near, mut sensitive, mut flat) = (Tally::default(), Tally::default(), 0);
    let (mut beaten, mut matters, mut bests) = (Vec::new(), Vec::new(), Vec::new());
    for s in swept {
        let moved: Vec<String> = (s.sweeps.iter())
            .filter(|w| w.best().0 != w.own)
            .map(|w| {
                format!(
                    "{} {} ({:+.2} %)",
                    w.param.name(),
                    num(w.best().0),
                    (w.best().1 - 1.0) * 100.0
                )
            })
            .collect();
        if !moved.is_empty() {
            bests.push(format!("{}: {}", s.workload, moved.join(", ")));
        }
        for w in &s.sweeps {
            // A flat case (no value tried makes a difference) says nothing
            // of which value is best: left out of the first claim's count.
            if w.flat() {
                flat += 1;
            } else {
                near.count(w.own_near_best());
            }
            sensitive.count(w.sensitive());
            if !w.own_near_best() {
                beaten.push(case_line(s, w));
            }
            if w.sensitive() {
                matters.push(case_line(s, w));
            }
        }
    }
    if near.cases + flat == 0 {
        return;
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join("; ")
        }
    };
    verdict.push(Claim::new(
        source,
        format!(
            "for each workload category and parameter the selected value performs best ({scope}: the table's value within {:.0} % of the best value tried, \
             counted over every (workload, parameter) case that can act on at least {:.0} % of the requests and where some value tried changes performance \
             by more than {:.0} %)",
            NEAR_BEST * 100.0,
            MIN_SHARE * 100.0,
            NEAR_BEST * 100.0
        ),
        format!(
            "{near} ({flat} more cases left out as flat: no value tried changes performance by more than {:.0} %); clearly beaten: {}. \
             Every best value other than the table's: {}",
            NEAR_BEST * 100.0,
            list(&beaten),
            list(&bests)
        ),
        near.most(),
    ));
    verdict.push(Claim::new(
        source,
        format!(
            "the choice of value matters ({scope}: the best and the worst value tried differ by more than {:.0} % in most (workload, parameter) cases)",
            SENSITIVE * 100.0
        ),
        format!("{sensitive}: {}", list(&matters)),
        sensitive.most(),
    ));
}

/// One chart per workload: performance against a weight's value, a series
/// per weight swept; `neighbours` on a chart of its own (another scale).
fn figures(ctx: &Context, verdict: &mut Verdict, swept: &[Swept], prefix: &str) -> Result<()> {
    let mut neighbours = chart(
        format!("{prefix}: neighbours evicted with a victim, per workload"),
        axis("neighbours", Scale::Linear, Ticks::Number),
        axis(
            "performance / the table's (mean response time)",
            Scale::Linear,
            Ticks::Number,
        ),
    );
    for s in swept {
        let mut weights = chart(
            format!(
                "Fig. 16, {} ({}, {} eviction): one weight varied, the others the table's",
                s.workload,
                s.category.name,
                s.category.eviction.name()
            ),
            axis("the weight's value", Scale::Linear, Ticks::Number),
            axis(
                "performance / the table's (mean response time)",
                Scale::Linear,
                Ticks::Number,
            ),
        );
        for w in &s.sweeps {
            let line = series(w.param.name(), w.points.clone());
            if w.param == Param::Neighbours {
                neighbours
                    .series
                    .push(series(s.workload.clone(), w.points.clone()));
            } else {
                weights.series.push(line);
            }
        }
        if !weights.series.is_empty() {
            let file = format!("{prefix}-{}", s.workload.split('.').next().unwrap_or(&s.workload));
            ctx.figure(verdict, &file, &weights)?;
        }
    }
    if !neighbours.series.is_empty() {
        ctx.figure(verdict, &format!("{prefix}-neighbours"), &neighbours)?;
    }
    Ok(())
}

/// The whole table of sweeps as Markdown (`table.md`).
fn table_rows(swept: &[Swept], paper: bool) -> String {
    let mut out = String::new();
    for s in swept {
        out += &format!(
            "| **{}**{}: {}, {} eviction; the table's values: {:.0} µs, {} MiB cache |  |  |  |  |  |\n",
            s.workload,
            if paper { "" } else { " (not in the paper)" },
            s.category.name,
            s.category.eviction.name(),
            s.own_us,
            s.cache_bytes >> 20
        );
        for w in &s.sweeps {
            let (best, perf) = w.best();
            let at = w
                .points
                .iter()
                .map(|(v, p)| {
                    let cell = format!("{}: {p:.3}", num(*v));
                    if *v == w.own {
                        format!("**{cell}**")
                    } else {
                        cell
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            out += &format!(
                "|  | {} | {} | {at} | {} ({perf:.3}) | {:.3}x |\n",
                w.param.name(),
                num(w.own),
                num(best),
                w.spread()
            );
        }
        for (param, why) in &s.idle {
            out += &format!(
                "|  | {} | {} | not swept: {why} |  |  |\n",
                param.name(),
                num(param.get(&s.category))
            );
        }
    }
    out
}

pub fn run(ctx: &Context) -> Result<Verdict> {
    let mut verdict = Verdict::new(
        "reca-priorities",
        "Salkhordeh, Ebrahimi & Asadi, ReCA (TPDS'18), §6.3 and Fig. 16: the sensitivity of the priority parameters",
    );
    let table = CategoryTable::builtin();
    let weights = if ctx.quick {
        &QUICK_WEIGHTS[..]
    } else {
        &WEIGHTS[..]
    };
    let neighbours = if ctx.quick {
        &QUICK_NEIGHBOURS[..]
    } else {
        &NEIGHBOURS[..]
    };
    let cap = if ctx.quick { QUICK_TRACE_CAP } else { TRACE_CAP };
    verdict.setup.push(format!(
        "per category C: iocache gen examples/workloads/reca-reference/C.toml | iocache sim --trace - --format msr \
         --cache-size (a fifth of the footprint in 4 KiB lines) --cache-device {CACHE_DEVICE} --backend-device {BACKEND_DEVICE} \
         --closed-loop {OUTSTANDING} --warmup 0.5 --fill line, with C's line size and write policy and --policy reca:... as C's row \
         of data/reca-categories.toml sets it, then with one parameter changed at a time: each priority weight that can act \
         to {} and the table's value, neighbours to {} and the table's value; performance = the table configuration's mean \
         response time over the changed one's",
        weights.iter().map(|v| num(*v)).collect::<Vec<_>>().join(", "),
        neighbours.iter().map(|v| num(*v)).collect::<Vec<_>>().join(", "),
    ));
    verdict.setup.push(format!(
        "per real trace T: its first {cap} requests (an in-memory MSR CSV of them when T is longer, without the process ids \
         some formats carry), classified as one window (iocache trace stats T --reca --reca-window (its length)), and the same \
         sweep for that category, in the same setting"
    ));
    let mut swept = Vec::new();
    for (name, text) in REFERENCES {
        let (category, spec) = super::reca_setup::reference(&table, name, text, ctx.quick)?;
        let open = || gen_reader(&spec);
        let (seen, _) = whole_trace_category(&open, &table, name)?;
        swept.push(sweep(ctx, &open, name, category, &seen.features)?);
    }
    figures(ctx, &mut verdict, &swept, "reca-fig16")?;
    claims(
        &mut verdict,
        &swept,
        "Fig. 16, §6.3",
        "on each category's reference workload",
    );
    idle_lines(&mut verdict, &swept);

    // The same search on the real traces, for the category of each.
    let traces = if ctx.quick {
        &SAMPLE_TRACES[2..4]
    } else {
        &SAMPLE_TRACES[..]
    };
    let mut real = Vec::new();
    for name in traces {
        let Some(path) = ctx.trace(name, &mut verdict, "Fig. 16 on a real trace") else {
            continue;
        };
        let csv = capped(&path, cap)?;
        let open = || match &csv {
            Some(csv) => Ok(TraceReader::from_bytes(
                name,
                csv.clone(),
                Some(TraceFormat::Msr),
                ReaderOptions::default(),
            )?),
            None => open_trace(&path),
        };
        let (seen, category) = whole_trace_category(&open, &table, name)?;
        let label = if csv.is_some() {
            format!("{name} (first {cap})")
        } else {
            name.to_string()
        };
        real.push(sweep(ctx, &open, &label, category, &seen.features)?);
    }
    if !real.is_empty() {
        figures(ctx, &mut verdict, &real, "reca-fig16-trace")?;
        idle_lines(&mut verdict, &real);
        claims(
            &mut verdict,
            &real,
            "Fig. 16, on the real traces at hand (not in the paper)",
            "on each real trace, for the category the classifier gives the whole trace",
        );
    }
    let md = ctx.dir.join("table.md");
    let text = format!(
        "# reca-priorities: every sweep\n\nPerformance is the table configuration's mean response time over the changed \
         configuration's (above 1: faster than the table's); the table's value in bold.\n\n\
         | workload | parameter | the table's value | performance at each value | best value | best / worst |\n\
         |---|---|---:|---|---|---:|\n{}{}",
        table_rows(&swept, true),
        table_rows(&real, false)
    );
    std::fs::write(&md, text).at_file(&md)?;
    verdict.skipped.push(
        "the paper's Fig. 16 values (its text gives none) and its absolute response times (filebench on its own HDD/SSD pair) are not compared".into(),
    );
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep_of(points: &[(f64, f64)], own: f64) -> Sweep {
        Sweep {
            param: Param::Access(2),
            own,
            points: points.to_vec(),
        }
    }

    #[test]
    fn the_tables_value_wins_ties_and_counts_within_one_percent() {
        let flat = sweep_of(&[(-1.0, 1.0), (0.0, 1.0), (1.0, 1.0)], 1.0);
        assert_eq!(flat.best(), (1.0, 1.0));
        assert!(flat.own_near_best() && !flat.sensitive());
        let close = sweep_of(&[(0.0, 1.009), (1.0, 1.0), (2.0, 0.9)], 1.0);
        assert_eq!(close.best(), (0.0, 1.009));
        assert!(close.own_near_best() && close.sensitive());
        let beaten = sweep_of(&[(0.0, 1.02), (1.0, 1.0), (2.0, 1.0)], 1.0);
        assert!(!beaten.own_near_best() && !beaten.sensitive());
    }

    /// A flat case (no value tried matters) is left out of "the table's
    /// value performs best", which it would hold for nothing.
    #[test]
    fn flat_cases_do_not_count_for_the_tables_value() {
        let table = CategoryTable::builtin();
        let swept = Swept {
            workload: "w".into(),
            category: table.categories[0].clone(),
            sweeps: vec![
                sweep_of(&[(-1.0, 1.0), (0.0, 1.0), (1.0, 1.0)], 1.0),
                sweep_of(&[(-1.0, 1.0), (0.0, 1.004), (1.0, 1.0)], 1.0),
                sweep_of(&[(0.0, 1.02), (1.0, 1.0), (2.0, 0.9)], 1.0),
            ],
            idle: Vec::new(),
            own_us: 1.0,
            cache_bytes: 1,
        };
        let mut verdict = Verdict::new("t", "t");
        claims(&mut verdict, &[swept], "Fig. 16", "reference");
        let best = &verdict.claims[0];
        assert!(
            best.ours.starts_with("0 of 1 (2 more cases left out as flat"),
            "{}",
            best.ours
        );
        assert_eq!(best.outcome, crate::reproduce::verdict::Outcome::Not);
        assert!(
            verdict.claims[1].ours.starts_with("1 of 3"),
            "{}",
            verdict.claims[1].ours
        );
    }

    #[test]
    fn every_category_sweeps_what_can_act_and_keeps_its_own_value() {
        let table = CategoryTable::builtin();
        let all = [0.1; 7];
        for c in &table.categories {
            for p in Param::all() {
                let values = p.values(p.get(c), false);
                assert!(values.contains(&p.get(c)), "{} {}", c.name, p.name());
                let idle = p.idle(c, &all);
                assert_eq!(
                    idle.is_some(),
                    c.eviction == EvictionRule::Lru && p != Param::Neighbours,
                    "{} {}",
                    c.name,
                    p.name()
                );
                // The changed configuration is a policy the core accepts.
                for v in values {
                    let mut changed = c.clone();
                    p.set(&mut changed, v);
                    assert_eq!(p.get(&changed), v);
                    let _ = changed.policy_spec(None);
                }
            }
        }
        let reads_only = [0.5, 0.0, 0.495, 0.0, 0.005, 0.0, 0.0];
        let c = &table.categories[table.find("archival_consumers").unwrap()];
        assert!(Param::Write(0).idle(c, &reads_only).is_some());
        assert!(Param::Overlapped.idle(c, &reads_only).is_some());
        assert!(Param::Access(2).idle(c, &reads_only).is_some());
        assert!(Param::Read(1).idle(c, &reads_only).is_none());
    }
}
