//! ICPP'22's motivation and overhead figures, measured page by page: which
//! write request put each buffered page there (Figs. 2-3), the policies'
//! list nodes as a share of the buffer (Fig. 12) and the pages on
//! Req-block's three lists over time (Fig. 13). The simulator reports
//! totals only, so this drives the policy core request by request.

use std::collections::BTreeMap;

use iocache_core::fasthash::FxHashMap;
use iocache_core::units::format_byte_size;
use iocache_core::{
    split_request_keys, AccessHints, Cache, CacheConfig, IoKind, LineKey, LineSize, WritePolicy,
};
use iocache_report::{Chart, Scale, Ticks};
use iocache_trace::TraceReader;

use super::verdict::{Check, Claim, Tolerance, Verdict};
use super::{axis, mean, series, Context};
use crate::error::Result;

/// The paper's list node sizes (§4.2.5): a page for LRU, a block for
/// BPLRU and VBBMS (a virtual block takes a block's node), a request block
/// for Req-block; and the gauge of our policy that counts those nodes
/// (`resident` for LRU: its nodes are the cached pages).
const NODES: [(&str, &str, u64); 4] = [
    ("lru", "resident", 12),
    ("bplru", "blocks", 24),
    ("vbbms", "virtual_blocks", 24),
    ("reqblock", "request_blocks", 32),
];
/// Fig. 12's average overheads (% of the cache), in `NODES` order.
const PAPER_OVERHEAD: [f64; 4] = [0.29, 0.32, 0.53, 0.41];
/// How often the lists and nodes are sampled (Fig. 13's interval).
const SAMPLE_EVERY: u64 = 10_000;
/// Workloads drawn in Fig. 13 (three lines each).
const FIG13_WORKLOADS: usize = 2;

/// One workload, read once for every cache this file drives.
pub(super) struct PageRun {
    pub name: String,
    /// Mean size of all its requests: a request is small when it is at most
    /// this (the paper's footnote 1).
    mean_request_bytes: f64,
    /// By the size of the write request that inserted the page: pages
    /// inserted, page hits, and pages hit at least once while buffered.
    by_size: BTreeMap<u64, [u64; 3]>,
    /// Per `NODES` policy and cache size: the mean over samples of its
    /// nodes' bytes over the bytes of the pages it buffers, in percent.
    overhead: Vec<(usize, u64, f64)>,
    /// Req-block's pages on IRL, SRL and DRL at each sample.
    lists: Vec<[u64; 3]>,
}

impl PageRun {
    /// Share of (inserted pages, page hits) whose write request was small.
    fn small_shares(&self) -> (f64, f64) {
        let (mut small, mut all) = ([0u64; 2], [0u64; 2]);
        for (&size, c) in &self.by_size {
            for k in 0..2 {
                all[k] += c[k];
                if size as f64 <= self.mean_request_bytes {
                    small[k] += c[k];
                }
            }
        }
        let share = |k: usize| small[k] as f64 / all[k].max(1) as f64;
        (share(0), share(1))
    }

    /// Pages of large requests inserted, and the share of them hit again.
    fn large_reaccessed(&self) -> (u64, f64) {
        let (mut inserted, mut hit) = (0, 0);
        for (&size, c) in &self.by_size {
            if size as f64 > self.mean_request_bytes {
                inserted += c[0];
                hit += c[2];
            }
        }
        (inserted, hit as f64 / inserted.max(1) as f64)
    }

    /// Cumulative shares of inserts (`k` 0) or hits (1) by request size.
    fn cdf(&self, k: usize) -> Vec<(f64, f64)> {
        let total: u64 = self.by_size.values().map(|c| c[k]).sum();
        let mut sum = 0;
        self.by_size
            .iter()
            .map(|(&size, c)| {
                sum += c[k];
                (size as f64 / 1024.0, sum as f64 / total.max(1) as f64)
            })
            .collect()
    }
}

/// A cache of the page-level runs: 4 KiB pages, write-buffer mode.
fn buffer(policy: &str, pages: u64) -> Result<Cache> {
    let mut config = CacheConfig::new(pages, LineSize::new(4096)?, policy.parse()?);
    config.write_policy = WritePolicy::WriteOnly;
    Ok(Cache::new(config)?)
}

/// Reads `reader` once: an LRU buffer of `attribution_pages` pages whose
/// every page remembers the write request that inserted it (Figs. 2-3),
/// and every `NODES` policy at each of `sizes` pages, sampled every
/// [`SAMPLE_EVERY`] requests (Figs. 12-13; the lists of Req-block at
/// `sizes[1]`, or the only size).
pub(super) fn page_run(
    name: &str,
    reader: &mut TraceReader,
    attribution_pages: u64,
    sizes: &[u64],
) -> Result<PageRun> {
    let mut lru = buffer("lru", attribution_pages)?;
    // Per cache: its `NODES` index, pages, the cache, and the sum and count
    // of its overhead samples.
    let mut caches: Vec<(usize, u64, Cache, f64, u64)> = Vec::new();
    for (i, (policy, _, _)) in NODES.iter().enumerate() {
        for &pages in sizes {
            caches.push((i, pages, buffer(policy, pages)?, 0.0, 0));
        }
    }
    let list_size = sizes[1.min(sizes.len() - 1)];
    let mut inserted_by: FxHashMap<LineKey, (u64, bool)> = FxHashMap::default();
    let mut by_size: BTreeMap<u64, [u64; 3]> = BTreeMap::new();
    let (mut requests, mut bytes) = (0u64, 0u64);
    let mut lists = Vec::new();
    let mut keys = Vec::new();
    for record in reader.by_ref() {
        let request = iocache_sim::request_of(&record?);
        if request.validate().is_err() {
            continue;
        }
        requests += 1;
        bytes += request.length_bytes;
        keys.clear();
        keys.extend(split_request_keys(&request, lru.config().line_size));
        let cached: Vec<bool> = keys.iter().map(|&k| lru.line_state(k).is_some()).collect();
        let _ = lru.access_counted(&request, AccessHints::default());
        for (&key, &was) in keys.iter().zip(&cached) {
            if was {
                if let Some((size, hit)) = inserted_by.get_mut(&key) {
                    let c = by_size.entry(*size).or_default();
                    c[1] += 1;
                    if !*hit {
                        *hit = true;
                        c[2] += 1;
                    }
                }
            } else if request.kind == IoKind::Write && lru.line_state(key).is_some() {
                inserted_by.insert(key, (request.length_bytes, false));
                by_size.entry(request.length_bytes).or_default()[0] += 1;
            }
        }
        for (_, _, cache, _, _) in &mut caches {
            let _ = cache.access_counted(&request, AccessHints::default());
        }
        if requests.is_multiple_of(SAMPLE_EVERY) {
            for (i, pages, cache, sum, samples) in &mut caches {
                let gauges = cache.policy_gauges();
                let gauge = |name: &str| gauges.iter().find(|(n, _)| *n == name).map_or(0, |&(_, v)| v);
                let nodes = match NODES[*i].1 {
                    "resident" => cache.resident_lines(),
                    other => gauge(other),
                };
                let resident = cache.resident_lines();
                if resident > 0 {
                    *sum += (nodes * NODES[*i].2) as f64 / (resident * 4096) as f64 * 100.0;
                    *samples += 1;
                }
                if NODES[*i].0 == "reqblock" && *pages == list_size {
                    lists.push([gauge("irl_pages"), gauge("srl_pages"), gauge("drl_pages")]);
                }
            }
        }
    }
    Ok(PageRun {
        name: name.into(),
        mean_request_bytes: bytes as f64 / requests.max(1) as f64,
        by_size,
        overhead: caches
            .into_iter()
            .filter(|c| c.4 > 0)
            .map(|(i, pages, _, sum, samples)| (i, pages, sum / samples as f64))
            .collect(),
        lists,
    })
}

/// The claims and figures of Figs. 2, 3, 12 and 13 over `runs`.
pub(super) fn push_claims(
    ctx: &Context,
    verdict: &mut Verdict,
    runs: &[PageRun],
    attribution_pages: u64,
    sample_pages: u64,
) -> Result<()> {
    let buffer = format_byte_size(attribution_pages * 4096);
    verdict.setup.push(format!(
        "Figs. 2-3: an LRU write buffer of {buffer} ({} on the samples; 4 KiB pages, write-only) driven request \
         by request; each page \
         remembers the size of the write request that inserted it; a page hit is a request touching a buffered \
         page; a request is small when it is at most the workload's mean request size (the paper's footnote 1). \
         Figs. 12-13: LRU, BPLRU, VBBMS and Req-block driven alike, their list nodes counted every {SAMPLE_EVERY} \
         requests, priced at the paper's node sizes (12, 24, 24 and 32 bytes) and divided by the bytes of the pages \
         buffered then (a full LRU buffer is 12 / 4096 = 0.29 %, the paper's LRU figure)",
        format_byte_size(sample_pages * 4096)
    ));
    // Fig. 2 / Observation 1.
    let mut rows = Vec::new();
    let (mut more_hits, mut eighty, mut n) = (0, 0, 0);
    for r in runs {
        let (inserts, hits) = r.small_shares();
        rows.push(format!(
            "{} (small ≤ {:.1} KiB): {:.0} % of inserted pages, {:.0} % of hits",
            r.name,
            r.mean_request_bytes / 1024.0,
            inserts * 100.0,
            hits * 100.0
        ));
        if r.by_size.values().map(|c| c[1]).sum::<u64>() == 0 {
            continue;
        }
        n += 1;
        more_hits += usize::from(hits > inserts);
        eighty += usize::from(hits >= 0.8 && inserts < 0.5);
    }
    verdict.push(Claim::new(
        "Fig. 2",
        "Pages of small write requests get a larger share of the hits than of the cache space",
        format!(
            "hit share above insert share in {more_hits} of {n} workloads: {}",
            rows.join("; ")
        ),
        Check::most(more_hits, n),
    ));
    verdict.push(Claim::new(
        "Fig. 2",
        "Small write requests take a minority of the cache space but about 80 % of the page hits",
        format!("at least 80 % of hits from under half of the pages in {eighty} of {n} workloads"),
        Check::most(eighty, n),
    ));
    // Fig. 3 / Observation 2.
    let reaccessed: Vec<(String, u64, f64)> = runs
        .iter()
        .map(|r| {
            let (pages, share) = r.large_reaccessed();
            (r.name.clone(), pages, share)
        })
        .filter(|(_, pages, _)| *pages >= 100)
        .collect();
    let shares: Vec<f64> = reaccessed.iter().map(|(_, _, s)| s * 100.0).collect();
    if shares.is_empty() {
        verdict
            .skipped
            .push("Fig. 3: no workload buffered 100 pages of large requests".into());
    } else {
        verdict.push(Claim::new(
            "Fig. 3",
            "Only 22.0-37.2 % of the buffered pages of large write requests are accessed again",
            format!(
                "mean {:.1} % over {} workloads with at least 100 such pages: {}",
                mean(&shares),
                shares.len(),
                reaccessed
                    .iter()
                    .map(|(n, p, s)| format!("{n} {:.1} % of {p}", s * 100.0))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            Check::Effect {
                paper_lo: 22.0,
                paper_hi: 37.2,
                ours: mean(&shares),
                neutral: 100.0,
                min_effect: 10.0,
                tolerance: Tolerance::points(10.0),
            },
        ));
    }
    // Fig. 12: node bytes over buffered bytes, averaged over runs and sizes.
    if runs.iter().all(|r| r.overhead.is_empty()) {
        verdict
            .skipped
            .push(format!("Fig. 12: no workload reached {SAMPLE_EVERY} requests"));
    } else {
        fig12(verdict, runs);
    }
    // Fig. 13: which list holds the pages.
    let (mut srl_most, mut drl_least, mut m) = (0, 0, 0);
    let mut list_rows = Vec::new();
    for r in runs.iter().filter(|r| !r.lists.is_empty()) {
        let avg: Vec<f64> = (0..3)
            .map(|k| mean(&r.lists.iter().map(|l| l[k] as f64).collect::<Vec<_>>()))
            .collect();
        let total = avg.iter().sum::<f64>().max(1.0);
        m += 1;
        srl_most += usize::from(avg[1] >= avg[0] && avg[1] >= avg[2]);
        drl_least += usize::from(avg[2] <= avg[0] && avg[2] <= avg[1]);
        list_rows.push(format!(
            "{}: IRL {:.0} %, SRL {:.0} %, DRL {:.0} %",
            r.name,
            avg[0] / total * 100.0,
            avg[1] / total * 100.0,
            avg[2] / total * 100.0
        ));
    }
    verdict.push(Claim::new(
        "Fig. 13",
        "SRL holds the most buffered pages in most cases",
        format!(
            "SRL the largest in {srl_most} of {m} workloads (mean shares): {}",
            list_rows.join("; ")
        ),
        Check::most(srl_most, m),
    ));
    verdict.push(Claim::new(
        "Fig. 13",
        "DRL holds a small part of the buffered pages",
        format!("DRL the smallest in {drl_least} of {m} workloads"),
        Check::most(drl_least, m),
    ));
    // Figures.
    for (k, what, name) in [
        (1, "page hits", "icpp22-fig2-hits"),
        (0, "inserted pages", "icpp22-fig2-inserts"),
    ] {
        let chart = Chart {
            title: format!("Fig. 2: CDF of {what} by write request size (LRU, {buffer})"),
            x: axis("write request size (KiB)", Scale::Log, Ticks::Number),
            y: axis(&format!("share of {what}"), Scale::Linear, Ticks::Percent),
            series: runs.iter().map(|r| series(r.name.clone(), r.cdf(k))).collect(),
        };
        ctx.figure(verdict, name, &chart)?;
    }
    let chart = Chart {
        title: format!(
            "Fig. 13: Req-block's pages on IRL, SRL and DRL (the first {FIG13_WORKLOADS} workloads)"
        ),
        x: axis(
            &format!("requests (× {SAMPLE_EVERY})"),
            Scale::Linear,
            Ticks::Number,
        ),
        y: axis("pages", Scale::Linear, Ticks::Number),
        series: runs
            .iter()
            .filter(|r| !r.lists.is_empty())
            .take(FIG13_WORKLOADS)
            .flat_map(|r| {
                ["IRL", "SRL", "DRL"]
                    .into_iter()
                    .enumerate()
                    .map(move |(k, list)| {
                        series(
                            format!("{} {list}", r.name),
                            r.lists
                                .iter()
                                .enumerate()
                                .map(|(i, l)| ((i + 1) as f64, l[k] as f64))
                                .collect(),
                        )
                    })
            })
            .collect(),
    };
    ctx.figure(verdict, "icpp22-fig13-lists", &chart)?;
    Ok(())
}

/// Fig. 12's claims: the nodes' share of the buffer, and the ordering.
fn fig12(verdict: &mut Verdict, runs: &[PageRun]) {
    let overhead = |i: usize| -> f64 {
        let per: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.overhead.iter().filter(move |(p, _, _)| *p == i))
            .map(|&(_, _, percent)| percent)
            .collect();
        mean(&per)
    };
    let ours: Vec<f64> = (0..NODES.len()).map(overhead).collect();
    let text = NODES
        .iter()
        .zip(&ours)
        .zip(PAPER_OVERHEAD)
        .map(|(((p, _, _), o), paper)| format!("{p} {o:.2} % (paper {paper} %)"))
        .collect::<Vec<_>>()
        .join(", ");
    verdict.push(Claim::new(
        "Fig. 12",
        "Req-block's lists take 0.41 % of the buffered data on average (LRU 0.29 %, BPLRU 0.32 %, VBBMS 0.53 %)",
        text,
        Check::effect(0.41, ours[3], 0.0, 0.01, Tolerance::factor(1.5)),
    ));
    let (mut between, mut cases) = (0, 0);
    for r in runs {
        let at = |i: usize, pages: u64| {
            r.overhead
                .iter()
                .find(|&&(p, s, _)| p == i && s == pages)
                .map(|o| o.2)
        };
        for &(_, pages, _) in r.overhead.iter().filter(|o| o.0 == 3) {
            if let (Some(b), Some(v), Some(q)) = (at(1, pages), at(2, pages), at(3, pages)) {
                cases += 1;
                between += usize::from(b <= q && q <= v);
            }
        }
    }
    verdict.push(Claim::new(
        "Fig. 12",
        "Req-block's list overhead lies between BPLRU's and VBBMS's",
        format!("BPLRU ≤ Req-block ≤ VBBMS in {between} of {cases} (workload, buffer size) cases"),
        Check::most(between, cases),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use iocache_trace::{ReaderOptions, TraceFormat};

    fn msr(lines: &[(&str, u64, u64)]) -> TraceReader {
        let text: String = lines
            .iter()
            .enumerate()
            .map(|(i, (kind, offset, size))| format!("{},hm,0,{kind},{offset},{size},100\n", 1000 + i))
            .collect();
        TraceReader::from_reader(
            "test",
            Box::new(std::io::Cursor::new(text.into_bytes())),
            Some(TraceFormat::Msr),
            ReaderOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn pages_remember_the_write_that_inserted_them() {
        // A small write (one page) hit twice, a large write (four pages)
        // whose first page is read once; an 8-page buffer holds all.
        let run = page_run(
            "t",
            &mut msr(&[
                ("Write", 0, 4096),
                ("Write", 65536, 16384),
                ("Read", 0, 4096),
                ("Write", 0, 4096),
                ("Read", 65536, 4096),
            ]),
            8,
            &[8],
        )
        .unwrap();
        // Mean request size: (4 + 16 + 4 + 4 + 4) KiB / 5 = 6.4 KiB.
        assert!((run.mean_request_bytes - 6.4 * 1024.0).abs() < 1e-9);
        assert_eq!(run.by_size[&4096], [1, 2, 1]);
        assert_eq!(run.by_size[&16384], [4, 1, 1]);
        let (inserts, hits) = run.small_shares();
        assert!((inserts - 0.2).abs() < 1e-9 && (hits - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(run.large_reaccessed(), (4, 0.25));
        assert_eq!(run.cdf(0), vec![(4.0, 0.2), (16.0, 1.0)]);
    }

    #[test]
    fn a_page_evicted_and_written_again_belongs_to_its_new_request() {
        // A one-page buffer: the large write's second page evicts its first
        // within the request (a page in and out within one request is not
        // counted: only a request larger than the buffer does that), then
        // a small write takes page 0 and is hit.
        let run = page_run(
            "t",
            &mut msr(&[("Write", 0, 8192), ("Write", 0, 4096), ("Read", 0, 4096)]),
            1,
            &[1],
        )
        .unwrap();
        assert_eq!(run.by_size[&8192], [1, 0, 0]);
        assert_eq!(run.by_size[&4096], [1, 1, 1]);
    }
}
