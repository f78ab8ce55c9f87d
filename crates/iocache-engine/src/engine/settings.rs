//! An operator changes a serving cache's knobs
//! (`iocache ctl set`, as `casadm --set-cache-mode` / `--set-param` do),
//! and the change must reach every shard's core without stopping I/O,
//! lose no dirty line (and no cached one but those a smaller
//! `cache_size` has no room for), survive a restart, and never leave a
//! crash in between unsafe. The cores do the switching ([`Cache::apply`]);
//! this file applies a change to all of them, keeps the configured and the
//! current values, writes the changes into the superblock (an A/B update,
//! so a crash finds either the old or the new values, never a mixture),
//! drains dirty lines in the background when the new write policy keeps
//! none, and brings the changes back at the next start.
//!
//! At start, a value changed at run time comes back only if the
//! configuration still says what it said when the change was made: an
//! operator who edits the configuration file (or the flags) since gets what
//! the configuration now says.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use iocache_core::Setting;
use iocache_format::{RecordedChange, SettingsRecord};

use super::{lock, Engine, EngineError, Inner};

/// One knob: its configured value and the one in force (both in the
/// syntax of [`Setting::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobState {
    pub key: &'static str,
    pub configured: String,
    pub current: String,
}

/// The knobs' values: as configured at start, and as changed since.
#[derive(Debug, Default)]
pub(super) struct Knobs {
    /// The configuration's values, in [`Setting::KEYS`] order.
    pub configured: Vec<Setting>,
    /// The values in force, in the same order.
    pub current: Vec<Setting>,
}

impl Knobs {
    pub fn new(configured: Vec<Setting>) -> Knobs {
        Knobs {
            current: configured.clone(),
            configured,
        }
    }

    /// The operator's dirty cap in force.
    pub fn dirty_cap(&self) -> Option<u64> {
        match self.current[Self::index("max_dirty_lines")] {
            Setting::MaxDirtyLines(cap) => cap,
            _ => unreachable!("max_dirty_lines holds a MaxDirtyLines"),
        }
    }

    fn index(key: &str) -> usize {
        Setting::KEYS.iter().position(|k| *k == key).expect("a known key")
    }

    /// Every value that differs from the configuration, as the
    /// superblock's settings record keeps it.
    pub fn changes(&self) -> Vec<RecordedChange> {
        (self.configured.iter().zip(&self.current))
            .filter(|(configured, current)| configured != current)
            .map(|(configured, current)| RecordedChange {
                key: current.key().to_string(),
                value: current.value_text(),
                configured: configured.value_text(),
            })
            .collect()
    }

    /// The run-time changes a superblock recorded that still apply: those
    /// whose configured value is what the configuration says now. Returns
    /// them, and the ones dropped (with why).
    pub fn recorded(&self, changes: &[RecordedChange]) -> (Vec<Setting>, Vec<String>) {
        let mut keep = Vec::new();
        let mut dropped = Vec::new();
        for change in changes {
            let setting = format!("{}={}", change.key, change.value);
            let was = change.configured.as_str();
            match setting.parse::<Setting>() {
                Ok(s) => {
                    let now = self.configured[Self::index(s.key())].value_text();
                    if now == was {
                        keep.push(s);
                    } else {
                        dropped.push(format!(
                            "{s} (set at run time over {was}): the configuration says {now} now"
                        ));
                    }
                }
                Err(e) => dropped.push(format!("`{setting}`: {e}")),
            }
        }
        (keep, dropped)
    }
}

/// The per-shard dirty cap: the operator's cap shared by the shards in
/// proportion to their lines (rounded up), and at most what a cache array
/// can mirror.
pub(super) fn shard_dirty_cap(
    user_cap: Option<u64>,
    array_cap: Option<u64>,
    shard_lines: u64,
    capacity_lines: u64,
) -> Option<u64> {
    let user = user_cap.map(|cap| (cap * shard_lines).div_ceil(capacity_lines.max(1)));
    match (user, array_cap) {
        (Some(u), Some(a)) => Some(u.min(a)),
        (u, a) => u.or(a),
    }
}

impl Inner {
    /// Applies `changes` to every shard's core and to the knobs' record.
    /// Every change is checked before any is applied.
    pub(super) fn apply_settings(&self, changes: &[Setting]) -> Result<(), EngineError> {
        for change in changes {
            if let Setting::Policy(spec) = change {
                spec.build(1)
                    .map_err(|e| EngineError::Config(format!("policy={spec}: {e}")))?;
            }
            if let Setting::CacheSize(bytes) = change {
                self.check_size(*bytes)?;
            }
        }
        // A resize first, without the knobs held: a shrink may wait for
        // dirty lines to be written back.
        for change in changes {
            if let Setting::CacheSize(bytes) = change {
                self.resize(bytes / self.line_bytes)?;
            }
        }
        let now_ns = self.now_ns();
        let mut knobs = lock(&self.knobs);
        for change in changes {
            match change {
                Setting::MaxDirtyLines(cap) => self.set_dirty_caps(*cap),
                Setting::CacheSize(_) => {}
                Setting::Readahead(readahead) => {
                    for shard in &self.shards {
                        lock(&shard.state).cache.apply(change, now_ns)?;
                    }
                    self.readahead.set(*readahead);
                }
                other => {
                    for shard in &self.shards {
                        lock(&shard.state).cache.apply(other, now_ns)?;
                    }
                }
            }
            let i = Knobs::index(change.key());
            knobs.current[i] = change.clone();
        }
        Ok(())
    }

    /// Gives every shard its share of the operator's dirty cap `user_cap`,
    /// bounded by what a cache array can mirror now.
    pub(super) fn set_dirty_caps(&self, user_cap: Option<u64>) {
        let capacity: u64 = self
            .shards
            .iter()
            .map(|s| lock(&s.state).cache.lines_in_service())
            .sum();
        let array_cap = self.slots.array.as_ref().map(|a| a.dirty_cap());
        for shard in &self.shards {
            let mut state = lock(&shard.state);
            let lines = state.cache.lines_in_service();
            state
                .cache
                .set_max_dirty_lines(shard_dirty_cap(user_cap, array_cap, lines, capacity));
        }
    }

    /// Notes `bytes` in service as the size in force, in the knobs.
    pub(super) fn note_size(&self, bytes: u64) {
        lock(&self.knobs).current[Knobs::index("cache_size")] = Setting::CacheSize(bytes);
    }

    /// [`Inner::note_size`], and in the superblock (a growth, before its
    /// slots come back).
    pub(super) fn record_size(&self, bytes: u64) -> Result<(), EngineError> {
        self.note_size(bytes);
        self.persist_settings()
    }

    /// The superblock's settings record now (an A/B update of the superblock).
    pub(super) fn persist_settings(&self) -> Result<(), EngineError> {
        let mut record = SettingsRecord {
            opened_with: self.opened_with.clone(),
            changes: lock(&self.knobs).changes(),
            ..SettingsRecord::default()
        };
        self.update_superblock(|superblock| {
            // Read under the superblock's lock: ReCA's thread persists
            // without the admin lock, and the last update must carry its
            // latest choice.
            record.reca_line = self.reca_line();
            let text = record.encode();
            let changed = superblock.settings != text;
            superblock.settings = text;
            changed
        })
    }
}

impl Engine {
    /// Changes knobs while the cache serves (see the module doc): every
    /// shard switches between two requests; no dirty line is dropped, and
    /// no cached one but those a smaller `cache_size` leaves no room for
    /// (`resize.rs`). Leaving a write policy that keeps dirty data (wb, wo) for
    /// one that does not (wt, wi, wa, pt) writes the dirty lines back in the
    /// background while new writes follow the new policy; until then they
    /// are served from the cache as before. Returns the knobs' values.
    pub fn apply_settings(&self, changes: &[Setting]) -> Result<Vec<KnobState>, EngineError> {
        let _admin = lock(&self.inner.admin);
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(EngineError::Shutdown);
        }
        self.inner.apply_settings(changes)?;
        self.inner.persist_settings()?;
        if changes.iter().any(|c| matches!(c, Setting::WritePolicy(_))) {
            Inner::drain_if_needed(&self.inner);
        }
        Ok(self.settings())
    }

    /// The knobs: configured and current values.
    pub fn settings(&self) -> Vec<KnobState> {
        let knobs = lock(&self.inner.knobs);
        knobs
            .configured
            .iter()
            .zip(&knobs.current)
            .map(|(configured, current)| KnobState {
                key: configured.key(),
                configured: configured.value_text(),
                current: current.value_text(),
            })
            .collect()
    }
}

impl Inner {
    /// Writes dirty lines back in the background when the policy in force
    /// keeps none (one drain at a time; it ends when none is left, the
    /// policy keeps dirty data again, or the engine stops).
    pub(super) fn drain_if_needed(inner: &Arc<Inner>) {
        let keeps_dirty = lock(&inner.shards[0].state)
            .cache
            .effective_mode()
            .policy
            .keeps_dirty();
        if keeps_dirty || inner.draining.swap(true, Ordering::SeqCst) {
            return;
        }
        let drainer = Arc::clone(inner);
        let spawned = std::thread::Builder::new()
            .name("iocache-drain".into())
            .spawn(move || {
                let inner = drainer;
                while !inner.stopping.load(Ordering::SeqCst) {
                    let policy = lock(&inner.shards[0].state).cache.effective_mode().policy;
                    let dirty: u64 = inner
                        .shards
                        .iter()
                        .map(|s| lock(&s.state).cache.dirty_lines())
                        .sum();
                    if dirty == 0 || policy.keeps_dirty() {
                        break;
                    }
                    if inner.flush_all().is_err() {
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                }
                inner.draining.store(false, Ordering::SeqCst);
            });
        if spawned.is_err() {
            // No thread: the dirty lines stay dirty (served and written
            // back by cleaning, a FLUSH or the shutdown).
            inner.draining.store(false, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs() -> Knobs {
        Knobs::new(Setting::all_of(&iocache_core::CacheConfig::new(
            8,
            iocache_core::LineSize::new(4096).unwrap(),
            iocache_core::PolicySpec::lru(),
        )))
    }

    #[test]
    fn run_time_changes_come_back_only_over_the_same_configuration() {
        let mut k = knobs();
        k.current[0] = "write_policy=wt".parse().unwrap();
        k.current[2] = "policy=arc".parse().unwrap();
        let text = SettingsRecord {
            changes: k.changes(),
            ..SettingsRecord::default()
        }
        .encode();
        assert!(
            text.contains("set:write_policy=wt|wb") && text.contains("set:policy=arc|lru"),
            "{text}"
        );
        let changes = SettingsRecord::decode(&text).changes;
        let (keep, dropped) = knobs().recorded(&changes);
        assert_eq!(keep.len(), 2);
        assert!(dropped.is_empty());
        // The configuration changed since: its value wins.
        let mut other = knobs();
        other.configured[0] = "write_policy=wa".parse().unwrap();
        let (keep, dropped) = other.recorded(&changes);
        assert_eq!(keep, vec!["policy=arc".parse::<Setting>().unwrap()]);
        assert!(
            dropped[0].contains("the configuration says wa now"),
            "{dropped:?}"
        );
    }

    #[test]
    fn the_dirty_cap_is_shared_by_the_shards_and_bounded_by_the_array() {
        assert_eq!(shard_dirty_cap(Some(100), None, 250, 1000), Some(25));
        assert_eq!(shard_dirty_cap(Some(10), None, 333, 1000), Some(4));
        assert_eq!(shard_dirty_cap(Some(100), Some(10), 250, 1000), Some(10));
        assert_eq!(shard_dirty_cap(None, Some(10), 250, 1000), Some(10));
        assert_eq!(shard_dirty_cap(None, None, 250, 1000), None);
    }
}
