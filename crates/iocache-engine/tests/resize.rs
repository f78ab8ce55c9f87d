//! A cache resized while it serves: a shrink keeps the lines read most
//! recently and writes back every dirty line that leaves, a growth keeps
//! every line, the size survives a restart, and a process killed at any
//! moment of a resize restarts on the old size or the new one with every
//! write that was flushed before it.

use std::sync::Arc;
use std::time::Duration;

use iocache_core::{CacheConfig, LineSize, PolicySpec, Setting, WritePolicy};
use iocache_device::{BlockDevice, FaultDevice, MemDevice};
use iocache_engine::{Engine, Persistence};

mod common;
use common::{count_from_env, Model, Rng, SECTOR, VOLUME_SECTORS};

const LINES: u64 = 64;
const LINE: u64 = 4096;

fn config(lines_in_service: Option<u64>) -> CacheConfig {
    let mut c = CacheConfig::new(LINES, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    c.write_policy = WritePolicy::WriteBack;
    c.lines_in_service = lines_in_service;
    c
}

fn devices() -> (Arc<FaultDevice<MemDevice>>, Arc<FaultDevice<MemDevice>>) {
    common::fault_devices(LINE, LINES, VOLUME_SECTORS * SECTOR)
}

fn resize(engine: &Engine, lines: u64) {
    engine
        .apply_settings(&[Setting::CacheSize(lines * LINE)])
        .unwrap_or_else(|e| panic!("resize to {lines} lines: {e}"));
}

/// Writes `line` whole, stamped with the model's next write number.
fn write_line(engine: &Engine, model: &mut Model, line: u64) {
    let mut rng = Rng::seeded(line);
    let mut w = model.next_write(&mut rng, false);
    w.first = line * (LINE / SECTOR);
    w.sectors = LINE / SECTOR;
    engine.write(w.offset(), &w.data(), false).unwrap();
    model.record(&w);
}

fn check_all(engine: &Engine, model: &Model, context: &str) {
    let mut buf = vec![0u8; (VOLUME_SECTORS * SECTOR) as usize];
    engine.read(0, &mut buf).unwrap();
    model.assert_latest(0, &buf, context);
}

fn resident(engine: &Engine, line: u64) -> bool {
    engine.read_would_hit(engine.default_volume(), line * LINE, LINE)
}

#[test]
fn a_shrink_keeps_the_recent_lines_and_a_growth_keeps_them_all() {
    let (cache, backend) = devices();
    let engine = common::open_engine_in(&config(None), 1, Persistence::All, cache.clone(), backend.clone());
    let mut model = Model::new();
    for line in 0..LINES {
        write_line(&engine, &mut model, line);
    }
    // The last 16 written are the most recent; every line is dirty.
    assert_eq!(engine.stats().dirty_lines, LINES);
    resize(&engine, 16);
    let stats = engine.stats();
    assert_eq!((stats.capacity_lines, stats.lines_in_service), (LINES, 16));
    assert!(
        stats.resident_lines <= 16,
        "{} lines resident",
        stats.resident_lines
    );
    let kept = (LINES - 16..LINES).filter(|&l| resident(&engine, l)).count();
    assert!(kept >= 14, "{kept} of the 16 most recent lines kept");
    // The lines that left were written back: the backend alone has them.
    let mut on_backend = vec![0u8; (VOLUME_SECTORS * SECTOR) as usize];
    backend.read_at(&mut on_backend, 0).unwrap();
    model.assert_latest(
        0,
        &on_backend[..((LINES - 16) * LINE) as usize],
        "backend after the shrink",
    );
    check_all(&engine, &model, "after the shrink");
    // Growing keeps every line and fills the new room.
    let before: Vec<u64> = (0..LINES).filter(|&l| resident(&engine, l)).collect();
    resize(&engine, 48);
    assert!(
        before.iter().all(|&l| resident(&engine, l)),
        "a growth dropped a line"
    );
    for line in 0..32 {
        write_line(&engine, &mut model, line);
    }
    assert!(engine.stats().resident_lines > 16);
    assert!(engine.stats().resident_lines <= 48);
    check_all(&engine, &model, "after the growth");
    // The size survives a restart, with the lines.
    resize(&engine, 24);
    let kept: Vec<u64> = (0..LINES).filter(|&l| resident(&engine, l)).collect();
    engine.shutdown().unwrap();
    drop(engine);
    let engine = common::open_engine_in(&config(None), 1, Persistence::All, cache.clone(), backend.clone());
    assert_eq!(engine.stats().lines_in_service, 24);
    assert!(
        kept.iter().all(|&l| resident(&engine, l)),
        "the restart dropped a line"
    );
    check_all(&engine, &model, "after the restart");
    // Out of range: refused, the size unchanged.
    for bad in [0, LINES + 1] {
        let err = engine
            .apply_settings(&[Setting::CacheSize(bad * LINE)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("1 to 64 lines") && err.contains("formatted for 64"),
            "{err}"
        );
    }
    assert_eq!(engine.stats().lines_in_service, 24);
}

/// Under ordered write-back the backend takes epochs in turn: a shrink
/// writes back the epochs up to the newest of the lines leaving, and no
/// newer one, so the lines written since the last FLUSH stay dirty.
#[test]
fn an_ordered_shrink_writes_back_no_epoch_newer_than_the_lines_leaving() {
    let (cache, backend) = devices();
    let mut c = config(None);
    c.ordered_write_back = true;
    c.cleaning = iocache_core::CleaningPolicy::Nop;
    let engine = common::open_engine_in(&c, 1, Persistence::All, cache.clone(), backend.clone());
    let mut model = Model::new();
    for line in 0..LINES / 2 {
        write_line(&engine, &mut model, line);
    }
    engine.flush().unwrap();
    model.flushed();
    for line in LINES / 2..LINES {
        write_line(&engine, &mut model, line);
    }
    assert_eq!(engine.stats().dirty_lines, LINES);
    // The least recent half leaves: the epoch before the FLUSH.
    resize(&engine, LINES / 2);
    let stats = engine.stats();
    assert_eq!(stats.lines_in_service, LINES / 2);
    assert_eq!(
        stats.dirty_lines,
        LINES / 2,
        "the lines written after the FLUSH stay dirty"
    );
    assert!((0..LINES / 2).all(|line| !resident(&engine, line)));
    check_all(&engine, &model, "after an ordered shrink");
    engine.shutdown().unwrap();
    let mut sector = vec![0u8; SECTOR as usize];
    for s in 0..VOLUME_SECTORS {
        backend.read_at(&mut sector, s * SECTOR).unwrap();
        model.assert_latest(s, &sector, "the backend after the shutdown");
    }
}

#[test]
fn a_smaller_configured_size_at_a_start_keeps_the_lines_that_fit() {
    let (cache, backend) = devices();
    let engine = common::open_engine_in(
        &config(None),
        2,
        Persistence::Dirty,
        cache.clone(),
        backend.clone(),
    );
    let mut model = Model::new();
    for line in 0..LINES {
        write_line(&engine, &mut model, line);
    }
    engine.flush().unwrap();
    drop(engine); // killed: dirty lines still in the cache
    let engine = common::open_engine_in(
        &config(Some(20)),
        2,
        Persistence::Dirty,
        cache.clone(),
        backend.clone(),
    );
    let stats = engine.stats();
    assert_eq!(stats.lines_in_service, 20);
    assert!(stats.resident_lines <= 20 && stats.resident_lines > 0);
    check_all(&engine, &model, "after a start at a smaller size");
    let setting = engine
        .settings()
        .into_iter()
        .find(|k| k.key == "cache_size")
        .unwrap();
    assert_eq!(
        (setting.configured.as_str(), setting.current.as_str()),
        ("80KiB", "80KiB")
    );
}

/// One kill during a resize: returns whether the restart found the new size.
fn kill_during_resize(seed: u64) -> bool {
    let mut rng = Rng::seeded(seed);
    let (cache, backend) = devices();
    backend.set_latency(Duration::from_micros(100 + rng.below(400)));
    let persistence = [Persistence::All, Persistence::Dirty][rng.below(2) as usize];
    let engine = Arc::new(common::open_engine_in(
        &config(None),
        2,
        persistence,
        cache.clone(),
        backend.clone(),
    ));
    let mut model = Model::new();
    for _ in 0..(50 + rng.below(200)) {
        let w = model.next_write(&mut rng, true);
        engine.write(w.offset(), &w.data(), w.fua).unwrap();
        model.record(&w);
    }
    if rng.below(3) > 0 {
        resize(&engine, 2 + rng.below(LINES - 2));
    }
    engine.flush().unwrap();
    model.flushed();
    let old = engine.stats().lines_in_service;
    let new = 2 + rng.below(LINES - 2);
    let resizing = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || engine.apply_settings(&[Setting::CacheSize(new * LINE)]).is_ok())
    };
    // The kill: at once, a few milliseconds in, or once the resize is
    // done (so that some kills come after it however busy the machine).
    let mut resizing = Some(resizing);
    match rng.below(4) {
        0 => {}
        1 => {
            let _ = resizing.take().map(|r| r.join().unwrap());
        }
        _ => std::thread::sleep(Duration::from_micros(rng.below(3_000))),
    }
    // Killed: nothing more reaches the cache device, then the backend.
    cache.set_writes_dropped(true);
    backend.set_writes_dropped(true);
    let _ = resizing.map(|r| r.join().unwrap());
    drop(Arc::try_unwrap(engine).ok().expect("the resize thread is done"));
    cache.clear_faults();
    backend.clear_faults();
    backend.set_latency(Duration::ZERO);
    let engine = common::open_engine_in(&config(None), 2, persistence, cache, backend);
    let size = engine.stats().lines_in_service;
    assert!(
        size == old || size == new,
        "seed {seed}: {size} lines in service after a kill while going from {old} to {new}"
    );
    check_all(
        &engine,
        &model,
        &format!("seed {seed} ({persistence}, {old} to {new} lines)"),
    );
    size == new && new != old
}

#[test]
fn a_kill_during_a_resize_loses_no_flushed_write() {
    let runs = count_from_env("RESIZE_KILLS", 24);
    let finished = (0..runs).filter(|&seed| kill_during_resize(seed)).count();
    // Some kills came after the new size was recorded, some before.
    assert!(
        finished > 0 && finished < runs as usize,
        "{finished} of {runs} kills after the resize"
    );
}
