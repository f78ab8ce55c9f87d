//! The workload generator's output against its spec: read share, zoned and
//! Zipf skew, sequential streams, size mix, bursts, volumes and reproducibility,
//! within statistical tolerance; the fio job says the same mix; bad specs
//! name the phase and key.

use iocache_sim::workload::{BurstSpec, PhaseSpec, WorkloadSpec};
use iocache_trace::{IoKind, TraceRecord};

fn phase(distribution: &str) -> PhaseSpec {
    PhaseSpec {
        name: None,
        requests: 100_000,
        rate: 1000.0,
        read_percent: 70.0,
        distribution: distribution.into(),
        sizes: "4KiB".into(),
        streams: 1,
        burst: None,
        range: None,
        volumes: 1,
        volume_distribution: None,
    }
}

fn spec(phases: Vec<PhaseSpec>) -> WorkloadSpec {
    WorkloadSpec {
        seed: 5,
        volume_size: "400MiB".into(),
        block_size: "4KiB".into(),
        phases,
    }
}

fn records(spec: &WorkloadSpec) -> Vec<TraceRecord> {
    spec.generator().unwrap().collect()
}

fn share(records: &[TraceRecord], f: impl Fn(&TraceRecord) -> bool) -> f64 {
    records.iter().filter(|r| f(r)).count() as f64 / records.len() as f64
}

#[test]
fn reads_zones_and_sizes_follow_the_spec() {
    let mut p = phase("zoned:85/10:15/90");
    p.sizes = "4KiB:70,64KiB:30".into();
    let r = records(&spec(vec![p]));
    assert_eq!(r.len(), 100_000);
    let reads = share(&r, |x| x.kind == IoKind::Read);
    assert!((reads - 0.70).abs() < 0.01, "reads {reads}");
    let zone = share(&r, |x| x.offset_bytes < 40 << 20);
    assert!((zone - 0.85).abs() < 0.01, "first zone {zone}");
    let small = share(&r, |x| x.length_bytes == 4096);
    assert!((small - 0.70).abs() < 0.01, "4 KiB share {small}");
    assert!(r
        .iter()
        .all(|x| x.offset_bytes % 4096 == 0 && x.offset_bytes + x.length_bytes <= 400 << 20));
}

#[test]
fn zipf_ranks_follow_the_harmonic_weights() {
    let mut s = spec(vec![phase("zipf:1")]);
    s.volume_size = "4000KiB".into(); // 1000 blocks
    let r = records(&s);
    let mut counts = std::collections::HashMap::new();
    for x in &r {
        *counts.entry(x.offset_bytes).or_insert(0u64) += 1;
    }
    let mut by_count: Vec<u64> = counts.values().copied().collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    let harmonic: f64 = (1..=1000).map(|k| 1.0 / k as f64).sum();
    let top = by_count[0] as f64 / r.len() as f64;
    let second = by_count[1] as f64 / r.len() as f64;
    assert!((top - 1.0 / harmonic).abs() < 0.01, "top block {top}");
    assert!((second - 0.5 / harmonic).abs() < 0.01, "second block {second}");
    // The hottest blocks are scattered, not the first ones.
    let hottest = counts.iter().max_by_key(|(_, c)| **c).unwrap().0;
    assert_ne!(*hottest, 0);
}

#[test]
fn sequential_streams_continue_where_they_left_off() {
    let mut p = phase("sequential");
    p.streams = 1;
    p.sizes = "16KiB".into();
    let r = records(&spec(vec![p.clone()]));
    let continued = r
        .windows(2)
        .filter(|w| w[1].offset_bytes == w[0].offset_bytes + w[0].length_bytes)
        .count();
    assert!(continued as f64 / r.len() as f64 > 0.99, "{continued}");
    // Four interleaved streams: each request continues one of the four.
    p.streams = 4;
    let r = records(&spec(vec![p]));
    let mut ends = std::collections::HashSet::new();
    let mut continued = 0;
    for x in &r {
        if ends.remove(&x.offset_bytes) {
            continued += 1;
        }
        ends.insert(x.offset_bytes + x.length_bytes);
    }
    assert!(continued as f64 / r.len() as f64 > 0.99, "{continued}");
    let strided = records(&spec(vec![phase("strided:60KiB")]));
    assert!(strided
        .windows(2)
        .take(100)
        .all(|w| w[1].offset_bytes == w[0].offset_bytes + 64 * 1024));
}

#[test]
fn phases_bursts_and_seeds() {
    let mut quiet = phase("uniform");
    quiet.requests = 1000;
    let mut burst = phase("uniform");
    burst.requests = 10_000;
    burst.rate = 10_000.0;
    burst.burst = Some(BurstSpec {
        on: "200ms".into(),
        off: "800ms".into(),
    });
    let s = spec(vec![quiet, burst]);
    let r = records(&s);
    assert_eq!(r.len(), 11_000);
    assert!(
        r.windows(2).all(|w| w[1].time_ns >= w[0].time_ns),
        "time goes forward"
    );
    let start = r[1000].time_ns;
    for x in &r[1000..] {
        let within_cycle = (x.time_ns - start) % 1_000_000_000;
        assert!(
            within_cycle < 200_000_000,
            "a request in an off period at {}",
            x.time_ns
        );
    }
    assert_eq!(records(&s), r, "same seed, same trace");
    let mut other = s.clone();
    other.seed = 6;
    assert_ne!(records(&other), r);
}

#[test]
fn the_fio_job_says_the_same_mix_and_bad_specs_name_the_phase() {
    let mut p = phase("zoned:85/10:15/90");
    p.sizes = "4KiB:70,64KiB:30".into();
    p.name = Some("hot".into());
    let job = spec(vec![p])
        .fio_job("nbd+unix:///iocache?socket=s.sock")
        .unwrap();
    for needle in [
        "ioengine=nbd",
        "[hot]",
        "rw=randrw",
        "rwmixread=70",
        "random_distribution=zoned:85/10:15/90",
        "bssplit=4096/70:65536/30",
        "number_ios=100000",
    ] {
        assert!(job.contains(needle), "{needle} missing:\n{job}");
    }
    let mut bad = phase("zoned:85/10:10/90");
    bad.name = Some("typo".into());
    let e = spec(vec![phase("uniform"), bad])
        .generator()
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("phase 2 (typo)") && e.contains("distribution") && e.contains("100"),
        "{e}"
    );
    let mut bad = phase("uniform");
    bad.sizes = "4096".into();
    let e = spec(vec![bad]).generator().err().unwrap().to_string();
    assert!(e.contains("sizes") && e.contains("4096B"), "{e}");
}

#[test]
fn requests_spread_over_volumes_as_asked() {
    let count = |p: PhaseSpec| {
        let mut by = vec![0u64; 4];
        for r in spec(vec![p]).generator().unwrap() {
            by[r.volume as usize] += 1;
        }
        by
    };
    let uniform = count(PhaseSpec {
        volumes: 4,
        ..phase("uniform")
    });
    for n in &uniform {
        // Binomial(100000, 1/4): sd 137; five of them either side.
        assert!((24_315..=25_685).contains(n), "{uniform:?}");
    }
    let skewed = count(PhaseSpec {
        volumes: 4,
        volume_distribution: Some("zipf:1".into()),
        ..phase("uniform")
    });
    // Weights 1, 1/2, 1/3, 1/4 of 25/12: 48 %, 24 %, 16 %, 12 %.
    for (n, share) in skewed.iter().zip([0.48, 0.24, 0.16, 0.12]) {
        assert!((*n as f64 / 100_000.0 - share).abs() < 0.01, "{skewed:?}");
    }
    // Sequential stream i stays in volume i mod volumes.
    for r in spec(vec![PhaseSpec {
        volumes: 2,
        streams: 4,
        ..phase("sequential")
    }])
    .generator()
    .unwrap()
    .take(1000)
    {
        assert!(r.volume < 2);
    }
    // One volume (the default): every request in volume 0.
    let one: Vec<TraceRecord> = spec(vec![phase("zipf:0.9")]).generator().unwrap().collect();
    assert!(one.iter().all(|r| r.volume == 0));
    let bad = spec(vec![PhaseSpec {
        volumes: 2,
        volume_distribution: Some("pareto".into()),
        ..phase("uniform")
    }]);
    let err = bad.generator().err().unwrap().to_string();
    assert!(
        err.contains("volume_distribution") && err.contains("pareto"),
        "{err}"
    );
}
