//! Starting and stopping a server: every cache device opened with the
//! backends of its volumes and one engine built per device, the NBD
//! server's listeners bound before any device is touched, the admin socket
//! and metrics started, and at the stop every dirty line written back.
//! [`serve`] runs it all until the stop flag is set.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iocache_core::units::format_size_readably;
use iocache_core::{CacheConfig, WritePolicy};
use iocache_device::BlockDevice;
use iocache_engine::layout::{self, LayoutError};
use iocache_engine::{CacheArray, Engine, EngineConfig, InitMode, Persistence};
use iocache_nbd::{Server, ServerConfig};

use crate::config::{normalize, CacheDeviceConfig, Origin, ServeConfig, DEFAULT_CACHE_BYTES};
use crate::devices::{
    canonical_path, check_claim, create_socket_dir, open_backend, open_cache_file, record_claim, BackendSpec,
    Claim, Scope,
};
use crate::error::{refused, Acknowledgement, Result, ServeError, Within};
use crate::running::{describe, lock, CacheGroup, Running, ServedVolume};
use crate::{EngineCell, EngineExport};

/// Opens cache device `cache` and the backends of the volumes that share
/// it (`members`, indices into `config.volumes`), and builds its engine.
fn open_cache_group(
    config: &ServeConfig,
    cache: usize,
    members: &[usize],
    files: &mut Vec<Claim>,
    start: StartMode,
    own: &Scope,
) -> Result<CacheGroup> {
    let v = &config.caches[cache];
    // The volume that names the cache in claims and messages.
    let first = &config.volumes[members[0]].export;
    if v.ordered_write_back {
        // Each of these changes write policies or writes back on its own.
        let other = [
            ("cache_array", !v.cache_array.is_empty()),
            ("adapt", v.adapt.is_some() || v.reca.is_some()),
        ];
        if let Some((key, _)) = other.iter().find(|(_, set)| *set) {
            return Err(refused!(
                "{}: not combined with {}",
                v.key("ordered_write_back"),
                v.key(key)
            ));
        }
    }
    if v.persistence == Persistence::None
        && matches!(v.write_policy, WritePolicy::WriteBack | WritePolicy::WriteOnly)
        && !start.force
    {
        return Err(ServeError::NeedsAcknowledgement {
            message: format!(
                "{}: none keeps no metadata on the cache device, so with write policy {} every FLUSH must \
                 write all dirty lines back and a crash loses the cache; choose all or dirty",
                v.key("persistence"),
                v.write_policy
            ),
            acknowledgement: Acknowledgement::Force,
        });
    }
    let mut backends = Vec::with_capacity(members.len());
    // Backends that existed before this start (they may have been served
    // through this cache before).
    let mut existing_backends = Vec::new();
    for &i in members {
        let m = &config.volumes[i];
        let (backend, created) = open_backend(
            &BackendSpec {
                backend: &m.backend,
                create_bytes: m.backend_create_bytes,
                export: &m.export,
                key: &m.key("backend"),
                size_key: &m.origin.short_key("backend_size"),
                beneath: None,
            },
            files,
            own,
        )?;
        let backend: Arc<dyn BlockDevice> = match &m.backend_id {
            Some(id) => Arc::new(iocache_device::Identified::new(backend, id)),
            None => backend,
        };
        if !created {
            existing_backends.push(m.backend.clone());
        }
        backends.push((m.export.clone(), backend));
    }
    // The cache device holds a superblock and metadata records before the
    // lines (docs/format.md): a new file gets room for both.
    let line_bytes = v.line_size.bytes();
    // Room for `cache_size_max` when given (the cache may grow to it).
    let create_bytes = layout::device_bytes_for(
        line_bytes,
        (v.cache_max_bytes.or(v.cache_bytes)).unwrap_or(DEFAULT_CACHE_BYTES),
    )
    .map_err(|e| {
        let key = if v.cache_max_bytes.is_some() {
            "cache_size_max"
        } else {
            "cache_size"
        };
        refused!("{}: {e}", v.key(key))
    })?;
    // A missing cache device is refused before anything is created.
    let missing = std::iter::once(&v.path)
        .chain(&v.cache_array)
        .all(|p| std::fs::symlink_metadata(p).is_err());
    if missing && !start.init && !existing_backends.is_empty() {
        return Err(refuse_empty_cache(v, &existing_backends, "does not exist"));
    }
    check_claim(files, &v.path, "cache", &v.key("cache"))?;
    let mut cache_file = Some(
        open_cache_file(
            &v.path,
            create_bytes,
            v.direct,
            own.no_follow(&v.path),
            config.map_cache,
        )
        .within(|| v.key("cache"))?,
    );
    let canonical = record_claim(files, &v.path, first, "cache");
    // ReCA's line size from the last run, while the configuration still
    // says what it said then (one device only: an array's geometry is its
    // members').
    let configured_line_size = v.line_size;
    let recorded = match (&v.reca, v.cache_array.is_empty(), start.init, &cache_file) {
        (Some(_), true, false, Some(file)) => crate::reca::line_size_to_start_with(file, v)?,
        _ => None,
    };
    let with_reca_line;
    let v = match recorded {
        Some(line_size) => {
            with_reca_line = CacheDeviceConfig {
                line_size,
                ..v.clone()
            };
            &with_reca_line
        }
        None => v,
    };
    let line_bytes = v.line_size.bytes();
    let array = if v.cache_array.is_empty() {
        None
    } else {
        let mut members: Vec<(String, Option<Arc<dyn BlockDevice>>)> = vec![(
            v.path.display().to_string(),
            Some(Arc::new(cache_file.take().expect("opened above"))),
        )];
        for path in &v.cache_array {
            check_claim(files, path, "cache", &v.key("cache_array"))?;
            let dev = open_cache_file(
                path,
                create_bytes,
                v.direct,
                own.no_follow(path),
                config.map_cache,
            )
            .within(|| v.key("cache_array"))?;
            record_claim(files, path, first, "cache");
            members.push((path.display().to_string(), Some(Arc::new(dev))));
        }
        Some(Arc::new(
            CacheArray::open_or_create(members, line_bytes, v.mirror_percent)
                .within(|| v.key("cache_array"))?,
        ))
    };
    let cache_dev: Arc<dyn BlockDevice> = match (&array, v.slow_cache) {
        (Some(_), Some(_)) => return Err(refused!("{}: not with a cache array", v.key("slow_cache"))),
        (Some(array), None) => array.clone(),
        (None, None) => Arc::new(cache_file.take().expect("opened above")),
        (None, Some(slow)) => {
            let dev = iocache_device::FaultDevice::new(cache_file.take().expect("opened above"));
            dev.set_journal(false);
            dev.set_latency(Duration::from_nanos(slow.latency_ns));
            dev.set_servers(slow.servers);
            log::warn!(
                "{}: slowed down for an experiment: {} per I/O through {} servers",
                v.path.display(),
                iocache_core::units::format_duration_ns(slow.latency_ns),
                slow.servers
            );
            Arc::new(dev)
        }
    };
    if array.is_none() && !(start.init && start.force) {
        // Before sizing a cache from the device: a device smaller than the
        // cache it holds was truncated (growing it would serve zeroes).
        iocache_engine::check_not_shrunk(cache_dev.as_ref())?;
    }
    let (capacity_lines, lines_in_service) = match &array {
        Some(array) => (array.geometry().slots(), None),
        None => formatted_and_in_service(v, cache_dev.as_ref(), line_bytes, start.init)?,
    };
    let cache_bytes = match (&array, v.cache_bytes) {
        (None, Some(bytes)) => bytes,
        _ => capacity_lines * line_bytes,
    };
    let volume_bytes: u64 = backends.iter().map(|(_, b)| b.len_bytes()).sum();
    if cache_bytes > volume_bytes {
        log::warn!(
            "{}: the cache ({}) is larger than the volumes it serves together ({}): at most {} of it will \
             ever hold data",
            v.key("cache_size"),
            format_size_readably(cache_bytes),
            format_size_readably(volume_bytes),
            format_size_readably(volume_bytes)
        );
    }
    if !start.init
        && !existing_backends.is_empty()
        && iocache_engine::is_blank(cache_dev.as_ref())
            .within(|| format!("reading the superblocks of {}", cache_dev.name()))?
    {
        return Err(refuse_empty_cache(
            v,
            &existing_backends,
            "holds no cache (blank)",
        ));
    }
    // A cache array's members were formatted for one line size.
    let line_size_live = array.is_none() && v.reca.as_ref().is_some_and(|r| r.line_size_live);
    let mut config_of_engine = engine_config(
        v,
        capacity_lines,
        if start.init {
            InitMode::Format {
                discard_dirty: start.force,
            }
        } else if start.accept_damage {
            InitMode::LoadAcceptingDamage
        } else {
            InitMode::Load
        },
        array,
    );
    config_of_engine.rebind_backends = start.rebind;
    config_of_engine.cache.lines_in_service = lines_in_service;
    let engine = Engine::with_volumes(config_of_engine, cache_dev, backends).within(|| match &v.origin {
        Origin::Flags => "building the cache".to_string(),
        Origin::File(path) if members.len() == 1 => format!("{path}: volume `{first}`"),
        Origin::File(path) => format!(
            "{path}: cache {} of volumes {}",
            v.path.display(),
            members
                .iter()
                .map(|&i| format!("`{}`", config.volumes[i].export))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })?;
    report_start(config, members, &engine, v);
    if let Some(adapt) = &v.adapt {
        log::info!("cache {}: load balancer {}", v.path.display(), adapt.text);
    }
    if let Some(reca) = &v.reca {
        crate::reca::start_live(&engine, reca, &v.path, configured_line_size, line_size_live)
            .within(|| v.key("reca_table"))?;
    }
    Ok(CacheGroup {
        path: v.path.clone(),
        canonical,
        cell: Arc::new(EngineCell::new(Arc::new(engine))),
        broken: std::sync::atomic::AtomicBool::new(false),
        config: v.clone(),
        cache_bytes,
        capacity_lines,
        staged: Default::default(),
    })
}

/// Lines of `line_bytes` the cache of `v` holds on a device of
/// `device_bytes` (not a cache array): `cache_size`'s whole lines if they
/// and their records fit the device (smaller lines need more records),
/// else an error saying how to grow it; without `cache_size`, as many as
/// fit. The one rule for a start, a recorded ReCA line size
/// (`reca_cli.rs`) and a line size changed while serving
/// (`relayout.rs`).
pub(crate) fn cache_lines(v: &CacheDeviceConfig, device_bytes: u64, line_bytes: u64) -> Result<u64> {
    lines_of_size(v, "cache_size", v.cache_bytes, device_bytes, line_bytes)
}

/// The lines the cache device of `v` is formatted for and, when fewer,
/// the lines in service: `cache_size_max`'s lines, `cache_size`'s in
/// service. Without `cache_size_max`, a device that already holds a cache
/// of this line size with more lines keeps its format (unless `init`), so
/// that a smaller `cache_size` keeps the lines that fit rather than
/// formatting anew.
fn formatted_and_in_service(
    v: &CacheDeviceConfig,
    dev: &dyn BlockDevice,
    line_bytes: u64,
    init: bool,
) -> Result<(u64, Option<u64>)> {
    let device_bytes = dev.len_bytes();
    let in_service = cache_lines(v, device_bytes, line_bytes)?;
    let formatted = match v.cache_max_bytes {
        Some(max) => lines_of_size(v, "cache_size_max", Some(max), device_bytes, line_bytes)?,
        None if !init => iocache_engine::formatted_lines(dev, line_bytes)
            .within(|| format!("reading the superblocks of {}", dev.name()))?
            .filter(|&lines| {
                lines > in_service && lines <= layout::slots_fitting(line_bytes, device_bytes).unwrap_or(0)
            })
            .unwrap_or(in_service),
        None => in_service,
    };
    Ok((formatted, (in_service < formatted).then_some(in_service)))
}

/// [`cache_lines`] for `bytes` given by the key `size_key` of `v`.
fn lines_of_size(
    v: &CacheDeviceConfig,
    size_key: &str,
    bytes: Option<u64>,
    device_bytes: u64,
    line_bytes: u64,
) -> Result<u64> {
    let (lines, bytes) = match bytes {
        Some(bytes) => match layout::fit_bytes(line_bytes, bytes, device_bytes) {
            Ok(_) => (bytes / line_bytes, bytes),
            Err(LayoutError::DoesNotFit {
                needed_bytes,
                device_bytes,
                ..
            }) => {
                return Err(refused!(
                "{} with lines of {}: {} of lines and their metadata need {}, more than the cache device {} \
                 ({}); to grow the cache, grow the device first (a file: truncate -s {} {}), or give a size \
                 that fits (docs/ops.md, \"Growing or shrinking a cache\")",
                v.key(size_key),
                format_size_readably(line_bytes),
                format_size_readably(bytes),
                format_size_readably(needed_bytes),
                v.path.display(),
                format_size_readably(device_bytes),
                needed_bytes,
                v.path.display()
            ))
            }
            Err(e) => return Err(refused!("{}: {e}", v.key(size_key))),
        },
        None => {
            let lines = layout::slots_fitting(line_bytes, device_bytes)
                .map_err(|e| refused!("{}: {e}", v.key("cache")))?;
            (lines, lines * line_bytes)
        }
    };
    if lines == 0 {
        return Err(refused!(
            "{}: the cache ({}) holds no line of {}",
            v.key(size_key),
            format_size_readably(bytes),
            format_size_readably(line_bytes)
        ));
    }
    Ok(lines)
}

/// The engine's configuration for the cache of `v` (its line size), with
/// `capacity_lines` lines.
pub(crate) fn engine_config(
    v: &CacheDeviceConfig,
    capacity_lines: u64,
    init: InitMode,
    array: Option<Arc<CacheArray>>,
) -> EngineConfig {
    let mut cache = CacheConfig::new(capacity_lines, v.line_size, v.policy.clone());
    cache.write_policy = v.write_policy;
    cache.promotion = v.promotion;
    cache.cleaning = v.cleaning;
    cache.write_miss_bypass = v.write_miss_bypass;
    cache.ordered_write_back = v.ordered_write_back;
    cache.seq_cutoff = v.seq_cutoff;
    cache.readahead = v.readahead;
    cache.fill = v.fill;
    cache.max_dirty_lines = v.max_dirty_lines;
    EngineConfig {
        cache,
        lookup: v.lookup,
        shards: 0,
        io: v.io,
        persistence: v.persistence,
        init,
        volume_name: v.path.display().to_string(),
        array,
        balance: v.adapt.as_ref().map(|a| a.config),
        dirty_checksums: true,
        clean_check_budget: Duration::from_nanos(v.clean_check_budget_ns),
        commit_interval: (v.commit_interval_ns > 0).then(|| Duration::from_nanos(v.commit_interval_ns)),
        rebind_backends: false,
        write_back_gap_bytes: v.write_back_gap_bytes,
    }
}

/// Why a new (missing or blank) cache device is not formatted over
/// backends that existed before this start, and the way out.
fn refuse_empty_cache(v: &CacheDeviceConfig, existing_backends: &[String], found: &str) -> ServeError {
    // A file this start did not create existed before; a remote export
    // always may have (nothing here can tell a new one).
    let (remote, files): (Vec<&String>, Vec<&String>) = existing_backends
        .iter()
        .partition(|b| crate::config::is_nbd_uri(b));
    let mut which = Vec::new();
    if !files.is_empty() {
        let names: Vec<&str> = files.iter().map(|b| b.as_str()).collect();
        which.push(format!("the backend {} existed before", names.join(", ")));
    }
    if !remote.is_empty() {
        let names: Vec<&str> = remote.iter().map(|b| b.as_str()).collect();
        which.push(format!(
            "the backend {} is a remote export that may hold data",
            names.join(", ")
        ));
    }
    let message = format!(
        "{}: {} {found}, but {}: if it was served through a cache before, that cache may hold its \
         newest writes (lost if the cache device was deleted, replaced or mistyped). Check the path",
        v.key("cache"),
        v.path.display(),
        which.join(", and ")
    );
    ServeError::NeedsAcknowledgement {
        message,
        acknowledgement: Acknowledgement::Init,
    }
}

/// Tells what opening a cache device found (for every volume sharing it).
fn report_start(config: &ServeConfig, members: &[usize], engine: &Engine, v: &CacheDeviceConfig) {
    let who = if members.len() == 1 {
        format!("volume `{}`", config.volumes[members[0]].export)
    } else {
        format!(
            "volumes {}",
            members
                .iter()
                .map(|&i| format!("`{}`", config.volumes[i].export))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let stats = engine.stats();
    let r = stats.recovery;
    let device = match &stats.array {
        None => v.path.display().to_string(),
        Some(a) => {
            let members: Vec<String> = a
                .array
                .members
                .iter()
                .map(|(name, failed)| {
                    if *failed {
                        format!("{name} (failed)")
                    } else {
                        name.clone()
                    }
                })
                .collect();
            format!("the cache array {}", members.join(" + "))
        }
    };
    for change in &r.identity_changes {
        log::warn!("{who}: volume {change}");
    }
    for info in engine.volumes() {
        if let Ok(volume) = engine.volume(info.id) {
            let backend = volume.backend();
            let described = iocache_engine::describe_backend(&**backend);
            if backend.identity().is_some_and(|id| id.weak) {
                log::warn!(
                    "volume `{}`: backend {} has a weak identity ({described}): a swap with another such device \
                     is not detected",
                    info.name,
                    backend.name()
                );
            } else {
                log::info!("volume `{}`: backend {} ({described})", info.name, backend.name());
            }
        }
    }
    if r.loaded {
        log::info!(
            "{who}: loaded the cache on {} ({}): {} dirty ({} verified by checksum{}) and {} clean lines{}, \
             {} clean lines dropped, {} corrupt record copies, {} lines written back",
            device,
            if r.clean_shutdown {
                "shut down cleanly"
            } else {
                "not shut down cleanly: recovered"
            },
            r.dirty_lines,
            r.verified_dirty_lines,
            match (r.verified_with_intents, r.repaired_from_mirror) {
                (0, 0) => String::new(),
                (i, 0) => format!(", {i} with the intents of writes in flight at the crash"),
                (0, m) => format!(", {m} repaired from their mirror"),
                (i, m) => format!(
                    ", {i} with the intents of writes in flight at the crash, {m} repaired from their mirror"
                ),
            },
            r.clean_lines,
            if r.clean_shutdown || r.clean_lines + r.stale_clean_lines + r.unchecked_clean_lines == 0 {
                String::new()
            } else {
                format!(
                    " ({} checked against the backend; dropped: {} older than it, {} unchecked)",
                    r.checked_clean_lines, r.stale_clean_lines, r.unchecked_clean_lines
                )
            },
            r.dropped_clean_lines,
            r.corrupt_copies,
            r.written_back_lines
        );
        if let Some(version) = r.upgraded_from_version {
            log::info!(
                "{who}: the cache on {device} was in format version {version}; upgraded to {}",
                iocache_format::FORMAT_VERSION
            );
        }
        if let Some((was, now)) = &r.geometry_changed {
            log::info!(
                "{who}: the cache on {device} had another geometry ({was}); its {} dirty lines were written back \
                 and it was formatted anew as {now} (clean lines start cold)",
                r.written_back_lines
            );
        }
        for (offset, reason) in r.corrupt_examples.iter().take(4) {
            log::warn!("{who}: corrupt metadata at offset {offset}: {reason}");
        }
        if !r.restored_settings.is_empty() {
            log::info!(
                "{who}: settings changed at run time before, kept: {} (iocache ctl set to change them)",
                r.restored_settings.join(" ")
            );
        }
        for dropped in &r.dropped_settings {
            log::warn!("{who}: a setting changed at run time is not kept: {dropped}");
        }
        if !r.damaged_slots.is_empty() {
            log::warn!(
                "{who}: started over damaged metadata (accepted): {} slots \
                 dropped what they may have described",
                r.damaged_slots.len()
            );
            for slot in r.damaged_slots.iter().take(8) {
                log::warn!("{who}: damaged: {slot}");
            }
        }
    } else {
        log::info!(
            "{who}: formatted a new cache on {} (persistence {})",
            device,
            v.persistence
        );
    }
}

/// How the cache devices are opened, for every volume.
#[derive(Clone, Copy, Debug, Default)]
pub struct StartMode {
    /// Format a new cache over backends that existed before.
    pub init: bool,
    /// With `init`: format even over dirty lines; also run a configuration
    /// that loses the cache at a crash.
    pub force: bool,
    /// Start over damaged metadata with what can be verified.
    pub accept_damage: bool,
    /// Bind volumes to the backends given, whatever the cache recorded.
    pub rebind: bool,
}

/// Where a started server can be reached, for its banner.
pub struct Reach<'a> {
    pub state: &'a Running,
    /// The bound TCP address, if it listens on one.
    pub tcp: Option<std::net::SocketAddr>,
    pub admin_socket: Option<&'a Path>,
}

/// Serves every volume of `config` until `stop` is set, then finishes
/// the requests in flight and writes every dirty line back. `serving` is
/// called once every export is served (to tell how to reach them).
pub fn serve(
    config: &ServeConfig,
    start: StartMode,
    stop: &'static AtomicBool,
    serving: &mut dyn FnMut(Reach<'_>),
) -> Result<()> {
    // Listeners first: a busy port, or a server already answering on one
    // of the socket paths, stops this start before any device is opened
    // (and so before anything on them is read or changed).
    if let Some(socket) = &config.socket {
        create_socket_dir(socket).within(|| config.origin.server_key("socket"))?;
    }
    let socket_group = config
        .socket_group
        .as_deref()
        .map(|g| group_id(g).within(|| config.origin.server_key("socket_group")))
        .transpose()?;
    let tls = if config.tls == iocache_nbd::TlsMode::Off {
        None
    } else {
        if config.tls_certificates.is_none() && config.tls_psk.is_none() {
            return Err(refused!(
                "{}: TLS {} needs credentials: give {} (the server's certificate and key), {} \
                 (pre-shared keys), or both",
                config.origin.server_key("tls"),
                config.tls,
                config.origin.server_key("tls_certificates"),
                config.origin.server_key("tls_psk")
            ));
        }
        if config.tls_verify_peer && config.tls_certificates.is_none() {
            return Err(refused!(
                "{} needs {} (its ca-cert.pem signs the clients' certificates)",
                config.origin.server_key("tls_verify_peer"),
                config.origin.server_key("tls_certificates")
            ));
        }
        let creds = iocache_nbd::TlsCredentials {
            certificates: config.tls_certificates.clone(),
            psk: config.tls_psk.clone(),
            verify_peer: config.tls_verify_peer,
        };
        let key = match iocache_nbd::TlsServer::new(config.tls, &creds) {
            Ok(server) => Ok(server),
            Err(e) if e.concerns_psk() => Err((e, "tls_psk")),
            Err(e) => Err((e, "tls_certificates")),
        };
        Some(key.map_err(|(e, key)| refused!("{}: {e}", config.origin.server_key(key)))?)
    };
    if config.tls == iocache_nbd::TlsMode::Off {
        let given: Vec<String> = [
            ("tls_certificates", config.tls_certificates.is_some()),
            ("tls_psk", config.tls_psk.is_some()),
            ("tls_verify_peer", config.tls_verify_peer),
        ]
        .into_iter()
        .filter(|(_, given)| *given)
        .map(|(key, _)| config.origin.server_key(key))
        .collect();
        if !given.is_empty() {
            log::warn!(
                "{} {} no effect without {} on or require: clients are served in plaintext",
                given.join(" and "),
                if given.len() == 1 { "has" } else { "have" },
                config.origin.server_key("tls")
            );
        }
    }
    let defaults = ServerConfig::default();
    let mut server = Server::new(ServerConfig {
        tls,
        unix_socket: config.socket.clone(),
        unix_socket_mode: if socket_group.is_some() { 0o660 } else { 0o600 },
        unix_socket_group: socket_group,
        tcp: config.listen,
        max_connections_per_peer: config
            .max_connections_per_peer
            .unwrap_or(defaults.max_connections_per_peer),
        max_handshakes_per_peer: config
            .max_handshakes_per_peer
            .unwrap_or(defaults.max_handshakes_per_peer),
        workers_per_connection: config
            .threads_per_connection
            .unwrap_or(defaults.workers_per_connection),
        poll_before_sleep: config
            .poll_before_sleep_us
            .map_or(defaults.poll_before_sleep, Duration::from_micros),
        ..defaults
    });
    // The admin socket before the NBD listeners: whoever sees the NBD
    // socket appear (a script, `lab run`) finds the admin socket too (its
    // answers wait until the server runs).
    let admin_path = config.admin_socket.clone();
    let admin = match &admin_path {
        Some(path) => {
            create_socket_dir(path).within(|| config.origin.server_key("admin_socket"))?;
            Some(
                iocache_nbd::bind_unix_socket(path, 0o600, None)
                    .within(|| config.origin.server_key("admin_socket"))?,
            )
        }
        None => None,
    };
    // Removes the admin socket file however this function returns.
    let _admin_file = RemoveOnDrop(admin.as_ref().map(|a| a.remover()));
    if let Err(e) = server.bind() {
        let key = match e {
            iocache_nbd::ServerError::Listen(_) => "socket",
            _ => "listen",
        };
        return Err(e).within(|| config.origin.server_key(key));
    }
    if let Some(addr) = config.listen.filter(|a| !a.ip().is_loopback()) {
        if config.tls == iocache_nbd::TlsMode::Require
            && (config.tls_verify_peer || config.tls_certificates.is_none())
        {
            log::info!(
                "listening on {addr}, beyond this machine's loopback, with TLS required and clients \
                 authenticated (a client certificate from the CA or a pre-shared key)"
            );
        } else if config.tls == iocache_nbd::TlsMode::Require {
            log::info!(
                "listening on {addr}, beyond this machine's loopback, with TLS required \
                 (clients are not authenticated unless by a pre-shared key: anyone who reaches it \
                 and trusts the certificate may read and write every export; {} \
                 requires client certificates)",
                config.origin.server_key("tls_verify_peer")
            );
        } else {
            log::warn!(
                "listening on {addr}, beyond this machine's loopback, without \
                 {tls} require: any host that reaches it can read and write every export, in the \
                 clear; prefer the Unix socket, a loopback address behind an SSH tunnel, or \
                 {tls} require",
                tls = config.origin.server_key("tls")
            );
        }
    }
    let own = Scope {
        socket: config.socket.as_deref().map(canonical_path),
        tcp: server.bound_tcp_addr(),
        private_dir: config.private_dir.clone(),
        attach_dirs: config
            .attach_dirs
            .iter()
            .map(|d| normalize(&std::path::absolute(d).unwrap_or_else(|_| d.clone())))
            .collect(),
    };
    let _pid_file = config
        .pid_file
        .as_deref()
        .map(|path| crate::service::PidFile::create(path).within(|| config.origin.server_key("pid_file")))
        .transpose()?;
    let metrics = config
        .metrics
        .map(|address| {
            crate::metrics::bind(&address.to_string()).within(|| config.origin.server_key("metrics"))
        })
        .transpose()?;

    let mut files = Vec::new();
    let mut caches = Vec::new();
    let mut volumes = Vec::new();
    for cache in 0..config.caches.len() {
        let members = config.members(cache);
        let group = open_cache_group(config, cache, &members, &mut files, start, &own)?;
        for &i in &members {
            let v = &config.volumes[i];
            let volume = group
                .engine()
                .volume_named(&v.export)
                .ok_or_else(|| refused!("volume `{}` is not in its engine", v.export))?;
            volumes.push(ServedVolume {
                export: v.export.clone(),
                backend: volume.backend().name().to_string(),
                cache: caches.len(),
                volume,
                read_only: v.read_only,
                discard: v.discard,
            });
        }
        caches.push(group);
    }
    // In the order of the configuration (the first is the default export).
    let order: Vec<&str> = config.volumes.iter().map(|v| v.export.as_str()).collect();
    volumes.sort_by_key(|v| order.iter().position(|e| *e == v.export));

    for v in &volumes {
        let group = &caches[v.cache];
        // The first export added is also the default one (the empty name).
        server
            .add_export(
                v.export.clone(),
                Arc::new(
                    EngineExport::in_cell(
                        Arc::clone(&group.cell),
                        &v.volume,
                        Some(describe(group, &v.backend)),
                    )
                    .with_read_only(v.read_only)
                    .with_discard(v.discard),
                ),
            )
            .within(|| {
                config
                    .volumes
                    .iter()
                    .find(|c| c.export == v.export)
                    .map_or_else(String::new, |c| c.key("export"))
            })?;
    }
    let running = server.start()?;
    let state = Arc::new(Running::new(caches, volumes, running.exports(), files, own, stop));
    if state.caches.iter().any(|g| g.config.reca.is_some()) {
        let state = Arc::clone(&state);
        std::thread::Builder::new()
            .name("iocache-relayout".into())
            .spawn(move || crate::relayout::watch(state))
            .within(|| "starting the line size watcher".to_string())?;
    }
    if let Some(admin) = admin {
        let state = Arc::clone(&state);
        std::thread::spawn(move || crate::admin::serve_admin(admin.listener, state));
    }
    if let Some(listener) = metrics {
        if let Ok(address) = listener.local_addr() {
            log::info!("metrics on http://{address}/metrics");
        }
        let state = Arc::clone(&state);
        std::thread::spawn(move || crate::metrics::serve(listener, state));
    }
    serving(Reach {
        state: &state,
        tcp: running.tcp_addr(),
        admin_socket: admin_path.as_deref(),
    });
    crate::service::notify(&format!(
        "READY=1\nSTATUS=serving {}\nMAINPID={}",
        iocache_core::units::count(config.volumes.len() as u64, "volume"),
        std::process::id()
    ));

    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    log::info!("stopping: finishing requests in flight");
    crate::service::notify("STOPPING=1\nSTATUS=writing back dirty lines");
    // No attach, detach or volume flush runs from now on.
    let _admin = state.lock_admin();
    let server_stats = running.shutdown();
    let mut failed = None;
    let volumes = lock(&state.volumes);
    for (index, group) in state.caches.iter().enumerate() {
        let members: Vec<&ServedVolume> = volumes.iter().filter(|v| v.cache == index).collect();
        for v in &members {
            let dirty = group
                .engine()
                .volume_stats(v.volume.id())
                .map_or(0, |s| s.dirty_lines);
            log::info!("volume `{}`: writing back {dirty} dirty lines", v.export);
        }
        if group.broken.load(Ordering::SeqCst) {
            log::error!(
                "cache {}: not shut down (a line size change left it without an engine)",
                group.path.display()
            );
            continue;
        }
        // No request inside the engine (a warm-up's reads included).
        let current = group.cell.quiesce();
        if let Err(e) = current.engine.shutdown() {
            let names = members
                .iter()
                .map(|v| format!("`{}`", v.export))
                .collect::<Vec<_>>()
                .join(", ");
            log::warn!(
                "cache {} (volumes {names}): write-back failed: {e}; the dirty lines stay on \
                 the cache device and are written back when it is served again",
                group.path.display()
            );
            failed.get_or_insert_with(|| {
                format!("volumes {names}: not every dirty line was written back (see above)")
            });
        }
    }
    for v in volumes.iter() {
        let engine = state.caches[v.cache].engine();
        let Ok(stats) = engine.volume_stats(v.volume.id()) else {
            continue;
        };
        let count = iocache_core::units::count;
        log::info!(
            "volume `{}`: {}, {:.2} % line hit ratio, {}, {} in its cache",
            v.export,
            count(stats.requests(), "request"),
            stats.hit_ratio() * 100.0,
            count(stats.errors, "failed request"),
            count(engine.stats().io_errors, "I/O error")
        );
    }
    log::info!(
        "stopped after {}",
        iocache_core::units::count(server_stats.connections, "connection")
    );
    match failed {
        // A failure, not a refusal: the next start may well succeed.
        Some(e) => Err(crate::ServeError::Io(std::io::Error::other(e))),
        None => Ok(()),
    }
}

/// Removes a socket file this process bound when dropped (if it is still
/// the one bound).
struct RemoveOnDrop(Option<iocache_nbd::SocketFileRemover>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(r) = &self.0 {
            r.remove();
        }
    }
}

/// The id of a group given by name or number.
fn group_id(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group).map_err(|_| refused!("group `{group}`: contains NUL"))?;
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrnam_r writes into `entry` and `buf`, which outlive the
    // call, and sets `found` to `&mut entry` or null.
    let rc = unsafe { libc::getgrnam_r(name.as_ptr(), &mut entry, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() {
        return Err(refused!("no group named `{group}` on this system"));
    }
    Ok(entry.gr_gid)
}
