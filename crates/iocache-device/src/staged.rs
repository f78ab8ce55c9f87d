//! A device whose reads of some ranges are answered from memory, copies of
//! what it holds there: a cache that changes its layout keeps the data it
//! cached this way (copied out before the device is formatted again) and
//! fills its new lines from the copies instead of reading the backend
//! again. A copy is only ever the device's own content: any write, discard
//! or zeroing that touches it drops it first, so a read answered from
//! memory returns what the device itself would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::{BlockDevice, DeviceError, RawTarget};

/// `inner` with copies of some of its ranges in memory (see the module
/// doc). Without copies it passes everything through.
pub struct Staged {
    inner: Arc<dyn BlockDevice>,
    /// Copies by offset; they never overlap.
    copies: RwLock<BTreeMap<u64, Box<[u8]>>>,
    /// Whether any copy is held (reads skip the lock when not).
    holding: AtomicBool,
    bytes: AtomicU64,
    /// Reads answered from memory.
    served: AtomicU64,
}

impl Staged {
    pub fn new(inner: Arc<dyn BlockDevice>) -> Staged {
        Staged {
            inner,
            copies: RwLock::new(BTreeMap::new()),
            holding: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    /// The device behind.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    fn copies_read(&self) -> RwLockReadGuard<'_, BTreeMap<u64, Box<[u8]>>> {
        self.copies.read().unwrap_or_else(|e| e.into_inner())
    }

    fn copies_write(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, Box<[u8]>>> {
        self.copies.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `data` as the copy of the device's bytes at `offset`. The
    /// caller vouches that the device holds exactly these bytes there and
    /// that nothing writes them meanwhile; copies it overlaps are dropped.
    pub fn stage(&self, offset: u64, data: Vec<u8>) {
        if data.is_empty() {
            return;
        }
        let mut copies = self.copies_write();
        self.drop_overlapping(&mut copies, offset, data.len() as u64);
        self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        copies.insert(offset, data.into_boxed_slice());
        self.holding.store(true, Ordering::Release);
    }

    /// Drops every copy: reads go to the device again. Returns the reads
    /// answered from memory since the last release.
    pub fn release(&self) -> u64 {
        let mut copies = self.copies_write();
        copies.clear();
        self.bytes.store(0, Ordering::Relaxed);
        self.holding.store(false, Ordering::Release);
        self.served.swap(0, Ordering::Relaxed)
    }

    /// Bytes held in memory now.
    pub fn staged_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Reads answered from memory since the last release.
    pub fn served_reads(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    fn drop_overlapping(&self, copies: &mut BTreeMap<u64, Box<[u8]>>, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        // Copies never overlap, so at most one starts before `offset` and
        // reaches into the range; the others start inside it.
        let mut gone: Vec<u64> = Vec::new();
        if let Some((&at, copy)) = copies.range(..offset).next_back() {
            if at + copy.len() as u64 > offset {
                gone.push(at);
            }
        }
        gone.extend(copies.range(offset..end).map(|(&at, _)| at));
        for at in gone {
            if let Some(copy) = copies.remove(&at) {
                self.bytes.fetch_sub(copy.len() as u64, Ordering::Relaxed);
            }
        }
        if copies.is_empty() {
            self.holding.store(false, Ordering::Release);
        }
    }

    /// Drops the copies a change of `offset..offset + len` makes stale,
    /// before the change reaches the device.
    fn before_change(&self, offset: u64, len: u64) {
        if self.holding.load(Ordering::Acquire) {
            let mut copies = self.copies_write();
            self.drop_overlapping(&mut copies, offset, len);
        }
    }

    /// Whether one copy holds all of `offset..offset + len` (a read of it
    /// would be answered from memory now).
    pub fn holds(&self, offset: u64, len: u64) -> bool {
        self.holding.load(Ordering::Acquire) && self.with_copy(offset, len as usize, |_| ()).is_some()
    }

    /// `f` of the bytes `offset..offset + len` of the copy that holds them
    /// all, if one does.
    fn with_copy<T>(&self, offset: u64, len: usize, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let copies = self.copies_read();
        let (&at, copy) = copies.range(..=offset).next_back()?;
        let from = (offset - at) as usize;
        copy.get(from..from.checked_add(len)?).map(f)
    }

    /// Answers a read from a copy that holds all of it, if one does.
    fn read_copy(&self, buf: &mut [u8], offset: u64) -> bool {
        if !self.holding.load(Ordering::Acquire) {
            return false;
        }
        let answered = self
            .with_copy(offset, buf.len(), |bytes| buf.copy_from_slice(bytes))
            .is_some();
        if answered {
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        answered
    }
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged")
            .field("inner", &self.inner.name())
            .field("staged_bytes", &self.staged_bytes())
            .finish()
    }
}

impl BlockDevice for Staged {
    crate::device::forward_block_device!(inner;
        len_bytes, flush, zeroes_fast, allocation, alignment, name, identity, check_intact,
        reads_at_memory_speed,
    );
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        if self.read_copy(buf, offset) {
            return Ok(());
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.before_change(offset, data.len() as u64);
        self.inner.write_at(data, offset)
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.before_change(offset, len);
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, keep_allocated: bool) -> Result<(), DeviceError> {
        self.before_change(offset, len);
        self.inner.write_zeroes(offset, len, keep_allocated)
    }
    /// None while copies are held: an I/O engine driving the descriptor
    /// directly would pass by them (its writes would leave them stale).
    fn raw_target(&self) -> Option<RawTarget> {
        if self.holding.load(Ordering::Acquire) {
            None
        } else {
            self.inner.raw_target()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    fn device() -> (Arc<MemDevice>, Staged) {
        let mem = Arc::new(MemDevice::new("mem", 1 << 16));
        let data: Vec<u8> = (0..1u32 << 16).map(|i| (i % 251) as u8).collect();
        mem.write_at(&data, 0).unwrap();
        let staged = Staged::new(mem.clone());
        (mem, staged)
    }

    fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        dev.read_at(&mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn a_read_inside_a_copy_is_answered_from_memory_and_others_from_the_device() {
        let (mem, staged) = device();
        staged.stage(4096, read(&*mem, 4096, 8192));
        assert_eq!(staged.staged_bytes(), 8192);
        assert!(staged.holds(4096, 8192) && staged.holds(5000, 10));
        assert!(!staged.holds(4000, 200) && !staged.holds(12_000, 1000));
        // The device changes behind the wrapper's back (tests only): what
        // a read inside the copy returns shows where it came from.
        mem.write_at(&[7u8; 8192], 4096).unwrap();
        assert_eq!(
            read(&staged, 5000, 1000),
            (5000..6000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>()
        );
        assert_eq!(staged.served_reads(), 1);
        // Reaching past the copy: the device.
        assert_eq!(
            read(&staged, 12_000, 1000),
            vec![7u8; 288]
                .into_iter()
                .chain((12_288..13_000u32).map(|i| (i % 251) as u8))
                .collect::<Vec<_>>()
        );
        assert_eq!(staged.served_reads(), 1);
        assert!(staged.raw_target().is_none());
    }

    #[test]
    fn a_write_discard_or_zeroing_drops_the_copies_it_touches_first() {
        let (mem, staged) = device();
        for (at, len) in [(0u64, 4096usize), (8192, 4096), (16_384, 4096), (24_576, 4096)] {
            staged.stage(at, read(&*mem, at, len));
        }
        staged.write_at(&[1u8; 10], 4090).unwrap(); // the end of the first copy
        staged.discard(12_288, 4097).unwrap(); // the start of the third
        staged.write_zeroes(24_575, 2, false).unwrap(); // the fourth
        assert_eq!(staged.staged_bytes(), 4096);
        assert_eq!(read(&staged, 4090, 6), vec![1u8; 6]);
        assert_eq!(read(&staged, 24_576, 1), vec![0u8]);
        // The second is untouched and still answered from memory.
        let before = staged.served_reads();
        assert_eq!(read(&staged, 8192, 4096), read(&*mem, 8192, 4096));
        assert_eq!(staged.served_reads(), before + 1);
    }

    #[test]
    fn a_new_copy_replaces_those_it_overlaps_and_release_drops_all() {
        let (mem, staged) = device();
        staged.stage(0, read(&*mem, 0, 4096));
        staged.stage(2048, read(&*mem, 2048, 4096));
        assert_eq!(staged.staged_bytes(), 4096);
        assert_eq!(staged.release(), 0);
        assert_eq!(staged.staged_bytes(), 0);
        mem.write_at(&[9u8; 16], 2048).unwrap();
        assert_eq!(read(&staged, 2048, 16), vec![9u8; 16]);
        assert_eq!(staged.served_reads(), 0);
    }
}
