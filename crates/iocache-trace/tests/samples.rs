//! Reads the real trace samples in `../shared/traces` (see its README.md)
//! end to end: format detection, record counts and a few spot values. The
//! samples are not part of this repository; when the directory is missing the
//! tests are compiled as ignored, with the reason (see build.rs).

use std::path::PathBuf;

use iocache_trace::{IoKind, ReaderOptions, TraceFormat, TraceReader, TraceRecord};

fn samples_dir() -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/"));
    // Present: build.rs found it, or the tests would be ignored.
    assert!(
        dir.is_dir(),
        "{} went away since this crate was built",
        dir.display()
    );
    dir
}

struct Summary {
    format: TraceFormat,
    records: Vec<TraceRecord>,
    ignored: u64,
    lines: u64,
    consumed: u64,
    len: Option<u64>,
}

fn read(name: &str) -> Summary {
    let path = samples_dir().join(name);
    let mut reader =
        TraceReader::open(&path, None, ReaderOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let records = reader
        .by_ref()
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(reader.skipped_lines(), 0);
    Summary {
        format: reader.format(),
        records,
        ignored: reader.ignored_records(),
        lines: reader.lines_read(),
        consumed: reader.input_bytes_consumed(),
        len: reader.input_len(),
    }
}

/// [`read`], checking the format detected and the number of records.
fn read_as(name: &str, format: TraceFormat, records: usize) -> Summary {
    let s = read(name);
    assert_eq!(s.format, format, "{name}");
    assert_eq!(s.records.len(), records, "{name}");
    s
}

fn reads_writes(records: &[TraceRecord]) -> (usize, usize) {
    let reads = records.iter().filter(|r| r.kind == IoKind::Read).count();
    (reads, records.len() - reads)
}

/// Tests of the shared samples: each is ignored, with the reason, when
/// they were absent when this crate was built.
macro_rules! sample_tests {
    ($(fn $name:ident() $body:block)*) => {
        $(
            #[test]
            #[cfg_attr(
                not(shared_traces),
                ignore = "needs ../shared/traces beside the repository (absent when this crate was built; scripts/get-traces.sh fetches it)"
            )]
            fn $name() $body
        )*
    };
}

sample_tests! {
    fn arc_p2() {
        let s = read_as("arc-P2.lis.zst", TraceFormat::Arc, 666_176);
        assert_eq!(s.ignored, 0);
        // README: 666,176 requests = 12,729,495 sector accesses.
        let sectors: u64 = s.records.iter().map(|r| r.length_bytes / 512).sum();
        assert_eq!(sectors, 12_729_495);
        assert!(s.records.iter().all(|r| r.kind == IoKind::Read && r.volume == 0));
        assert_eq!(
            s.records[0],
            TraceRecord::new(0, 0, 3050771 * 512, 25 * 512, IoKind::Read)
        );
        assert_eq!(s.records[666_175].time_ns, 666_175);
        assert_eq!(Some(s.consumed), s.len);
    }

    fn msr_hm0() {
        let s = read_as("msr-hm0-sample.csv", TraceFormat::Msr, 1_000);
        assert_eq!(s.lines, 1_000);
        assert!(s.records.iter().all(|r| r.volume == 0));
        assert_eq!(
            s.records[0],
            TraceRecord::new(
                (128166385295514663 - 116444736000000000) * 100,
                0,
                9056014336,
                2048,
                IoKind::Write
            )
        );
        println!("msr reads/writes: {:?}", reads_writes(&s.records));
    }

    fn systor17() {
        let s = read_as("systor17-sample.csv.gz", TraceFormat::Systor, 999);
        assert_eq!(s.lines, 1_000);
        assert_eq!(reads_writes(&s.records), (826, 173));
        assert_eq!(s.records[0].time_ns, 1_456_095_145_133_076_000);
        assert_eq!(s.records[0].offset_bytes, 899056122368);
        assert_eq!(s.records[0].length_bytes, 131072);
        assert_eq!(Some(s.consumed), s.len);
    }

    fn tencent_cbs() {
        let s = read_as("tencent-cbs-sample.csv.bz2", TraceFormat::Tencent, 50_000);
        assert_eq!(
            s.records[0],
            TraceRecord::new(
                1_538_323_200_000_000_000,
                1058,
                4247200 * 512,
                128 * 512,
                IoKind::Write
            )
        );
        println!("tencent reads/writes: {:?}", reads_writes(&s.records));
    }

    fn mqsim_disksim() {
        for (name, count) in [("tpcc-small.disksim", 6_999), ("wsrch-small.disksim", 24_783)] {
            let s = read_as(name, TraceFormat::Disksim, count);
            println!("{name} reads/writes: {:?}", reads_writes(&s.records));
        }
        let s = read("tpcc-small.disksim");
        assert_eq!(
            s.records[0],
            TraceRecord::new(938513000, 4, 264719034 * 512, 16 * 512, IoKind::Write)
        );
    }

    fn cloudphysics() {
        // 113,872 data lines, all opcodes 0x28 (read) or 0x2a (write).
        let s = read_as("cloudphysics-w106-sample.csv", TraceFormat::VscsiCsv, 113_872);
        assert_eq!(s.ignored, 0);
        assert_eq!(reads_writes(&s.records), (46_974, 66_898));
        assert_eq!(
            s.records[0],
            TraceRecord::new(5_633_898_000_000_000, 0, 42932745 * 512, 512, IoKind::Write)
        );
    }
}
