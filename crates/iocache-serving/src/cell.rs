//! The engine behind an export may be replaced while
//! it serves (a line size changed live is a new engine on the same devices,
//! see `iocache_engine`'s `succession.rs`), so exports and the operator's
//! commands reach it through an [`EngineCell`] instead of holding it.
//!
//! A request holds the cell's read guard while the engine serves it; a
//! replacement takes the write guard, so it runs with no request inside the
//! engine and new ones wait behind it (std's `RwLock` lets a waiting writer
//! in before new readers). Nothing else is ever done under the write guard
//! than the replacement, and no request takes the guard twice.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use iocache_engine::{Engine, Volume};

/// The engine in force and handles on its volumes.
pub struct CurrentEngine {
    pub engine: Arc<Engine>,
    volumes: Vec<Volume>,
    /// Replacements so far (0 for the first engine).
    pub generation: u64,
}

impl CurrentEngine {
    /// The handle on the attached volume named `name`, as of the last
    /// [`EngineCell::refresh_volumes`] or replacement.
    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.volumes.iter().find(|v| v.name() == name)
    }
}

fn handles(engine: &Engine) -> Vec<Volume> {
    engine
        .volumes()
        .into_iter()
        .filter_map(|v| engine.volume_named(&v.name))
        .collect()
}

/// Where the engine of one cache device is found (see the module doc).
pub struct EngineCell {
    current: RwLock<CurrentEngine>,
}

impl EngineCell {
    pub fn new(engine: Arc<Engine>) -> EngineCell {
        let volumes = handles(&engine);
        EngineCell {
            current: RwLock::new(CurrentEngine {
                engine,
                volumes,
                generation: 0,
            }),
        }
    }

    /// The engine in force now (it may be replaced right after: for the
    /// operator's commands, not for requests).
    pub fn engine(&self) -> Arc<Engine> {
        Arc::clone(&self.read().engine)
    }

    /// Holds the engine in force until the guard is dropped: a replacement
    /// waits for it.
    pub fn read(&self) -> RwLockReadGuard<'_, CurrentEngine> {
        self.current.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for every request inside the engine; new ones wait until the
    /// guard is dropped. For [`EngineCell::install`] only.
    pub fn quiesce(&self) -> RwLockWriteGuard<'_, CurrentEngine> {
        self.current.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `engine` in force under a guard from [`EngineCell::quiesce`].
    pub fn install(guard: &mut RwLockWriteGuard<'_, CurrentEngine>, engine: Arc<Engine>) {
        guard.volumes = handles(&engine);
        guard.engine = engine;
        guard.generation += 1;
    }

    /// Takes new volume handles from the engine in force (after an attach
    /// or a detach).
    pub fn refresh_volumes(&self) {
        let mut current = self.quiesce();
        current.volumes = handles(&current.engine);
    }
}
