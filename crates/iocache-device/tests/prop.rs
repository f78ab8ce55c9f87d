//! A property test that random batches of writes and
//! reads, at any offset, length and buffer alignment, give the same bytes as
//! a plain `Vec<u8>` model, through every device and every engine.

mod common;

use common::{pattern, TempPath, DISK_DIR, TMPFS_DIR};
use iocache_device::*;
use proptest::prelude::*;

const SIZE: u64 = 256 * 1024;

#[derive(Clone, Debug)]
struct Io {
    offset: u64,
    len: usize,
    /// Bytes by which the buffer's address is moved off 4096 alignment.
    misalign: usize,
    seed: u64,
}

#[derive(Clone, Debug)]
enum Batch {
    Writes(Vec<Io>),
    Reads(Vec<Io>),
}

fn io() -> impl Strategy<Value = Io> {
    (
        0..SIZE,
        prop_oneof![1usize..600, Just(512usize), Just(4096usize), 1usize..20_000],
        prop_oneof![Just(0usize), 0usize..600],
        any::<u64>(),
    )
        .prop_map(|(offset, len, misalign, seed)| {
            // Keep an aligned share of requests on O_DIRECT's fast path.
            let (offset, len) = if seed % 3 == 0 {
                (offset / 4096 * 4096, len.div_ceil(512) * 512)
            } else {
                (offset, len)
            };
            let len = len.min((SIZE - offset) as usize).max(1);
            let offset = offset.min(SIZE - len as u64);
            Io {
                offset,
                len,
                misalign: if seed % 3 == 0 { 0 } else { misalign },
                seed,
            }
        })
}

fn batch() -> impl Strategy<Value = Batch> {
    prop_oneof![
        proptest::collection::vec(io(), 1..6).prop_map(|v| {
            // Writes of one batch must not overlap.
            let mut kept: Vec<Io> = Vec::new();
            for w in v {
                let overlaps = kept
                    .iter()
                    .any(|k| w.offset < k.offset + k.len as u64 && k.offset < w.offset + w.len as u64);
                if !overlaps {
                    kept.push(w);
                }
            }
            Batch::Writes(kept)
        }),
        proptest::collection::vec(io(), 1..6).prop_map(Batch::Reads),
    ]
}

/// Runs one batch through `engine`, or straight on the device when `None`.
fn run(engine: Option<&dyn IoEngine>, dev: &dyn BlockDevice, b: &Batch, model: &mut [u8]) {
    match b {
        Batch::Writes(ws) => {
            let bufs: Vec<AlignedBuf> = ws
                .iter()
                .map(|w| {
                    let mut a = AlignedBuf::zeroed(w.len + w.misalign, 4096);
                    a[w.misalign..].copy_from_slice(&pattern(w.len, w.seed));
                    a
                })
                .collect();
            let mut ops: Vec<IoRequest> = ws
                .iter()
                .zip(&bufs)
                .map(|(w, a)| IoRequest::write(dev, &a[w.misalign..], w.offset))
                .collect();
            submit(engine, &mut ops);
            for w in ws {
                model[w.offset as usize..w.offset as usize + w.len].copy_from_slice(&pattern(w.len, w.seed));
            }
        }
        Batch::Reads(rs) => {
            let mut bufs: Vec<AlignedBuf> = rs
                .iter()
                .map(|r| AlignedBuf::zeroed(r.len + r.misalign, 4096))
                .collect();
            let mut ops: Vec<IoRequest> = rs
                .iter()
                .zip(bufs.iter_mut())
                .map(|(r, a)| IoRequest::read(dev, &mut a[r.misalign..], r.offset))
                .collect();
            submit(engine, &mut ops);
            drop(ops);
            for (r, a) in rs.iter().zip(&bufs) {
                let want = &model[r.offset as usize..r.offset as usize + r.len];
                assert!(&a[r.misalign..] == want, "{} {r:?}", dev.name());
            }
        }
    }
}

fn submit(engine: Option<&dyn IoEngine>, ops: &mut [IoRequest]) {
    match engine {
        Some(e) => e.submit(ops).unwrap(),
        None => {
            for op in ops.iter_mut() {
                op.result = Some(match &mut op.buf {
                    IoBuf::Read(b) => op.device.read_at(b, op.offset),
                    IoBuf::Write(b) => op.device.write_at(b, op.offset),
                });
            }
        }
    }
    for op in ops.iter() {
        op.outcome().unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn devices_and_engines_agree_with_a_vec_model(batches in proptest::collection::vec(batch(), 1..16)) {
        let mut engines: Vec<Option<Box<dyn IoEngine>>> = vec![
            None,
            Some(Box::new(PsyncEngine::inline())),
            Some(Box::new(PsyncEngine::with_workers(2))),
        ];
        if let Ok(u) = UringEngine::new(4, 1) {
            engines.push(Some(Box::new(u)));
        }
        for engine in &engines {
            let p1 = TempPath::new(TMPFS_DIR, "prop");
            let p2 = TempPath::new(DISK_DIR, "prop");
            let p3 = TempPath::new(TMPFS_DIR, "prop-mapped");
            let opts = |direct| OpenOptions { direct, create_size: Some(SIZE), read_only: false, exclusive: false, no_follow: false, beneath: None };
            // A file in memory, read and written through its mapping.
            let mut mapped = FileDevice::open(&p3.0, opts(false)).unwrap();
            prop_assert!(mapped.map_if_in_memory().unwrap(), "{} is in memory", p3.0.display());
            // A file on disk is never mapped.
            let mut on_disk = FileDevice::open(&p2.0, opts(true)).unwrap();
            prop_assert!(!on_disk.map_if_in_memory().unwrap());
            let devs: Vec<Box<dyn BlockDevice>> = vec![
                Box::new(MemDevice::new("mem", SIZE)),
                Box::new(FileDevice::open(&p1.0, opts(false)).unwrap()),
                Box::new(on_disk),
                Box::new(mapped),
                Box::new(FaultDevice::new(MemDevice::new("fault", SIZE))),
            ];
            for dev in &devs {
                let mut model = vec![0u8; SIZE as usize];
                for b in &batches {
                    run(engine.as_deref(), dev.as_ref(), b, &mut model);
                }
                let mut all = vec![0u8; SIZE as usize];
                dev.read_at(&mut all, 0).unwrap();
                prop_assert!(all == model, "{} final contents", dev.name());
            }
        }
    }
}
