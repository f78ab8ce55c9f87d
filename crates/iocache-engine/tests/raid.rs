//! Cache RAID under a member failure: a write-back cache striped over two or
//! three fault-injecting devices runs a verifying workload; at a random
//! moment one member goes offline. Every request must still succeed and
//! read the latest data (degraded mode serves dirty sectors from their
//! mirror), the engine must write back what lost a copy and retire the
//! dead member's slots, and a clean shutdown must leave the backend holding
//! exactly the latest values. The crash variant abandons the engine after
//! the failure and cuts the power on every device, then reopens the array
//! (the dead member sometimes back online with its stale contents, which
//! must not be trusted): every sector must hold its value as of the last
//! FLUSH or a later one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_core::{CacheConfig, CleaningPolicy, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, FaultDevice, MemDevice};
use iocache_engine::{CacheArray, Engine, EngineConfig, IoMode, Lookup, Persistence};

mod common;
use common::{
    decode, random_power_cut, stamps, DeviceWrite, Hook, Hooked, Model, Rng, SECTOR, VOLUME_SECTORS,
};

const LINE: u64 = 4096;
/// Each member: room for about 64 lines and the metadata.
const MEMBER_BYTES: u64 = 64 * LINE + 64 * 1024;

struct Rig {
    members: Vec<Arc<FaultDevice<MemDevice>>>,
    backend: Arc<FaultDevice<MemDevice>>,
    config: CacheConfig,
    persistence: Persistence,
    /// io_uring writes a dirty line's two copies at once; psync in turn.
    io: IoMode,
}

impl Rig {
    fn new(seed: u64, members: usize, persistence: Persistence) -> Rig {
        let mut config = CacheConfig::new(1, LineSize::new(LINE).unwrap(), PolicySpec::lru());
        config.write_policy = WritePolicy::WriteBack;
        if seed.is_multiple_of(2) {
            config.cleaning = "aggressive:interval=1ms:batch=4"
                .parse::<CleaningPolicy>()
                .unwrap();
        }
        Rig {
            members: (0..members)
                .map(|i| Arc::new(FaultDevice::new(MemDevice::new(format!("m{i}"), MEMBER_BYTES))))
                .collect(),
            backend: Arc::new(FaultDevice::new(MemDevice::new(
                "backend",
                VOLUME_SECTORS * SECTOR,
            ))),
            config,
            persistence,
            io: if seed.is_multiple_of(3) {
                IoMode::Uring
            } else {
                IoMode::Psync
            },
        }
    }

    fn open(&self) -> Engine {
        self.engine_on(self.open_array())
    }

    fn open_array(&self) -> Arc<CacheArray> {
        let members = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let dev: Arc<dyn BlockDevice> = m.clone();
                (format!("m{i}"), Some(dev))
            })
            .collect();
        Arc::new(CacheArray::open_or_create(members, LINE, 25).expect("array opens"))
    }

    fn engine_on(&self, array: Arc<CacheArray>) -> Engine {
        let mut config = self.config.clone();
        config.capacity_lines = array.geometry().slots();
        let cache_dev: Arc<dyn BlockDevice> = array.clone();
        let backend: Arc<dyn BlockDevice> = self.backend.clone();
        Engine::new(
            EngineConfig {
                lookup: Lookup::Fine,
                shards: 2,
                persistence: self.persistence,
                io: self.io,
                array: Some(array),
                ..EngineConfig::new(config)
            },
            cache_dev,
            backend,
        )
        .expect("engine opens the array")
    }
}

/// Runs the workload; member `victim` goes offline at step `fail_at`.
fn workload(
    seed: u64,
    rng: &mut Rng,
    engine: &Engine,
    rig: &Rig,
    model: &mut Model,
    victim: usize,
    fail_at: u64,
) {
    let steps = 300 + rng.below(600);
    for step in 0..steps {
        if step == fail_at {
            rig.members[victim].set_offline(true);
        }
        match rng.below(12) {
            0 => {
                engine
                    .flush()
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: flush: {e}"));
                model.flushed();
            }
            1..=6 => {
                let w = model.next_write(rng, true);
                engine
                    .write(w.offset(), &w.data(), w.fua)
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: write of sector {}: {e}", w.first));
                model.record(&w);
            }
            _ => {
                let sectors = if rng.below(2) == 0 {
                    1 + rng.below(8)
                } else {
                    LINE / SECTOR
                };
                let first = rng.below(VOLUME_SECTORS - sectors);
                let mut buf = vec![0u8; (sectors * SECTOR) as usize];
                engine
                    .read(first * SECTOR, &mut buf)
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: read of sector {first}: {e}"));
                model.assert_latest(
                    first,
                    &buf,
                    &format!("seed {seed} step {step} (failed at {fail_at})"),
                );
            }
        }
    }
}

fn wait_evacuated(seed: u64, engine: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = engine.stats();
        let array = stats.array.expect("array stats");
        if array.evacuated {
            assert!(array.degraded, "seed {seed}: a member failed");
            assert_eq!(array.lost_lines, 0, "seed {seed}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: evacuation did not finish: {array:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The start of a run: a rig and its engine, and a workload during which a
/// random member (returned) fails at a random step.
fn run_until_a_member_fails(
    seed: u64,
    members: usize,
    persistence: Persistence,
) -> (Rng, Rig, Engine, Model, usize) {
    let mut rng = Rng::seeded(seed);
    let rig = Rig::new(seed, members, persistence);
    let engine = rig.open();
    let mut model = Model::new();
    let victim = rng.below(members as u64) as usize;
    let fail_at = rng.below(300);
    workload(seed, &mut rng, &engine, &rig, &mut model, victim, fail_at);
    (rng, rig, engine, model, victim)
}

fn live_run(seed: u64, members: usize, persistence: Persistence) {
    let (mut rng, rig, engine, mut model, victim) = run_until_a_member_fails(seed, members, persistence);
    wait_evacuated(seed, &engine);
    // The cache keeps working degraded.
    workload(seed, &mut rng, &engine, &rig, &mut model, victim, u64::MAX);
    for sector in 0..VOLUME_SECTORS {
        let mut buf = [0u8; SECTOR as usize];
        engine.read(sector * SECTOR, &mut buf).unwrap();
        model.assert_latest(sector, &buf, &format!("seed {seed}"));
    }
    let stats = engine.stats();
    let array = stats.array.clone().unwrap();
    assert!(
        array.retired_slots > 0,
        "seed {seed}: the dead member's slots leave service"
    );
    if members == 2 {
        assert_eq!(array.dirty_cap, 0, "seed {seed}: one member left cannot mirror");
    }
    engine.shutdown().unwrap();
    for sector in 0..VOLUME_SECTORS {
        let mut buf = [0u8; SECTOR as usize];
        rig.backend.read_at(&mut buf, sector * SECTOR).unwrap();
        model.assert_latest(sector, &buf, &format!("seed {seed}: the backend after shutdown"));
    }
}

fn crash_run(seed: u64, members: usize, persistence: Persistence) {
    let (mut rng, rig, engine, model, victim) = run_until_a_member_fails(seed, members, persistence);
    // The power goes: nothing more reaches any device.
    drop(engine);
    let cut = random_power_cut(&mut rng);
    for (i, member) in rig.members.iter().enumerate() {
        if i != victim {
            member.power_cut(cut).unwrap();
        }
    }
    rig.backend.power_cut(cut).unwrap();
    // The dead member sometimes comes back with what it held when it died.
    let back = rng.below(2) == 0;
    if back {
        rig.members[victim].set_offline(false);
    }
    let engine = rig.open();
    let stats = engine.stats();
    let array = stats.array.clone().unwrap();
    // It failed only if some I/O reached it; then it stays failed.
    let failed = array.array.members[victim].1;
    assert!(
        failed || back,
        "seed {seed}: an offline member must not look live"
    );
    assert_durable(&engine, &model, &|| {
        format!(
            "seed {seed} ({members} members, victim {victim} back {back}, {persistence}, {cut:?}; recovery {:?}, \
             array {array:?})",
            stats.recovery
        )
    });
    engine.shutdown().unwrap();
}

/// Every sector reads as its value at the last FLUSH or a later one.
fn assert_durable(engine: &Engine, model: &Model, context: &dyn Fn() -> String) {
    for sector in 0..VOLUME_SECTORS {
        let mut buf = [0u8; SECTOR as usize];
        engine
            .read(sector * SECTOR, &mut buf)
            .unwrap_or_else(|e| panic!("{}: read of sector {sector}: {e}", context()));
        let found = decode(&buf, sector);
        assert!(
            found.is_some_and(|w| model.acceptable(sector, w)),
            "{}: sector {sector} holds {found:?}, durable {} or later {:?} expected",
            context(),
            model.durable[sector as usize],
            model.since[sector as usize],
        );
    }
}

/// A member replaced while the cache serves: it failed at a random moment
/// (or, healthy, is retired by the replacement itself), and a blank device
/// takes its place while another thread runs the verifying workload.
/// Afterwards the array is whole again (no member failed, the dirty cap
/// back, no slot retired, the new device taking lines); a crash keeps
/// every flushed write; with two members, the new one alone then serves
/// the cache (the metadata it was given); with three, the replaced device,
/// back in its old place, is not trusted.
fn replace_run(seed: u64, members: usize, persistence: Persistence, fail: bool, cut_short: bool) {
    let mut rng = Rng::seeded(seed);
    let mut rig = Rig::new(seed, members, persistence);
    let engine = rig.open();
    let mut model = Model::new();
    let victim = rng.below(members as u64) as usize;
    let full_cap = engine.stats().array.unwrap().dirty_cap;
    if fail {
        let fail_at = rng.below(300);
        workload(seed, &mut rng, &engine, &rig, &mut model, victim, fail_at);
        wait_evacuated(seed, &engine);
    }
    // The headers as they are before the replacement rewrites them.
    let headers: Vec<Vec<u8>> = rig
        .members
        .iter()
        .map(|m| {
            let mut b = vec![0u8; 4096];
            let _ = m.inner().read_at(&mut b, 0);
            b
        })
        .collect();
    let new: Arc<FaultDevice<MemDevice>> = Arc::new(FaultDevice::new(MemDevice::new(
        format!("m{victim}b"),
        MEMBER_BYTES,
    )));
    let replaced = std::thread::scope(|scope| {
        let replacing = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(rng_delay(seed)));
            let device: Arc<dyn BlockDevice> = new.clone();
            engine.replace_cache_member(&format!("m{victim}"), &format!("m{victim}b"), device, &|| false)
        });
        workload(seed, &mut rng, &engine, &rig, &mut model, victim, u64::MAX);
        replacing.join().unwrap()
    });
    let replaced = replaced.unwrap_or_else(|e| panic!("seed {seed}: replacing m{victim}: {e}"));
    assert_eq!(
        (replaced.member, replaced.retired),
        (victim, !fail),
        "seed {seed}"
    );
    let array = engine.stats().array.unwrap();
    assert!(!array.degraded, "seed {seed}: whole again: {array:?}");
    assert_eq!(array.retired_slots, 0, "seed {seed}");
    assert_eq!(array.dirty_cap, full_cap, "seed {seed}");
    assert_eq!(array.array.members[victim], (format!("m{victim}b"), false));
    assert_eq!(array.array.replacements, 1);
    let old = std::mem::replace(&mut rig.members[victim], new);
    let writes_before = rig.members[victim].stats().writes;
    workload(seed, &mut rng, &engine, &rig, &mut model, victim, u64::MAX);
    // Enough distinct lines to need the new member's slots.
    for line in 0..2 * MEMBER_BYTES / LINE {
        let mut buf = vec![0u8; LINE as usize];
        engine.read(line * LINE, &mut buf).unwrap();
        model.assert_latest(
            line * LINE / SECTOR,
            &buf,
            &format!("seed {seed} after replacing"),
        );
    }
    assert!(
        rig.members[victim].stats().writes > writes_before,
        "seed {seed}: the new member takes lines"
    );
    // The power goes; the array reopens with the new member.
    drop(engine);
    if cut_short {
        // As if the process had died before the replacement wrote any
        // header: the others' say the member failed, the new one's is blank.
        for (i, member) in rig.members.iter().enumerate() {
            let header = if i == victim {
                vec![0u8; 4096]
            } else {
                headers[i].clone()
            };
            member.inner().write_at(&header, 0).unwrap();
        }
    }
    let cut = random_power_cut(&mut rng);
    for member in &rig.members {
        member.power_cut(cut).unwrap();
    }
    rig.backend.power_cut(cut).unwrap();
    let check = |engine: &Engine, when: &str| {
        assert_durable(engine, &model, &|| {
            format!("seed {seed} ({members} members, victim {victim}, {persistence}, {cut:?}) {when}")
        })
    };
    let engine = rig.open();
    let array = engine.stats().array.unwrap();
    if cut_short {
        assert!(
            array.array.members[victim].1,
            "seed {seed}: a blank member: {array:?}"
        );
        check(&engine, "after a crash before the headers named the new member");
        engine.shutdown().unwrap();
        return;
    }
    assert!(
        array.array.members.iter().all(|(_, failed)| !failed),
        "seed {seed}: the new member is a member after a restart: {array:?}"
    );
    check(&engine, "after the crash");
    drop(engine);
    if members == 2 {
        // The other member is gone: the new one alone holds the cache, its
        // metadata copied at the replacement and kept since.
        rig.members[1 - victim].set_offline(true);
        let engine = rig.open();
        let array = engine.stats().array.unwrap();
        assert!(!array.array.members[victim].1, "seed {seed}: {array:?}");
        check(&engine, "with only the new member");
        engine.shutdown().unwrap();
        return;
    }
    // The replaced device comes back in its old place: it is not trusted.
    old.set_offline(false);
    rig.members[victim] = old;
    let engine = rig.open();
    let array = engine.stats().array.unwrap();
    assert!(
        array.array.members[victim].1,
        "seed {seed}: the replaced device must be a failed member: {array:?}"
    );
    check(&engine, "with the replaced device back");
    engine.shutdown().unwrap();
}

/// When the replacement starts, in milliseconds into the workload.
fn rng_delay(seed: u64) -> u64 {
    Rng::seeded(seed ^ 0x5eed).below(20)
}

/// `even` for even seeds, `odd` for odd ones: a test's iterations try both.
fn by_parity(seed: u64, even: Persistence, odd: Persistence) -> Persistence {
    if seed.is_multiple_of(2) {
        even
    } else {
        odd
    }
}

#[test]
fn a_failed_member_is_replaced_while_serving() {
    for seed in 0..iterations() {
        let persistence = by_parity(seed, Persistence::Dirty, Persistence::All);
        replace_run(300 + seed, 2 + (seed % 2) as usize, persistence, true, false);
    }
}

#[test]
fn a_healthy_member_is_retired_and_replaced_while_serving() {
    for seed in 0..iterations() {
        replace_run(
            400 + seed,
            2 + (seed % 2) as usize,
            Persistence::All,
            false,
            false,
        );
    }
}

/// A replacement the process did not live to record: a crash finds the
/// new device blank (a failed member) and the others' headers as before,
/// and every flushed write is still there (the dirty lines that used the
/// new member have their other copy).
#[test]
fn a_replacement_cut_before_its_headers_loses_nothing() {
    for seed in 0..iterations() {
        replace_run(500 + seed, 3, Persistence::All, seed.is_multiple_of(2), true);
    }
}

fn iterations() -> u64 {
    common::count_from_env("IOCACHE_RAID_ITERATIONS", 12)
}

#[test]
fn losing_one_of_two_members_loses_no_write() {
    for seed in 0..iterations() {
        live_run(seed, 2, by_parity(seed, Persistence::Dirty, Persistence::None));
    }
}

#[test]
fn losing_one_of_three_members_keeps_mirroring() {
    for seed in 0..iterations() {
        live_run(100 + seed, 3, Persistence::Dirty);
    }
}

#[test]
fn a_crash_after_a_member_died_keeps_every_flushed_write() {
    for seed in 0..iterations() {
        let persistence = by_parity(seed, Persistence::Dirty, Persistence::All);
        crash_run(200 + seed, 2 + (seed % 2) as usize, persistence);
    }
}

#[test]
fn a_healthy_array_stripes_clean_lines_and_mirrors_dirty_ones() {
    let rig = Rig::new(1, 2, Persistence::Dirty);
    let engine = rig.open();
    // Dirty lines get mirrors, up to the cap; past it writes go through.
    let cap = engine.stats().array.unwrap().dirty_cap;
    assert!(cap > 0);
    for line in 0..cap + 10 {
        let data = stamps(line + 1, line * LINE / SECTOR, LINE / SECTOR);
        engine.write(line * LINE, &data, false).unwrap();
    }
    let stats = engine.stats();
    let array = stats.array.clone().unwrap();
    assert!(
        stats.dirty_lines <= cap,
        "{} dirty lines, cap {cap}",
        stats.dirty_lines
    );
    assert!(array.array.mirror_slots_used >= stats.dirty_lines);
    assert!(stats.cache.dirty_cap_write_throughs >= 10);
    // Both members hold lines (striping): each saw writes past the header.
    for member in &rig.members {
        assert!(member.stats().writes > 2, "{:?}", member.stats());
    }
    engine.shutdown().unwrap();
}

/// A member's hook: once armed, the next write into the line area (at or
/// past `data_from`) waits until the test lets it go.
#[derive(Debug, Default)]
struct Gated {
    data_from: std::sync::atomic::AtomicU64,
    gate: std::sync::Mutex<Gate>,
    changed: std::sync::Condvar,
}

#[derive(Debug, Default, PartialEq)]
enum Gate {
    #[default]
    Open,
    Armed,
    Holding,
}

impl Gated {
    fn set(&self, gate: Gate) {
        *self.gate.lock().unwrap() = gate;
        self.changed.notify_all();
    }

    /// Waits up to `patience` for a write to be held; whether one is.
    fn holding_within(&self, patience: Duration) -> bool {
        let gate = self.gate.lock().unwrap();
        let (gate, _) = self
            .changed
            .wait_timeout_while(gate, patience, |g| *g != Gate::Holding)
            .unwrap();
        *gate == Gate::Holding
    }
}

impl Hook for Gated {
    fn write(&self, inner: &dyn BlockDevice, w: DeviceWrite<'_>) -> Result<(), iocache_device::DeviceError> {
        let DeviceWrite { data, offset, .. } = w;
        use std::sync::atomic::Ordering;
        let mut gate = self.gate.lock().unwrap();
        if *gate == Gate::Armed && offset >= self.data_from.load(Ordering::Relaxed) {
            *gate = Gate::Holding;
            self.changed.notify_all();
            gate = self.changed.wait_while(gate, |g| *g == Gate::Holding).unwrap();
        }
        drop(gate);
        inner.write_at(data, offset)
    }
}

/// A member that fails while a fill's write to one of its slots is under
/// way: the evacuation drops the line, and the fill's write, landing
/// after, must not record it in the slot again. Were it recorded, the
/// record would outlive the member's replacement (the metadata is copied
/// to the new device) and a start after a clean shutdown would load the
/// line, unchecked, from the new device's blank slot.
#[test]
fn a_fill_landing_after_its_member_failed_leaves_no_record() {
    let gated = Arc::new(Hooked::memory(
        "m0",
        MEMBER_BYTES,
        Gated {
            data_from: u64::MAX.into(),
            ..Gated::default()
        },
    ));
    let other = Arc::new(MemDevice::new("m1", MEMBER_BYTES));
    let backend = Arc::new(MemDevice::new("backend", VOLUME_SECTORS * SECTOR));
    for line in 0..VOLUME_SECTORS * SECTOR / LINE {
        backend.write_at(&stamps(1, line * 8, 8), line * LINE).unwrap();
    }
    let open = |members: [Arc<dyn BlockDevice>; 2]| {
        let array = CacheArray::open_or_create(
            vec![
                ("m0".into(), Some(members[0].clone())),
                ("m1".into(), Some(members[1].clone())),
            ],
            LINE,
            25,
        )
        .expect("array opens");
        let array = Arc::new(array);
        let mut config = CacheConfig::new(
            array.geometry().slots(),
            LineSize::new(LINE).unwrap(),
            PolicySpec::lru(),
        );
        config.write_policy = WritePolicy::WriteThrough;
        let cache: Arc<dyn BlockDevice> = array.clone();
        let engine = Engine::new(
            EngineConfig {
                lookup: Lookup::Fine,
                shards: 1,
                persistence: Persistence::All,
                io: IoMode::Psync,
                array: Some(array.clone()),
                ..EngineConfig::new(config)
            },
            cache,
            backend.clone(),
        )
        .expect("engine opens the array");
        (engine, array)
    };
    let (engine, array) = open([gated.clone(), other.clone()]);
    gated.hook.data_from.store(
        iocache_engine::RAID_MEMBER_HEADER_BYTES + array.geometry().meta_bytes,
        std::sync::atomic::Ordering::Relaxed,
    );
    // Reads miss, one line after the other, until a fill's write to the
    // gated member is held.
    gated.hook.set(Gate::Armed);
    let held = std::thread::scope(|scope| {
        for line in 0..16u64 {
            let engine = &engine;
            let reader = scope.spawn(move || {
                let mut buf = vec![0u8; LINE as usize];
                engine.read(line * LINE, &mut buf).unwrap();
                buf
            });
            if gated.hook.holding_within(Duration::from_millis(500)) {
                // The member fails with the fill's write in flight; the
                // cleaner evacuates it. Then the write lands.
                array.retire_member(0).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                gated.hook.set(Gate::Open);
                assert_eq!(reader.join().unwrap(), stamps(1, line * 8, 8));
                return Some(line);
            }
            reader.join().unwrap();
        }
        None
    });
    let line = held.expect("a fill wrote to the gated member");
    wait_evacuated(0, &engine);
    let blank: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("m0b", MEMBER_BYTES));
    engine
        .replace_cache_member("m0", "m0b", blank.clone(), &|| false)
        .expect("the member is replaced");
    engine.shutdown().unwrap();
    drop(engine);
    let (engine, _) = open([blank, other]);
    let mut buf = vec![0u8; LINE as usize];
    engine.read(line * LINE, &mut buf).unwrap();
    let expected = stamps(1, line * 8, 8);
    let differ = buf.iter().zip(&expected).filter(|(a, b)| a != b).count();
    assert_eq!(
        differ, 0,
        "line {line} after the replacement and a restart: bytes differ"
    );
    engine.shutdown().unwrap();
}

/// Reads every sector through the engine: each must hold its latest write.
fn assert_latest_everywhere(engine: &Engine, model: &Model, context: &str) {
    let mut buf = vec![0u8; (VOLUME_SECTORS * SECTOR) as usize];
    engine
        .read(0, &mut buf)
        .unwrap_or_else(|e| panic!("{context}: read: {e}"));
    model.assert_latest(0, &buf, context);
}

/// A member replaced while the backend refuses every write: nothing can
/// be written back, so the dirty lines that had a copy on the member get
/// that copy back on the new device from their other copy (each of its
/// slots from the mirror, each of its mirrors from the line's slot).
/// Then the other member is lost too: the new device alone still serves
/// every latest write, so its copies are whole. The member fails first
/// (by I/O errors) or is healthy and retired by the replacement.
fn rebuild_run(seed: u64, members: usize, fail: bool) {
    let mut rng = Rng::seeded(seed);
    let mut rig = Rig::new(seed, members, Persistence::All);
    rig.config.cleaning = "nop".parse::<CleaningPolicy>().unwrap();
    let engine = rig.open();
    let mut model = Model::new();
    let victim = rng.below(members as u64) as usize;
    workload(seed, &mut rng, &engine, &rig, &mut model, victim, u64::MAX);
    rig.backend.fail_range(0, u64::MAX, false, true);
    if fail {
        rig.members[victim].set_offline(true);
        // Reads of its lines fail it (and are served from the mirrors).
        assert_latest_everywhere(&engine, &model, &format!("seed {seed}: degraded"));
        assert!(engine.stats().array.unwrap().degraded, "seed {seed}");
    }
    assert!(
        engine.stats().dirty_lines > 0,
        "seed {seed}: the workload left dirty lines"
    );
    let new = Arc::new(FaultDevice::new(MemDevice::new(
        format!("m{victim}b"),
        MEMBER_BYTES,
    )));
    let replaced = std::thread::scope(|scope| {
        let replacing = scope.spawn(|| {
            let device: Arc<dyn BlockDevice> = new.clone();
            engine.replace_cache_member(&format!("m{victim}"), &format!("m{victim}b"), device, &|| false)
        });
        // Reads meanwhile, of lines rebuilt and not yet.
        for _ in 0..4 {
            assert_latest_everywhere(&engine, &model, &format!("seed {seed}: while rebuilding"));
        }
        replacing.join().unwrap()
    })
    .unwrap_or_else(|e| panic!("seed {seed}: replacing m{victim}: {e}"));
    assert_eq!(
        (replaced.member, replaced.retired),
        (victim, !fail),
        "seed {seed}"
    );
    assert!(
        replaced.rebuilt_lines + replaced.rebuilt_mirrors > 0,
        "seed {seed}: {replaced:?}"
    );
    let stats = engine.stats();
    let array = stats.array.clone().unwrap();
    assert!(!array.degraded, "seed {seed}: {array:?}");
    assert_eq!(
        (array.array.rebuilding, array.array.rebuild_pending),
        (None, 0),
        "seed {seed}"
    );
    assert_latest_everywhere(&engine, &model, &format!("seed {seed}: rebuilt"));
    // Every other member is lost: what is left is the new device.
    rig.backend.clear_faults();
    let other = (victim + 1) % members;
    rig.members[other].set_offline(true);
    assert_latest_everywhere(
        &engine,
        &model,
        &format!("seed {seed}: m{other} lost after m{victim} was rebuilt"),
    );
    engine.shutdown().unwrap();
    for sector in 0..VOLUME_SECTORS {
        let mut buf = [0u8; SECTOR as usize];
        rig.backend.read_at(&mut buf, sector * SECTOR).unwrap();
        model.assert_latest(sector, &buf, &format!("seed {seed}: the backend after shutdown"));
    }
}

#[test]
fn a_replacement_is_rebuilt_from_the_other_copies_without_writing_back() {
    for seed in 0..iterations() {
        rebuild_run(600 + seed, 2 + (seed % 2) as usize, seed % 4 < 2);
    }
}

/// The process is killed while a replacement is being rebuilt: nothing
/// more reaches any device. The restart finds the new device named in the
/// headers and marked as being rebuilt (or, cut before that, the old
/// state), serves every flushed write, and finishes the rebuild: with two
/// members, the new one alone then still serves every flushed write.
/// Returns whether the restart resumed a rebuild.
fn rebuild_cut(seed: u64) -> bool {
    let mut rng = Rng::seeded(seed);
    let members = 2;
    let mut rig = Rig::new(seed, members, Persistence::All);
    let engine = rig.open();
    let mut model = Model::new();
    let victim = rng.below(members as u64) as usize;
    workload(seed, &mut rng, &engine, &rig, &mut model, victim, u64::MAX);
    engine.flush().unwrap();
    model.flushed();
    let new = Arc::new(FaultDevice::new(MemDevice::new(
        format!("m{victim}b"),
        MEMBER_BYTES,
    )));
    // Slow enough that a kill a few milliseconds in finds it under way.
    new.set_latency(Duration::from_micros(300));
    std::thread::scope(|scope| {
        let replacing = scope.spawn(|| {
            let device: Arc<dyn BlockDevice> = new.clone();
            engine.replace_cache_member(&format!("m{victim}"), &format!("m{victim}b"), device, &|| false)
        });
        std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        // Killed: nothing more reaches any device.
        for device in rig.members.iter().chain([&new, &rig.backend]) {
            device.set_writes_dropped(true);
        }
        let _ = replacing.join().unwrap();
    });
    drop(engine);
    for device in rig.members.iter().chain([&new, &rig.backend]) {
        device.clear_faults();
    }
    new.set_latency(Duration::ZERO);
    let old = std::mem::replace(&mut rig.members[victim], new);
    let array = rig.open_array();
    let resumed = array.rebuilding_member() == Some(victim);
    let new_is_member = !array.member_failed(victim);
    let engine = rig.engine_on(array);
    let context = || format!("seed {seed}, victim m{victim}, resumed {resumed}");
    assert_durable(&engine, &model, &|| format!("{}: after the restart", context()));
    let array = engine.stats().array.unwrap();
    assert_eq!(
        (array.array.rebuilding, array.array.rebuild_pending),
        (None, 0),
        "{}",
        context()
    );
    drop(engine);
    if new_is_member {
        // The other member is gone: the new one alone holds the cache.
        rig.members[1 - victim].set_offline(true);
        let engine = rig.open();
        assert_durable(&engine, &model, &|| {
            format!("{}: with only the new member", context())
        });
        engine.shutdown().unwrap();
    } else {
        // Cut before the headers named it: the old device is still the
        // member.
        rig.members[victim] = old;
        let engine = rig.open();
        assert_durable(&engine, &model, &|| format!("{}: with the old member", context()));
        engine.shutdown().unwrap();
    }
    resumed
}

#[test]
fn a_kill_during_a_rebuild_loses_nothing_and_the_rebuild_resumes() {
    let runs = iterations();
    let resumed = (0..runs).filter(|&seed| rebuild_cut(700 + seed)).count();
    assert!(resumed > 0, "no kill of {runs} came during a rebuild");
}
