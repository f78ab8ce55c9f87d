//! LBICA (Ahmadian, Salkhordeh, Asadi, "LBICA: A Load
//! Balancer for I/O Cache Architectures", DATE'19, §III) keeps the cache
//! device from becoming the bottleneck under bursts by changing the cache's
//! write policy while the burst lasts. This is our implementation from the
//! paper's description, sans-I/O: the driver closes an interval with
//! [`IntervalInputs`] and applies the returned [`Action`].
//!
//! # The decision
//!
//! 1. **Bottleneck test** (§III-A, Eq. 1): `T = Q × L` per device, with `Q`
//!    the mean number of requests queued or in service over the interval and
//!    `L` the time per queued request. The cache is the bottleneck when
//!    `T_cache > enter_ratio × T_backend` (the paper: ratio 1) and, our
//!    addition, `T_cache > service_floor × S_backend` (a tenth of a
//!    backend service time, by default): Eq. 1 alone calls a nearly idle
//!    system a bottleneck as soon as one request waits at the cache and none
//!    at the backend. (With the floor at 1, a queue must be longer than one
//!    backend service before anything moves, which reacts late to bursts
//!    over disks; docs/results/lbica.md compares.) And `T_cache` must be at
//!    least `own_floor` (1) times the cache's own service time `S_cache`:
//!    a request waits behind at least one other. Over a fast backend (an
//!    SSD array, 0.1 × S_backend a few µs) the fills of a cold cache made a
//!    "bottleneck" of a 20 µs queue at 3 % device utilization, and a steady
//!    load (which never calms) then kept WO, and the cache cold, for good.
//! 2. **Characterization** (§III-B): the cache queue's R/W/P/E mix gives a
//!    [`WorkloadGroup`] (`queue_mix.rs`).
//! 3. **Policy** (§III-C): random read → WO (read misses are not promoted);
//!    mixed read-write → RO (`wa`: writes go around the cache); write
//!    intensive → the configured policy (the paper's WB) with the tail of
//!    the cache queue bypassed to the backend ([`Balancer::bypass`]: a
//!    request goes to the backend when it would complete there sooner);
//!    sequential read → the configured policy (the cache is not what the
//!    requests wait for). Unclassified queues (the paper leaves them out)
//!    get the tail bypass, our extension (`unclassified_bypass`, on by
//!    default): the commonest of them is a queue of read hits, the paper's
//!    own motivating case (§I: hits queue at the cache while the disk
//!    idles), where neither WO nor RO would take anything off the cache.
//!
//! # Hysteresis (how a burst episode begins and ends)
//!
//! A policy chosen for a burst changes the very queue it was chosen from
//! (under WO the promotions vanish; under RO the writes do), so the cache
//! may stop being the bottleneck while the burst goes on. Leaving the
//! policy on that signal would flap: WB, burst detected, WO, queue drains,
//! WB, burst detected... So the exit is judged on the offered load instead,
//! which no policy changes:
//!
//! - an episode starts after `enter_intervals` consecutive bottleneck
//!   intervals whose queue characterizes to a group with an action;
//! - during it the action is held (the distorted mix is not characterized
//!   again), and the episode's peak arrivals per interval are tracked;
//! - it ends after at least `min_hold_intervals`, once `exit_intervals`
//!   consecutive intervals had at most `exit_load_fraction` of the peak
//!   arrivals; the configured policy returns.
//!
//! A burst may change character without calming down (the paper's mail
//! server: read-only, then write-only, then write-back). While the cache
//! stays the bottleneck under the action, its queue is characterized
//! again; the action removes one class from it (WO the fills, RO the
//! writes), so a group seen through that is a real change. After
//! `enter_intervals` + 1 consecutive intervals of another group whose
//! action differs, the episode takes that group and its action (unless the
//! back-off withdrew the policy: it stays withdrawn).
//!
//! # Back-off (our extension)
//!
//! WO and RO move work to the backend; RO moves every write, and its
//! write-around also drops the cached copies of the written lines, so
//! their reads miss too. Over disks that can overload the backend for the
//! rest of the burst. So, during an episode whose action sets a policy,
//! once the backend is the bottleneck (`T_backend > T_cache`) with
//! `T_backend` above `backoff` times its value when the episode began (and
//! above the service floor) for `exit_intervals` consecutive intervals, the
//! policy is withdrawn for the rest of the episode and only the tail bypass
//! stays (it moves a request only when the backend would serve it sooner).
//! `backoff = 0` turns this off (the paper has no such rule).

use crate::balance::queue_mix::{characterize, GroupThresholds, WorkloadGroup};
use crate::balance::{backend_is_faster, Action, Balancer, Decision, DeviceLoad, IntervalInputs};
use crate::config::WritePolicy;

/// LBICA's knobs (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LbicaConfig {
    /// The cache is the bottleneck when `T_cache > enter_ratio × T_backend`.
    pub enter_ratio: f64,
    /// ... and `T_cache > service_floor × S_backend` (0 for Eq. 1 alone).
    pub service_floor: f64,
    /// ... and `T_cache > own_floor × S_cache` (0 for no such floor).
    pub own_floor: f64,
    /// Consecutive bottleneck intervals that start an episode.
    pub enter_intervals: u32,
    /// Intervals an episode lasts at least.
    pub min_hold_intervals: u32,
    /// Consecutive calm intervals that end an episode.
    pub exit_intervals: u32,
    /// An interval is calm when its arrivals are at most this fraction of
    /// the episode's peak.
    pub exit_load_fraction: f64,
    /// Whether an unclassified queue gets the tail bypass (else nothing).
    pub unclassified_bypass: bool,
    /// The growth of `T_backend` since the episode began past which a
    /// policy that overloads the backend is withdrawn (0: never).
    pub backoff: f64,
    pub thresholds: GroupThresholds,
}

impl Default for LbicaConfig {
    fn default() -> Self {
        LbicaConfig {
            enter_ratio: 1.0,
            service_floor: 0.1,
            own_floor: 1.0,
            enter_intervals: 1,
            min_hold_intervals: 2,
            exit_intervals: 2,
            exit_load_fraction: 0.5,
            unclassified_bypass: true,
            backoff: 2.0,
            thresholds: GroupThresholds::default(),
        }
    }
}

impl LbicaConfig {
    /// The action §III-C assigns to a group (unclassified: see the module doc).
    pub fn action_for(&self, group: WorkloadGroup) -> Action {
        match group {
            WorkloadGroup::RandomRead => Action {
                policy: Some(WritePolicy::WriteOnly),
                bypass: false,
            },
            WorkloadGroup::MixedReadWrite => Action {
                policy: Some(WritePolicy::WriteAround),
                bypass: false,
            },
            WorkloadGroup::RandomWrite | WorkloadGroup::SequentialWrite => Action {
                policy: None,
                bypass: true,
            },
            WorkloadGroup::Unclassified => Action {
                policy: None,
                bypass: self.unclassified_bypass,
            },
            WorkloadGroup::SequentialRead => Action::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// No episode; `bottleneck_run` consecutive bottleneck intervals so far.
    Watching { bottleneck_run: u32 },
    /// An episode with its action.
    Balancing {
        group: WorkloadGroup,
        action: Action,
        held: u32,
        peak_arrivals: u64,
        calm_run: u32,
        /// `T_backend` when the episode began.
        entry_backend_ns: f64,
        /// Consecutive intervals with the backend overloaded (back-off).
        overload_run: u32,
        /// The back-off withdrew the policy for the rest of the episode.
        backed_off: bool,
        /// Another group seen in that many consecutive bottleneck intervals.
        change: Option<(WorkloadGroup, u32)>,
    },
}

/// The LBICA controller.
#[derive(Clone, Debug)]
pub struct Lbica {
    config: LbicaConfig,
    state: State,
}

impl Lbica {
    pub fn new(config: LbicaConfig) -> Lbica {
        Lbica {
            config,
            state: State::Watching { bottleneck_run: 0 },
        }
    }

    pub fn config(&self) -> &LbicaConfig {
        &self.config
    }

    /// Whether the cache is the bottleneck under these loads (step 1).
    pub fn is_bottleneck(&self, cache: &DeviceLoad, backend: &DeviceLoad) -> bool {
        let t_cache = cache.queue_time_ns();
        t_cache > self.config.enter_ratio * backend.queue_time_ns()
            && t_cache > self.config.service_floor * backend.service_ns
            && t_cache > self.config.own_floor * cache.service_ns
    }
}

impl Balancer for Lbica {
    fn name(&self) -> &'static str {
        "lbica"
    }

    fn on_interval(&mut self, inputs: &IntervalInputs) -> Decision {
        let before = self.action();
        let shares = inputs.cache_mix.shares();
        let bottleneck = self.is_bottleneck(&inputs.cache, &inputs.backend);
        let mut group = None;
        self.state = match self.state {
            State::Watching { bottleneck_run } => {
                let run = if bottleneck { bottleneck_run + 1 } else { 0 };
                if run >= self.config.enter_intervals.max(1) {
                    let g = characterize(&shares, &self.config.thresholds);
                    group = Some(g);
                    let action = self.config.action_for(g);
                    if action == Action::default() {
                        State::Watching { bottleneck_run: run }
                    } else {
                        State::Balancing {
                            group: g,
                            action,
                            held: 1,
                            peak_arrivals: inputs.arrivals,
                            calm_run: 0,
                            entry_backend_ns: inputs.backend.queue_time_ns(),
                            overload_run: 0,
                            backed_off: false,
                            change: None,
                        }
                    }
                } else {
                    State::Watching { bottleneck_run: run }
                }
            }
            State::Balancing {
                group: mut g,
                mut action,
                held,
                peak_arrivals,
                calm_run,
                mut entry_backend_ns,
                overload_run,
                mut backed_off,
                change,
            } => {
                let peak = peak_arrivals.max(inputs.arrivals);
                let calm = inputs.arrivals as f64 <= self.config.exit_load_fraction * peak as f64;
                let calm_run = if calm { calm_run + 1 } else { 0 };
                let held = held + 1;
                let t_backend = inputs.backend.queue_time_ns();
                let overloaded = self.config.backoff > 0.0
                    && action.policy.is_some()
                    && t_backend > inputs.cache.queue_time_ns()
                    && t_backend > self.config.backoff * entry_backend_ns
                    && t_backend > self.config.service_floor * inputs.backend.service_ns;
                let mut overload_run = if overloaded { overload_run + 1 } else { 0 };
                if overload_run >= self.config.exit_intervals.max(1) {
                    action = Action {
                        policy: None,
                        bypass: true,
                    };
                    backed_off = true;
                }
                // The burst changed character (see the module doc).
                let seen = bottleneck.then(|| characterize(&shares, &self.config.thresholds));
                let change = match (seen, change) {
                    (Some(n), _) if n == g || self.config.action_for(n) == action => None,
                    (Some(WorkloadGroup::Unclassified), _) | (None, _) => None,
                    (Some(n), Some((p, run))) if p == n => Some((n, run + 1)),
                    (Some(n), _) => Some((n, 1)),
                };
                let change = match change {
                    Some((n, run)) if run > self.config.enter_intervals.max(1) && !backed_off => {
                        g = n;
                        action = self.config.action_for(n);
                        entry_backend_ns = t_backend;
                        overload_run = 0;
                        None
                    }
                    other => other,
                };
                group = Some(g);
                if held > self.config.min_hold_intervals && calm_run >= self.config.exit_intervals.max(1) {
                    State::Watching { bottleneck_run: 0 }
                } else {
                    State::Balancing {
                        group: g,
                        action,
                        held,
                        peak_arrivals: peak,
                        calm_run,
                        entry_backend_ns,
                        overload_run,
                        backed_off,
                        change,
                    }
                }
            }
        };
        let action = self.action();
        Decision::new(inputs, shares, bottleneck, group, action, action != before)
    }

    fn action(&self) -> Action {
        match self.state {
            State::Watching { .. } => Action::default(),
            State::Balancing { action, .. } => action,
        }
    }

    fn bypass(&self, cache_now: &DeviceLoad, backend_now: &DeviceLoad) -> bool {
        self.action().bypass && backend_is_faster(cache_now, backend_now)
    }

    fn bypass_margin(&self) -> Option<f64> {
        self.action().bypass.then_some(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::QueueMix;

    const SSD: DeviceLoad = DeviceLoad {
        queued: 0.0,
        per_request_ns: 10_000.0,
        service_ns: 150_000.0,
    };
    const HDD: DeviceLoad = DeviceLoad {
        queued: 0.0,
        per_request_ns: 5_000_000.0,
        service_ns: 5_000_000.0,
    };

    /// An interval with `cache_queued` at the SSD, `backend_queued` at the
    /// HDD, the mix in percent and `arrivals` requests.
    fn interval(
        i: u64,
        cache_queued: f64,
        backend_queued: f64,
        mix: [f64; 4],
        arrivals: u64,
    ) -> IntervalInputs {
        IntervalInputs {
            interval: i,
            now_ns: (i + 1) * 1_000_000_000,
            cache: DeviceLoad {
                queued: cache_queued,
                ..SSD
            },
            backend: DeviceLoad {
                queued: backend_queued,
                ..HDD
            },
            cache_mix: QueueMix::new(mix[0], mix[1], mix[2], mix[3]),
            arrivals,
        }
    }

    const TPCC: [f64; 4] = [44.0, 2.2, 51.0, 2.8];
    const MAIL: [f64; 4] = [13.9, 70.4, 3.9, 11.8];
    const WRITES: [f64; 4] = [5.0, 60.0, 5.0, 30.0];

    #[test]
    fn eq1_decides_the_bottleneck() {
        let l = Lbica::new(LbicaConfig::default());
        // T_cache = 2000 × 10 µs = 20 ms; T_backend = 3 × 5 ms = 15 ms.
        let c = DeviceLoad {
            queued: 2000.0,
            ..SSD
        };
        let b = DeviceLoad { queued: 3.0, ..HDD };
        assert!(l.is_bottleneck(&c, &b));
        // 5 at the backend: 25 ms > 20 ms.
        assert!(!l.is_bottleneck(&c, &DeviceLoad { queued: 5.0, ..HDD }));
        // An idle backend and a short cache queue: Eq. 1 alone says yes,
        // the service floor says no (0.1 ms < 0.1 × 5 ms).
        let short = DeviceLoad { queued: 10.0, ..SSD };
        assert!(!l.is_bottleneck(&short, &HDD));
        let eq1_only = Lbica::new(LbicaConfig {
            service_floor: 0.0,
            own_floor: 0.0,
            ..LbicaConfig::default()
        });
        assert!(eq1_only.is_bottleneck(&short, &HDD));
        // Over a fast backend: a queue shorter than one cache service is
        // no bottleneck, however slower than the backend's it is.
        let fast_backend = DeviceLoad {
            queued: 0.1,
            per_request_ns: 10_000.0,
            service_ns: 70_000.0,
        };
        let fills = DeviceLoad { queued: 2.0, ..SSD };
        assert!(fills.queue_time_ns() > 0.1 * fast_backend.service_ns);
        assert!(!l.is_bottleneck(&fills, &fast_backend));
        let no_own_floor = Lbica::new(LbicaConfig {
            own_floor: 0.0,
            ..LbicaConfig::default()
        });
        assert!(no_own_floor.is_bottleneck(&fills, &fast_backend));
    }

    #[test]
    fn the_papers_examples_choose_the_papers_policies() {
        for (mix, action) in [
            (
                TPCC,
                Action {
                    policy: Some(WritePolicy::WriteOnly),
                    bypass: false,
                },
            ),
            (
                MAIL,
                Action {
                    policy: Some(WritePolicy::WriteAround),
                    bypass: false,
                },
            ),
            (
                WRITES,
                Action {
                    policy: None,
                    bypass: true,
                },
            ),
        ] {
            let mut l = Lbica::new(LbicaConfig::default());
            let quiet = l.on_interval(&interval(0, 10.0, 1.0, mix, 100));
            assert!(!quiet.bottleneck && !quiet.changed);
            assert_eq!(quiet.action, Action::default());
            let burst = l.on_interval(&interval(1, 3000.0, 1.0, mix, 1000));
            assert!(burst.bottleneck && burst.changed, "{burst:?}");
            assert_eq!(burst.action, action, "{mix:?}");
            assert_eq!(l.action(), action);
        }
        // A sequential read changes nothing: the cache is not what it waits for.
        let mut l = Lbica::new(LbicaConfig::default());
        let d = l.on_interval(&interval(0, 3000.0, 1.0, [5.0, 0.0, 95.0, 0.0], 1000));
        assert_eq!(d.group, Some(WorkloadGroup::SequentialRead));
        assert_eq!(d.action, Action::default());
        // A queue of read hits: the tail bypass, unless told to follow the
        // paper to the letter.
        let hits = [95.0, 4.5, 0.5, 0.0];
        let mut l = Lbica::new(LbicaConfig::default());
        let d = l.on_interval(&interval(0, 3000.0, 1.0, hits, 1000));
        assert_eq!(d.group, Some(WorkloadGroup::Unclassified));
        assert_eq!(
            d.action,
            Action {
                policy: None,
                bypass: true
            }
        );
        let mut strict = Lbica::new(LbicaConfig {
            unclassified_bypass: false,
            ..LbicaConfig::default()
        });
        let d = strict.on_interval(&interval(0, 3000.0, 1.0, hits, 1000));
        assert_eq!((d.action, d.changed), (Action::default(), false));
    }

    #[test]
    fn a_burst_that_changes_character_gets_the_new_groups_policy() {
        // The mail server's sequence within one burst: mixed (RO), then
        // random reads (WO), then writes (write-back and the tail bypass),
        // the cache the bottleneck throughout. Each change takes two
        // intervals of the new group; a single odd interval changes nothing.
        let mut l = Lbica::new(LbicaConfig::default());
        let mut i = 0;
        let mut step = |mix: [f64; 4]| {
            i += 1;
            l.on_interval(&interval(i, 3000.0, 1.0, mix, 1000))
        };
        assert_eq!(step(MAIL).action.policy, Some(WritePolicy::WriteAround));
        assert_eq!(step(TPCC).action.policy, Some(WritePolicy::WriteAround));
        assert_eq!(
            step(MAIL).action.policy,
            Some(WritePolicy::WriteAround),
            "one odd interval"
        );
        assert_eq!(step(TPCC).action.policy, Some(WritePolicy::WriteAround));
        let d = step(TPCC);
        assert_eq!((d.action.policy, d.changed), (Some(WritePolicy::WriteOnly), true));
        assert_eq!(d.group, Some(WorkloadGroup::RandomRead));
        step(WRITES);
        let d = step(WRITES);
        assert_eq!(
            d.action,
            Action {
                policy: None,
                bypass: true
            }
        );
        // Once the cache is no longer the bottleneck, nothing is judged.
        let d = l.on_interval(&interval(9, 10.0, 1.0, MAIL, 1000));
        assert_eq!(d.action.policy, None);
    }

    #[test]
    fn tail_bypass_only_where_the_backend_is_faster() {
        let mut l = Lbica::new(LbicaConfig::default());
        l.on_interval(&interval(0, 3000.0, 1.0, WRITES, 1000));
        // Backend: 1 × 5 ms + 5 ms = 10 ms. Cache: Q × 10 µs + 0.15 ms.
        let b = DeviceLoad { queued: 1.0, ..HDD };
        assert!(!l.bypass(&DeviceLoad { queued: 900.0, ..SSD }, &b));
        assert!(l.bypass(
            &DeviceLoad {
                queued: 1000.0,
                ..SSD
            },
            &b
        ));
        assert_eq!(l.bypass_margin(), Some(1.0));
        // No bypass outside an episode or under WO.
        let mut w = Lbica::new(LbicaConfig::default());
        assert_eq!(w.bypass_margin(), None);
        assert!(!w.bypass(
            &DeviceLoad {
                queued: 5000.0,
                ..SSD
            },
            &b
        ));
        w.on_interval(&interval(0, 3000.0, 1.0, TPCC, 1000));
        assert!(!w.bypass(
            &DeviceLoad {
                queued: 5000.0,
                ..SSD
            },
            &b
        ));
        assert_eq!(w.bypass_margin(), None);
    }

    #[test]
    fn hysteresis_holds_through_a_drained_queue_and_exits_when_calm() {
        let config = LbicaConfig {
            enter_intervals: 2,
            min_hold_intervals: 3,
            exit_intervals: 2,
            ..LbicaConfig::default()
        };
        let mut l = Lbica::new(config);
        let wo = Some(WritePolicy::WriteOnly);
        // One bottleneck interval is not enough, and a break resets the count.
        let steps: Vec<(f64, u64, Option<WritePolicy>)> = vec![
            (3000.0, 1000, None),
            (10.0, 1000, None),
            (3000.0, 1000, None),
            (3000.0, 1000, wo), // second in a row: WO
            // The queue drains under WO while the burst goes on: held.
            (10.0, 1000, wo),
            (10.0, 1000, wo),
            (10.0, 1000, wo),
            // Calm (at most half the peak) and the hold is over, but one
            // calm interval is not two.
            (10.0, 400, wo),
            // A burst interval between calm ones resets the calm count.
            (10.0, 1000, wo),
            (10.0, 500, wo),
            (10.0, 100, None), // two calm in a row: back to the configured policy
            (10.0, 100, None),
        ];
        let mut changes = 0;
        for (i, &(queued, arrivals, want)) in steps.iter().enumerate() {
            let d = l.on_interval(&interval(i as u64, queued, 1.0, TPCC, arrivals));
            assert_eq!(d.action.policy, want, "interval {i}: {d:?}");
            changes += d.changed as u32;
        }
        assert_eq!(changes, 2);
    }

    #[test]
    fn a_policy_that_overloads_the_backend_is_withdrawn() {
        let ra = Some(WritePolicy::WriteAround);
        let run = |backoff: f64| -> Vec<(Option<WritePolicy>, bool)> {
            let mut l = Lbica::new(LbicaConfig {
                backoff,
                ..LbicaConfig::default()
            });
            // RO sends the writes to the disks: their queue grows from 1 to
            // 20 while the burst lasts, then the burst calms.
            let steps = [
                (3000.0, 1.0, 1000),
                (50.0, 3.0, 1000),
                (10.0, 10.0, 1000),
                (10.0, 20.0, 1000),
                (10.0, 20.0, 1000),
                (10.0, 1.0, 100),
                (10.0, 1.0, 100),
            ];
            steps
                .iter()
                .enumerate()
                .map(|(i, &(c, b, arrivals))| {
                    let d = l.on_interval(&interval(i as u64, c, b, MAIL, arrivals));
                    (d.action.policy, d.action.bypass)
                })
                .collect()
        };
        // T_backend: 5 ms at entry, then 15 and 50 ms against T_cache at
        // most 0.5 ms: overloaded twice in a row, withdrawn.
        assert_eq!(
            run(2.0),
            [
                (ra, false),
                (ra, false),
                (None, true),
                (None, true),
                (None, true),
                (None, true),
                (None, false)
            ]
        );
        // Off, RO stays until the burst calms.
        assert_eq!(
            run(0.0),
            [
                (ra, false),
                (ra, false),
                (ra, false),
                (ra, false),
                (ra, false),
                (ra, false),
                (None, false)
            ]
        );
        // Far from doubling (a random-read burst's misses, as under WB): kept.
        let mut l = Lbica::new(LbicaConfig::default());
        for (i, b) in [4.0, 5.0, 5.0, 5.0].into_iter().enumerate() {
            let c = if i == 0 { 3000.0 } else { 10.0 };
            let d = l.on_interval(&interval(i as u64, c, b, TPCC, 1000));
            assert_eq!(d.action.policy, Some(WritePolicy::WriteOnly), "{i}");
        }
    }

    #[test]
    fn the_hold_is_a_minimum() {
        let mut l = Lbica::new(LbicaConfig {
            min_hold_intervals: 4,
            exit_intervals: 1,
            ..LbicaConfig::default()
        });
        let policies: Vec<Option<WritePolicy>> = [1000, 10, 10, 10, 10, 10]
            .iter()
            .enumerate()
            .map(|(i, &arrivals)| {
                let queued = if i == 0 { 3000.0 } else { 10.0 };
                l.on_interval(&interval(i as u64, queued, 1.0, MAIL, arrivals))
                    .action
                    .policy
            })
            .collect();
        let ra = Some(WritePolicy::WriteAround);
        assert_eq!(policies, [ra, ra, ra, ra, None, None]);
    }
}
