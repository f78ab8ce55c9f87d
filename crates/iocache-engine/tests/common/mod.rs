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
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
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

/// Per sector: the value guaranteed durable, and every value written since.
pub struct Model {
    pub durable: Vec<u64>,
    pub since: Vec<Vec<u64>>,
    pub latest: Vec<u64>,
}

impl Model {
    pub fn new() -> Model {
        Model {
            durable: vec![0; VOLUME_SECTORS as usize],
            since: vec![Vec::new(); VOLUME_SECTORS as usize],
            latest: vec![0; VOLUME_SECTORS as usize],
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
    pub fn acceptable(&self, sector: u64, found: u64) -> bool {
        let s = sector as usize;
        found == self.durable[s] || self.since[s].contains(&found)
    }
}
