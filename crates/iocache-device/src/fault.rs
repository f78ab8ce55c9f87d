//! The cache engine must survive failing devices and
//! crashes, and tests need to cause both on demand. `FaultDevice` wraps any
//! device and fails the n-th read, write or flush, fails I/O touching a byte
//! range, adds latency (optionally through a limited number of servers, so
//! that a burst queues as at a saturated device), goes offline, and simulates a power cut by undoing
//! (wholly or sector by sector) the writes made since the last flush.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::Duration;

use crate::device::{check_range, BlockDevice};
use crate::error::{DeviceError, IoKind};
use crate::rng::SplitMix64;

/// Granularity of torn writes: a disk persists whole sectors or nothing.
pub const SECTOR: u64 = 512;

/// What a power cut does to the writes not yet flushed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PowerCut {
    /// Every write since the last successful flush is lost.
    DropUnflushed,
    /// Each 512-byte sector of each unflushed write independently survives
    /// with probability `keep`, decided by a generator seeded with `seed`.
    /// For each byte the latest surviving write wins, else the flushed data.
    Tear {
        /// Seed of the decisions.
        seed: u64,
        /// Probability that one sector of one write survives.
        keep: f64,
    },
}

/// What a power cut did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerCutReport {
    /// Writes (and discards) that were not flushed.
    pub unflushed_writes: usize,
    /// Sector pieces of those writes that survived.
    pub pieces_kept: u64,
    /// Sector pieces of those writes that were lost.
    pub pieces_lost: u64,
}

/// Operation counts seen by a [`FaultDevice`] (including failed ones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
}

#[derive(Clone, Copy, Debug)]
struct FaultRange {
    start: u64,
    end: u64,
    reads: bool,
    writes: bool,
}

#[derive(Debug)]
struct JournalEntry {
    offset: u64,
    old: Vec<u8>,
    new: Vec<u8>,
}

#[derive(Debug)]
struct Journal {
    enabled: bool,
    entries: Vec<JournalEntry>,
}

fn slot(kind: IoKind) -> usize {
    match kind {
        IoKind::Read => 0,
        IoKind::Write | IoKind::Discard => 1,
        IoKind::Flush => 2,
    }
}

/// A device wrapper that injects faults. All settings take effect at once
/// and may be changed while I/O is running.
///
/// The power-cut journal is on by default: every write first reads the bytes
/// it replaces, and writes are serialised while the journal is on. A
/// successful flush empties the journal; turn it off with
/// [`set_journal`](FaultDevice::set_journal) when crashes are not simulated.
#[derive(Debug)]
pub struct FaultDevice<D: BlockDevice> {
    inner: D,
    counts: [AtomicU64; 3],
    nth: [AtomicU64; 3],
    ranges: RwLock<Vec<FaultRange>>,
    latency_ns: AtomicU64,
    /// Servers of the latency (0: every I/O sleeps at once).
    servers: AtomicU64,
    /// I/Os sleeping their latency now, when servers are limited.
    busy: Mutex<u64>,
    server_free: Condvar,
    offline: AtomicBool,
    /// Every flush fails (reads and writes still work).
    flushes_fail: AtomicBool,
    /// Writes report success without reaching the device.
    writes_dropped: AtomicBool,
    /// Zeroing as a device without a quick way does it: zero buffers.
    zeroes_slow: AtomicBool,
    journal: Mutex<Journal>,
}

impl<D: BlockDevice> FaultDevice<D> {
    /// Wraps `inner`, with no faults set and the power-cut journal on.
    pub fn new(inner: D) -> Self {
        FaultDevice {
            inner,
            counts: Default::default(),
            nth: Default::default(),
            ranges: RwLock::new(Vec::new()),
            latency_ns: AtomicU64::new(0),
            servers: AtomicU64::new(0),
            busy: Mutex::new(0),
            server_free: Condvar::new(),
            offline: AtomicBool::new(false),
            flushes_fail: AtomicBool::new(false),
            writes_dropped: AtomicBool::new(false),
            zeroes_slow: AtomicBool::new(false),
            journal: Mutex::new(Journal {
                enabled: true,
                entries: Vec::new(),
            }),
        }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Makes the `n`-th (1-based, counted from now) I/O of `kind` fail, once.
    /// `kind` is `Read`, `Write` (discards count as writes) or `Flush`;
    /// `n == 0` cancels.
    pub fn fail_nth(&self, kind: IoKind, n: u64) {
        let s = slot(kind);
        let target = if n == 0 {
            0
        } else {
            self.counts[s].load(Ordering::SeqCst) + n
        };
        self.nth[s].store(target, Ordering::SeqCst);
    }

    /// Makes every read (if `reads`) and write (if `writes`) overlapping
    /// `start..start + len` fail, until [`clear_faults`](Self::clear_faults).
    pub fn fail_range(&self, start: u64, len: u64, reads: bool, writes: bool) {
        self.ranges.write().unwrap().push(FaultRange {
            start,
            end: start.saturating_add(len),
            reads,
            writes,
        });
    }

    /// Makes every flush fail while reads and writes work (a device that
    /// cannot make data durable), until [`clear_faults`](Self::clear_faults).
    pub fn set_flushes_fail(&self, fail: bool) {
        self.flushes_fail.store(fail, Ordering::SeqCst);
    }

    /// Makes every write (and discard) report success without reaching
    /// the device, flushes too: a device that loses acknowledged writes
    /// (lying firmware, a volatile cache that lost power unnoticed), until
    /// set back or [`clear_faults`](Self::clear_faults).
    pub fn set_writes_dropped(&self, dropped: bool) {
        self.writes_dropped.store(dropped, Ordering::SeqCst);
    }

    /// With `slow`, the device says it cannot zero quickly and zeroes by
    /// writing zero buffers, as one without a zeroing command does.
    pub fn set_zeroes_slow(&self, slow: bool) {
        self.zeroes_slow.store(slow, Ordering::SeqCst);
    }

    /// Removes every n-th, range, flush and dropped-write fault (not
    /// latency, not offline).
    pub fn clear_faults(&self) {
        self.flushes_fail.store(false, Ordering::SeqCst);
        self.writes_dropped.store(false, Ordering::SeqCst);
        self.ranges.write().unwrap().clear();
        for t in &self.nth {
            t.store(0, Ordering::SeqCst);
        }
    }

    /// Adds `latency` before every I/O (zero for none).
    pub fn set_latency(&self, latency: Duration) {
        self.latency_ns.store(latency.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Limits how many I/Os spend the added latency at once (0: no limit,
    /// the default): with `n` servers, I/Os beyond `n` wait for one to
    /// finish, so the device saturates at `n / latency` I/Os per second
    /// and a burst builds a queue, as at a real device.
    pub fn set_servers(&self, n: u64) {
        self.servers.store(n, Ordering::SeqCst);
        self.server_free.notify_all();
    }

    /// Sleeps the added latency, on one of the servers when they are limited.
    fn serve_latency(&self, ns: u64) {
        let servers = self.servers.load(Ordering::Relaxed);
        if servers == 0 {
            std::thread::sleep(Duration::from_nanos(ns));
            return;
        }
        let mut busy = self.busy.lock().unwrap();
        while *busy >= servers.max(1) && self.servers.load(Ordering::Relaxed) != 0 {
            busy = self.server_free.wait(busy).unwrap();
        }
        *busy += 1;
        drop(busy);
        std::thread::sleep(Duration::from_nanos(ns));
        *self.busy.lock().unwrap() -= 1;
        self.server_free.notify_one();
    }

    /// Takes the device offline (every I/O fails) or back online.
    pub fn set_offline(&self, offline: bool) {
        self.offline.store(offline, Ordering::SeqCst);
    }

    /// Turns the power-cut journal on or off (off empties it).
    pub fn set_journal(&self, enabled: bool) {
        let mut j = self.journal.lock().unwrap();
        j.enabled = enabled;
        if !enabled {
            j.entries.clear();
        }
    }

    /// Writes and discards made since the last successful flush (journal on).
    pub fn unflushed_writes(&self) -> usize {
        self.journal.lock().unwrap().entries.len()
    }

    /// Operations seen so far.
    pub fn stats(&self) -> FaultStats {
        FaultStats {
            reads: self.counts[0].load(Ordering::SeqCst),
            writes: self.counts[1].load(Ordering::SeqCst),
            flushes: self.counts[2].load(Ordering::SeqCst),
        }
    }

    fn injected(&self, kind: IoKind, offset: u64, len: u64, fault: &'static str) -> DeviceError {
        DeviceError::Injected {
            device: self.inner.name().to_string(),
            kind,
            offset,
            len,
            fault,
        }
    }

    /// Counts the operation and decides whether it fails; sleeps the latency.
    fn gate(&self, kind: IoKind, offset: u64, len: u64) -> Result<(), DeviceError> {
        let s = slot(kind);
        let count = self.counts[s].fetch_add(1, Ordering::SeqCst) + 1;
        let ns = self.latency_ns.load(Ordering::Relaxed);
        if ns > 0 {
            self.serve_latency(ns);
        }
        if self.offline.load(Ordering::SeqCst) {
            return Err(self.injected(kind, offset, len, "offline"));
        }
        let target = self.nth[s].load(Ordering::SeqCst);
        if target != 0
            && count == target
            && self.nth[s]
                .compare_exchange(target, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            return Err(self.injected(kind, offset, len, "n-th I/O"));
        }
        if kind == IoKind::Flush && self.flushes_fail.load(Ordering::SeqCst) {
            return Err(self.injected(kind, offset, len, "every flush"));
        }
        if kind != IoKind::Flush {
            let end = offset.saturating_add(len.max(1));
            let ranges = self.ranges.read().unwrap();
            let hit = ranges.iter().any(|r| {
                let applies = if kind == IoKind::Read { r.reads } else { r.writes };
                applies && offset < r.end && r.start < end
            });
            if hit {
                return Err(self.injected(kind, offset, len, "byte range"));
            }
        }
        Ok(())
    }

    /// Runs a modification of `offset..offset + len`, journaling the bytes
    /// before and after when the journal is on.
    /// A change of `offset..offset + len` (a write, a discard, zeroes): the
    /// faults set for `kind` first, then dropped if writes are, else
    /// applied and journaled.
    fn change(
        &self,
        kind: IoKind,
        offset: u64,
        len: u64,
        apply: impl FnOnce() -> Result<(), DeviceError>,
        new: impl FnOnce() -> Result<Vec<u8>, DeviceError>,
    ) -> Result<(), DeviceError> {
        self.gate(kind, offset, len)?;
        check_range(self, kind, offset, len)?;
        if self.writes_dropped.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.journaled(offset, len, apply, new)
    }

    fn journaled(
        &self,
        offset: u64,
        len: u64,
        apply: impl FnOnce() -> Result<(), DeviceError>,
        new: impl FnOnce() -> Result<Vec<u8>, DeviceError>,
    ) -> Result<(), DeviceError> {
        let mut j = self.journal.lock().unwrap();
        if !j.enabled || len == 0 {
            drop(j);
            return apply();
        }
        let mut old = vec![0u8; len as usize];
        self.inner.read_at(&mut old, offset)?;
        let result = apply();
        let new = new()?;
        j.entries.push(JournalEntry { offset, old, new });
        result
    }

    /// Simulates losing power: undoes (wholly or per sector, see
    /// [`PowerCut`]) the writes made since the last successful flush, makes
    /// the result durable on the inner device and empties the journal. The
    /// device stays online and keeps its fault settings.
    pub fn power_cut(&self, mode: PowerCut) -> Result<PowerCutReport, DeviceError> {
        let mut j = self.journal.lock().unwrap();
        let entries = std::mem::take(&mut j.entries);
        let mut report = PowerCutReport {
            unflushed_writes: entries.len(),
            ..Default::default()
        };
        let mut rng = match mode {
            PowerCut::DropUnflushed => None,
            PowerCut::Tear { seed, keep } => Some((SplitMix64::new(seed), keep)),
        };
        // sector -> pieces (entry, first byte, end byte within the sector, survives)
        let mut sectors: BTreeMap<u64, Vec<(usize, usize, usize, bool)>> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            let end = e.offset + e.new.len() as u64;
            let mut pos = e.offset;
            while pos < end {
                let s = pos / SECTOR;
                let piece_end = ((s + 1) * SECTOR).min(end);
                let survives = match &mut rng {
                    None => false,
                    Some((r, keep)) => r.next_f64() < *keep,
                };
                if survives {
                    report.pieces_kept += 1;
                } else {
                    report.pieces_lost += 1;
                }
                sectors.entry(s).or_default().push((
                    i,
                    (pos - s * SECTOR) as usize,
                    (piece_end - s * SECTOR) as usize,
                    survives,
                ));
                pos = piece_end;
            }
        }
        let dev_len = self.inner.len_bytes();
        for (s, pieces) in sectors {
            let start = s * SECTOR;
            let len = (SECTOR.min(dev_len - start)) as usize;
            let mut cur = vec![0u8; len];
            self.inner.read_at(&mut cur, start)?;
            let mut out = cur.clone();
            let mut decided = [false; SECTOR as usize];
            for &(i, a, b, survives) in pieces.iter().rev() {
                let e = &entries[i];
                for p in a..b {
                    if decided[p] {
                        continue;
                    }
                    let k = (start + p as u64 - e.offset) as usize;
                    if survives {
                        out[p] = e.new[k];
                        decided[p] = true;
                    } else {
                        out[p] = e.old[k];
                    }
                }
            }
            if out != cur {
                self.inner.write_at(&out, start)?;
            }
        }
        self.inner.flush()?;
        Ok(report)
    }
}

impl<D: BlockDevice> BlockDevice for FaultDevice<D> {
    crate::device::forward_block_device!(inner; len_bytes, alignment, name, identity, check_intact);

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.gate(IoKind::Read, offset, buf.len() as u64)?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        let len = data.len() as u64;
        self.change(
            IoKind::Write,
            offset,
            len,
            || self.inner.write_at(data, offset),
            || Ok(data.to_vec()),
        )
    }

    /// As fast as the device it wraps, unless latency is added.
    fn reads_at_memory_speed(&self) -> bool {
        self.latency_ns.load(Ordering::Relaxed) == 0 && self.inner.reads_at_memory_speed()
    }

    fn flush(&self) -> Result<(), DeviceError> {
        self.gate(IoKind::Flush, 0, 0)?;
        let mut j = self.journal.lock().unwrap();
        self.inner.flush()?;
        j.entries.clear();
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.change(
            IoKind::Discard,
            offset,
            len,
            || self.inner.discard(offset, len),
            || {
                let mut v = vec![0u8; len as usize];
                self.inner.read_at(&mut v, offset)?;
                Ok(v)
            },
        )
    }

    fn zeroes_fast(&self) -> bool {
        !self.zeroes_slow.load(Ordering::SeqCst) && self.inner.zeroes_fast()
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<crate::Allocation>, DeviceError> {
        self.gate(IoKind::Read, offset, len)?;
        self.inner.allocation(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, keep_allocated: bool) -> Result<(), DeviceError> {
        if self.zeroes_slow.load(Ordering::SeqCst) {
            return crate::device::write_zero_buffers(self, offset, len);
        }
        self.change(
            IoKind::Write,
            offset,
            len,
            || self.inner.write_zeroes(offset, len, keep_allocated),
            || Ok(vec![0u8; len as usize]),
        )
    }
}
