//! To choose the default engine and settings from
//! numbers, not guesses. Runs 4 KiB random reads in batches of 1 and 16
//! (the engine API's queue depth: a batch is submitted and waited for as a
//! whole) with each engine on a buffered file under /dev/shm and an
//! O_DIRECT file under /var/tmp, and prints IOPS.
//!
//! `cargo run --release -p iocache-device --example devbench -- [SIZE_MIB] [SECONDS]`

use std::time::{Duration, Instant};

use iocache_device::*;

const BLOCK: usize = 4096;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn prepare(path: &str, size: u64, direct: bool) -> FileDevice {
    let dev = FileDevice::open(
        path,
        OpenOptions {
            direct,
            create_size: Some(size),
            ..Default::default()
        },
    )
    .expect("open bench file");
    // Fill with data: reading holes would measure nothing.
    let chunk = 1 << 20;
    let mut buf = AlignedBuf::zeroed(chunk, BLOCK);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 251) as u8 + 1;
    }
    let mut off = 0;
    while off < size {
        let n = chunk.min((size - off) as usize);
        dev.write_at(&buf[..n], off).expect("fill");
        off += n as u64;
    }
    dev.flush().expect("flush");
    dev
}

fn bench(engine: &dyn IoEngine, dev: &dyn BlockDevice, qd: usize, secs: f64) -> (f64, f64) {
    let blocks = dev.len_bytes() / BLOCK as u64;
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut bufs: Vec<AlignedBuf> = (0..qd).map(|_| AlignedBuf::zeroed(BLOCK, BLOCK)).collect();
    let deadline = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut ios = 0u64;
    let mut batches = 0u64;
    while start.elapsed() < deadline {
        for _ in 0..16 {
            let offs: Vec<u64> = (0..qd).map(|_| (rng.next() % blocks) * BLOCK as u64).collect();
            let mut ops: Vec<IoRequest> = bufs
                .iter_mut()
                .zip(&offs)
                .map(|(b, &o)| IoRequest::read(dev, b, o))
                .collect();
            engine.submit(&mut ops).expect("submit");
            for op in &ops {
                op.outcome().expect("read");
            }
            ios += qd as u64;
            batches += 1;
        }
    }
    let t = start.elapsed().as_secs_f64();
    (ios as f64 / t, t / batches as f64 * 1e6)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let size_mib: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let size = size_mib << 20;

    let mut engines: Vec<Box<dyn IoEngine>> = vec![
        Box::new(PsyncEngine::inline()),
        Box::new(PsyncEngine::with_workers(2)),
        Box::new(PsyncEngine::with_workers(8)),
    ];
    match UringEngine::new(64, 1) {
        Ok(u) => engines.push(Box::new(u)),
        Err(e) => println!("io_uring unavailable: {e}"),
    }

    let shm = "/dev/shm/iocache-devbench";
    let disk = "/var/tmp/iocache-devbench";
    let disk_buffered = "/var/tmp/iocache-devbench-buffered";
    let targets: Vec<(&str, Box<dyn BlockDevice>)> = vec![
        ("mem", Box::new(MemDevice::new("mem", size))),
        ("shm buffered", Box::new(prepare(shm, size, false))),
        ("var/tmp buffered", Box::new(prepare(disk_buffered, size, false))),
        ("var/tmp O_DIRECT", Box::new(prepare(disk, size, true))),
    ];
    for (label, dev) in &targets {
        if let Some(t) = dev.raw_target() {
            println!("# {label}: {} alignment {}", dev.name(), t.alignment);
        }
    }
    println!("# {size_mib} MiB per file, {secs} s per run, 4 KiB random reads");
    println!(
        "{:<18} {:<12} {:>3} {:>10} {:>12}",
        "device", "engine", "qd", "IOPS", "us/batch"
    );
    for (label, dev) in &targets {
        for engine in &engines {
            for qd in [1usize, 16] {
                let (iops, us) = bench(engine.as_ref(), dev.as_ref(), qd, secs);
                println!(
                    "{:<18} {:<12} {:>3} {:>10.0} {:>12.1}",
                    label,
                    engine.name(),
                    qd,
                    iops,
                    us
                );
            }
        }
    }
    let _ = std::fs::remove_file(shm);
    let _ = std::fs::remove_file(disk);
    let _ = std::fs::remove_file(disk_buffered);
}
