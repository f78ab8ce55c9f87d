//! `--adapt` end to end on generated bursts (`iocache_sim::burst`): LBICA
//! switches the cache's policy when a burst makes the cache device the
//! bottleneck and switches back when it ends; and with every controller
//! deciding from the modelled queues, a data model of the devices (one
//! version per line) never returns stale data and loses no write.

use std::collections::HashMap;

use iocache_core::{
    AccessHints, Cache, CacheConfig, FlushOrder, IoKind, LineSize, Op, OpList, PolicySpec, Request,
    WritePolicy,
};
use iocache_sim::burst::BurstSpec;
use iocache_sim::timing::{ArrivalMode, DeviceSpec, Replay, TimingConfig, TimingModel};
use iocache_sim::{simulate, AdaptReport, AdaptSpec, Adapter, CacheSize, SimOptions, TimingSetup};
use iocache_trace::TraceFormat;

mod common;

use common::memory_reader;

const LINE: u64 = 4096;
const INTERVAL_NS: u64 = 50_000_000;

/// One cache server of 100 µs over 64 backend servers of 5 ms: the cache
/// saturates at 10,000 line I/Os per second, the backend at 12,800.
fn devices() -> (DeviceSpec, DeviceSpec) {
    (
        DeviceSpec::fixed("cache", 1, 100_000),
        DeviceSpec::fixed("backend", 64, 5_000_000),
    )
}

/// Random-read bursts: 700 ms at 200 requests/s, then 300 ms at 15,000,
/// three times, and 700 ms quiet again; 95 % reads, 60 % to a cached hot
/// set. In a burst WB puts
/// 15,000 line I/Os per second on the cache (hits, promotions, writes),
/// WO about 9,300 (no promotions).
fn random_read_bursts() -> BurstSpec {
    BurstSpec {
        phases: [
            "700ms@200",
            "300ms@15000",
            "700ms@200",
            "300ms@15000",
            "700ms@200",
            "300ms@15000",
            "700ms@200",
        ]
        .iter()
        .map(|p| format!("{p}:read=0.95:hot=0.6").parse().unwrap())
        .collect(),
        repeat: 1,
        hot_lines: 2000,
        cold_lines: 1_000_000,
        line_bytes: LINE,
        warm_lines_per_request: 64,
        warm_gap_ns: 2_000_000,
        seed: 7,
    }
}

fn simulate_with(spec: &BurstSpec, write_policy: WritePolicy, adapt: Option<&str>) -> iocache_sim::RunResult {
    let mut text = Vec::new();
    spec.write_disksim(&mut text).unwrap();
    let mut reader = memory_reader(text, TraceFormat::Disksim);
    let specs = common::specs(
        &[PolicySpec::lru()],
        &[CacheSize::Lines(4096)],
        LINE,
        write_policy,
    );
    let (cache, backend) = devices();
    let options = SimOptions {
        warmup_requests: spec.warm_requests(),
        threads: 1,
        timing: Some(TimingSetup {
            cache,
            backend,
            arrivals: ArrivalMode::Open { speed: 1.0 },
            series_interval_ns: Some(INTERVAL_NS),
        }),
        reconfigure: Vec::new(),
        reca: None,
        adapt: adapt.map(|a| a.parse().unwrap()),
        restarts: None,
        tally: Default::default(),
    };
    let mut report = simulate(&mut reader, &specs, &options, &mut |_, _| {}).unwrap();
    report.runs.remove(0)
}

/// Where an interval starting at `start_ns` lies in the phases of
/// [`random_read_bursts`]: the time since the phases began, modulo their
/// 1 s period, at its start and end; `None` during the warm-up.
fn phase_offsets(spec: &BurstSpec, start_ns: u64) -> Option<(u64, u64)> {
    let phases_start = spec.warm_requests() * spec.warm_gap_ns;
    let at = start_ns.checked_sub(phases_start)? % 1_000_000_000;
    Some((at, at + INTERVAL_NS))
}

/// The interval overlaps a burst.
fn in_burst(spec: &BurstSpec, start_ns: u64) -> bool {
    phase_offsets(spec, start_ns).is_some_and(|(a, b)| a >= 700_000_000 || b > 700_000_000)
}

/// The interval lies in a quiet phase, at least 100 ms after a burst.
fn quiet(spec: &BurstSpec, start_ns: u64) -> bool {
    phase_offsets(spec, start_ns).is_some_and(|(a, b)| a >= 100_000_000 && b <= 700_000_000)
}

#[test]
fn lbica_switches_to_wo_in_each_burst_and_back_after_it() {
    let spec = random_read_bursts();
    let lbica = simulate_with(&spec, WritePolicy::WriteBack, Some("lbica"));
    let adapt: &AdaptReport = lbica.adapt.as_ref().unwrap();
    assert_eq!(adapt.interval_ns, INTERVAL_NS, "the series interval by default");
    let changes: Vec<(u64, &str)> = adapt
        .rows
        .iter()
        .filter(|r| r.changed)
        .map(|r| (r.start_ns, r.policy.as_str()))
        .collect();
    // Three bursts: WO at the first interval of each, WB after it.
    assert_eq!(
        changes.iter().map(|c| c.1).collect::<Vec<_>>(),
        ["wo", "wb", "wo", "wb", "wo", "wb"],
        "{changes:?}"
    );
    for pair in changes.chunks(2) {
        assert!(in_burst(&spec, pair[0].0), "WO set outside a burst: {changes:?}");
        assert!(!in_burst(&spec, pair[1].0), "WB back inside a burst: {changes:?}");
    }
    // Every switch to WO came from a random-read queue with the cache the bottleneck.
    for row in adapt.rows.iter().filter(|r| r.changed && r.policy == "wo") {
        assert!(row.bottleneck && row.group == "random-read", "{row:?}");
        assert!(row.cache_queue_time_ns > row.backend_queue_time_ns, "{row:?}");
        assert!(row.share_r + row.share_p > 0.8, "{row:?}");
    }
    // Under WO no line is promoted: from the second interval under WO on
    // (the first still holds fills queued before the switch), no P.
    let wo_rows: Vec<_> = adapt
        .rows
        .windows(2)
        .filter(|w| w[0].policy == "wo" && !w[0].changed)
        .map(|w| &w[1])
        .collect();
    assert!(
        wo_rows.len() >= 6 && wo_rows.iter().all(|r| r.share_p < 0.01),
        "{wo_rows:?}"
    );

    let wb = simulate_with(&spec, WritePolicy::WriteBack, None);
    let mean = |r: &iocache_sim::RunResult| r.timing.as_ref().unwrap().all.mean_ns;
    assert!(
        mean(&lbica) < 0.5 * mean(&wb),
        "LBICA {} ns vs WB {} ns",
        mean(&lbica),
        mean(&wb)
    );
    assert!(wb.adapt.is_none());

    // Observing measures without changing anything, and shows the queue
    // LBICA kept shorter in the bursts (the paper's Fig. 4).
    let observed = simulate_with(&spec, WritePolicy::WriteBack, Some("observe"));
    assert_eq!(mean(&observed), mean(&wb));
    assert_eq!(observed.stats, wb.stats);
    let peak = |r: &iocache_sim::RunResult| {
        r.adapt
            .as_ref()
            .unwrap()
            .rows
            .iter()
            .filter(|row| in_burst(&spec, row.start_ns))
            .map(|row| row.max_cache_queue_time_ns)
            .fold(0.0, f64::max)
    };
    let observed_adapt = observed.adapt.as_ref().unwrap();
    assert_eq!(observed_adapt.switches + observed_adapt.bypassed, 0);
    assert!(
        peak(&lbica) < 0.5 * peak(&observed),
        "{} vs {}",
        peak(&lbica),
        peak(&observed)
    );
}

#[test]
fn sib_bypasses_only_while_the_cache_queue_is_long() {
    let spec = random_read_bursts();
    let sib = simulate_with(&spec, WritePolicy::WriteThrough, Some("sib"));
    let adapt = sib.adapt.as_ref().unwrap();
    assert_eq!(adapt.switches, 0);
    assert!(adapt.bypassed > 1000, "{}", adapt.bypassed);
    // The report counts the warm-up's bypasses too, the stats do not.
    assert!(sib.stats.balance_bypasses > 0 && sib.stats.balance_bypasses <= adapt.bypassed);
    let quiet_rows: Vec<_> = adapt.rows.iter().filter(|r| quiet(&spec, r.start_ns)).collect();
    assert!(quiet_rows.len() >= 30);
    for row in quiet_rows {
        assert_eq!(row.bypassed, 0, "a bypass in a quiet interval: {row:?}");
    }
    let burst_bypasses: u64 = adapt
        .rows
        .iter()
        .filter(|r| in_burst(&spec, r.start_ns))
        .map(|r| r.bypassed)
        .sum();
    assert!(burst_bypasses > 1000, "{burst_bypasses}");
}

/// Runs a burst through cache, timing model and controller, executing the
/// ops on line-granular devices and checking every read.
fn data_check(spec: &BurstSpec, configured: WritePolicy, adapt: &str) -> (AdaptReport, u64) {
    let (cache_dev, backend_dev) = devices();
    let mut cache = Cache::new({
        let mut c = CacheConfig::new(256, LineSize::new(LINE).unwrap(), PolicySpec::lru());
        c.write_policy = configured;
        c
    })
    .unwrap();
    let mut model = TimingModel::new(&TimingConfig {
        cache: cache_dev.clone(),
        backend: backend_dev.clone(),
        line_bytes: LINE,
        series_interval_ns: None,
    })
    .unwrap();
    model.track_queues();
    let mut replay = Replay::new(ArrivalMode::Open { speed: 1.0 }).unwrap();
    let spec_adapt: AdaptSpec = adapt.parse().unwrap();
    let mut adapter = Adapter::new(&spec_adapt, &cache_dev, &backend_dev, LINE, Some(INTERVAL_NS));
    let mut requests = Vec::new();
    spec.generate(|t, kind, offset, length| requests.push((t, kind, offset, length)));

    // Versions: the latest written per line, the backend's, the cache slots'.
    let mut latest: HashMap<u64, u64> = HashMap::new();
    let mut backend: HashMap<u64, u64> = HashMap::new();
    let mut slots: HashMap<u32, u64> = HashMap::new();
    let mut ops = OpList::new();
    let mut version = 0u64;
    for (i, &(t, kind, offset, length)) in requests.iter().enumerate() {
        let now = replay.next_arrival(&mut model, t);
        let request = Request {
            volume: 0,
            offset_bytes: offset,
            length_bytes: length,
            kind,
            now_ns: now,
            process: 0,
        };
        let hints: AccessHints = adapter.before_request(now, kind, &mut cache, &mut model);
        cache.access_with(&request, hints, &mut ops).unwrap();
        // The request's buffer: one version per line.
        let lines = (length / LINE) as usize;
        let mut buffer = vec![0u64; lines];
        if kind == IoKind::Write {
            for (j, b) in buffer.iter_mut().enumerate() {
                version += 1;
                *b = version;
                latest.insert(offset / LINE + j as u64, version);
            }
        }
        for op in ops.ops() {
            match *op {
                Op::ReadCache {
                    slot,
                    buffer_offset_bytes,
                    ..
                } => buffer[(buffer_offset_bytes / LINE) as usize] = slots.get(&slot).copied().unwrap_or(0),
                Op::ReadBackend {
                    offset_bytes,
                    length_bytes,
                    buffer_offset_bytes,
                    ..
                } => {
                    for k in 0..length_bytes / LINE {
                        buffer[(buffer_offset_bytes / LINE + k) as usize] =
                            backend.get(&(offset_bytes / LINE + k)).copied().unwrap_or(0);
                    }
                }
                Op::WriteCache {
                    slot,
                    buffer_offset_bytes,
                    ..
                } => {
                    slots.insert(slot, buffer[(buffer_offset_bytes / LINE) as usize]);
                }
                Op::WriteBackend {
                    offset_bytes,
                    length_bytes,
                    buffer_offset_bytes,
                    ..
                } => {
                    for k in 0..length_bytes / LINE {
                        backend.insert(
                            offset_bytes / LINE + k,
                            buffer[(buffer_offset_bytes / LINE + k) as usize],
                        );
                    }
                }
                Op::WriteBack {
                    slot, offset_bytes, ..
                } => {
                    backend.insert(offset_bytes / LINE, slots.get(&slot).copied().unwrap_or(0));
                }
                Op::Invalidate { .. } => {}
            }
        }
        if kind == IoKind::Read {
            for (j, &got) in buffer.iter().enumerate() {
                let line = offset / LINE + j as u64;
                assert_eq!(
                    got,
                    latest.get(&line).copied().unwrap_or(0),
                    "request {i}: stale line {line}"
                );
            }
        }
        model.submit(now, kind, ops.ops());
        if i % 997 == 0 {
            cache.check_invariants();
        }
    }
    cache.check_invariants();
    let report = adapter.finish(&mut cache);
    // Flush everything: the backend then holds every write.
    let mut tokens = Vec::new();
    while cache.dirty_lines() > 0 {
        cache.begin_flush(FlushOrder::Oldest, 64, &mut ops, &mut tokens);
        for op in ops.ops() {
            if let Op::WriteBack {
                slot, offset_bytes, ..
            } = *op
            {
                backend.insert(offset_bytes / LINE, slots[&slot]);
            }
        }
        for token in &tokens {
            assert!(cache.complete_flush(token, true));
        }
    }
    for (line, v) in &latest {
        assert_eq!(backend.get(line), Some(v), "line {line} lost its write");
    }
    (report, cache.stats().balance_bypasses)
}

/// Bursts of every kind: random reads, mixed read-write on the hot set,
/// writes to cold lines (dirty evictions).
fn mixed_bursts() -> BurstSpec {
    BurstSpec {
        phases: vec![
            "300ms@200:read=0.7:hot=0.7".parse().unwrap(),
            "200ms@15000:read=0.95:hot=0.6".parse().unwrap(),
            "300ms@200:read=0.7:hot=0.7".parse().unwrap(),
            "200ms@15000:read=0.3:hot=0.9".parse().unwrap(),
            "300ms@200:read=0.7:hot=0.7".parse().unwrap(),
            "200ms@15000:read=0.1:hot=0.1".parse().unwrap(),
        ],
        repeat: 1,
        hot_lines: 200,
        cold_lines: 5000,
        line_bytes: LINE,
        warm_lines_per_request: 16,
        warm_gap_ns: 2_000_000,
        seed: 11,
    }
}

#[test]
fn controlled_caches_never_serve_stale_data_nor_lose_writes() {
    let spec = mixed_bursts();
    let (lbica, lbica_bypasses) = data_check(&spec, WritePolicy::WriteBack, "lbica:interval=20ms");
    let policies: Vec<&str> = lbica
        .rows
        .iter()
        .filter(|r| r.changed)
        .map(|r| r.policy.as_str())
        .collect();
    // The test exercises what it claims to: each burst its policy (random
    // read: WO; mixed: RO; writes to cold lines: WB with tail bypass), and
    // bypassed requests.
    for policy in ["wo", "wa", "wb+bypass"] {
        assert!(policies.contains(&policy), "{policy} missing: {policies:?}");
    }
    assert!(lbica_bypasses > 100, "{lbica_bypasses}");
    let (_, sib_bypasses) = data_check(&spec, WritePolicy::WriteOnly, "sib");
    assert!(sib_bypasses > 100, "{sib_bypasses}");
}

/// A steady load that keeps an NVMe cache a few per cent busy over an SSD
/// array (50,000 reads/s, 40 % to a warm hot set, the rest cold fills): its
/// queue of fills is shorter than one of the cache's own services, which
/// Eq. 1 with the backend floor alone calls a bottleneck (WO, held for
/// good: a steady load never calms). With the cache's own floor LBICA
/// leaves it alone.
#[test]
fn a_steady_light_load_over_a_fast_backend_is_no_bottleneck() {
    let spec = BurstSpec {
        phases: vec!["3s@50000:read=1.0:hot=0.4".parse().unwrap()],
        repeat: 1,
        hot_lines: 16_384,
        cold_lines: 1 << 22,
        line_bytes: LINE,
        warm_lines_per_request: 64,
        warm_gap_ns: 2_000_000,
        seed: 1,
    };
    let mut text = Vec::new();
    spec.write_disksim(&mut text).unwrap();
    let run = |adapt: &str| {
        let mut reader = memory_reader(text.clone(), TraceFormat::Disksim);
        let specs = common::specs(
            &[PolicySpec::lru()],
            &[CacheSize::Lines(16_384)],
            LINE,
            WritePolicy::WriteBack,
        );
        let options = SimOptions {
            warmup_requests: spec.warm_requests(),
            threads: 1,
            timing: Some(TimingSetup {
                cache: iocache_sim::timing::parse_device("nvme").unwrap(),
                backend: iocache_sim::timing::parse_device("ssd-raid5").unwrap(),
                arrivals: ArrivalMode::Open { speed: 1.0 },
                series_interval_ns: Some(100_000_000),
            }),
            adapt: Some(adapt.parse().unwrap()),
            ..SimOptions::default()
        };
        let mut report = simulate(&mut reader, &specs, &options, &mut |_, _| {}).unwrap();
        let run = report.runs.remove(0);
        (run.timing.unwrap(), run.adapt.unwrap())
    };
    let (timing, adapt) = run("lbica");
    assert!(
        timing.cache_device.utilization < 0.2,
        "{}",
        timing.cache_device.utilization
    );
    assert_eq!(adapt.switches, 0, "{adapt:?}");
    let (_, without_own_floor) = run("lbica:own-floor=0");
    assert!(without_own_floor.switches >= 1, "{without_own_floor:?}");
}
