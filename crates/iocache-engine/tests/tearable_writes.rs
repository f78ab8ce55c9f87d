//! Which cache writes the engine lets a kill tear
//! (`BlockDevice::write_tearable_at`): writes into slots that no record on
//! the device may call dirty, and every write without persistent metadata;
//! never a write into a slot whose record says dirty (its unchecked
//! sectors would be served after a crash), and never without dirty
//! checksums (writes are then not counted in flight, so a barrier could
//! take a dirty record of the slot during the copy).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use iocache_core::{CacheConfig, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, DeviceError, MemDevice};
use iocache_engine::{Engine, EngineConfig, Layout, Persistence};

mod common;
use common::{DeviceWrite, Hook, Hooked};

const LINE: u64 = 4096;
const LINES: u64 = 64;

/// A cache device's hook that counts its data writes by kind.
#[derive(Debug)]
struct Counting {
    data_offset: u64,
    tearable: AtomicU64,
    whole: AtomicU64,
}

impl Hook for Counting {
    fn write(&self, inner: &dyn BlockDevice, w: DeviceWrite<'_>) -> Result<(), DeviceError> {
        let DeviceWrite {
            data,
            offset,
            tearable,
        } = w;
        if tearable {
            assert!(offset >= self.data_offset, "metadata is never written tearable");
            self.tearable.fetch_add(1, Ordering::Relaxed);
        } else if offset >= self.data_offset {
            self.whole.fetch_add(1, Ordering::Relaxed);
        }
        inner.write_at(data, offset)
    }
}

fn engine(persistence: Persistence, dirty_checksums: bool) -> (Engine, Arc<Hooked<Counting>>) {
    let layout = Layout::for_slots(LINE, LINES).unwrap();
    let cache = CacheConfig {
        write_policy: WritePolicy::WriteBack,
        ..CacheConfig::new(LINES, LineSize::new(LINE).unwrap(), PolicySpec::lru())
    };
    let dev = Arc::new(Hooked::memory(
        "cache",
        layout.device_bytes(),
        Counting {
            data_offset: layout.line_offset(0),
            tearable: AtomicU64::new(0),
            whole: AtomicU64::new(0),
        },
    ));
    let backend: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("backend", LINES * LINE * 4));
    let config = EngineConfig {
        persistence,
        dirty_checksums,
        ..EngineConfig::new(cache)
    };
    let engine = Engine::new(config, dev.clone(), backend).unwrap();
    (engine, dev)
}

/// (tearable, whole) data writes that `step` made.
fn writes_of(dev: &Hooked<Counting>, step: impl FnOnce()) -> (u64, u64) {
    let dev = &dev.hook;
    let before = (
        dev.tearable.load(Ordering::Relaxed),
        dev.whole.load(Ordering::Relaxed),
    );
    step();
    (
        dev.tearable.load(Ordering::Relaxed) - before.0,
        dev.whole.load(Ordering::Relaxed) - before.1,
    )
}

#[test]
fn a_slot_whose_record_may_say_dirty_is_never_written_tearable() {
    let (engine, dev) = engine(Persistence::All, true);
    let data = vec![7u8; LINE as usize];
    // A new line: no record names its slot.
    assert_eq!(writes_of(&dev, || engine.write(0, &data, false).unwrap()), (1, 0));
    // Rewritten before any barrier: still no record says dirty.
    assert_eq!(writes_of(&dev, || engine.write(0, &data, false).unwrap()), (1, 0));
    // A run of four new lines: one write, tearable.
    let run = vec![9u8; 4 * LINE as usize];
    assert_eq!(
        writes_of(&dev, || engine.write(8 * LINE, &run, false).unwrap()),
        (1, 0)
    );
    // After a FLUSH the records say dirty: rewrites go through `write_at`.
    engine.flush().unwrap();
    assert_eq!(writes_of(&dev, || engine.write(0, &data, false).unwrap()), (0, 1));
    let (tearable, whole) = writes_of(&dev, || engine.write(8 * LINE, &run, false).unwrap());
    assert_eq!(tearable, 0);
    assert!(whole >= 1);
    // A line the records do not name yet may still be torn.
    assert_eq!(
        writes_of(&dev, || engine.write(20 * LINE, &data, false).unwrap()),
        (1, 0)
    );
    // Every byte is the last write's, whichever way it was written.
    for (offset, expected) in [(0, &data), (8 * LINE, &run), (20 * LINE, &data)] {
        let mut buf = vec![0u8; expected.len()];
        engine.read(offset, &mut buf).unwrap();
        assert_eq!(&buf, expected, "at {offset}");
    }
    engine.shutdown().unwrap();
}

#[test]
fn without_persistent_metadata_every_write_may_be_torn() {
    let (engine, dev) = engine(Persistence::None, true);
    let data = vec![3u8; 4 * LINE as usize];
    assert_eq!(writes_of(&dev, || engine.write(0, &data, false).unwrap()), (1, 0));
    engine.flush().unwrap();
    assert_eq!(writes_of(&dev, || engine.write(0, &data, false).unwrap()), (1, 0));
    engine.shutdown().unwrap();
}

#[test]
fn without_dirty_checksums_no_write_may_be_torn() {
    let (engine, dev) = engine(Persistence::All, false);
    let data = vec![5u8; LINE as usize];
    assert_eq!(writes_of(&dev, || engine.write(0, &data, false).unwrap()), (0, 1));
    engine.flush().unwrap();
    let other = vec![6u8; 2 * LINE as usize];
    assert_eq!(writes_of(&dev, || engine.write(0, &other, false).unwrap()).0, 0);
    let mut buf = vec![0u8; other.len()];
    engine.read(0, &mut buf).unwrap();
    assert_eq!(buf, other);
    engine.shutdown().unwrap();
}
