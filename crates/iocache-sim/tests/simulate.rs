//! The simulation loop: thread count does not change results, warmup excludes
//! what it should, and hand-checked counts on a tiny in-memory trace.

use iocache_core::{PolicySpec, WritePolicy};
use iocache_sim::{simulate, CacheSize, RunSpec, SimOptions, SimReport};
use iocache_trace::TraceFormat;

mod common;

use common::memory_reader as reader;

fn specs(policies: &[PolicySpec], sizes: &[u64], wp: WritePolicy) -> Vec<RunSpec> {
    let sizes: Vec<CacheSize> = sizes.iter().map(|&n| CacheSize::Lines(n)).collect();
    common::specs(policies, &sizes, 4096, wp)
}

fn run(text: &str, format: TraceFormat, specs: &[RunSpec], warmup: u64, threads: usize) -> SimReport {
    let options = SimOptions {
        warmup_requests: warmup,
        threads,
        timing: None,
        reconfigure: Vec::new(),
        reca: None,
        adapt: None,
        restarts: None,
        tally: Default::default(),
    };
    simulate(&mut reader(text, format), specs, &options, &mut |_, _| {}).unwrap()
}

/// A pseudo-random Tencent-format trace (offsets and sizes in sectors, 0 = read).
fn random_trace(requests: usize) -> String {
    let mut state = 0x0123_4567_89ab_cdefu64;
    let mut out = String::new();
    for i in 0..requests {
        common::xorshift(&mut state);
        let offset = (state % 4096) * 8;
        let sectors = 8 * (1 + (state >> 20) % 4);
        let write = (state >> 40).is_multiple_of(3);
        let volume = (state >> 50) % 2;
        out.push_str(&format!(
            "{},{offset},{sectors},{},{volume}\n",
            i / 100,
            write as u8
        ));
    }
    out
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let text = random_trace(60_000); // several batches
    let specs = specs(
        &[PolicySpec::lru(), PolicySpec::arc()],
        &[64, 512, 2048],
        WritePolicy::WriteBack,
    );
    let one = run(&text, TraceFormat::Tencent, &specs, 1_000, 1);
    let many = run(&text, TraceFormat::Tencent, &specs, 1_000, 4);
    assert_eq!(one.runs.len(), 6);
    assert!(many.threads > 1);
    for (a, b) in one.runs.iter().zip(&many.runs) {
        assert_eq!(a.spec.policy, b.spec.policy);
        assert_eq!(a.spec.capacity_lines, b.spec.capacity_lines);
        assert_eq!(a.stats, b.stats);
    }
    // Bigger caches hit more on this trace, and write-back writes back something.
    assert!(one.runs[0].stats.full_hits < one.runs[2].stats.full_hits);
    assert!(one.runs[0].stats.dirty_writebacks > 0);
}

#[test]
fn warmup_requests_are_not_counted() {
    // Four reads of the same 4 KiB line: the first misses, the rest hit.
    let text = "0 8 0 0\n0 8 0 1\n0 8 0 2\n0 8 0 3\n";
    let specs = specs(&[PolicySpec::lru()], &[4], WritePolicy::WriteBack);
    let cold = run(text, TraceFormat::Arc, &specs, 0, 1);
    assert_eq!(
        (cold.runs[0].stats.accesses, cold.runs[0].stats.full_hits),
        (4, 3)
    );
    let warm = run(text, TraceFormat::Arc, &specs, 1, 1);
    assert_eq!(
        (warm.runs[0].stats.accesses, warm.runs[0].stats.full_hits),
        (3, 3)
    );
    assert_eq!(warm.runs[0].simulated_accesses, 4);
    let all_warmup = run(text, TraceFormat::Arc, &specs, 10, 1);
    assert_eq!(all_warmup.runs[0].stats.accesses, 0);
}

/// `text` through a 4-line LRU cache under `wp`, without warmup, on one thread.
fn run_lru4(text: &str, format: TraceFormat, wp: WritePolicy) -> SimReport {
    run(text, format, &specs(&[PolicySpec::lru()], &[4], wp), 0, 1)
}

#[test]
fn write_policies_move_the_expected_bytes() {
    // Tencent: write 4 KiB to line 0 twice, then read it.
    let text = "0,0,8,1,0\n1,0,8,1,0\n2,0,8,0,0\n";
    let wb = run_lru4(text, TraceFormat::Tencent, WritePolicy::WriteBack);
    let s = wb.runs[0].stats;
    assert_eq!(
        (s.backend_write_bytes, s.cache_write_bytes, s.cache_read_bytes),
        (0, 8192, 4096)
    );
    assert_eq!(wb.runs[0].dirty_lines_at_end, 1);
    let wt = run_lru4(text, TraceFormat::Tencent, WritePolicy::WriteThrough);
    let s = wt.runs[0].stats;
    assert_eq!(
        (s.backend_write_bytes, s.cache_write_bytes, s.read_hits),
        (8192, 8192, 1)
    );
    let wa = run_lru4(text, TraceFormat::Tencent, WritePolicy::WriteAround);
    let s = wa.runs[0].stats;
    assert_eq!(
        (s.backend_write_bytes, s.backend_read_bytes, s.read_hits),
        (8192, 4096, 0)
    );
}

#[test]
fn unaligned_records_are_widened_to_sectors() {
    // MSR: a 100-byte read at byte 700 touches sector 1 only.
    let text = "128166385295514663,hm,0,Read,700,100,0\n";
    let report = run_lru4(text, TraceFormat::Msr, WritePolicy::WriteBack);
    assert_eq!(report.runs[0].stats.requested_bytes, 512);
}

/// `--reconfigure`: the simulator applies a change through the
/// same core call the engine uses (`Cache::apply`), at the request given:
/// its counters equal a replay that drives one `Cache` by hand with the same
/// requests and the same changes at the same places, and differ from a run
/// without the changes.
#[test]
fn reconfigure_applies_the_core_settings_at_the_given_request() {
    use iocache_core::{Cache, OpList, Setting};
    use iocache_sim::{request_of, Reconfigure};
    let trace = random_trace(6000);
    let specs = specs(&[PolicySpec::lru()], &[256], WritePolicy::WriteBack);
    let changes: Vec<Reconfigure> = [
        "1500:write_policy=wt,policy=arc",
        "3000:promotion=nhit:2,max_dirty_lines=16",
        "4500:write_policy=wb,policy=s3fifo,seq_cutoff=64KiB",
    ]
    .iter()
    .map(|t| t.parse().unwrap())
    .collect();
    let options = SimOptions {
        threads: 1,
        reconfigure: changes.clone(),
        ..SimOptions::default()
    };
    let simulated = simulate(
        &mut reader(&trace, TraceFormat::Tencent),
        &specs,
        &options,
        &mut |_, _| {},
    )
    .unwrap();

    let mut cache = Cache::new(specs[0].cache_config()).unwrap();
    let mut ops = OpList::new();
    for (n, record) in (0u64..).zip(reader(&trace, TraceFormat::Tencent)) {
        let request = request_of(&record.unwrap());
        for change in &changes {
            if change.at == iocache_sim::Trigger::Request(n) {
                for setting in &change.settings {
                    cache.apply(setting, request.now_ns).unwrap();
                }
            }
        }
        cache.access(&request, &mut ops).unwrap();
    }
    assert_eq!(simulated.runs[0].stats, *cache.stats());
    assert_eq!(
        cache.settings()[2],
        "policy=s3fifo".parse::<Setting>().unwrap(),
        "the last policy set is in force"
    );
    let plain = run(&trace, TraceFormat::Tencent, &specs, 0, 1);
    assert_ne!(
        plain.runs[0].stats, simulated.runs[0].stats,
        "the changes changed nothing"
    );
}

/// `--restart-every`: keeping every line (persistence all) changes nothing;
/// keeping only dirty lines loses hits, and starting empty loses more; the
/// restarts are counted, and `none` writes the dirty lines back.
#[test]
fn restarts_keep_what_the_persistence_mode_keeps() {
    let text = random_trace(20_000); // 200 s of trace time
    let specs = specs(&[PolicySpec::lru()], &[2048], WritePolicy::WriteBack);
    let with = |restarts: Option<&str>| {
        let options = SimOptions {
            threads: 1,
            restarts: restarts.map(|r| r.parse().unwrap()),
            ..SimOptions::default()
        };
        simulate(
            &mut reader(&text, TraceFormat::Tencent),
            &specs,
            &options,
            &mut |_, _| {},
        )
        .unwrap()
        .runs
        .remove(0)
    };
    let plain = with(None);
    let all = with(Some("10s"));
    let dirty = with(Some("10s:persistence=dirty"));
    let none = with(Some("10s:persistence=none"));
    assert_eq!(plain.restarts, 0);
    assert_eq!(all.restarts, 19);
    assert_eq!(all.stats.full_hits, plain.stats.full_hits);
    assert!(
        dirty.stats.full_hits < all.stats.full_hits,
        "{} {}",
        dirty.stats.full_hits,
        all.stats.full_hits
    );
    assert!(
        none.stats.full_hits < dirty.stats.full_hits,
        "{} {}",
        none.stats.full_hits,
        dirty.stats.full_hits
    );
    assert!(none.stats.flushed_lines > 0);
    assert!("0s".parse::<iocache_sim::Restarts>().is_err());
    assert!("1h:persistence=some".parse::<iocache_sim::Restarts>().is_err());
    // Restarts at given times: the same as every 10 s when the times are
    // every 10 s; three of them, three restarts.
    let times: Vec<String> = (1..20).map(|i| format!("{}s", 10 * i)).collect();
    let at = with(Some(&format!("at={}:persistence=dirty", times.join("/"))));
    assert_eq!(at.stats, dirty.stats);
    assert_eq!(at.restarts, dirty.restarts);
    let three = with(Some("at=15s/90s/150s:persistence=none"));
    assert_eq!(three.restarts, 3);
    assert!(three.stats.full_hits < plain.stats.full_hits);
    assert!("at=20s/10s".parse::<iocache_sim::Restarts>().is_err());
    assert!("at=".parse::<iocache_sim::Restarts>().is_err());
}
