//! Checks that every I/O engine runs mixed batches
//! over several kinds of device with the same outcome as direct
//! pread/pwrite, reports errors per request, copes with batches larger than
//! its queue and with concurrent submitters; and reports whether io_uring
//! is usable on this machine.

mod common;

use std::sync::Arc;

use common::{new_file_device, pattern, TempPath, DISK_DIR, TMPFS_DIR};
use iocache_device::*;

const SIZE: u64 = 4 << 20;

fn engines() -> Vec<Box<dyn IoEngine>> {
    let mut v: Vec<Box<dyn IoEngine>> = vec![
        Box::new(PsyncEngine::inline()),
        Box::new(PsyncEngine::with_workers(3)),
    ];
    match UringEngine::new(16, 2) {
        Ok(u) => v.push(Box::new(u)),
        Err(e) => {
            assert!(matches!(e, DeviceError::UringUnavailable { .. }), "{e}");
            eprintln!("io_uring unavailable, engine tests run without it: {e}");
        }
    }
    v
}

#[test]
fn uring_is_available_or_reports_why() {
    match UringEngine::new(8, 1) {
        Ok(_) => eprintln!("io_uring available"),
        Err(e) => {
            assert!(matches!(e, DeviceError::UringUnavailable { .. }), "{e}");
            eprintln!("io_uring unavailable: {e}");
        }
    }
}

/// Submits `ops` through `engine` and checks that every one succeeded.
fn submit_ok(engine: &dyn IoEngine, ops: &mut [IoRequest<'_>]) {
    engine.submit(ops).unwrap();
    assert!(ops.iter().all(|o| o.outcome().is_ok()), "{}", engine.name());
}

fn file(dir: &str, direct: bool) -> (TempPath, FileDevice) {
    new_file_device(dir, "engine", SIZE, direct)
}

struct Devices {
    _paths: Vec<TempPath>,
    devs: Vec<Box<dyn BlockDevice>>,
}

fn devices() -> Devices {
    let (p1, buffered) = file(TMPFS_DIR, false);
    let (p2, direct) = file(DISK_DIR, true);
    let fault = FaultDevice::new(MemDevice::new("fault-mem", SIZE));
    fault.set_journal(false);
    Devices {
        _paths: vec![p1, p2],
        devs: vec![
            Box::new(buffered),
            Box::new(direct),
            Box::new(MemDevice::new("mem", SIZE)),
            Box::new(fault),
        ],
    }
}

#[test]
fn mixed_batches_match_direct_io() {
    for engine in engines() {
        let d = devices();
        let mut seed = 0u64;
        // Per device: aligned buffers at aligned offsets, unaligned Vecs at
        // odd offsets, sizes from 1 byte to 256 KiB.
        let shapes: [(u64, usize, bool); 6] = [
            (0, 4096, true),
            (8192, 65_536, true),
            (300_001, 1, false),
            (400_000, 4096, false),
            (500_123, 70_001, false),
            (1 << 20, 256 * 1024, true),
        ];
        let mut datas: Vec<(usize, u64, AlignedBuf)> = Vec::new();
        for (di, dev) in d.devs.iter().enumerate() {
            for &(off, len, aligned) in &shapes {
                seed += 1;
                let mut b = AlignedBuf::zeroed(len + 1, 4096);
                b.copy_from_slice(&pattern(len + 1, seed));
                let _ = aligned;
                datas.push((di, off, b));
                let _ = dev;
            }
        }
        // Writes: the aligned shapes use the aligned buffer, others a slice
        // starting one byte in (misaligned address).
        let mut ops: Vec<IoRequest> = Vec::new();
        for (k, (di, off, b)) in datas.iter().enumerate() {
            let (_, len, aligned) = shapes[k % shapes.len()];
            let data = if aligned { &b[..len] } else { &b[1..] };
            ops.push(IoRequest::write(d.devs[*di].as_ref(), data, *off));
        }
        engine.submit(&mut ops).unwrap();
        for op in &ops {
            op.outcome().unwrap_or_else(|e| panic!("{}: {e}", engine.name()));
        }
        drop(ops);
        // Direct reads see the writes.
        for (k, (di, off, b)) in datas.iter().enumerate() {
            let (_, len, aligned) = shapes[k % shapes.len()];
            let want = if aligned { &b[..len] } else { &b[1..] };
            let mut got = vec![0u8; len];
            d.devs[*di].read_at(&mut got, *off).unwrap();
            assert!(got == want, "{} dev {di} off {off}", engine.name());
        }
        // Engine reads (aligned and not) see what direct reads see.
        let mut bufs: Vec<AlignedBuf> = datas
            .iter()
            .enumerate()
            .map(|(k, _)| AlignedBuf::zeroed(shapes[k % shapes.len()].1 + 1, 4096))
            .collect();
        let mut ops: Vec<IoRequest> = Vec::new();
        for (k, ((di, off, _), buf)) in datas.iter().zip(bufs.iter_mut()).enumerate() {
            let (_, len, aligned) = shapes[k % shapes.len()];
            let b = if aligned { &mut buf[..len] } else { &mut buf[1..] };
            ops.push(IoRequest::read(d.devs[*di].as_ref(), b, *off - (k as u64 % 2)));
        }
        engine.submit(&mut ops).unwrap();
        for op in &ops {
            op.outcome().unwrap();
        }
        drop(ops);
        for (k, ((di, off, _), buf)) in datas.iter().zip(bufs.iter()).enumerate() {
            let (_, len, aligned) = shapes[k % shapes.len()];
            let got = if aligned { &buf[..len] } else { &buf[1..] };
            let mut want = vec![0u8; len];
            d.devs[*di].read_at(&mut want, *off - (k as u64 % 2)).unwrap();
            assert!(got == &want[..], "{} read dev {di} off {off}", engine.name());
        }
    }
}

#[test]
fn errors_are_per_request() {
    for engine in engines() {
        let (_p, direct) = file(DISK_DIR, true);
        let fault = FaultDevice::new(MemDevice::new("flaky", SIZE));
        fault.fail_range(8192, 1, true, true);
        let ro_path = TempPath::new(DISK_DIR, "ro");
        FileDevice::open(
            &ro_path.0,
            OpenOptions {
                create_size: Some(SIZE),
                ..Default::default()
            },
        )
        .unwrap();
        let ro = FileDevice::open(
            &ro_path.0,
            OpenOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        let w = AlignedBuf::zeroed(4096, 4096);
        let mut r1 = AlignedBuf::zeroed(4096, 4096);
        let mut r2 = vec![0u8; 4096];
        let mut r3 = vec![0u8; 10];
        let mut ops = vec![
            IoRequest::write(&direct, &w, 0),               // ok
            IoRequest::read(&direct, &mut r1, SIZE - 2048), // out of range
            IoRequest::read(&fault, &mut r2, 8000),         // injected
            IoRequest::write(&ro, &w, 0),                   // read-only
            IoRequest::read(&fault, &mut r3, 100),          // ok
            IoRequest::write(&fault, &w, 0),                // ok
        ];
        engine.submit(&mut ops).unwrap();
        let n = engine.name().to_string();
        assert!(ops[0].outcome().is_ok(), "{n}");
        let e = ops[1].outcome().unwrap_err();
        assert!(
            matches!(e, DeviceError::OutOfRange { offset, .. } if *offset == SIZE - 2048),
            "{n}: {e}"
        );
        let e = ops[2].outcome().unwrap_err();
        assert!(e.is_injected() && e.offset() == Some(8000), "{n}: {e}");
        assert!(e.to_string().contains("flaky"));
        assert!(
            matches!(ops[3].outcome(), Err(DeviceError::ReadOnly { .. })),
            "{n}"
        );
        assert!(ops[4].outcome().is_ok() && ops[5].outcome().is_ok(), "{n}");
    }
}

#[test]
fn batches_larger_than_the_queue_and_concurrent_submitters() {
    for engine in engines() {
        let engine: Arc<dyn IoEngine> = Arc::from(engine);
        let (_p, dev) = file(DISK_DIR, true);
        let dev = Arc::new(dev);
        // 4 threads, each 3 batches of 100 aligned 4 KiB writes then reads.
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let engine = Arc::clone(&engine);
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    for round in 0..3u64 {
                        let bufs: Vec<AlignedBuf> = (0..100u64)
                            .map(|i| {
                                let mut b = AlignedBuf::zeroed(4096, 4096);
                                b.copy_from_slice(&pattern(4096, t * 1000 + i + round));
                                b
                            })
                            .collect();
                        let off = |i: u64| (i * 4 + t) * 4096;
                        let mut ops: Vec<IoRequest> = bufs
                            .iter()
                            .enumerate()
                            .map(|(i, b)| IoRequest::write(dev.as_ref(), b, off(i as u64)))
                            .collect();
                        submit_ok(engine.as_ref(), &mut ops);
                        drop(ops);
                        let mut back: Vec<AlignedBuf> =
                            (0..100).map(|_| AlignedBuf::zeroed(4096, 4096)).collect();
                        let mut ops: Vec<IoRequest> = back
                            .iter_mut()
                            .enumerate()
                            .map(|(i, b)| IoRequest::read(dev.as_ref(), b, off(i as u64)))
                            .collect();
                        submit_ok(engine.as_ref(), &mut ops);
                        drop(ops);
                        for (a, b) in bufs.iter().zip(&back) {
                            assert!(a[..] == b[..], "{}", engine.name());
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
}

#[test]
fn uring_drives_aligned_file_requests_through_the_ring() {
    let Ok(u) = UringEngine::new(8, 1) else {
        eprintln!("io_uring unavailable: skipped");
        return;
    };
    let (_p, f) = file(DISK_DIR, true);
    let m = MemDevice::new("m", SIZE);
    let a = AlignedBuf::zeroed(8192, 4096);
    let v = AlignedBuf::zeroed(8193, 4096);
    let mut ops = vec![
        IoRequest::write(&f, &a, 0),          // ring
        IoRequest::write(&f, &a, 8192),       // ring
        IoRequest::write(&f, &v[1..], 16384), // misaligned buffer: device path
        IoRequest::write(&m, &a, 0),          // no fd: memcpy
    ];
    submit_ok(&u, &mut ops);
    assert_eq!(
        u.stats(),
        UringStats {
            ring_ops: 2,
            sync_ops: 2,
            nowait_reads: 0
        }
    );
}

#[test]
fn uring_serves_cached_buffered_reads_without_the_ring() {
    let Ok(u) = UringEngine::new(8, 1) else {
        eprintln!("io_uring unavailable: skipped");
        return;
    };
    let (_p1, disk) = file(DISK_DIR, false);
    let (_p2, shm) = file(TMPFS_DIR, false);
    let data = pattern(8192, 5);
    disk.write_at(&data, 4096).unwrap();
    shm.write_at(&data, 4096).unwrap();
    let mut a = vec![0u8; 8192];
    let mut b = vec![0u8; 8192];
    let mut ops = vec![
        IoRequest::read(&disk, &mut a, 4096),
        IoRequest::read(&shm, &mut b, 4096),
    ];
    submit_ok(&u, &mut ops);
    drop(ops);
    assert!(a == data && b == data);
    let st = u.stats();
    // ext4 has non-blocking buffered reads (page cache hit after the write);
    // tmpfs answers EOPNOTSUPP (Linux 6.18) or serves them too.
    assert_eq!(st.nowait_reads + st.sync_ops, 2, "{st:?}");
    assert!(st.nowait_reads >= 1, "{st:?}");
}

#[test]
fn empty_batches_and_empty_requests() {
    for engine in engines() {
        let m = MemDevice::new("m", 100);
        engine.submit(&mut []).unwrap();
        let (_p, f) = file(DISK_DIR, true);
        let mut ops = vec![IoRequest::read(&f, &mut [], 0), IoRequest::write(&m, &[], 100)];
        submit_ok(engine.as_ref(), &mut ops);
    }
}
