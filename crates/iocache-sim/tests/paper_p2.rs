//! Reproduces the ARC paper's Table IV on trace P2 (Megiddo & Modha, FAST'03):
//! 512-byte pages, a cache of 32,768 pages: LRU 18.47 %, ARC 27.38 %.
//! Runs when `../shared/traces` is present (it is in CI); compiled as
//! ignored, with the reason, otherwise (see the build script,
//! `../iocache-trace/build.rs`).

use std::path::PathBuf;

use iocache_core::{LineSize, PolicySpec};
use iocache_sim::{combinations, simulate, CacheSettings, CacheSize, SimOptions};
use iocache_trace::{ReaderOptions, TraceReader};

fn p2() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/arc-P2.lis.zst");
    assert!(path.exists(), "{} is missing", path.display());
    Some(path)
}

#[test]
#[cfg_attr(
    not(shared_traces),
    ignore = "needs ../shared/traces beside the repository (absent when this crate was built; scripts/get-traces.sh fetches it)"
)]
fn lru_and_arc_hit_ratios_match_the_arc_paper_on_p2() {
    let Some(path) = p2() else { return };
    let specs = combinations(
        &[PolicySpec::lru(), PolicySpec::arc()],
        &[CacheSize::Lines(32_768)],
        &[LineSize::new(512).unwrap()],
        &CacheSettings::default(),
    )
    .unwrap();
    let mut reader = TraceReader::open(&path, None, ReaderOptions::default()).unwrap();
    let report = simulate(&mut reader, &specs, &SimOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!(report.trace_records, 666_176);
    let percent: Vec<f64> = report.runs.iter().map(|r| r.stats.hit_ratio() * 100.0).collect();
    for run in &report.runs {
        // Every sector of every request is one access.
        assert_eq!(run.stats.accesses, 12_729_495);
    }
    // The paper prints two decimals; ours must round to the same figures.
    assert_eq!(
        format!("{:.2}", percent[0]),
        "18.47",
        "LRU hit ratio {}",
        percent[0]
    );
    assert_eq!(
        format!("{:.2}", percent[1]),
        "27.38",
        "ARC hit ratio {}",
        percent[1]
    );
}
