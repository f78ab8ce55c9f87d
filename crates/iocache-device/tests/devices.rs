//! Round trips, range checks, flush and discard for
//! each device (files buffered and with O_DIRECT on a real disk, the tmpfs
//! fallback, RAM), and every FaultDevice behaviour the crash tests rely on.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{new_file_device, pattern, TempPath, DISK_DIR, TMPFS_DIR};
use iocache_device::*;

const SIZE: u64 = 1 << 20;

fn open_file(dir: &str, direct: bool) -> (TempPath, FileDevice) {
    new_file_device(dir, if direct { "direct" } else { "buffered" }, SIZE, direct)
}

/// Writes and reads back at many offsets and sizes, aligned and not,
/// checking against a model of the whole device.
fn round_trips(dev: &dyn BlockDevice) {
    let len = dev.len_bytes() as usize;
    let mut model = vec![0u8; len];
    let mut whole = vec![0u8; len];
    dev.read_at(&mut whole, 0).unwrap();
    assert_eq!(whole, model, "{} starts zeroed", dev.name());
    let offsets = [0u64, 1, 511, 512, 4095, 4096, 4097, 65_535, 65_536, 200_000];
    let sizes = [1usize, 7, 512, 513, 4096, 4097, 8192, 70_000];
    let mut seed = 0;
    for &off in &offsets {
        for &size in &sizes {
            if off as usize + size > len {
                continue;
            }
            seed += 1;
            let data = pattern(size, seed);
            dev.write_at(&data, off).unwrap();
            model[off as usize..off as usize + size].copy_from_slice(&data);
            let mut back = vec![0u8; size];
            dev.read_at(&mut back, off).unwrap();
            assert_eq!(back, data, "{} off {off} size {size}", dev.name());
            // A read straddling the write's edges sees the model too.
            let lo = off.saturating_sub(3) as usize;
            let hi = (off as usize + size + 3).min(len);
            let mut around = vec![0u8; hi - lo];
            dev.read_at(&mut around, lo as u64).unwrap();
            assert_eq!(around, model[lo..hi], "{} around off {off}", dev.name());
        }
    }
    // Aligned buffers on the fast path.
    let a = dev.alignment().max(512);
    let mut buf = AlignedBuf::zeroed(4 * a, a);
    buf.copy_from_slice(&pattern(4 * a, 99));
    dev.write_at(&buf, 8 * a as u64).unwrap();
    model[8 * a..12 * a].copy_from_slice(&buf);
    let mut back = AlignedBuf::zeroed(4 * a, a);
    dev.read_at(&mut back, 8 * a as u64).unwrap();
    assert_eq!(&back[..], &buf[..]);
    dev.flush().unwrap();
    dev.read_at(&mut whole, 0).unwrap();
    assert!(whole == model, "{} whole device matches the model", dev.name());
}

fn out_of_range(dev: &dyn BlockDevice) {
    let len = dev.len_bytes();
    let mut b = [0u8; 16];
    let e = dev.read_at(&mut b, len - 8).unwrap_err();
    assert!(
        matches!(e, DeviceError::OutOfRange { offset, len: 16, .. } if offset == len - 8),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains(&(len - 8).to_string()), "{msg}");
    assert!(msg.contains(dev.name()), "{msg}");
    assert!(matches!(
        dev.write_at(&b, u64::MAX - 3),
        Err(DeviceError::OutOfRange { .. })
    ));
    dev.read_at(&mut b, len - 16).unwrap();
    dev.read_at(&mut [], len).unwrap();
}

#[test]
fn file_buffered_round_trips() {
    let (_p, d) = open_file(DISK_DIR, false);
    assert_eq!(d.direct_io(), &DirectIo::Off);
    assert_eq!(d.alignment(), 1);
    assert_eq!(d.len_bytes(), SIZE);
    round_trips(&d);
    out_of_range(&d);
}

#[test]
fn file_direct_round_trips_on_disk() {
    let (_p, d) = open_file(DISK_DIR, true);
    match d.direct_io() {
        DirectIo::On { alignment } => {
            assert!(alignment.is_power_of_two() && *alignment >= 512, "{alignment}");
            assert_eq!(d.alignment(), *alignment);
            eprintln!("O_DIRECT alignment under {DISK_DIR}: {alignment}");
        }
        other => panic!("O_DIRECT should work under {DISK_DIR}: {other:?}"),
    }
    round_trips(&d);
    out_of_range(&d);
}

#[test]
fn file_direct_on_tmpfs_falls_back_or_works() {
    let (_p, d) = open_file(TMPFS_DIR, true);
    // tmpfs refused O_DIRECT with EINVAL on older kernels; newer ones accept it.
    match d.direct_io() {
        DirectIo::FellBack { errno } => {
            assert_eq!(*errno, libc_einval());
            assert_eq!(d.alignment(), 1);
        }
        DirectIo::On { alignment } => eprintln!("tmpfs accepted O_DIRECT, alignment {alignment}"),
        DirectIo::Off => panic!("direct was asked for"),
    }
    round_trips(&d);
}

/// The real refusal path: set IOCACHE_NODIRECT_DIR to a directory on a
/// filesystem that refuses O_DIRECT (ramfs: `mount -t ramfs ramfs DIR`).
#[test]
fn file_direct_fallback_on_a_filesystem_without_o_direct() {
    let Ok(dir) = std::env::var("IOCACHE_NODIRECT_DIR") else {
        eprintln!("IOCACHE_NODIRECT_DIR not set: skipped");
        return;
    };
    let (_p, d) = open_file(&dir, true);
    assert_eq!(d.direct_io(), &DirectIo::FellBack { errno: libc_einval() });
    assert_eq!(d.alignment(), 1);
    round_trips(&d);
}

fn libc_einval() -> i32 {
    22
}

#[test]
fn file_concurrent_sub_block_writes_do_not_lose_bytes() {
    // Many threads write disjoint 100-byte pieces that share O_DIRECT blocks:
    // the read-modify-write must not lose any piece.
    let (_p, d) = open_file(DISK_DIR, true);
    let d = Arc::new(d);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    let piece = i * 4 + t;
                    d.write_at(&[t as u8 + 1; 100], piece * 100).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut back = vec![0u8; 40_000];
    d.read_at(&mut back, 0).unwrap();
    for piece in 0..400usize {
        let want = (piece % 4) as u8 + 1;
        assert!(
            back[piece * 100..piece * 100 + 100].iter().all(|&b| b == want),
            "piece {piece}"
        );
    }
}

#[test]
fn file_create_is_sparse_reopen_keeps_data_and_read_only_refuses_writes() {
    let p = TempPath::new(DISK_DIR, "reopen");
    let size = 64 << 20;
    {
        let d = FileDevice::open(
            &p.0,
            OpenOptions {
                create_size: Some(size),
                ..Default::default()
            },
        )
        .unwrap();
        d.write_at(b"hello", 12_345).unwrap();
        d.flush().unwrap();
    }
    let meta = std::fs::metadata(&p.0).unwrap();
    assert_eq!(meta.len(), size);
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 < 1 << 20, "sparse: {} blocks", meta.blocks());
    let d = FileDevice::open(
        &p.0,
        OpenOptions {
            read_only: true,
            direct: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(d.len_bytes(), size);
    let mut b = [0u8; 5];
    d.read_at(&mut b, 12_345).unwrap();
    assert_eq!(&b, b"hello");
    let e = d.write_at(b"x", 0).unwrap_err();
    assert!(matches!(e, DeviceError::ReadOnly { .. }), "{e}");
    assert!(d.flush().is_ok());
}

#[test]
fn file_open_errors_name_the_path() {
    let e = FileDevice::open("/nonexistent/dir/dev", OpenOptions::default()).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/dir/dev"), "{e}");
    let e = FileDevice::open("/dev/null", OpenOptions::default()).unwrap_err();
    assert!(e.to_string().contains("/dev/null"), "{e}");
}

#[test]
fn file_discard_punches_a_hole() {
    for direct in [false, true] {
        let (_p, d) = open_file(DISK_DIR, direct);
        d.write_at(&[7u8; 65_536], 0).unwrap();
        d.discard(4096, 8192).unwrap();
        let mut b = vec![0u8; 65_536];
        d.read_at(&mut b, 0).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 7));
        assert!(b[4096..12_288].iter().all(|&x| x == 0));
        assert!(b[12_288..].iter().all(|&x| x == 7));
        assert!(matches!(
            d.discard(SIZE - 1, 2),
            Err(DeviceError::OutOfRange { .. })
        ));
    }
}

/// Blocks the file takes on its file system, in 512-byte units.
fn allocated_blocks(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks()
}

#[test]
fn file_write_zeroes_punches_or_keeps_the_range_allocated() {
    for (dir, direct) in [(DISK_DIR, false), (DISK_DIR, true), (TMPFS_DIR, false)] {
        for keep_allocated in [false, true] {
            let (p, d) = open_file(dir, direct);
            assert!(d.zeroes_fast(), "{dir}");
            d.write_at(&[7u8; 1 << 20], 0).unwrap();
            d.flush().unwrap();
            let before = allocated_blocks(&p.0);
            d.write_zeroes(4096, 512 << 10, keep_allocated).unwrap();
            let mut b = vec![0u8; 1 << 20];
            d.read_at(&mut b, 0).unwrap();
            assert!(b[..4096].iter().all(|&x| x == 7), "{dir} {keep_allocated}");
            assert!(b[4096..4096 + (512 << 10)].iter().all(|&x| x == 0));
            assert!(b[4096 + (512 << 10)..].iter().all(|&x| x == 7));
            let after = allocated_blocks(&p.0);
            if keep_allocated {
                assert!(after >= before, "{dir}: {before} blocks, then {after}");
            } else {
                assert!(
                    after + 1000 <= before,
                    "{dir}: a hole punched: {before} blocks, then {after}"
                );
            }
            assert!(matches!(
                d.write_zeroes(SIZE - 1, 2, keep_allocated),
                Err(DeviceError::OutOfRange { .. })
            ));
        }
    }
}

#[test]
fn a_sparse_file_s_allocation_names_its_holes() {
    // SIZE is 1 MiB: data at 0..64 KiB and 512..516 KiB, holes between.
    let (_p, d) = open_file(DISK_DIR, false);
    d.write_at(&[3u8; 65_536], 0).unwrap();
    d.write_at(&[4u8; 4096], 512 << 10).unwrap();
    let got = d.allocation(0, SIZE).unwrap();
    let want = [
        (65_536, false),
        ((512 << 10) - 65_536, true),
        (4096, false),
        (SIZE - (512 << 10) - 4096, true),
    ];
    let got: Vec<(u64, bool)> = got.iter().map(|a| (a.length_bytes, a.hole)).collect();
    assert_eq!(got, want);
    // A range starting inside a hole and ending inside data.
    let got = d.allocation(256 << 10, (256 << 10) + 2048).unwrap();
    let got: Vec<(u64, bool)> = got.iter().map(|a| (a.length_bytes, a.hole)).collect();
    assert_eq!(got, [(256 << 10, true), (2048, false)]);
    assert!(matches!(
        d.allocation(SIZE, 1),
        Err(DeviceError::OutOfRange { .. })
    ));
    // Memory says all data.
    let m = MemDevice::new("m", 1 << 20);
    assert_eq!(m.allocation(0, 1 << 20).unwrap().len(), 1);
}

#[test]
fn the_default_write_zeroes_writes_zero_buffers() {
    #[derive(Debug)]
    struct Plain(MemDevice);
    impl BlockDevice for Plain {
        fn len_bytes(&self) -> u64 {
            self.0.len_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
            self.0.write_at(data, offset)
        }
        fn flush(&self) -> Result<(), DeviceError> {
            Ok(())
        }
        fn name(&self) -> &str {
            "plain"
        }
    }
    let d = Plain(MemDevice::new("m", 3 << 20));
    assert!(!d.zeroes_fast());
    d.write_at(&vec![9u8; 3 << 20], 0).unwrap();
    d.write_zeroes(512, (2 << 20) + 512, false).unwrap();
    let mut b = vec![0u8; 3 << 20];
    d.read_at(&mut b, 0).unwrap();
    assert!(b[..512].iter().all(|&x| x == 9));
    assert!(b[512..(2 << 20) + 1024].iter().all(|&x| x == 0));
    assert!(b[(2 << 20) + 1024..].iter().all(|&x| x == 9));
}

#[test]
fn mem_round_trips_and_ranges() {
    let d = MemDevice::new("mem0", SIZE + 77);
    round_trips(&d);
    out_of_range(&d);
    d.write_at(&[1; 200_000], 10).unwrap();
    d.discard(100, 150_000).unwrap();
    let mut b = vec![0u8; 200_010];
    d.read_at(&mut b, 0).unwrap();
    assert!(b[10..100].iter().all(|&x| x == 1));
    assert!(b[100..150_100].iter().all(|&x| x == 0));
    assert!(b[150_100..].iter().all(|&x| x == 1));
}

#[test]
fn mem_concurrent_writers() {
    let d = Arc::new(MemDevice::new("mem", SIZE));
    let hs: Vec<_> = (0..4u8)
        .map(|t| {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                for i in 0..64u64 {
                    d.write_at(&[t + 1; 1000], (i * 4 + t as u64) * 1000).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let mut b = vec![0u8; 256_000];
    d.read_at(&mut b, 0).unwrap();
    for (i, c) in b.chunks(1000).enumerate() {
        assert!(c.iter().all(|&x| x == (i % 4) as u8 + 1));
    }
}

fn fault(len: u64) -> FaultDevice<MemDevice> {
    FaultDevice::new(MemDevice::new("faulty", len))
}

#[test]
fn fault_nth_fails_once_per_kind() {
    let d = fault(SIZE);
    d.fail_nth(IoKind::Write, 3);
    d.fail_nth(IoKind::Read, 1);
    d.fail_nth(IoKind::Flush, 2);
    let mut b = [0u8; 4];
    let e = d.read_at(&mut b, 40).unwrap_err();
    assert!(e.is_injected() && e.offset() == Some(40), "{e}");
    assert!(e.to_string().contains("faulty"), "{e}");
    d.read_at(&mut b, 40).unwrap();
    d.write_at(b"a", 0).unwrap();
    d.write_at(b"b", 1).unwrap();
    let e = d.write_at(b"c", 2).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::Injected {
                kind: IoKind::Write,
                offset: 2,
                ..
            }
        ),
        "{e}"
    );
    d.write_at(b"d", 3).unwrap();
    d.flush().unwrap();
    assert!(d.flush().unwrap_err().is_injected());
    d.flush().unwrap();
    d.read_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"ab\0d", "the failed write changed nothing");
    assert_eq!(
        d.stats(),
        FaultStats {
            reads: 3,
            writes: 4,
            flushes: 3
        }
    );
}

#[test]
fn fault_ranges_offline_and_latency() {
    let d = fault(SIZE);
    d.fail_range(1000, 100, true, false);
    let mut b = [0u8; 10];
    assert!(d.read_at(&mut b, 995).unwrap_err().is_injected());
    assert!(d.read_at(&mut b, 1099).unwrap_err().is_injected());
    d.read_at(&mut b, 990).unwrap();
    d.read_at(&mut b, 1100).unwrap();
    d.write_at(&b, 1050).unwrap();
    d.fail_range(5000, 1, false, true);
    assert!(d.write_at(&b, 4995).unwrap_err().is_injected());
    d.read_at(&mut b, 4995).unwrap();
    d.clear_faults();
    d.read_at(&mut b, 1050).unwrap();
    d.write_at(&b, 4995).unwrap();

    d.set_offline(true);
    assert!(d.read_at(&mut b, 0).unwrap_err().to_string().contains("offline"));
    assert!(d.write_at(&b, 0).is_err());
    assert!(d.flush().is_err());
    d.set_offline(false);
    d.read_at(&mut b, 0).unwrap();

    d.set_latency(Duration::from_millis(5));
    let t = Instant::now();
    for _ in 0..4 {
        d.read_at(&mut b, 0).unwrap();
    }
    assert!(t.elapsed() >= Duration::from_millis(20));
    d.set_latency(Duration::ZERO);
}

#[test]
fn limited_servers_make_concurrent_io_queue() {
    // 8 reads of 100 ms from 8 threads: about 100 ms with no limit, at
    // least 400 ms through 2 servers (4 rounds).
    let d = Arc::new(fault(64 * 1024));
    d.set_journal(false);
    // 100 ms a read: room for a loaded machine to start eight threads.
    d.set_latency(Duration::from_millis(100));
    let run = |d: &Arc<FaultDevice<MemDevice>>| {
        let t = Instant::now();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let d = Arc::clone(d);
                std::thread::spawn(move || {
                    let mut b = [0u8; 512];
                    d.read_at(&mut b, 0).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        t.elapsed()
    };
    // Eight at once: one latency, not eight.
    assert!(run(&d) < Duration::from_millis(300));
    // Two at a time: four latencies at least.
    d.set_servers(2);
    assert!(run(&d) >= Duration::from_millis(400));
    d.set_servers(0);
    assert!(run(&d) < Duration::from_millis(300));
}

#[test]
fn power_cut_drops_exactly_the_unflushed_writes() {
    let d = fault(64 * 1024);
    d.write_at(&[1; 3000], 100).unwrap();
    d.flush().unwrap();
    let mut durable = vec![0u8; 64 * 1024];
    d.read_at(&mut durable, 0).unwrap();
    d.write_at(&[2; 1000], 2000).unwrap(); // overlaps flushed data
    d.write_at(&[3; 700], 2500).unwrap(); // overlaps the unflushed write
    d.discard(10_000, 5000).unwrap();
    d.write_at(&[4; 10], 50_000).unwrap();
    assert_eq!(d.unflushed_writes(), 4);
    let r = d.power_cut(PowerCut::DropUnflushed).unwrap();
    assert_eq!(r.unflushed_writes, 4);
    assert_eq!(r.pieces_kept, 0);
    assert_eq!(d.unflushed_writes(), 0);
    let mut now = vec![0u8; 64 * 1024];
    d.read_at(&mut now, 0).unwrap();
    assert!(now == durable);
    // Writes after the cut are journaled afresh; a flush makes them stay.
    d.write_at(&[5; 10], 0).unwrap();
    d.flush().unwrap();
    d.write_at(&[6; 10], 0).unwrap();
    d.power_cut(PowerCut::DropUnflushed).unwrap();
    let mut b = [0u8; 10];
    d.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [5; 10]);
}

#[test]
fn power_cut_tears_at_sector_granularity() {
    // Base 0, then unflushed w1 (all 1s, sector aligned) and w2 (all 2s,
    // unaligned, overlapping w1's end). After a torn cut, within one sector
    // each write's bytes survive or vanish together, and where w2 vanished
    // the bytes show w1's fate in that sector.
    let len = 64 * 1024usize;
    let (w1s, w1e) = (1024usize, 1024 + 20_000);
    let (w2s, w2e) = (15_000usize + 100, 15_100 + 9_000);
    let mut kept = [0usize; 2];
    let mut lost = [0usize; 2];
    for seed in 0..20u64 {
        let d = fault(len as u64);
        d.write_at(&vec![1; w1e - w1s], w1s as u64).unwrap();
        d.write_at(&vec![2; w2e - w2s], w2s as u64).unwrap();
        let r = d.power_cut(PowerCut::Tear { seed, keep: 0.5 }).unwrap();
        assert_eq!(r.unflushed_writes, 2);
        let sectors = |a: usize, e: usize| (e - 1) / 512 - a / 512 + 1;
        let pieces = sectors(w1s, w1e) + sectors(w2s, w2e);
        assert_eq!((r.pieces_kept + r.pieces_lost) as usize, pieces, "{r:?}");
        let mut now = vec![0u8; len];
        d.read_at(&mut now, 0).unwrap();
        for s in 0..len / 512 {
            let sec = s * 512..(s + 1) * 512;
            let in1 = |p: usize| (w1s..w1e).contains(&p);
            let in2 = |p: usize| (w2s..w2e).contains(&p);
            let w2_fate: Vec<bool> = sec.clone().filter(|&p| in2(p)).map(|p| now[p] == 2).collect();
            assert!(
                w2_fate.windows(2).all(|w| w[0] == w[1]),
                "sector {s}: w2 torn within a sector"
            );
            let w2_kept = w2_fate.first().copied();
            // w1's fate in this sector: from a byte that w2 does not cover,
            // or from an overlapped byte if w2 vanished there.
            let w1_vals: Vec<u8> = sec
                .clone()
                .filter(|&p| in1(p) && !(in2(p) && w2_kept == Some(true)))
                .map(|p| now[p])
                .collect();
            assert!(w1_vals.iter().all(|&v| v == 0 || v == 1), "sector {s}");
            assert!(
                w1_vals.windows(2).all(|w| w[0] == w[1]),
                "sector {s}: w1 torn within a sector"
            );
            for p in sec {
                if !in1(p) && !in2(p) {
                    assert_eq!(now[p], 0, "byte {p} was never written");
                }
            }
            for (i, fate) in [w1_vals.first().map(|&v| v == 1), w2_kept]
                .into_iter()
                .enumerate()
            {
                match fate {
                    Some(true) => kept[i] += 1,
                    Some(false) => lost[i] += 1,
                    None => {}
                }
            }
        }
    }
    assert!(
        kept.iter().chain(&lost).all(|&n| n > 20),
        "kept {kept:?} lost {lost:?}"
    );
}

#[test]
fn power_cut_tear_extremes_match_drop_and_keep() {
    let d = fault(32 * 1024);
    d.write_at(&[9; 5000], 3).unwrap();
    let r = d.power_cut(PowerCut::Tear { seed: 1, keep: 1.0 }).unwrap();
    assert_eq!(r.pieces_lost, 0);
    let mut b = vec![0u8; 5000];
    d.read_at(&mut b, 3).unwrap();
    assert!(b.iter().all(|&x| x == 9));
    d.write_at(&[8; 5000], 3).unwrap();
    d.power_cut(PowerCut::Tear { seed: 1, keep: 0.0 }).unwrap();
    d.read_at(&mut b, 3).unwrap();
    assert!(b.iter().all(|&x| x == 9));
}

#[test]
fn failed_flush_keeps_the_journal() {
    let d = fault(8192);
    d.write_at(&[1; 100], 0).unwrap();
    d.fail_nth(IoKind::Flush, 1);
    assert!(d.flush().is_err());
    assert_eq!(d.unflushed_writes(), 1);
    d.power_cut(PowerCut::DropUnflushed).unwrap();
    let mut b = [1u8; 100];
    d.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [0; 100]);
}

#[test]
fn power_cut_on_a_file_device() {
    let (_p, f) = open_file(DISK_DIR, true);
    let d = FaultDevice::new(f);
    d.write_at(&[1; 4096], 0).unwrap();
    d.flush().unwrap();
    d.write_at(&[2; 100], 10).unwrap();
    d.power_cut(PowerCut::DropUnflushed).unwrap();
    let mut b = vec![0u8; 4096];
    d.inner().read_at(&mut b, 0).unwrap();
    assert!(b.iter().all(|&x| x == 1));
}

/// Old failure: two servers opened the same cache file and each overwrote
/// the other's lines. An exclusive open claims the file itself, so a second
/// exclusive open fails under any name (the path, a hard link, a symbolic
/// link) until the first is dropped; read-only opens share.
#[test]
fn an_exclusive_open_refuses_a_second_opener_under_any_name() {
    let p = TempPath::new(DISK_DIR, "exclusive");
    let opts = |read_only: bool| OpenOptions {
        create_size: (!read_only).then_some(SIZE),
        read_only,
        exclusive: true,
        ..Default::default()
    };
    let first = FileDevice::open(&p.0, opts(false)).expect("first open");
    first.write_at(b"owned", 0).unwrap();
    let hard = p.0.with_extension("hardlink");
    let soft = p.0.with_extension("symlink");
    std::fs::hard_link(&p.0, &hard).unwrap();
    std::os::unix::fs::symlink(&p.0, &soft).unwrap();
    for (name, path) in [("path", &p.0), ("hard link", &hard), ("symbolic link", &soft)] {
        for read_only in [false, true] {
            let err = FileDevice::open(
                path,
                OpenOptions {
                    create_size: None,
                    ..opts(read_only)
                },
            )
            .expect_err(&format!(
                "a second open by {name} (read_only {read_only}) must fail"
            ));
            match &err {
                DeviceError::Busy { path: busy, holders } => {
                    assert_eq!(busy, path);
                    assert!(
                        holders.iter().any(|h| h == "this process"),
                        "the holder is named: {holders:?}"
                    );
                }
                other => panic!("expected Busy, got {other}"),
            }
            let text = err.to_string();
            assert!(text.contains("in use by this process"), "{text}");
        }
    }
    // A non-exclusive open (tests, inspection tools) is not refused, and
    // the refused opens changed nothing.
    let peek = FileDevice::open(&p.0, OpenOptions::default()).unwrap();
    let mut b = [0u8; 5];
    peek.read_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"owned");
    assert_eq!(std::fs::metadata(&p.0).unwrap().len(), SIZE);
    drop(first);
    // Released with the device: readers share, and exclude a writer.
    let r1 = FileDevice::open(&p.0, opts(true)).expect("read-only after release");
    let r2 = FileDevice::open(&hard, opts(true)).expect("a second reader shares");
    assert!(matches!(
        FileDevice::open(
            &soft,
            OpenOptions {
                create_size: None,
                ..opts(false)
            }
        ),
        Err(DeviceError::Busy { .. })
    ));
    drop((r1, r2));
    FileDevice::open(
        &soft,
        OpenOptions {
            create_size: None,
            ..opts(false)
        },
    )
    .expect("free again");
    let _ = std::fs::remove_file(&hard);
    let _ = std::fs::remove_file(&soft);
}

/// What reads at memory speed (a scheduler may serve it inline): RAM, a
/// file on tmpfs; not a file on a disk, nor anything behind added latency.
#[test]
fn memory_speed_is_ram_and_tmpfs_without_added_latency() {
    assert!(MemDevice::new("m", 4096).reads_at_memory_speed());
    let (_shm, on_tmpfs) = open_file(TMPFS_DIR, false);
    assert!(on_tmpfs.reads_at_memory_speed());
    let (_disk, on_disk) = open_file(DISK_DIR, false);
    assert!(!on_disk.reads_at_memory_speed());
    let slow = fault(4096);
    assert!(slow.reads_at_memory_speed());
    slow.set_latency(Duration::from_micros(10));
    assert!(!slow.reads_at_memory_speed());
    let shared: Arc<dyn BlockDevice> = Arc::new(slow);
    assert!(!shared.reads_at_memory_speed());
}
