//! The device timing model against queueing theory and hand-computed
//! schedules: zero wait when arrivals are spaced, (N−1)s/2 for a burst, M/D/1
//! mean wait, k-way parallel completion, closed-loop Little's law,
//! utilization, the dependency rules of a request's ops, and random property
//! checks (completion ≥ arrival + service, FIFO per device, at most k in
//! service).

use iocache_core::{Cache, CacheConfig, IoKind, LineSize, Op, OpList, PolicySpec, Request, WritePolicy};
use iocache_sim::timing::device::{Device, Scheduled};
use iocache_sim::timing::rng::SplitMix64;
use iocache_sim::timing::{
    parse_device, preset, ArrivalMode, DeviceSpec, Dir, FlashSpec, OpCost, QueueSpec, Replay, TimingConfig,
    TimingModel, TimingReport,
};

const LINE: u64 = 4096;

fn model(cache: DeviceSpec, backend: DeviceSpec, series: Option<u64>) -> TimingModel {
    TimingModel::new(&TimingConfig {
        cache,
        backend,
        line_bytes: LINE,
        series_interval_ns: series,
    })
    .unwrap()
}

/// Cache: `k` servers of fixed service `s`; backend: one server of 1000 ns.
fn fixed_model(k: u32, s: u64) -> TimingModel {
    model(
        DeviceSpec::fixed("c", k, s),
        DeviceSpec::fixed("b", 1, 1000),
        None,
    )
}

fn read_cache(slot: u32) -> Op {
    Op::ReadCache {
        slot,
        line_offset_bytes: 0,
        length_bytes: LINE as u32,
        buffer_offset_bytes: 0,
    }
}

fn write_cache(slot: u32, buffer: u64) -> Op {
    Op::WriteCache {
        slot,
        line_offset_bytes: 0,
        length_bytes: LINE as u32,
        buffer_offset_bytes: buffer,
        dirty: false,
        fresh: true,
    }
}

fn read_backend(offset: u64, buffer: u64) -> Op {
    Op::ReadBackend {
        volume: 0,
        offset_bytes: offset,
        length_bytes: LINE,
        buffer_offset_bytes: buffer,
    }
}

fn write_backend(offset: u64) -> Op {
    Op::WriteBackend {
        volume: 0,
        offset_bytes: offset,
        length_bytes: LINE,
        buffer_offset_bytes: 0,
    }
}

fn write_back(slot: u32, offset: u64) -> Op {
    Op::WriteBack {
        slot,
        line_offset_bytes: 0,
        length_bytes: LINE as u32,
        volume: 0,
        offset_bytes: offset,
    }
}

/// Every completion not yet returned (needs `track_completions(true)` before
/// submitting when submissions process completions).
fn completions(m: &mut TimingModel) -> Vec<(u64, u64)> {
    std::iter::from_fn(|| m.next_completion())
        .map(|c| (c.id, c.completion_ns))
        .collect()
}

#[test]
fn spaced_arrivals_never_wait() {
    let mut m = fixed_model(1, 1000);
    for i in 0..100 {
        m.submit(i * 2000, IoKind::Read, &[read_cache(0)]);
    }
    let r = m.finish();
    assert_eq!(r.reads, 100);
    assert_eq!(
        (r.read.mean_ns, r.read.p50_ns, r.read.max_ns),
        (1000.0, 1000, 1000)
    );
    assert_eq!(r.cache_device.mean_wait_ns, 0.0);
    assert_eq!(r.cache_device.mean_waiting, 0.0);
    // Busy 100 × 1000 over 99 × 2000 + 1000.
    assert_eq!(r.span_ns, 199_000);
    assert!((r.cache_device.utilization - 100_000.0 / 199_000.0).abs() < 1e-12);
}

/// N requests at once on one server of service s: the i-th (from 0) waits
/// i·s, so the mean wait is (N−1)s/2 and the mean latency (N+1)s/2.
#[test]
fn a_burst_waits_n_minus_one_s_over_two() {
    let (n, s) = (10u64, 1000u64);
    let mut m = fixed_model(1, s);
    for _ in 0..n {
        m.submit(0, IoKind::Read, &[read_cache(0)]);
    }
    let got = completions(&mut m);
    assert_eq!(got, (0..n).map(|i| (i, (i + 1) * s)).collect::<Vec<_>>());
    let r = m.finish();
    assert_eq!(r.cache_device.mean_wait_ns, ((n - 1) * s) as f64 / 2.0);
    assert_eq!(r.read.mean_ns, ((n + 1) * s) as f64 / 2.0);
}

/// k servers and a burst of 3k: k complete at s, k at 2s, k at 3s.
#[test]
fn k_servers_complete_a_burst_k_at_a_time() {
    let (k, s) = (4u64, 1000u64);
    let mut m = fixed_model(k as u32, s);
    for _ in 0..3 * k {
        m.submit(0, IoKind::Read, &[read_cache(0)]);
    }
    let times: Vec<u64> = completions(&mut m).into_iter().map(|(_, t)| t).collect();
    let want: Vec<u64> = (0..3 * k).map(|i| (i / k + 1) * s).collect();
    assert_eq!(times, want);
    let r = m.finish();
    assert_eq!(r.cache_device.busy_ns, 3 * k * s);
    assert!((r.cache_device.utilization - 1.0).abs() < 1e-12);
}

/// M/D/1: Poisson arrivals at rate λ into one server of deterministic
/// service s; Pollaczek–Khinchine gives the mean wait ρs / (2(1 − ρ)).
#[test]
fn md1_mean_wait_matches_pollaczek_khinchine() {
    let s = 1000u64;
    for (rho, tolerance) in [(0.5, 0.03), (0.8, 0.06)] {
        let mut m = fixed_model(1, s);
        let mut rng = SplitMix64::new(2024);
        let mut t = 0.0;
        let n = 400_000;
        for _ in 0..n {
            t += rng.exponential(s as f64 / rho);
            m.submit(t as u64, IoKind::Read, &[read_cache(0)]);
        }
        let r = m.finish();
        let want = rho * s as f64 / (2.0 * (1.0 - rho));
        let got = r.cache_device.mean_wait_ns;
        assert!(
            (got - want).abs() / want < tolerance,
            "rho {rho}: {got} vs {want}"
        );
        // Utilization → ρ, and Little's law: Lq = λ Wq.
        assert!(
            (r.cache_device.utilization - rho).abs() < 0.01,
            "{}",
            r.cache_device.utilization
        );
        let lambda = n as f64 / r.span_ns as f64;
        assert!((r.cache_device.mean_waiting - lambda * got).abs() < 1e-9 * got.max(1.0));
    }
}

/// Closed loop with N outstanding on one server of service s: throughput is
/// 1/s and, past the first N, every latency is N·s (Little's law: N = X·R).
#[test]
fn closed_loop_obeys_littles_law() {
    let (n, s, requests) = (8u32, 1000u64, 10_000u64);
    let mut m = fixed_model(1, s);
    let mut replay = Replay::new(ArrivalMode::Closed { outstanding: n }).unwrap();
    for i in 0..requests {
        // The trace time is ignored.
        let at = replay.next_arrival(&mut m, i * 1_000_000_000);
        assert!(m.in_flight() < n as usize);
        m.submit(at, IoKind::Read, &[read_cache(0)]);
        assert!(m.in_flight() <= n as usize);
    }
    let r = m.finish();
    assert_eq!(r.requests, requests);
    assert!((r.iops - 1e9 / s as f64).abs() < 1e-6, "{}", r.iops);
    assert_eq!(r.read.p50_ns, n as u64 * s);
    assert_eq!(r.read.max_ns, n as u64 * s);
    let mean = r.read.mean_ns;
    assert!((mean - (n as u64 * s) as f64).abs() / mean < 0.001, "{mean}");
}

/// Bounded clients: a burst at one trace time is issued N at once, then one
/// per completion (every latency N·s, not the open loop's growing queue);
/// once the clients are free, requests arrive at trace time / speed.
#[test]
fn bounded_clients_keep_trace_time_but_cap_what_is_outstanding() {
    let (n, s) = (2u32, 1000u64);
    let mut m = fixed_model(1, s);
    let mut replay = Replay::new(ArrivalMode::Clients {
        speed: 2.0,
        outstanding: n,
    })
    .unwrap();
    let mut arrivals = Vec::new();
    for _ in 0..10 {
        let at = replay.next_arrival(&mut m, 3_000_000);
        assert!(m.in_flight() < n as usize);
        m.submit(at, IoKind::Read, &[read_cache(0)]);
        arrivals.push(at);
    }
    assert_eq!(arrivals, [0, 0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000]);
    // 2 ms of trace time later at speed 2: 1 ms, long after the burst drained.
    assert_eq!(replay.next_arrival(&mut m, 5_000_000), 1_000_000);
    m.submit(1_000_000, IoKind::Read, &[read_cache(0)]);
    let r = m.finish();
    assert_eq!(r.requests, 11);
    assert_eq!(r.read.max_ns, n as u64 * s);
    // The same burst open loop: the tenth waits behind nine.
    let mut m = fixed_model(1, s);
    let mut replay = Replay::new(ArrivalMode::Open { speed: 2.0 }).unwrap();
    for _ in 0..10 {
        let at = replay.next_arrival(&mut m, 3_000_000);
        m.submit(at, IoKind::Read, &[read_cache(0)]);
    }
    assert_eq!(m.finish().read.max_ns, 10 * s);
    for (speed, outstanding) in [(0.0, 1), (f64::NAN, 1), (1.0, 0)] {
        assert!(Replay::new(ArrivalMode::Clients { speed, outstanding }).is_err());
    }
}

#[test]
fn open_loop_divides_trace_time_by_the_speed() {
    let mut m = fixed_model(1, 10);
    let mut replay = Replay::new(ArrivalMode::Open { speed: 20.0 }).unwrap();
    assert_eq!(replay.next_arrival(&mut m, 5_000_000), 0);
    assert_eq!(replay.next_arrival(&mut m, 7_000_000), 100_000);
    m.submit(200_000, IoKind::Read, &[read_cache(0)]);
    // Earlier than the clock: moved to the clock.
    assert_eq!(replay.next_arrival(&mut m, 6_000_000), 200_000);
    assert!(Replay::new(ArrivalMode::Open { speed: 0.0 }).is_err());
    assert!(Replay::new(ArrivalMode::Closed { outstanding: 0 }).is_err());
}

#[test]
fn utilization_is_busy_time_over_span() {
    let mut m = fixed_model(2, 300);
    let mut rng = SplitMix64::new(5);
    let mut t = 0;
    let mut busy = 0;
    for _ in 0..1000 {
        t += rng.below(400);
        m.submit(t, IoKind::Read, &[read_cache(0)]);
        busy += 300;
    }
    let r = m.finish();
    assert_eq!(r.cache_device.busy_ns, busy);
    let want = busy as f64 / (2.0 * r.span_ns as f64);
    assert!((r.cache_device.utilization - want).abs() < 1e-12);
}

// ---- What the client waits for ----

/// Cache 100 ns, backend 1000 ns, one server each.
fn two_speed() -> TimingModel {
    let mut m = model(
        DeviceSpec::fixed("c", 1, 100),
        DeviceSpec::fixed("b", 1, 1000),
        None,
    );
    m.track_completions(true);
    m
}

#[test]
fn a_read_miss_does_not_wait_for_its_fill() {
    let mut m = two_speed();
    // Miss: backend read 0..1000, fill on the cache 1000..1100 in the background.
    m.submit(0, IoKind::Read, &[read_backend(0, 0), write_cache(3, 0)]);
    // A hit arriving at 1000 queues behind the fill: 1100..1200.
    m.submit(1000, IoKind::Read, &[read_cache(7)]);
    assert_eq!(completions(&mut m), [(0, 1000), (1, 1200)]);
    let r = m.finish();
    assert_eq!(r.cache_device.write_ops, 1);
    assert_eq!(r.end_ns, 1200);
}

#[test]
fn a_write_miss_waits_for_the_victims_write_back() {
    let mut m = two_speed();
    // Victim slot 0: cache read 0..100, backend write 100..1100; then the
    // client's data into slot 0: 1100..1200.
    let ops = [
        write_back(0, 8192),
        Op::Invalidate {
            slot: 0,
            key: iocache_core::LineKey {
                volume: 0,
                line_index: 2,
            },
        },
        write_cache(0, 0),
    ];
    m.submit(0, IoKind::Write, &ops);
    assert_eq!(completions(&mut m), [(0, 1200)]);
}

#[test]
fn write_through_waits_for_both_devices() {
    let mut m = two_speed();
    m.submit(0, IoKind::Write, &[write_backend(0), write_cache(1, 0)]);
    assert_eq!(completions(&mut m), [(0, 1000)]);
}

#[test]
fn a_read_of_a_line_just_written_back_waits_for_the_write_back() {
    let mut m = two_speed();
    // The request evicts dirty line 1 (slot 5), then reads line 1 from the
    // backend: cache read 0..100, backend write 100..1100, backend read 1100..2100.
    m.submit(0, IoKind::Read, &[write_back(5, 4096), read_backend(4096, 0)]);
    assert_eq!(completions(&mut m), [(0, 2100)]);
    // A write-back to another range does not delay the read.
    let mut m = two_speed();
    m.submit(0, IoKind::Read, &[write_back(5, 1 << 20), read_backend(4096, 0)]);
    assert_eq!(completions(&mut m), [(0, 1000)]);
}

#[test]
fn background_flushes_occupy_the_devices() {
    let mut m = two_speed();
    m.submit_background(0, &[write_back(0, 0)]);
    // The backend is free at 0 (the flush's backend write comes after its
    // cache read at 100), so this read runs 0..1000; the flush's write then
    // runs 1000..2000 and a read at 500 waits for both: 2000..3000.
    m.submit(0, IoKind::Read, &[read_backend(1 << 20, 0)]);
    m.submit(500, IoKind::Read, &[read_backend(2 << 20, 0)]);
    assert_eq!(completions(&mut m), [(0, 1000), (1, 3000)]);
    let r = m.finish();
    assert_eq!(r.background_ops, 1);
    assert_eq!(r.backend_device.write_ops, 1);
    assert_eq!(r.end_ns, 3000);
}

// ---- Property checks ----

/// Random queue devices and arrivals: each op starts no earlier than it
/// arrives and than the previous op started (FIFO), ends at least its idle
/// service after its start, and no more than k ops are in service at once.
#[test]
fn queue_devices_are_fifo_and_never_faster_than_service() {
    let mut rng = SplitMix64::new(99);
    for case in 0..200 {
        let spec = QueueSpec {
            servers: 1 + rng.below(4) as u32,
            read: OpCost::new(rng.below(2000) as f64, rng.below(100) as f64),
            write: OpCost::new(rng.below(2000) as f64, if case % 2 == 0 { 0.0 } else { 50.0 }),
        };
        let mut dev = Device::new(&DeviceSpec::queue("q", spec)).unwrap();
        let mut t = 0;
        let mut prev_start = 0;
        let mut spans: Vec<Scheduled> = Vec::new();
        for _ in 0..300 {
            t += rng.below(1500);
            let dir = if rng.below(2) == 0 { Dir::Read } else { Dir::Write };
            let bytes = 512 * (1 + rng.below(64));
            let s = dev.schedule(t, dir, 0, bytes, &mut |_, _| {});
            assert!(s.start_ns >= t);
            assert!(s.start_ns >= prev_start, "FIFO");
            assert!(s.end_ns >= s.start_ns + spec.cost(dir).service(bytes));
            prev_start = s.start_ns;
            spans.push(s);
        }
        // At most k overlapping [start, end) intervals.
        let mut edges: Vec<(u64, i32)> = spans
            .iter()
            .flat_map(|s| [(s.start_ns, 1), (s.end_ns, -1)])
            .collect();
        edges.sort_by_key(|&(t, d)| (t, d));
        let mut open = 0;
        for (_, d) in edges {
            open += d;
            assert!(open <= spec.servers as i32);
        }
    }
}

/// Random requests of random ops through the whole model: every request
/// completes, no earlier than its arrival plus the idle service of each op
/// it waits for.
#[test]
fn requests_never_complete_before_their_service() {
    let mut rng = SplitMix64::new(7);
    let cache = parse_device("sata-ssd").unwrap();
    let backend = parse_device("hdd").unwrap();
    let mut m = model(cache.clone(), backend.clone(), Some(1_000_000));
    m.track_completions(true);
    let mut t = 0;
    let mut expected = Vec::new();
    for i in 0..2000u64 {
        t += rng.below(200_000);
        let slot = rng.below(16) as u32;
        let (kind, ops): (IoKind, Vec<Op>) = match rng.below(5) {
            0 => (IoKind::Read, vec![read_cache(slot)]),
            1 => (
                IoKind::Read,
                vec![read_backend(i * LINE, 0), write_cache(slot, 0)],
            ),
            2 => (
                IoKind::Write,
                vec![write_back(slot, i * LINE), write_cache(slot, 0)],
            ),
            3 => (IoKind::Write, vec![write_backend(i * LINE), write_cache(slot, 0)]),
            _ => (IoKind::Write, vec![write_cache(slot, 0)]),
        };
        let min = ops
            .iter()
            .map(|op| match (kind, op) {
                (IoKind::Read, Op::ReadCache { .. }) => cache.idle_service_ns(Dir::Read, LINE),
                (IoKind::Read, Op::ReadBackend { .. }) => backend.idle_service_ns(Dir::Read, LINE),
                (IoKind::Write, Op::WriteCache { .. }) => cache.idle_service_ns(Dir::Write, LINE),
                (IoKind::Write, Op::WriteBackend { .. }) => backend.idle_service_ns(Dir::Write, LINE),
                (IoKind::Write, Op::WriteBack { .. }) => {
                    cache.idle_service_ns(Dir::Read, LINE)
                        + backend.idle_service_ns(Dir::Write, LINE)
                        + cache.idle_service_ns(Dir::Write, LINE)
                }
                _ => 0,
            })
            .max()
            .unwrap();
        let id = m.submit(t, kind, &ops);
        expected.push((id, t, min));
    }
    let done: Vec<_> = std::iter::from_fn(|| m.next_completion()).collect();
    assert_eq!(done.len(), expected.len());
    for c in &done {
        let (_, arrival, min) = expected[c.id as usize];
        assert_eq!(c.arrival_ns, arrival);
        assert!(c.completion_ns >= arrival + min, "{c:?} min {min}");
    }
    assert!(done.windows(2).all(|w| w[0].completion_ns <= w[1].completion_ns));
    let r = m.finish();
    check_series(&r);
}

fn check_series(r: &TimingReport) {
    let reads: u64 = r.series.iter().map(|row| row.reads).sum();
    let writes: u64 = r.series.iter().map(|row| row.writes).sum();
    assert_eq!((reads, writes), (r.reads, r.writes));
    let interval = r.series_interval_ns.unwrap();
    let busy: f64 = r
        .series
        .iter()
        .map(|row| row.cache_utilization * (row.end_ns - row.start_ns) as f64)
        .sum::<f64>()
        * r.cache_device.servers as f64;
    assert!((busy - r.cache_device.busy_ns as f64).abs() / (r.cache_device.busy_ns as f64) < 1e-9);
    assert!(r.series.windows(2).all(|w| w[0].end_ns == w[1].start_ns));
    assert!(r
        .series
        .iter()
        .rev()
        .skip(1)
        .all(|row| row.end_ns - row.start_ns == interval));
    let json = serde_json::to_string(r).unwrap();
    assert!(json.contains("\"cache_utilization\""));
    let mut csv = Vec::new();
    r.write_series_csv(&mut csv).unwrap();
    assert_eq!(
        String::from_utf8(csv).unwrap().lines().count(),
        r.series.len() + 1
    );
}

/// The real cache's op lists through the model, under every write policy:
/// everything completes and the totals add up.
#[test]
fn real_cache_op_lists_run_to_completion() {
    for wp in [
        WritePolicy::WriteBack,
        WritePolicy::WriteThrough,
        WritePolicy::WriteAround,
        WritePolicy::WriteInvalidate,
    ] {
        let mut config = CacheConfig::new(64, LineSize::new(LINE).unwrap(), PolicySpec::lru());
        config.write_policy = wp;
        let mut cache = Cache::new(config).unwrap();
        let mut m = model(
            preset("optane").unwrap(),
            preset("ssd-raid5").unwrap(),
            Some(100_000),
        );
        let mut replay = Replay::new(ArrivalMode::Open { speed: 1.0 }).unwrap();
        let mut rng = SplitMix64::new(11);
        let mut ops = OpList::new();
        let mut flush_ops = OpList::new();
        let mut tokens = Vec::new();
        let n = 5000;
        for i in 0..n {
            let now = replay.next_arrival(&mut m, i * 3_000);
            let offset = 512 * rng.below(2048);
            let len = 512 * (1 + rng.below(32));
            let (kind, req) = if rng.below(3) == 0 {
                (IoKind::Write, Request::write(0, offset, len, now))
            } else {
                (IoKind::Read, Request::read(0, offset, len, now))
            };
            cache.access(&req, &mut ops).unwrap();
            m.submit(now, kind, ops.ops());
            if i % 100 == 0 {
                cache.begin_flush(iocache_core::FlushOrder::Oldest, 8, &mut flush_ops, &mut tokens);
                m.submit_background(now, flush_ops.ops());
                for t in &tokens {
                    cache.complete_flush(t, true);
                }
            }
            if i == 1000 {
                m.reset_stats();
            }
        }
        let r = m.finish();
        // Requests 0..=1000 were warmup.
        assert_eq!(r.requests + 1001, n, "{wp:?}");
        assert!(r.read.p50_ns >= 6_000 && r.read.p9999_ns >= r.read.p99_ns);
        assert!(r.cache_device.utilization > 0.0 && r.cache_device.utilization <= 1.0);
        assert!(r.backend_device.utilization > 0.0 && r.backend_device.utilization <= 1.0);
        assert_eq!(r.clamped_arrivals, 0);
        let reads: u64 = r.series.iter().map(|row| row.reads + row.writes).sum();
        assert_eq!(reads, n); // the series includes the warmup
    }
}

/// A flash backend (the write-buffer setting): a small drive written over
/// and over must garbage-collect, and the report shows it.
#[test]
fn flash_backend_reports_garbage_collection() {
    let spec = FlashSpec {
        capacity_bytes: 256 << 20,
        ..FlashSpec::req_block()
    };
    let logical_pages = spec.logical_bytes() / LINE;
    let flash = DeviceSpec {
        name: "flash".into(),
        model: iocache_sim::timing::DeviceModel::Flash(spec),
    };
    let mut m = model(preset("ramdisk").unwrap(), flash, None);
    let mut replay = Replay::new(ArrivalMode::Closed { outstanding: 16 }).unwrap();
    let mut rng = SplitMix64::new(1);
    let writes = 100_000;
    for _ in 0..writes {
        let now = replay.next_arrival(&mut m, 0);
        m.submit(
            now,
            IoKind::Write,
            &[write_backend(LINE * rng.below(logical_pages))],
        );
    }
    let r = m.finish();
    let c = &r.backend_device.counters;
    assert!(c["gc_erases"] > 0, "{c:?}");
    assert!(c["gc_page_copies"] > 0);
    assert!(c["gc_busy_ns"] >= c["gc_erases"] * 15_000_000);
    assert_eq!(c["host_page_writes"], writes);
    // 16 chips programming 2 ms pages: at most 8000 page writes per second.
    assert!(r.iops < 8_000.0, "{}", r.iops);
}

/// The simulator moves each run to a worker thread.
#[test]
fn the_model_can_move_between_threads() {
    fn send<T: Send>() {}
    send::<TimingModel>();
    send::<Replay>();
}
