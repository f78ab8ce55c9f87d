//! `--adapt reca` in the simulation loop: on a trace whose phase changes
//! from a file server's sequential reads and writes to a mail server's
//! random ones, the controller picks the right category for each phase
//! within two windows, reconfigures the cache (write policy, `reca`
//! priorities, and the line size by rebuilding the cache), and the counters
//! span the whole replay.

use iocache_core::reca::{CategoryTable, RecaControllerParams};
use iocache_core::{PolicySpec, WritePolicy};
use iocache_sim::reca::RecaOptions;
use iocache_sim::{simulate, CacheSize, SimOptions};
use iocache_trace::TraceFormat;

mod common;

use common::memory_reader;

const WINDOW: u64 = 4_000;
const CHANGE_AT: u64 = 30_000;
const REQUESTS: u64 = 60_000;

/// Tencent format: `time_s,offset_sectors,size_sectors,write,volume`.
fn phase_trace() -> String {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || common::xorshift(&mut x);
    let mut cursor = [0u64; 6];
    let mut out = String::new();
    for i in 0..REQUESTS {
        let (offset, sectors, write) = if i < CHANGE_AT {
            // Six files of 2 MiB (12 MiB in all: they fit in the cache)
            // read or written front to back in 16 KiB requests, again and
            // again, interleaved.
            let f = (rand() % 6) as usize;
            let offset = ((f as u64) << 16) + cursor[f];
            cursor[f] = (cursor[f] + 32) % (1 << 12);
            (offset, 32, f % 2 == 1)
        } else {
            // 4 KiB random reads and writes over 256 MiB.
            ((rand() % 65_536) * 8, 8, rand() % 100 >= 55)
        };
        out.push_str(&format!("{},{offset},{sectors},{},0\n", i / 1000, write as u8));
    }
    out
}

#[test]
fn the_controller_follows_the_phases_and_counts_every_request() {
    let trace = phase_trace();
    let specs = common::specs(
        &[PolicySpec::lru()],
        &[CacheSize::Bytes(16 << 20)],
        4096,
        WritePolicy::WriteBack,
    );
    let options = SimOptions {
        threads: 1,
        reca: Some(RecaOptions {
            table: CategoryTable::builtin(),
            params: RecaControllerParams {
                window_requests: WINDOW,
                ..RecaControllerParams::default()
            },
        }),
        ..SimOptions::default()
    };
    let mut reader = memory_reader(trace, TraceFormat::Tencent);
    let report = simulate(&mut reader, &specs, &options, &mut |_, _| {}).unwrap();
    let run = &report.runs[0];
    let reca = run.reca.as_ref().expect("reca ran");
    // Every request counted, across the rebuilds.
    assert_eq!(run.stats.requests, REQUESTS);
    assert_eq!(reca.windows.len() as u64, REQUESTS / WINDOW);
    let names: Vec<(u64, &str)> = reca.events.iter().map(|e| (e.requests, e.new.as_str())).collect();
    assert_eq!(names[0], (WINDOW, "sequential_producer_consumers"), "{names:?}");
    let switch = names
        .iter()
        .find(|(_, n)| *n == "random_producer_consumers")
        .unwrap_or_else(|| panic!("{names:?}"));
    assert!(
        switch.0 > CHANGE_AT && switch.0 <= CHANGE_AT + 2 * WINDOW,
        "{names:?}"
    );
    assert_eq!(names.len(), 2, "{names:?}");
    // The first change moved to 128 KiB lines and write-through, the
    // second back to 4 KiB; every window after a change was served so.
    let first = &reca.events[0];
    assert!(
        first.changes.iter().any(|c| c == "write policy: wb -> wt"),
        "{:?}",
        first.changes
    );
    assert!(
        first
            .changes
            .iter()
            .any(|c| c.starts_with("line size: 4KiB -> 128KiB")),
        "{:?}",
        first.changes
    );
    assert_eq!(reca.relayouts, 2);
    assert_eq!(reca.windows[1].line_bytes, 128 << 10);
    assert_eq!(reca.windows.last().unwrap().line_bytes, 4096);
    assert!(reca
        .windows
        .iter()
        .all(|w| w.hit_ratio >= 0.0 && w.hit_ratio <= 1.0 && w.accesses > 0));
    // The files fit in the cache: once they were read, the sequential
    // phase hits, in 128 KiB lines as in 4 KiB ones (the rebuild kept what
    // was cached).
    assert!(reca.windows[0].hit_ratio > 0.5, "{:?}", reca.windows[0]);
    assert!(reca.windows[2].hit_ratio > 0.95, "{:?}", reca.windows[2]);
}

/// blkparse text: 100 processes read files of their own front to back in
/// 16 KiB requests, in turn, on one device; `pid` gives each its PID or,
/// with `anonymous`, the same one.
fn many_readers_trace(anonymous: bool) -> String {
    let mut out = String::new();
    for i in 0..50u64 {
        for p in 0..100u64 {
            let pid = if anonymous { 1 } else { 1000 + p };
            let sector = (p << 21) + i * 32;
            let seq = i * 100 + p + 1;
            let time = format!("{}.{:09}", seq / 1000, (seq % 1000) * 1_000_000);
            out.push_str(&format!(
                "  8,0 0 {seq} {time} {pid} Q R {sector} + 32 [reader]\n"
            ));
        }
    }
    out
}

#[test]
fn each_process_of_a_blkparse_trace_is_a_stream_of_its_own() {
    let characterize = |anonymous: bool| {
        let mut reader = memory_reader(many_readers_trace(anonymous), TraceFormat::BLKPARSE);
        iocache_sim::reca::reca_characterize(
            &mut reader,
            &CategoryTable::builtin(),
            RecaControllerParams {
                window_requests: 1_000,
                ..RecaControllerParams::default()
            },
        )
        .unwrap()
    };
    // Feature 0 is the share of sequential reads, 4 of random reads.
    let per_process = characterize(false);
    assert!(per_process.features[0] > 0.95, "{:?}", per_process.features);
    assert_eq!(per_process.volumes.len(), 100);
    assert!(per_process
        .volumes
        .iter()
        .all(|v| v.volume == 0 && v.process >= 1000));
    assert_ne!(per_process.category, "random_consumers");
    // One PID for all: one stream whose 64-request history never holds a
    // request's successor (100 requests later): all random.
    let anonymous = characterize(true);
    assert!(anonymous.features[4] > 0.95, "{:?}", anonymous.features);
    assert_eq!(anonymous.category, "random_consumers");
}
