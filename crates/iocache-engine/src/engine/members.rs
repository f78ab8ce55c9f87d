//! Replacing a member of a cache array while the cache serves: a live
//! member is first retired as if it had failed, the cleaner writes back
//! every dirty line that depended on it (degraded mode, `cleaner.rs`), and
//! then the array takes the new device (`raid.rs`) and the member's slots
//! come back in service, empty, to fill again as lines are read and
//! written.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_device::BlockDevice;

use super::{lock, Engine, EngineError};
use crate::raid::CacheArray;

/// The longest a replacement waits for the member's dirty lines to be
/// written back.
pub const EVACUATION_PATIENCE: Duration = Duration::from_secs(600);

/// What a replacement did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberReplacement {
    /// The member's index in the array.
    pub member: usize,
    /// The member was live and was retired first.
    pub retired: bool,
    /// Line slots put back in service (empty) on the new device.
    pub restored_slots: u64,
}

impl Engine {
    /// The cache array the engine runs on, if any.
    pub fn cache_array(&self) -> Option<&Arc<CacheArray>> {
        self.inner.slots.array.as_ref()
    }

    /// Puts `device`, named `new_name`, in place of the array member named
    /// `old_name`. A live member is retired first; either way this waits
    /// until the cleaner has written back every dirty line that had a copy
    /// on it, then copies the array's metadata to the new device and puts
    /// the member's slots back in service. Requests are served throughout.
    /// The wait ends early, with an error, once `give_up` says so (the
    /// server stops) or after [`EVACUATION_PATIENCE`] (a backend that
    /// refuses the write-backs): the member then stays out of service, and
    /// the same call later picks up where this one left off.
    pub fn replace_cache_member(
        &self,
        old_name: &str,
        new_name: &str,
        device: Arc<dyn BlockDevice>,
        give_up: &dyn Fn() -> bool,
    ) -> Result<MemberReplacement, EngineError> {
        let inner = &self.inner;
        let Some(array) = inner.slots.array.clone() else {
            return Err(EngineError::NotSupported(
                "replacing a member: the cache is not an array".into(),
            ));
        };
        let member = array
            .member_index(old_name)
            .ok_or_else(|| EngineError::Config(format!("the cache array has no member named {old_name}")))?;
        if array.member_index(new_name).is_some_and(|other| other != member) {
            return Err(EngineError::Config(format!(
                "{new_name} is already a member of the cache array"
            )));
        }
        // Checked before a healthy member is retired for nothing.
        array.check_member_size(new_name, &*device)?;
        let retired = !array.member_failed(member);
        if retired {
            array.retire_member(member)?;
        }
        // The cleaner evacuates the member (writes back what lost a copy,
        // takes its slots out of service); wait for it.
        let deadline = Instant::now() + EVACUATION_PATIENCE;
        while inner.cleaner.array_failures_handled.load(Ordering::Acquire) != array.failures() {
            if inner.stopping.load(Ordering::Relaxed) {
                return Err(EngineError::Shutdown);
            }
            if give_up() || Instant::now() > deadline {
                return Err(EngineError::DirtyLinesRemain {
                    lines: inner
                        .shards
                        .iter()
                        .map(|s| lock(&s.state).cache.dirty_lines())
                        .sum(),
                });
            }
            inner.wake_cleaner();
            std::thread::sleep(Duration::from_millis(5));
        }
        // No flush batch in flight while the slots come back.
        let _cleaning = lock(&inner.cleaner.cleaning);
        array.replace_member(member, new_name, device)?;
        let mut restored_slots = 0;
        for shard in &inner.shards {
            let base = shard.base_slot;
            restored_slots += lock(&shard.state)
                .cache
                .restore_slots(|slot| array.member_of(base + u64::from(slot)) == member);
        }
        inner.set_dirty_caps(lock(&inner.knobs).dirty_cap());
        Ok(MemberReplacement {
            member,
            retired,
            restored_slots,
        })
    }
}
