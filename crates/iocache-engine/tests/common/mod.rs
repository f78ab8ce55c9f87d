//! Helpers shared by the engine's crash and fault tests: a tiny
//! deterministic RNG, self-describing sector contents, and a model of which
//! values each sector may hold after a crash.
#![allow(dead_code)]

pub const SECTOR: u64 = 512;
pub const VOLUME_SECTORS: u64 = 2048;

/// The count in environment variable `var` (a soak raises it), or `default`.
pub fn count_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub struct Rng(pub u64);

impl Rng {
    /// An RNG for `seed`, spread over the bits (and never zero).
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// The RNG of client thread `thread` of a concurrent workload.
    pub fn for_thread(thread: u64) -> Rng {
        Rng(0x9e37_79b9_7f4a_7c15u64 ^ (thread + 1).wrapping_mul(0x1234_5678_9abc_def1))
    }
}

/// A sector's content in a concurrent workload: the writer thread and its
/// write number, repeated.
pub fn thread_pattern(thread: u64, seq: u64) -> [u8; SECTOR as usize] {
    let mut s = [0u8; SECTOR as usize];
    let word = (thread << 48 | seq).to_le_bytes();
    for chunk in s.chunks_mut(8) {
        chunk.copy_from_slice(&word);
    }
    s
}

/// One request of thread `thread` of `threads` in a concurrent workload,
/// placed by the random `r` among the first `span_sectors` sectors (1 to 8
/// sectors): with `write` (`Some(fua)`), write `seq` of the sectors the
/// thread owns there (see [`write_owned_sectors`]); else a read of them
/// all, returned with its first sector for the caller to check.
pub fn owned_request(
    engine: &iocache_engine::Engine,
    (threads, thread): (u64, u64),
    r: u64,
    span_sectors: u64,
    write: Option<bool>,
    seq: u64,
    model: &mut [u64],
) -> Option<(u64, Vec<u8>)> {
    let first = (r >> 8) % (span_sectors - 8);
    let count = 1 + (r >> 40) % 8;
    if let Some(fua) = write {
        write_owned_sectors(engine, (threads, thread), first..first + count, seq, fua, model);
        return None;
    }
    let mut buf = vec![0u8; (count * SECTOR) as usize];
    engine.read(first * SECTOR, &mut buf).unwrap();
    Some((first, buf))
}

/// Writes write `seq` of thread `thread` of `threads`: each sector of
/// `sectors` the thread owns (`sector % threads == thread`) as a request
/// of its own (with FUA if `fua`), noted in `model`.
pub fn write_owned_sectors(
    engine: &iocache_engine::Engine,
    (threads, thread): (u64, u64),
    sectors: std::ops::Range<u64>,
    seq: u64,
    fua: bool,
    model: &mut [u64],
) {
    for sector in sectors.filter(|s| s % threads == thread) {
        engine
            .write(sector * SECTOR, &thread_pattern(thread, seq), fua)
            .unwrap();
        model[sector as usize] = seq;
    }
}

/// A sector's content: the write that stored it and the sector it belongs to.
pub fn stamp(write: u64, sector: u64) -> [u8; SECTOR as usize] {
    let mut s = [0u8; SECTOR as usize];
    for (i, chunk) in s.chunks_mut(16).enumerate() {
        chunk[..8].copy_from_slice(&write.to_le_bytes());
        chunk[8..].copy_from_slice(&(sector ^ (i as u64) << 48).to_le_bytes());
    }
    s
}

/// The contents write `write` gives sectors `first..first + sectors`.
pub fn stamps(write: u64, first: u64, sectors: u64) -> Vec<u8> {
    let mut data = Vec::with_capacity((sectors * SECTOR) as usize);
    for s in first..first + sectors {
        data.extend_from_slice(&stamp(write, s));
    }
    data
}

/// Which write a sector's content came from; `Some(0)` for never written
/// (zeros), `None` for anything that is not a well-formed stamp of `sector`.
pub fn decode(bytes: &[u8], sector: u64) -> Option<u64> {
    if bytes.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let write = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    (bytes == stamp(write, sector)).then_some(write)
}

/// The power cut of a crash test: the unflushed writes dropped, or torn
/// sector by sector, as `rng` decides.
pub fn random_power_cut(rng: &mut Rng) -> iocache_device::PowerCut {
    if rng.below(2) == 0 {
        iocache_device::PowerCut::DropUnflushed
    } else {
        iocache_device::PowerCut::Tear {
            seed: rng.next(),
            keep: 0.5,
        }
    }
}

/// A write of the workloads: `sectors` sectors from `first`, each stamped
/// with the write's number `no`.
pub struct Write {
    pub no: u64,
    pub first: u64,
    pub sectors: u64,
    pub fua: bool,
}

impl Write {
    /// Its byte offset on the volume.
    pub fn offset(&self) -> u64 {
        self.first * SECTOR
    }
    /// What it writes.
    pub fn data(&self) -> Vec<u8> {
        stamps(self.no, self.first, self.sectors)
    }
}

/// Per sector: the value guaranteed durable, and every value written since.
pub struct Model {
    pub durable: Vec<u64>,
    pub since: Vec<Vec<u64>>,
    pub latest: Vec<u64>,
    /// The number of the last write made.
    pub writes: u64,
}

impl Model {
    pub fn new() -> Model {
        Model {
            durable: vec![0; VOLUME_SECTORS as usize],
            since: vec![Vec::new(); VOLUME_SECTORS as usize],
            latest: vec![0; VOLUME_SECTORS as usize],
            writes: 0,
        }
    }
    /// The next write: 1 to 16 sectors anywhere on the volume, FUA one
    /// time in eight if `may_be_fua`. Not recorded until [`Model::record`].
    pub fn next_write(&mut self, rng: &mut Rng, may_be_fua: bool) -> Write {
        let sectors = 1 + rng.below(16);
        let first = rng.below(VOLUME_SECTORS - sectors);
        self.writes += 1;
        let fua = may_be_fua && rng.below(8) == 0;
        Write {
            no: self.writes,
            first,
            sectors,
            fua,
        }
    }
    /// Records that `w` was written.
    pub fn record(&mut self, w: &Write) {
        for s in w.first..w.first + w.sectors {
            self.wrote(s, w.no, w.fua);
        }
    }
    /// Asserts that `buf`, read from sector `first` on, holds each
    /// sector's latest value (`context` says where).
    pub fn assert_latest(&self, first: u64, buf: &[u8], context: &str) {
        for (i, chunk) in buf.chunks(SECTOR as usize).enumerate() {
            let sector = first + i as u64;
            assert_eq!(
                decode(chunk, sector),
                Some(self.latest[sector as usize]),
                "{context}: read of sector {sector}"
            );
        }
    }
    pub fn wrote(&mut self, sector: u64, write: u64, fua: bool) {
        let s = sector as usize;
        self.latest[s] = write;
        if fua {
            self.durable[s] = write;
            self.since[s].clear();
        } else {
            self.since[s].push(write);
        }
    }
    pub fn flushed(&mut self) {
        self.durable.copy_from_slice(&self.latest);
        self.since.iter_mut().for_each(Vec::clear);
    }
    /// One step of a random workload on `engine`: a FLUSH (one in ten), a
    /// write (six in ten, some with FUA), recorded here; else `false`, the
    /// caller's turn to read.
    pub fn flush_or_write(&mut self, engine: &iocache_engine::Engine, rng: &mut Rng) -> bool {
        match rng.below(10) {
            0 => {
                engine.flush().unwrap();
                self.flushed();
            }
            1..=6 => {
                let w = self.next_write(rng, true);
                engine.write(w.offset(), &w.data(), w.fua).unwrap();
                self.record(&w);
            }
            _ => return false,
        }
        true
    }

    pub fn acceptable(&self, sector: u64, found: u64) -> bool {
        let s = sector as usize;
        found == self.durable[s] || self.since[s].contains(&found)
    }
}

/// A cache and a backend on memory devices that inject faults: the cache
/// device big enough for `lines` lines of `line_bytes`, the backend of
/// `backend_bytes`.
pub fn fault_devices(
    line_bytes: u64,
    lines: u64,
    backend_bytes: u64,
) -> (
    std::sync::Arc<iocache_device::FaultDevice<iocache_device::MemDevice>>,
    std::sync::Arc<iocache_device::FaultDevice<iocache_device::MemDevice>>,
) {
    use iocache_device::{FaultDevice, MemDevice};
    let layout = iocache_engine::Layout::for_slots(line_bytes, lines).unwrap();
    (
        std::sync::Arc::new(FaultDevice::new(MemDevice::new("cache", layout.device_bytes()))),
        std::sync::Arc::new(FaultDevice::new(MemDevice::new("backend", backend_bytes))),
    )
}

/// An engine over `cache` and `backend`: fine lookup in two shards, with
/// `persistence`.
pub fn open_engine(
    config: &iocache_core::CacheConfig,
    persistence: iocache_engine::Persistence,
    cache: std::sync::Arc<dyn iocache_device::BlockDevice>,
    backend: std::sync::Arc<dyn iocache_device::BlockDevice>,
) -> iocache_engine::Engine {
    open_engine_in(config, 2, persistence, cache, backend)
}

/// [`open_engine`] in `shards` shards.
pub fn open_engine_in(
    config: &iocache_core::CacheConfig,
    shards: usize,
    persistence: iocache_engine::Persistence,
    cache: std::sync::Arc<dyn iocache_device::BlockDevice>,
    backend: std::sync::Arc<dyn iocache_device::BlockDevice>,
) -> iocache_engine::Engine {
    iocache_engine::Engine::new(
        iocache_engine::EngineConfig {
            lookup: iocache_engine::Lookup::Fine,
            shards,
            persistence,
            ..iocache_engine::EngineConfig::new(config.clone())
        },
        cache,
        backend,
    )
    .expect("engine opens the devices")
}

/// What a test's device does with each write and flush before, or
/// instead of, passing it on to the device under it (`inner`): count,
/// record, hold or fail it.
pub trait Hook: Send + Sync + std::fmt::Debug {
    /// Runs in place of a write.
    fn write(
        &self,
        inner: &dyn iocache_device::BlockDevice,
        w: DeviceWrite<'_>,
    ) -> Result<(), iocache_device::DeviceError> {
        inner.write_at(w.data, w.offset)
    }

    /// Runs in place of a flush.
    fn flush(&self, inner: &dyn iocache_device::BlockDevice) -> Result<(), iocache_device::DeviceError> {
        inner.flush()
    }
}

/// A write that reached a [`Hooked`] device.
pub struct DeviceWrite<'a> {
    pub data: &'a [u8],
    pub offset: u64,
    /// Of [`BlockDevice::write_tearable_at`](iocache_device::BlockDevice::write_tearable_at).
    pub tearable: bool,
}

/// A device whose writes and flushes go through `hook`; the rest goes to
/// `inner` as it is.
#[derive(Debug)]
pub struct Hooked<H> {
    pub inner: std::sync::Arc<dyn iocache_device::BlockDevice>,
    pub hook: H,
}

impl<H> Hooked<H> {
    /// A new memory device of `bytes` named `name` under `hook`.
    pub fn memory(name: &str, bytes: u64, hook: H) -> Hooked<H> {
        Hooked {
            inner: std::sync::Arc::new(iocache_device::MemDevice::new(name, bytes)),
            hook,
        }
    }
}

impl<H: Hook> iocache_device::BlockDevice for Hooked<H> {
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), iocache_device::DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), iocache_device::DeviceError> {
        self.hook.write(
            &*self.inner,
            DeviceWrite {
                data,
                offset,
                tearable: false,
            },
        )
    }
    fn write_tearable_at(&self, data: &[u8], offset: u64) -> Result<(), iocache_device::DeviceError> {
        self.hook.write(
            &*self.inner,
            DeviceWrite {
                data,
                offset,
                tearable: true,
            },
        )
    }
    fn flush(&self) -> Result<(), iocache_device::DeviceError> {
        self.hook.flush(&*self.inner)
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
}
