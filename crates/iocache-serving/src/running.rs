//! The state of a running server ([`Running`]), built by `start.rs` and
//! shared with the admin socket (statistics; attach, detach, flush and
//! settings), the metrics and the line-size watcher.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{refused, Result, Within};
use crate::{EngineCell, EngineExport};
use iocache_core::units::{format_size_readably, parse_byte_size};
use iocache_engine::{Engine, Volume};
use iocache_nbd::ExportHandle;

use crate::config::{normalize, CacheDeviceConfig};
use crate::devices::{check_claim, open_backend, open_cache_file, record_claim, BackendSpec, Claim, Scope};

/// One cache device and the engine that runs it (shared by its volumes).
pub struct CacheGroup {
    /// The path as configured.
    pub path: PathBuf,
    /// The path with symbolic links resolved, to recognize it.
    pub canonical: PathBuf,
    /// Where its engine is found (replaced when ReCA changes the line size).
    pub cell: Arc<EngineCell>,
    /// Set when a line size change left no engine that can serve (neither
    /// the successor nor the old geometry opened): nothing touches the
    /// device again, not even the stop.
    pub broken: AtomicBool,
    /// The cache device's configuration.
    pub config: CacheDeviceConfig,
    pub cache_bytes: u64,
    pub capacity_lines: u64,
    /// The wrappers a line size change put around its volumes' backends
    /// (reused by the next change: they do not nest).
    pub staged: Mutex<Vec<Arc<iocache_device::Staged>>>,
}

impl CacheGroup {
    /// The engine in force now (for the operator's commands and reports).
    pub fn engine(&self) -> Arc<Engine> {
        self.cell.engine()
    }
}

/// A volume being served: an export of the NBD server.
pub struct ServedVolume {
    pub export: String,
    /// The backend's name (path or URI).
    pub backend: String,
    /// Its index in [`Running::caches`].
    pub cache: usize,
    pub volume: Volume,
    /// Served read-only (`--read-only`, `read_only = true`).
    pub read_only: bool,
    /// What a client's TRIM does.
    pub discard: crate::config::DiscardMode,
}

/// What the admin socket and the shutdown see of a running server.
pub struct Running {
    pub caches: Vec<CacheGroup>,
    pub volumes: Mutex<Vec<ServedVolume>>,
    exports: ExportHandle,
    files: Mutex<Vec<Claim>>,
    /// Serializes attach, detach, flush and shutdown.
    admin: Mutex<()>,
    /// Where this server listens (no volume may use it as its backend).
    own: Scope,
    /// Line sizes changed while serving (`relayout.rs`), oldest first.
    pub relayouts: Mutex<Vec<crate::relayout::Relayout>>,
    /// Set (by a signal handler) when the server is to stop.
    stop: &'static AtomicBool,
}

/// Locks `m`, even if a thread panicked while holding it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What an NBD client reads as the export's description: the cache, not
/// where the data lives (no path or address of the backend is told to
/// clients).
pub fn describe(group: &CacheGroup, backend: &str) -> String {
    let kind = if backend.starts_with("nbd://") || backend.starts_with("nbd+unix://") {
        "a remote NBD volume"
    } else {
        "a local volume"
    };
    // The engine in force: a live line size change replaces it.
    let engine = group.engine();
    format!(
        "iocache: {} cache of {} lines of {} over {kind}",
        engine.write_policy(),
        engine.stats().capacity_lines,
        format_size_readably(engine.line_bytes()),
    )
}

/// What `attach` was asked to do (see `iocache ctl attach`).
pub struct AttachRequest<'a> {
    pub export: &'a str,
    pub backend: &'a str,
    pub backend_size: Option<&'a str>,
    pub cache: Option<&'a str>,
}

impl Running {
    /// The NBD server's statistics (connections, limits, requests).
    pub fn server_stats(&self) -> iocache_nbd::ServerStats {
        self.exports.server_stats()
    }

    /// The state of a server that serves `volumes` from `caches` through
    /// the export table `exports`.
    pub fn new(
        caches: Vec<CacheGroup>,
        volumes: Vec<ServedVolume>,
        exports: ExportHandle,
        files: Vec<Claim>,
        own: Scope,
        stop: &'static AtomicBool,
    ) -> Running {
        Running {
            caches,
            volumes: Mutex::new(volumes),
            exports,
            files: Mutex::new(files),
            admin: Mutex::new(()),
            own,
            relayouts: Mutex::new(Vec::new()),
            stop,
        }
    }

    /// The flag that stops the server, for threads that outlive a borrow.
    pub fn stop_flag(&self) -> &'static AtomicBool {
        self.stop
    }

    /// Whether the server is stopping (no attach or setting change then).
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Holds back attach, detach and flush (for as long as the guard lives:
    /// the shutdown keeps it).
    pub fn lock_admin(&self) -> MutexGuard<'_, ()> {
        lock(&self.admin)
    }

    fn cache_for(&self, cache: Option<&str>) -> Result<usize> {
        match cache {
            Some(path) => {
                let wanted = std::fs::canonicalize(path).unwrap_or_else(|_| normalize(Path::new(path)));
                self.caches
                    .iter()
                    .position(|g| g.canonical == wanted || normalize(&g.path) == normalize(Path::new(path)))
                    .ok_or_else(|| refused!("cache {path}: not a cache device of this server"))
            }
            None if self.caches.len() == 1 => Ok(0),
            None => Err(refused!(
                "this server has {} cache devices ({}); name the one to use",
                self.caches.len(),
                self.caches
                    .iter()
                    .map(|g| g.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// Adds a volume to a cache device and serves it as a new export.
    pub fn attach(&self, request: &AttachRequest<'_>) -> Result<serde_json::Value> {
        let _admin = lock(&self.admin);
        if self.stopping() {
            return Err(refused!("the server is stopping"));
        }
        let export = request.export;
        if export.is_empty() || export.len() > 255 || export.contains('\0') {
            return Err(refused!(
                "export: a name of 1 to 255 bytes without NUL, not `{export}`"
            ));
        }
        if lock(&self.volumes).iter().any(|v| v.export == export) {
            return Err(refused!("export `{export}` is already served"));
        }
        let index = self.cache_for(request.cache)?;
        let group = &self.caches[index];
        let create_bytes = request
            .backend_size
            .map(|t| parse_byte_size(t).map_err(|e| refused!("backend_size: {e}")))
            .transpose()?;
        if create_bytes == Some(0) {
            return Err(refused!("backend_size: a backend cannot be empty"));
        }
        let is_nbd = request.backend.starts_with("nbd://") || request.backend.starts_with("nbd+unix://");
        let beneath = if is_nbd {
            None
        } else {
            Some(self.own.attach_location(Path::new(request.backend))?)
        };
        if create_bytes.is_some() && is_nbd {
            return Err(refused!(
                "backend_size: only for a backend file; `{}` is an NBD export",
                request.backend
            ));
        }
        let (backend, _) = {
            let mut files = lock(&self.files);
            open_backend(
                &BackendSpec {
                    backend: request.backend,
                    create_bytes,
                    export,
                    key: "backend",
                    size_key: "backend_size",
                    beneath: beneath.as_ref(),
                },
                &mut files,
                &self.own,
            )?
        };
        let release = || lock(&self.files).retain(|(_, e, role)| !(e == export && *role == "backend"));
        let id = match group.engine().attach(export, Arc::clone(&backend)) {
            Ok(id) => id,
            Err(e) => {
                release();
                return Err(refused!("attaching `{export}`: {e}"));
            }
        };
        let volume = group.engine().volume(id)?;
        group.cell.refresh_volumes();
        let name = backend.name().to_string();
        let served = EngineExport::in_cell(Arc::clone(&group.cell), &volume, Some(describe(group, &name)));
        if let Err(e) = self.exports.add_export(export, Arc::new(served)) {
            let _ = group.engine().detach(id);
            group.cell.refresh_volumes();
            release();
            return Err(refused!("serving `{export}`: {e}"));
        }
        log::info!(
            "attached export `{export}` ({} volume over {name}, {}) to the cache {}; name it in the \
             configuration to serve it after a restart",
            format_size_readably(volume.size_bytes()),
            iocache_engine::describe_backend(&*backend),
            group.path.display()
        );
        lock(&self.volumes).push(ServedVolume {
            export: export.to_string(),
            backend: name.clone(),
            cache: index,
            volume: volume.clone(),
            read_only: false,
            discard: Default::default(),
        });
        Ok(serde_json::json!({
            "export": export,
            "volume_id": id,
            "size_bytes": volume.size_bytes(),
            "backend": name,
            "cache": group.path.display().to_string(),
        }))
    }

    fn served(&self, export: &str) -> Result<(usize, Volume)> {
        lock(&self.volumes)
            .iter()
            .find(|v| v.export == export)
            .map(|v| (v.cache, v.volume.clone()))
            .ok_or_else(|| refused!("no export `{export}` is served"))
    }

    /// Stops serving a volume: its export disappears (new connections are
    /// refused, connections on it close after answering what they sent),
    /// its dirty lines are written back and its lines leave the cache.
    pub fn detach(&self, export: &str) -> Result<serde_json::Value> {
        let _admin = lock(&self.admin);
        let (cache, volume) = self.served(export)?;
        let engine = self.caches[cache].engine();
        let dirty = engine.volume_stats(volume.id()).map_or(0, |s| s.dirty_lines);
        let removed = self.exports.remove_export(export);
        if let Err(e) = engine.detach(volume.id()) {
            if let Some(served) = removed {
                let _ = self.exports.add_export(export, served);
            }
            return Err(refused!("detaching `{export}`: {e}; it is still served"));
        }
        // The cell's handle on the volume holds its backend open.
        self.caches[cache].cell.refresh_volumes();
        lock(&self.volumes).retain(|v| v.export != export);
        lock(&self.files).retain(|(_, e, role)| !(e == export && *role == "backend"));
        log::info!("detached export `{export}`: {dirty} dirty lines written back");
        let left = lock(&self.volumes).len();
        if left == 0 {
            log::warn!("the server serves no export now; `iocache ctl attach` adds one");
        }
        Ok(serde_json::json!({
            "export": export,
            "dirty_lines_written_back": dirty,
            "exports_left": left,
        }))
    }

    /// Writes back a volume's dirty lines while it keeps serving.
    /// The cache `export` names (its volume's), or the only one.
    fn cache_of_export(&self, export: Option<&str>) -> Result<usize> {
        match export {
            Some(export) => Ok(self.served(export)?.0),
            None if self.caches.len() == 1 => Ok(0),
            None => Err(refused!(
                "this server has {} cache devices: name an export whose cache to use",
                self.caches.len()
            )),
        }
    }

    /// The knobs of the cache `export` uses (or the only one): configured,
    /// current, and the write policy in force with its cause.
    pub fn get_settings(&self, export: Option<&str>) -> Result<serde_json::Value> {
        let group = &self.caches[self.cache_of_export(export)?];
        Ok(settings_json(group))
    }

    /// Reloads ReCA's category table of the cache `export` uses (or the
    /// only one): `table`, or the file in use.
    pub fn reca_reload(&self, export: Option<&str>, table: Option<&str>) -> Result<serde_json::Value> {
        let _admin = lock(&self.admin);
        if self.stopping() {
            return Err(refused!("the server is stopping"));
        }
        let group = &self.caches[self.cache_of_export(export)?];
        crate::reca::reload(&group.engine(), table.map(Path::new))
            .within(|| format!("reloading ReCA's table on the cache {}", group.path.display()))
    }

    /// Changes knobs of the cache `export` uses (or the only one) while it
    /// serves; `changes` are `KEY=VALUE` in the configuration file's syntax.
    /// All are checked before any is applied.
    pub fn set_settings(&self, export: Option<&str>, changes: &[String]) -> Result<serde_json::Value> {
        let _admin = lock(&self.admin);
        if self.stopping() {
            return Err(refused!("the server is stopping"));
        }
        if changes.is_empty() {
            return Err(refused!(
                "nothing to set: give KEY=VALUE (keys: {})",
                iocache_core::Setting::KEYS.join(", ")
            ));
        }
        let parsed = changes
            .iter()
            .map(|c| c.parse::<iocache_core::Setting>().map_err(|e| refused!("{e}")))
            .collect::<Result<Vec<_>>>()?;
        let index = self.cache_of_export(export)?;
        let group = &self.caches[index];
        if group.config.reca.is_some()
            && parsed
                .iter()
                .any(|s| matches!(s, iocache_core::Setting::CacheSize(_)))
        {
            return Err(refused!(
                "cache_size: not under ReCA, which formats the cache anew when it changes the line size"
            ));
        }
        group.engine().apply_settings(&parsed).within(|| {
            format!(
                "setting {} on the cache {}",
                changes.join(" "),
                group.path.display()
            )
        })?;
        log::info!(
            "cache {}: set {}",
            group.path.display(),
            parsed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        );
        Ok(settings_json(group))
    }

    /// Starts reading `length` bytes at `offset` of the export (the whole
    /// volume by default) through its cache, in the background; the
    /// progress shows in the stats (`warmed_bytes` of
    /// `warm_requested_bytes`).
    pub fn warm(&self, export: &str, offset: Option<u64>, length: Option<u64>) -> Result<serde_json::Value> {
        let (cache, volume) = self.served(export)?;
        let offset = offset.unwrap_or(0);
        let size = volume.size_bytes();
        if offset >= size {
            return Err(refused!(
                "warming `{export}`: offset {offset} is past its end ({size} bytes)"
            ));
        }
        // By default to the end, whole sectors.
        let length = length.unwrap_or((size - offset) / 512 * 512).min(size - offset);
        if !offset.is_multiple_of(512) || !length.is_multiple_of(512) {
            return Err(refused!(
                "warming `{export}`: offset {offset} and length {length} must be multiples of 512 bytes"
            ));
        }
        let engine = self.caches[cache].engine();
        let name = export.to_string();
        std::thread::Builder::new()
            .name("iocache-warm".into())
            .spawn(move || match engine.warm_range(&volume, offset, length) {
                Ok(()) => log::info!("warmed `{name}`: {length} bytes at {offset} read through the cache"),
                Err(e) => log::warn!("warming `{name}` stopped: {e}"),
            })
            .within(|| format!("warming `{export}`: starting its thread"))?;
        Ok(serde_json::json!({ "export": export, "offset": offset, "length": length }))
    }

    /// Puts the device file `new` (created when missing) in place of the
    /// cache-array member `old` (as configured) of the cache `cache` (the
    /// only one when not named): see `Engine::replace_cache_member`.
    pub fn replace_member(&self, cache: Option<&str>, old: &str, new: &str) -> Result<serde_json::Value> {
        let _admin = lock(&self.admin);
        if self.stopping() {
            return Err(refused!("the server is stopping"));
        }
        let group = &self.caches[self.cache_for(cache)?];
        let engine = group.engine();
        let Some(array) = engine.cache_array() else {
            return Err(refused!(
                "the cache {} is not a cache array",
                group.path.display()
            ));
        };
        let members: Vec<String> = array.stats().members.into_iter().map(|(name, _)| name).collect();
        let same = |a: &str, b: &str| {
            a == b || std::fs::canonicalize(a).is_ok_and(|c| std::fs::canonicalize(b).is_ok_and(|d| c == d))
        };
        let Some(old_name) = members.iter().find(|m| same(m, old)) else {
            return Err(refused!(
                "old: {old} is not a member of the cache array {} (members: {})",
                group.path.display(),
                members.join(", ")
            ));
        };
        let new_path = Path::new(new);
        let owner = group.path.display().to_string();
        {
            let files = lock(&self.files);
            check_claim(&files, new_path, "cache", "new")?;
        }
        let device = open_cache_file(
            new_path,
            array.geometry().member_bytes(),
            group.config.direct,
            self.own.no_follow(new_path),
            false,
        )
        .within(|| "new".to_string())?;
        let done = engine
            .replace_cache_member(old_name, new, Arc::new(device), &|| self.stopping())
            .within(|| format!("replacing {old_name} with {new}"))?;
        record_claim(&mut lock(&self.files), new_path, &owner, "cache");
        log::warn!(
            "cache array {}: {new} replaced {old_name}; name it in place of {old_name} in the configuration \
             (cache_array, or --cache-array)",
            group.path.display()
        );
        Ok(serde_json::json!({
            "cache": owner,
            "old": old_name,
            "new": new,
            "member": done.member,
            "retired": done.retired,
            "restored_slots": done.restored_slots,
            "rebuilt_lines": done.rebuilt_lines,
            "rebuilt_mirrors": done.rebuilt_mirrors,
        }))
    }

    pub fn flush(&self, export: &str) -> Result<serde_json::Value> {
        let _admin = lock(&self.admin);
        let (cache, volume) = self.served(export)?;
        let written = self.caches[cache]
            .engine()
            .flush_volume(volume.id())
            .within(|| format!("flushing `{export}`"))?;
        Ok(serde_json::json!({ "export": export, "written_back_lines": written }))
    }
}

/// A cache's knobs as JSON: for each, configured and current; and the
/// write policy in force with its cause.
fn settings_json(group: &CacheGroup) -> serde_json::Value {
    let engine = group.engine();
    let effective = engine.effective_mode();
    let knobs: Vec<serde_json::Value> = engine
        .settings()
        .into_iter()
        .map(|k| serde_json::json!({"key": k.key, "configured": k.configured, "current": k.current}))
        .collect();
    serde_json::json!({
        "cache": group.path.display().to_string(),
        "volumes": engine.volumes().into_iter().map(|v| v.name).collect::<Vec<_>>(),
        "settings": knobs,
        "effective_write_policy": effective.policy.to_string(),
        "effective_write_policy_cause": effective.cause.name(),
        "dirty_lines": engine.stats().dirty_lines,
        "reca": engine.reca_status().as_ref().map(crate::stats::RecaSnapshot::from),
    })
}
