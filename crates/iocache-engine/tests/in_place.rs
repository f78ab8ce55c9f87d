//! Reads served in place (`Engine::read_in_place_with`) on a cache file in
//! memory: the bytes handed over are the read's, a miss or a device not in
//! memory fills the buffer instead, and a write to a line waits until the
//! reader is done with the line's bytes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iocache_core::{CacheConfig, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, FileDevice, MemDevice, OpenOptions};
use iocache_engine::{Engine, EngineConfig, Layout, Persistence};

const LINE: u64 = 4096;
const LINES: u64 = 256;

/// Bytes that tell their position and a version apart.
fn pattern(offset: u64, len: usize, version: u8) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i) % 251) as u8 ^ version.wrapping_mul(0x5b) | 1)
        .collect()
}

struct ShmFile(std::path::PathBuf);

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// An engine whose cache is a mapped file in /dev/shm (`None` where
/// /dev/shm is not a memory filesystem), or in memory without a mapping.
fn engine(mapped: bool) -> Option<(Engine, Option<ShmFile>)> {
    let cache = CacheConfig::new(LINES, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    let layout = Layout::for_slots(LINE, LINES).unwrap();
    let backend: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("backend", LINES * LINE * 2));
    let config = EngineConfig {
        persistence: Persistence::All,
        ..EngineConfig::new(CacheConfig {
            write_policy: WritePolicy::WriteBack,
            ..cache
        })
    };
    if !mapped {
        let dev = Arc::new(MemDevice::new("cache", layout.device_bytes()));
        return Some((Engine::new(config, dev, backend).unwrap(), None));
    }
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/iocache-in-place-{}-{}",
        std::process::id(),
        rand_tag()
    ));
    let file = ShmFile(path.clone());
    let options = OpenOptions {
        create_size: Some(layout.device_bytes()),
        ..Default::default()
    };
    let mut dev = FileDevice::open(&path, options).ok()?;
    if !dev.map_if_in_memory().ok()? {
        return None;
    }
    Some((Engine::new(config, Arc::new(dev), backend).unwrap(), Some(file)))
}

/// [`engine`] over a cache file mapped in memory, or `None` (said on
/// stderr) where /dev/shm is not a memory filesystem.
fn mapped_engine() -> Option<(Engine, ShmFile)> {
    let mapped = engine(true).map(|(engine, file)| (engine, file.expect("a mapped cache has its file")));
    if mapped.is_none() {
        eprintln!("skipped: /dev/shm is not a memory filesystem here");
    }
    mapped
}

fn rand_tag() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Reads `len` bytes at `offset` in place if the engine can: (whether it
/// did, the bytes read). The bytes handed over are also declined once (the
/// engine then copies them into the buffer): the same bytes either way.
fn read(engine: &Engine, offset: u64, len: usize) -> (bool, Vec<u8>) {
    let volume = engine.volume(0).unwrap();
    let mut results = Vec::new();
    for take in [true, false] {
        let mut buf = vec![0u8; len];
        let mut got = Vec::new();
        let taken = engine
            .read_in_place_with(&volume, offset, &mut buf, &mut |parts| {
                got = parts.concat();
                take
            })
            .unwrap();
        assert!(!taken || take, "taken though declined");
        if taken {
            assert!(buf.iter().all(|&b| b == 0), "the buffer is left alone");
            results.push((true, got));
        } else {
            if !got.is_empty() {
                assert_eq!(got, buf, "declined bytes are copied into the buffer");
            }
            results.push((!got.is_empty(), buf));
        }
    }
    assert_eq!(results[0], results[1], "taken or declined, the same read");
    results.remove(0)
}

#[test]
fn a_full_hit_in_memory_is_read_in_place_and_anything_else_is_copied() {
    let Some((engine, _file)) = mapped_engine() else {
        return;
    };
    // Sequential lines (adjacent slots: one part) and scattered ones.
    engine
        .write(0, &pattern(0, 64 * LINE as usize, 1), false)
        .unwrap();
    for line in [100u64, 90, 130, 95] {
        engine
            .write(line * LINE, &pattern(line * LINE, LINE as usize, 2), false)
            .unwrap();
    }
    let (in_place, bytes) = read(&engine, 0, 64 * LINE as usize);
    assert!(in_place, "a full hit on a mapped cache is read in place");
    assert_eq!(bytes, pattern(0, 64 * LINE as usize, 1));
    let (in_place, bytes) = read(&engine, 512, 3 * LINE as usize);
    assert!(in_place, "parts of lines too");
    assert_eq!(bytes, pattern(512, 3 * LINE as usize, 1));
    for line in [90u64, 95, 100, 130] {
        let (in_place, bytes) = read(&engine, line * LINE, LINE as usize);
        assert!(in_place);
        assert_eq!(bytes, pattern(line * LINE, LINE as usize, 2));
    }
    // A miss (the backend's zeroes), and a read half hit, half missed:
    // into the buffer.
    let (in_place, bytes) = read(&engine, 200 * LINE, LINE as usize);
    assert!(!in_place);
    assert_eq!(bytes, vec![0u8; LINE as usize]);
    let (in_place, bytes) = read(&engine, 63 * LINE, 2 * LINE as usize);
    assert!(!in_place);
    assert_eq!(&bytes[..LINE as usize], &pattern(63 * LINE, LINE as usize, 1)[..]);
    // A hit on sectors of zeroes goes the usual way (which decides whether
    // the cache device lost its content).
    engine.write(10 * LINE, &vec![0u8; LINE as usize], false).unwrap();
    let (in_place, bytes) = read(&engine, 10 * LINE, LINE as usize);
    assert!(!in_place);
    assert_eq!(bytes, vec![0u8; LINE as usize]);
    let stats = engine.stats();
    assert_eq!(stats.io_errors, 0);
    engine.shutdown().unwrap();
}

#[test]
fn a_cache_not_in_memory_is_never_read_in_place() {
    let (engine, _) = engine(false).unwrap();
    engine.write(0, &pattern(0, 8 * LINE as usize, 1), false).unwrap();
    let (in_place, bytes) = read(&engine, 0, 8 * LINE as usize);
    assert!(!in_place);
    assert_eq!(bytes, pattern(0, 8 * LINE as usize, 1));
    engine.shutdown().unwrap();
}

/// While the reader holds the bytes of a line, a write to that line waits:
/// what the reader sees never changes under it, and the write lands after.
#[test]
fn a_write_waits_for_the_reader_of_its_line() {
    let Some((engine, _file)) = mapped_engine() else {
        return;
    };
    let engine = Arc::new(engine);
    engine.write(0, &pattern(0, 4 * LINE as usize, 1), false).unwrap();
    let volume = engine.volume(0).unwrap();
    let wrote = Arc::new(AtomicBool::new(false));
    let mut buf = vec![0u8; 4 * LINE as usize];
    let mut writer = None;
    let in_place = engine
        .read_in_place_with(&volume, 0, &mut buf, &mut |parts| {
            let (e, w) = (engine.clone(), wrote.clone());
            writer = Some(std::thread::spawn(move || {
                e.write(LINE, &pattern(LINE, LINE as usize, 9), false).unwrap();
                w.store(true, Ordering::SeqCst);
            }));
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                !wrote.load(Ordering::SeqCst),
                "the write went ahead of the reader"
            );
            assert_eq!(parts.concat(), pattern(0, 4 * LINE as usize, 1));
            true
        })
        .unwrap();
    assert!(in_place);
    writer.unwrap().join().unwrap();
    assert!(wrote.load(Ordering::SeqCst));
    let (_, bytes) = read(&engine, LINE, LINE as usize);
    assert_eq!(bytes, pattern(LINE, LINE as usize, 9));
    engine.shutdown().unwrap();
}

/// The cache file truncated by someone else while a reader holds its
/// bytes: touching them faults (the mapping's guard puts zeroes in their
/// place), and the read fails instead of passing for a success.
#[test]
fn a_fault_while_the_bytes_are_held_fails_the_read() {
    let Some((engine, file)) = mapped_engine() else {
        return;
    };
    let path = file.0.clone();
    engine
        .write(0, &pattern(0, 16 * LINE as usize, 1), false)
        .unwrap();
    let volume = engine.volume(0).unwrap();
    let mut buf = vec![0u8; 16 * LINE as usize];
    let mut seen = Vec::new();
    let result = engine.read_in_place_with(&volume, 0, &mut buf, &mut |parts| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        seen = parts.concat();
        true
    });
    assert!(
        result.is_err(),
        "a read whose bytes faulted succeeded: {result:?}"
    );
    assert!(
        seen.iter().all(|&b| b == 0),
        "the pages were gone: zeroes stood in"
    );
    // Later reads never use the failed memory (the line's dirty data is
    // gone with it: an error).
    let mut buf = vec![0u8; LINE as usize];
    let later = engine.read_in_place_with(&volume, 0, &mut buf, &mut |_| {
        panic!("read in place from failed memory")
    });
    assert!(later.is_err(), "{later:?}");
    drop(engine);
}
