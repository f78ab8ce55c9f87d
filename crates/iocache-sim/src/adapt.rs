//! An adaptive controller (`--adapt`) needs the
//! simulated devices' queues, which only the timing model knows, and its
//! decisions must reach the cache between two requests, as they would in
//! the engine. An [`Adapter`] sits in a run between the replay and the
//! cache: before each request it reads what the devices hold at that
//! simulated time ([`TimingModel::queues`]), closes the controller's
//! intervals that ended (applying each decision with
//! `Cache::set_controller_policy`), and asks the controller whether this
//! request goes around the cache (`AccessHints`). Every interval becomes an
//! [`AdaptRow`]: the paper's Figs. 4-6 (maximum queue time of both devices,
//! the R/W/P/E shares, the group and the policy).
//!
//! Controllers, by `--adapt` name: `lbica` and `sib` (`iocache_core::
//! balance`), and `observe`, which measures the same rows and never acts
//! (the baseline's queues, for the paper's Figs. 4-5). The name list is [`AdaptSpec::NAMES`]; other controllers
//! (ReCA) add theirs to [`AdaptKind`].
//!
//! # The measurements
//!
//! - `Q`: I/Os waiting or in service at the device (`timing/queues.rs`),
//!   sampled at each arrival; an interval's `Q` is the mean of its samples,
//!   its maximum queue time the largest `Q × L` sampled.
//! - `L` (time per queued I/O, Eq. 1) and `S` (one I/O alone) per device
//!   and direction, for one op of a cache line: `S` is the idle service
//!   time; `L` is `S / servers`, or the data channel's transfer time when
//!   that is longer (a queueing device drains at most one transfer at a
//!   time). An interval's values are weighted by the directions queued
//!   (cache: R and E read, W and P write); a request's own `S` is its
//!   direction's.

use std::fmt::Write as _;
use std::str::FromStr;

use iocache_core::balance::{
    Action, Balancer, Decision, DeviceLoad, IntervalInputs, Lbica, LbicaConfig, QueueMix, RequestClass, Sib,
    SibConfig,
};
use iocache_core::units::{format_duration_ns, parse_duration_ns};
use iocache_core::{AccessHints, Cache, IoKind};
use serde::Serialize;

use crate::error::SimError;
use crate::timing::{DeviceModel, DeviceSpec, Dir, TimingModel};

/// The default controller interval when neither `interval=` nor a series
/// interval is given.
pub const DEFAULT_INTERVAL_NS: u64 = 100_000_000;

/// Which controller, with its knobs.
#[derive(Clone, Debug, PartialEq)]
pub enum AdaptKind {
    Lbica(LbicaConfig),
    Sib(SibConfig),
    Observe,
}

/// `--adapt NAME[:KEY=VALUE...]`.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptSpec {
    pub kind: AdaptKind,
    /// The controller's interval; `None`: the series interval, else
    /// [`DEFAULT_INTERVAL_NS`].
    pub interval_ns: Option<u64>,
}

impl AdaptSpec {
    /// Every name `--adapt` knows.
    pub const NAMES: &'static str =
        "lbica, sib, observe (and reca, which the binary routes to ReCA's options)";
    pub const SYNTAX: &'static str =
        "lbica[:interval=100ms:enter=1:floor=0.1:own-floor=1:enter-intervals=1:hold=2:\
exit-intervals=2:exit-load=0.5:seq-read=0.75:pair=0.6:second=0.2:other=bypass|none:backoff=2], \
sib[:interval=100ms:margin=1] or observe[:interval=100ms]";

    pub fn name(&self) -> &'static str {
        match self.kind {
            AdaptKind::Lbica(_) => "lbica",
            AdaptKind::Sib(_) => "sib",
            AdaptKind::Observe => "observe",
        }
    }

    fn build(&self) -> Box<dyn Balancer> {
        match self.kind {
            AdaptKind::Lbica(c) => Box::new(Lbica::new(c)),
            AdaptKind::Sib(c) => Box::new(Sib::new(c)),
            AdaptKind::Observe => Box::new(Observer),
        }
    }
}

impl FromStr for AdaptSpec {
    type Err = SimError;
    fn from_str(text: &str) -> Result<AdaptSpec, SimError> {
        let bad =
            |why: String| SimError::Spec(format!("--adapt `{text}`: {why} (expected {})", Self::SYNTAX));
        let mut parts = text.trim().split(':');
        let name = parts.next().unwrap_or("");
        let mut kind = match name {
            "lbica" => AdaptKind::Lbica(LbicaConfig::default()),
            "sib" => AdaptKind::Sib(SibConfig::default()),
            "observe" => AdaptKind::Observe,
            other => {
                return Err(bad(format!(
                    "unknown controller `{other}`; known: {}",
                    Self::NAMES
                )))
            }
        };
        let mut interval_ns = None;
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not KEY=VALUE")))?;
            let number = || -> Result<f64, SimError> {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| bad(format!("{key}: `{value}` is not a number >= 0")))
            };
            let count = || -> Result<u32, SimError> {
                value
                    .parse::<u32>()
                    .map_err(|_| bad(format!("{key}: `{value}` is not a count")))
            };
            match (&mut kind, key) {
                (_, "interval") => {
                    let ns = parse_duration_ns(value).map_err(|e| bad(format!("interval: {e}")))?;
                    if ns == 0 {
                        return Err(bad("interval must be positive".into()));
                    }
                    interval_ns = Some(ns);
                }
                (AdaptKind::Lbica(c), "enter") => c.enter_ratio = number()?,
                (AdaptKind::Lbica(c), "floor") => c.service_floor = number()?,
                (AdaptKind::Lbica(c), "own-floor") => c.own_floor = number()?,
                (AdaptKind::Lbica(c), "enter-intervals") => c.enter_intervals = count()?,
                (AdaptKind::Lbica(c), "hold") => c.min_hold_intervals = count()?,
                (AdaptKind::Lbica(c), "exit-intervals") => c.exit_intervals = count()?,
                (AdaptKind::Lbica(c), "exit-load") => c.exit_load_fraction = number()?,
                (AdaptKind::Lbica(c), "seq-read") => c.thresholds.sequential_read_share = number()?,
                (AdaptKind::Lbica(c), "pair") => c.thresholds.min_pair_share = number()?,
                (AdaptKind::Lbica(c), "second") => c.thresholds.min_second_share = number()?,
                (AdaptKind::Lbica(c), "backoff") => c.backoff = number()?,
                (AdaptKind::Lbica(c), "other") => {
                    c.unclassified_bypass = match value {
                        "bypass" => true,
                        "none" => false,
                        _ => return Err(bad(format!("other: `{value}` is neither bypass nor none"))),
                    }
                }
                (AdaptKind::Sib(c), "margin") => c.margin = number()?,
                _ => return Err(bad(format!("unknown key `{key}` for {name}"))),
            }
        }
        Ok(AdaptSpec { kind, interval_ns })
    }
}

/// `--adapt observe`: the measurements of a controller, no action.
struct Observer;

impl Balancer for Observer {
    fn name(&self) -> &'static str {
        "observe"
    }

    fn on_interval(&mut self, inputs: &IntervalInputs) -> Decision {
        Decision::observed(inputs, Action::default())
    }

    fn action(&self) -> Action {
        Action::default()
    }

    fn bypass(&self, _: &DeviceLoad, _: &DeviceLoad) -> bool {
        false
    }

    fn bypass_margin(&self) -> Option<f64> {
        None
    }
}

/// One controller interval: what it measured and what it decided.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AdaptRow {
    pub start_ns: u64,
    pub end_ns: u64,
    /// Client requests that arrived in the interval.
    pub arrivals: u64,
    /// Mean I/Os at each device (sampled at arrivals).
    pub cache_queued: f64,
    pub backend_queued: f64,
    /// Eq. 1 on the means: `T = Q × L`.
    pub cache_queue_time_ns: f64,
    pub backend_queue_time_ns: f64,
    /// The largest `Q × L` sampled in the interval (the paper's Figs. 4-5).
    pub max_cache_queue_time_ns: f64,
    pub max_backend_queue_time_ns: f64,
    /// The cache queue's R/W/P/E shares.
    pub share_r: f64,
    pub share_w: f64,
    pub share_p: f64,
    pub share_e: f64,
    /// Whether the controller found the cache the bottleneck.
    pub bottleneck: bool,
    /// The workload group, when the controller characterized the queue.
    pub group: String,
    /// The policy in force from the end of this interval (`wo`,
    /// `wb+bypass`, ...).
    pub policy: String,
    /// Whether it changed at the end of this interval.
    pub changed: bool,
    /// Requests sent around the cache during the interval.
    pub bypassed: u64,
}

impl AdaptRow {
    /// The CSV columns of [`AdaptRow::csv_record`].
    pub const CSV_HEADER: &'static str = "adapt_arrivals,cache_queued,backend_queued,\
cache_queue_time_ns,backend_queue_time_ns,max_cache_queue_time_ns,max_backend_queue_time_ns,\
share_r,share_w,share_p,share_e,bottleneck,group,adapt_policy,changed,bypassed";

    pub fn csv_record(&self) -> String {
        format!(
            "{},{:.3},{:.3},{:.0},{:.0},{:.0},{:.0},{:.4},{:.4},{:.4},{:.4},{},{},{},{},{}",
            self.arrivals,
            self.cache_queued,
            self.backend_queued,
            self.cache_queue_time_ns,
            self.backend_queue_time_ns,
            self.max_cache_queue_time_ns,
            self.max_backend_queue_time_ns,
            self.share_r,
            self.share_w,
            self.share_p,
            self.share_e,
            self.bottleneck,
            self.group,
            self.policy,
            self.changed,
            self.bypassed
        )
    }

    /// Empty cells for a series row without a controller interval.
    pub fn csv_empty() -> String {
        ",".repeat(Self::CSV_HEADER.matches(',').count())
    }
}

/// A run's controller log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdaptReport {
    pub controller: String,
    pub interval_ns: u64,
    /// Policy changes.
    pub switches: u64,
    /// Requests sent around the cache.
    pub bypassed: u64,
    /// Intervals in which the controller found the cache the bottleneck.
    pub bottleneck_intervals: u64,
    /// Intervals by the policy in force from their end, in the order the
    /// policies first appear.
    pub intervals_by_policy: Vec<PolicyIntervals>,
    pub rows: Vec<AdaptRow>,
}

/// How many intervals ended under one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyIntervals {
    pub policy: String,
    pub intervals: u64,
}

impl AdaptReport {
    /// One line: the controller, its switches, bypasses, and the share of
    /// intervals under each policy.
    pub fn summary(&self) -> String {
        let total = self.rows.len().max(1) as f64;
        let mut out = format!(
            "{} every {}: {} switches, {} requests bypassed; intervals by policy:",
            self.controller,
            format_duration_ns(self.interval_ns),
            self.switches,
            self.bypassed
        );
        for p in &self.intervals_by_policy {
            let _ = write!(out, " {} {:.1} %", p.policy, p.intervals as f64 * 100.0 / total);
        }
        out
    }
}

/// The cost of one line-sized op on one device, per direction.
#[derive(Clone, Copy, Debug)]
struct DeviceCost {
    /// `L`: time per queued op, [read, write].
    per_request_ns: [f64; 2],
    /// `S`: one op alone, [read, write].
    service_ns: [f64; 2],
}

impl DeviceCost {
    fn of(spec: &DeviceSpec, bytes: u64) -> DeviceCost {
        let servers = spec.servers().max(1) as f64;
        let one = |dir: Dir| {
            let service = spec.idle_service_ns(dir, bytes) as f64;
            let per_request = match &spec.model {
                DeviceModel::Queue(q) => (service / servers).max(q.cost(dir).transfer(bytes) as f64),
                // A flash device and a disk head: the idle service time
                // (a disk's is that of a random request) shared by its servers.
                DeviceModel::Flash(_) | DeviceModel::Hdd(_) => service / servers,
            };
            (per_request, service)
        };
        let (lr, sr) = one(Dir::Read);
        let (lw, sw) = one(Dir::Write);
        DeviceCost {
            per_request_ns: [lr, lw],
            service_ns: [sr, sw],
        }
    }

    /// The load of `reads + writes` queued ops, costs weighted by direction.
    fn load(&self, reads: f64, writes: f64) -> DeviceLoad {
        let total = reads + writes;
        let (wr, ww) = if total > 0.0 {
            (reads / total, writes / total)
        } else {
            (1.0, 0.0)
        };
        DeviceLoad {
            queued: total,
            per_request_ns: wr * self.per_request_ns[0] + ww * self.per_request_ns[1],
            service_ns: wr * self.service_ns[0] + ww * self.service_ns[1],
        }
    }
}

fn cache_directions(q: &[f64; 4]) -> (f64, f64) {
    let at = |c: RequestClass| q[c as usize];
    (
        at(RequestClass::ReadHit) + at(RequestClass::Eviction),
        at(RequestClass::Write) + at(RequestClass::Promotion),
    )
}

/// Sums over one interval's arrivals.
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    samples: u64,
    cache: [f64; 4],
    backend: [f64; 2],
    max_cache_ns: f64,
    max_backend_ns: f64,
    bypasses_at_start: u64,
}

/// A controller driven by a run's timing model (see the module doc).
pub struct Adapter {
    controller: String,
    balancer: Box<dyn Balancer>,
    interval_ns: u64,
    costs: [DeviceCost; 2],
    origin: Option<u64>,
    index: u64,
    sums: Sums,
    rows: Vec<AdaptRow>,
    last_ns: u64,
}

impl Adapter {
    pub fn new(
        spec: &AdaptSpec,
        cache: &DeviceSpec,
        backend: &DeviceSpec,
        line_bytes: u64,
        series_interval_ns: Option<u64>,
    ) -> Adapter {
        Adapter {
            controller: spec.name().to_string(),
            balancer: spec.build(),
            interval_ns: spec
                .interval_ns
                .or(series_interval_ns)
                .unwrap_or(DEFAULT_INTERVAL_NS),
            costs: [
                DeviceCost::of(cache, line_bytes),
                DeviceCost::of(backend, line_bytes),
            ],
            origin: None,
            index: 0,
            sums: Sums::default(),
            rows: Vec::new(),
            last_ns: 0,
        }
    }

    /// Called before the cache decides a request of `kind` arriving at
    /// `now_ns`: closes the intervals that ended, samples the queues and
    /// answers whether the request goes around the cache.
    pub fn before_request(
        &mut self,
        now_ns: u64,
        kind: IoKind,
        cache: &mut Cache,
        model: &mut TimingModel,
    ) -> AccessHints {
        let origin = *self.origin.get_or_insert_with(|| {
            self.sums.bypasses_at_start = cache.stats().balance_bypasses;
            now_ns
        });
        model.advance_to(now_ns);
        while now_ns >= origin + (self.index + 1) * self.interval_ns {
            let end = origin + (self.index + 1) * self.interval_ns;
            self.close(end, cache);
        }
        self.last_ns = now_ns;
        let [c, b] = model.queues();
        let cache_q = c.by_class.map(|n| n as f64);
        let backend_q = [b.by_class[0] as f64, b.by_class[1] as f64];
        let (cr, cw) = cache_directions(&cache_q);
        let mut cache_now = self.costs[0].load(cr, cw);
        let mut backend_now = self.costs[1].load(backend_q[0], backend_q[1]);
        let s = &mut self.sums;
        s.samples += 1;
        for (sum, n) in s.cache.iter_mut().zip(cache_q) {
            *sum += n;
        }
        s.backend[0] += backend_q[0];
        s.backend[1] += backend_q[1];
        s.max_cache_ns = s.max_cache_ns.max(cache_now.queue_time_ns());
        s.max_backend_ns = s.max_backend_ns.max(backend_now.queue_time_ns());
        // The request's own service is its direction's.
        let dir = match kind {
            IoKind::Read => 0,
            IoKind::Write => 1,
        };
        cache_now.service_ns = self.costs[0].service_ns[dir];
        backend_now.service_ns = self.costs[1].service_ns[dir];
        AccessHints {
            balance_bypass: self.balancer.bypass(&cache_now, &backend_now),
            ..Default::default()
        }
    }

    /// Closes the interval ending at `end_ns` and applies its decision.
    fn close(&mut self, end_ns: u64, cache: &mut Cache) {
        let s = std::mem::take(&mut self.sums);
        let n = s.samples.max(1) as f64;
        let cache_q = s.cache.map(|v| v / n);
        let backend_q = [s.backend[0] / n, s.backend[1] / n];
        let (cr, cw) = cache_directions(&cache_q);
        let inputs = IntervalInputs {
            interval: self.index,
            now_ns: end_ns,
            cache: self.costs[0].load(cr, cw),
            backend: self.costs[1].load(backend_q[0], backend_q[1]),
            cache_mix: QueueMix { by_class: cache_q },
            arrivals: s.samples,
        };
        let decision = self.balancer.on_interval(&inputs);
        cache.set_controller_policy(decision.action.policy);
        let bypasses_now = cache.stats().balance_bypasses;
        self.rows.push(AdaptRow {
            start_ns: end_ns.saturating_sub(self.interval_ns),
            end_ns,
            arrivals: s.samples,
            cache_queued: inputs.cache.queued,
            backend_queued: inputs.backend.queued,
            cache_queue_time_ns: decision.cache_queue_time_ns,
            backend_queue_time_ns: decision.backend_queue_time_ns,
            max_cache_queue_time_ns: s.max_cache_ns,
            max_backend_queue_time_ns: s.max_backend_ns,
            share_r: decision.shares.read_hits,
            share_w: decision.shares.writes,
            share_p: decision.shares.promotions,
            share_e: decision.shares.evictions,
            bottleneck: decision.bottleneck,
            group: decision.group.map_or(String::new(), |g| g.to_string()),
            policy: decision.action.describe(cache.write_policy()),
            changed: decision.changed,
            bypassed: bypasses_now - s.bypasses_at_start,
        });
        self.sums.bypasses_at_start = bypasses_now;
        self.index += 1;
    }

    /// Closes the interval in progress (cut at the last arrival) and
    /// reports.
    pub fn finish(mut self, cache: &mut Cache) -> AdaptReport {
        if self.sums.samples > 0 {
            let end = self
                .last_ns
                .max(self.origin.unwrap_or(0) + self.index * self.interval_ns + 1);
            let start = self.origin.unwrap_or(0) + self.index * self.interval_ns;
            self.close(end, cache);
            if let Some(row) = self.rows.last_mut() {
                row.start_ns = start;
            }
        }
        let mut intervals_by_policy: Vec<PolicyIntervals> = Vec::new();
        for row in &self.rows {
            match intervals_by_policy.iter_mut().find(|p| p.policy == row.policy) {
                Some(p) => p.intervals += 1,
                None => intervals_by_policy.push(PolicyIntervals {
                    policy: row.policy.clone(),
                    intervals: 1,
                }),
            }
        }
        AdaptReport {
            controller: self.controller,
            interval_ns: self.interval_ns,
            switches: self.rows.iter().filter(|r| r.changed).count() as u64,
            bypassed: self.rows.iter().map(|r| r.bypassed).sum(),
            bottleneck_intervals: self.rows.iter().filter(|r| r.bottleneck).count() as u64,
            intervals_by_policy,
            rows: self.rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::preset;

    #[test]
    fn specs_parse_and_refuse_what_they_do_not_know() {
        let s: AdaptSpec = "lbica:interval=50ms:hold=3:exit-load=0.25".parse().unwrap();
        assert_eq!(s.interval_ns, Some(50_000_000));
        match s.kind {
            AdaptKind::Lbica(c) => {
                assert_eq!((c.min_hold_intervals, c.exit_load_fraction), (3, 0.25));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            "sib:margin=2".parse::<AdaptSpec>().unwrap().kind,
            AdaptKind::Sib(SibConfig { margin: 2.0 })
        );
        assert_eq!("observe".parse::<AdaptSpec>().unwrap().kind, AdaptKind::Observe);
        for bad in [
            "reca2",
            "observe:margin=1",
            "lbica:margin=1",
            "sib:hold=2",
            "lbica:hold",
            "lbica:interval=0s",
            "sib:margin=-1",
        ] {
            let e = bad.parse::<AdaptSpec>().unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn costs_follow_the_device() {
        // ReCA's HDD: one server, so L = S.
        let hdd = DeviceCost::of(&preset("hdd").unwrap(), 4096);
        assert_eq!(hdd.per_request_ns[0], hdd.service_ns[0]);
        // ASPLOS'23's SATA SSD: 150 µs alone, about 1/93k s per queued 4 KiB read.
        let ssd = DeviceCost::of(&preset("sata-ssd").unwrap(), 4096);
        assert!((ssd.service_ns[0] - 150_000.0).abs() < 2.0, "{:?}", ssd);
        assert!((ssd.per_request_ns[0] - 1e9 / 93e3).abs() < 100.0, "{:?}", ssd);
        let load = ssd.load(3.0, 1.0);
        assert_eq!(load.queued, 4.0);
        assert!(load.per_request_ns > ssd.per_request_ns[0] && load.per_request_ns < ssd.per_request_ns[1]);
    }

    #[test]
    fn empty_csv_cells_match_the_header() {
        assert_eq!(
            AdaptRow::csv_empty().matches(',').count(),
            AdaptRow::default().csv_record().matches(',').count()
        );
    }
}
