//! `iocache serve`: cache devices in front of backends, served over NBD.
//!
//! With no arguments it creates `./iocache-data/backend.img` (1 GiB, sparse)
//! and `./iocache-data/cache.img` (128 MiB) if absent and serves them on a
//! Unix socket in that directory and on 127.0.0.1:10809. With `--config
//! FILE` it serves every volume the TOML file describes (docs/config.md):
//! volumes naming the same cache device share it (one `Engine` per cache
//! device), and every volume is an export of one NBD server. The flags and
//! the file both become a [`ServeConfig`]. The admin socket answers
//! `iocache stats` and `iocache ctl` (attach, detach and flush a volume at
//! run time; `admin.rs`, through the state of the running server,
//! `running.rs`; files are opened by `devices.rs`). SIGINT or SIGTERM stops accepting connections,
//! finishes requests in flight, writes every volume's dirty lines back and
//! exits 0.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use iocache_core::units::format_byte_size;
use iocache_core::{CacheConfig, WritePolicy};
use iocache_device::BlockDevice;
use iocache_engine::layout::{self, LayoutError};
use iocache_engine::{Acknowledgement, CacheArray, Engine, EngineConfig, EngineError, InitMode, Persistence};
use iocache_nbd::{Server, ServerConfig};
use iocache_serving::{EngineCell, EngineExport};

use crate::config::{
    normalize, parse_listen, Origin, ServeConfig, SizeText, VolumeConfig, VolumeText, DEFAULT_BACKEND_BYTES,
    DEFAULT_CACHE_BYTES,
};
use crate::devices::{
    canonical_path, check_claim, create_parent, open_backend, open_cache_file, record_claim, Claim, Scope,
};
use crate::running::{describe, install_signal_handlers, lock, CacheGroup, Running, ServedVolume, STOP};

const DEFAULT_DIR: &str = "iocache-data";

#[derive(Args)]
pub struct ServeArgs {
    /// Serve the volumes a TOML file describes (docs/config.md) instead of
    /// the one the flags below describe.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "backend", "backend_size", "backend_id", "cache", "cache_array", "mirror_percent", "cache_size", "line_size", "write_policy",
        "promotion", "policy", "lookup", "flush", "write_miss_bypass", "seq_cutoff", "max_dirty_lines", "io_engine", "direct",
        "persistence", "clean_check_budget", "read_only", "socket", "adapt", "adapt_interval", "slow_cache", "reca_table", "reca_window", "reca_line_size",
        "listen", "export",
        "admin_socket", "metrics", "pid_file", "attach_dir", "socket_group", "tls", "tls_certificates",
        "tls_psk", "tls_verify_peer", "max_connections_per_peer", "max_handshakes_per_peer",
        "threads_per_connection", "poll_before_sleep_us", "no_map_cache",
    ])]
    config: Option<PathBuf>,
    /// Backend: a file or block device, or a remote NBD export
    /// (nbd://host:port/name, nbd+unix:///name?socket=PATH)
    /// [default: ./iocache-data/backend.img, created with 1 GiB].
    #[arg(long, value_name = "PATH|URI")]
    backend: Option<String>,
    /// Size of the backend file to create when it does not exist; needed to create a named
    /// --backend (a mistyped path is refused) [default: 1GiB for the default backend].
    /// Sizes take a unit: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024; 1.5GiB allowed).
    #[arg(long, value_name = "SIZE")]
    backend_size: Option<String>,
    /// The backend's identity, as you name it (a UUID, a label), recorded on the cache device
    /// instead of the one the device gives (a file's inode and birth time, a disk's serial): for
    /// a disk without serial or WWN. A cache holding dirty lines is refused in front of a
    /// backend of another identity.
    #[arg(long, value_name = "TEXT")]
    backend_id: Option<String>,
    /// Cache device: a file or block device [default: ./iocache-data/cache.img].
    #[arg(long, value_name = "PATH")]
    cache: Option<PathBuf>,
    /// Cache RAID: more cache devices, forming an array with --cache: clean lines striped over
    /// all of them, dirty lines mirrored on two, so losing one loses no write (comma-separated).
    #[arg(long, value_name = "PATH,...", value_delimiter = ',')]
    cache_array: Vec<PathBuf>,
    /// Share of each array device's line slots kept for mirrors of dirty lines (1-50); dirty
    /// lines are capped at what the mirrors hold.
    #[arg(long, default_value_t = 25, value_name = "PERCENT")]
    mirror_percent: u32,
    /// Cache size [default: the cache device's size, or 128MiB for a new file].
    #[arg(long, value_name = "SIZE")]
    cache_size: Option<String>,
    /// Cache line size.
    #[arg(long, default_value = "4KiB", value_name = "SIZE")]
    line_size: String,
    /// Write policy: wb, wt, wi, wa, wo, pt.
    #[arg(long, default_value = "wb")]
    write_policy: String,
    /// Promotion: always, nhit:N or nhit:N:trigger=PERCENT.
    #[arg(long, default_value = "always")]
    promotion: String,
    /// Replacement policy (`iocache policies` lists them).
    #[arg(long, default_value = "lru")]
    policy: String,
    /// Lookup architecture: fine (sharded, default), coarse (one lock), single (one thread).
    #[arg(long, default_value = "fine")]
    lookup: String,
    /// Background flushing: nop, lazy[:...] or aggressive[:...].
    #[arg(long, default_value = "nop", value_name = "POLICY")]
    flush: String,
    /// Send write misses to the backend when every cache line is dirty.
    #[arg(long)]
    write_miss_bypass: bool,
    /// Sequential cutoff: off, or a stream length after which requests bypass (1MiB[:streams=16]).
    #[arg(long, default_value = "off", value_name = "BYTES|off")]
    seq_cutoff: String,
    /// At most this many dirty lines in the cache (a write that would make one more is written
    /// through) [default: no cap].
    #[arg(long, value_name = "LINES")]
    max_dirty_lines: Option<u64>,
    /// How reads of several cache lines are issued: psync (one after the other), uring (one
    /// io_uring batch) or auto (uring with --direct, psync otherwise).
    #[arg(long, default_value = "auto", value_name = "ENGINE")]
    io_engine: String,
    /// Open the cache device with O_DIRECT.
    #[arg(long)]
    direct: bool,
    /// Metadata kept on the cache device across restarts and crashes: all (every line: a restart
    /// finds a warm cache), dirty (dirty lines only), none (volatile: a FLUSH must write every
    /// dirty line back; refused with write-back unless --force).
    #[arg(long, default_value = crate::config::DEFAULT_PERSISTENCE, value_name = "MODE")]
    persistence: String,
    /// After a crash, with --persistence all: how long the clean lines found on the cache device
    /// may be compared with the backend before the rest are dropped (a clean line is loaded only
    /// if it still equals the backend; 0s drops them all) [default: 60s].
    #[arg(long, value_name = "DURATION")]
    clean_check_budget: Option<String>,
    /// ReCA's category table (TOML; default: the built-in
    /// crates/iocache-core/data/reca-categories.toml). Needs --adapt reca.
    #[arg(long, value_name = "FILE")]
    reca_table: Option<PathBuf>,
    /// Requests per ReCA window [default: 100000, the paper's]. Needs --adapt reca.
    #[arg(long, value_name = "REQUESTS")]
    reca_window: Option<u64>,
    /// When a line size ReCA chooses is put in force: `live` (while serving: dirty lines
    /// written back, the device formatted again, requests held meanwhile, the cached ranges read
    /// again) or `next_start` (recorded on the cache device). Needs --adapt reca.
    #[arg(long, value_name = "WHEN")]
    reca_line_size: Option<String>,
    /// Serve the export read-only (writes, trims and write-zeroes get EPERM); dirty lines an
    /// earlier run left are still written back to the backend.
    #[arg(long)]
    read_only: bool,
    /// An adaptive controller beside the cache (one at a time; default off). reca: every request
    /// is characterized, and each window of --reca-window requests puts the nearest workload
    /// category's write policy and reca replacement policy in force (its line size is shown as
    /// pending, applied at a restart with that --line-size; docs/results/reca.md). lbica: a load
    /// balancer that changes the write policy while the cache device is the bottleneck and sends
    /// the tail of its queue to the backend; sib: sends single requests to the backend when they
    /// would complete there sooner (docs/results/lbica.md), with the simulator's knobs:
    /// lbica[:enter=1:floor=0.1:hold=2:...], sib[:margin=1]. Requests whose sectors are dirty in
    /// the cache are never sent around it.
    #[arg(long, value_name = "off|reca|lbica|sib[:KEY=VALUE...]")]
    adapt: Option<String>,
    /// The load balancer's interval [default: 100ms].
    #[arg(long, value_name = "DURATION", requires = "adapt")]
    adapt_interval: Option<String>,
    /// For experiments only (docs/results/lbica.md): slow the cache device down, adding LATENCY
    /// to every I/O through N servers (an I/O beyond N waits), as a saturating device would.
    #[arg(long, hide = true, value_name = "LATENCY[:servers=N]")]
    slow_cache: Option<String>,
    /// Format the cache devices instead of loading the caches they hold (refused when one holds
    /// dirty lines, unless --force).
    #[arg(long)]
    init: bool,
    /// Allow what loses data on purpose: --init over dirty lines, --persistence none with
    /// write-back.
    #[arg(long)]
    force: bool,
    /// Start on a cache whose metadata is damaged where it may describe dirty data (the start is
    /// refused without it, naming the slots and the lines they probably held): only what can be
    /// verified is loaded, and what the damaged records described is lost.
    #[arg(long, conflicts_with = "init")]
    accept_damaged_metadata: bool,
    /// Bind each volume to the backend given even where the cache recorded another backend for
    /// it (the start is refused without it, naming both): for a backend restored from a copy.
    /// Its dirty lines are kept and written to this backend, its clean lines dropped.
    #[arg(long, conflicts_with = "init")]
    rebind_backend: bool,
    /// Unix socket to listen on [default: ./iocache-data/iocache.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Also listen on TCP (none by default: only the Unix socket, whose mode limits who may
    /// connect; any local user can connect to a TCP port unless --tls require asks for a
    /// certificate or a pre-shared key), e.g. 127.0.0.1:10809.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
    /// Export name (the export is also reachable under the empty name).
    #[arg(long, default_value = "iocache")]
    export: String,
    /// Unix socket answering `iocache stats` [default: ./iocache-data/admin.sock].
    #[arg(long, value_name = "PATH")]
    admin_socket: Option<PathBuf>,
    /// Serve Prometheus/OpenMetrics text on http://ADDR:PORT/metrics (per volume and per cache
    /// device: the counters of `iocache stats` and latency histograms). Off by default; it has
    /// no authentication, so keep it on loopback or a monitoring network.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
    /// Write this process's id to PATH while it runs (refused if a running process is named
    /// there). Under systemd, `Type=notify` also works: READY=1 is sent once every volume is
    /// loaded and the listeners answer.
    #[arg(long, value_name = "PATH")]
    pid_file: Option<PathBuf>,
    /// TLS for NBD clients (NBD_OPT_STARTTLS): off, on (offered to clients that ask) or require
    /// (every client, on TCP and on the Unix socket, must upgrade before any other option).
    #[arg(long, default_value = "off", value_name = "off|on|require")]
    tls: String,
    /// The directory holding the server's certificate chain and key (server-cert.pem and
    /// server-key.pem, as nbdkit and qemu-nbd name them); with --tls on|require, this or
    /// --tls-psk (or both) is needed.
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
    /// TLS-PSK: a file of pre-shared keys, one `identity:hexkey` a line (as GnuTLS's psktool
    /// writes; nbdkit's --tls-psk, qemu's tls-creds-psk). It must be its owner's only (0600).
    /// Usable alone or with --tls-certificates: a client offering a key from it needs no
    /// certificate.
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,
    /// Require a client certificate signed by the CA in --tls-certificates (its ca-cert.pem),
    /// as nbdkit's --tls-verify-peer (clients authenticated by --tls-psk need none).
    #[arg(long)]
    tls_verify_peer: bool,
    /// Let the members of this group (a name or a number) connect to the NBD Unix socket: it is
    /// then given to the group with mode 0660 (0600, its owner's only, without it).
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Connections one peer may hold at once on each listener (of its 64); one more first closes
    /// the peer's own oldest handshake, else it is refused. A peer is a user id on the Unix
    /// socket, an IPv4 address or an IPv6 /64 on TCP [default: 16].
    #[arg(long, value_name = "N")]
    max_connections_per_peer: Option<usize>,
    /// Connections one peer may have in the NBD handshake at once on each listener (of its 16);
    /// one more closes the peer's own oldest handshake [default: 16].
    #[arg(long, value_name = "N")]
    max_handshakes_per_peer: Option<usize>,
    /// Threads serving one connection's requests, taking turns reading them (leader and
    /// followers, as nbdkit's --threads); also the most requests of one connection served at
    /// once [default: 4].
    #[arg(long, value_name = "N")]
    threads_per_connection: Option<usize>,
    /// Microseconds a connection's reader polls its socket for the next request before it
    /// sleeps, while the client's waits are short: lower latency at low queue depth for up to
    /// that much CPU per request; 0 never polls [default: 20].
    #[arg(long, value_name = "MICROSECONDS")]
    poll_before_sleep_us: Option<u64>,
    /// Read and write a cache file on tmpfs or ramfs with pread and pwrite, not through a
    /// mapping of it (the mapping is faster, and allocates the whole file at start).
    #[arg(long)]
    no_map_cache: bool,
    /// A directory under which `iocache ctl attach` may open or create backend files
    /// (repeatable) [default: ./iocache-data when it is the data directory; none otherwise: only
    /// NBD backends can be attached].
    #[arg(long, value_name = "DIR")]
    attach_dir: Vec<PathBuf>,
}

/// Opens a cache device and the backends of the volumes that share it
/// (`members`, indices into `config.volumes`), and builds its engine.
fn open_cache_group(
    config: &ServeConfig,
    members: &[usize],
    files: &mut Vec<Claim>,
    start: StartMode,
    own: &Scope,
) -> Result<CacheGroup> {
    let v = &config.volumes[members[0]];
    if v.persistence == Persistence::None
        && matches!(v.write_policy, WritePolicy::WriteBack | WritePolicy::WriteOnly)
        && !start.force
    {
        bail!(
            "{}: none keeps no metadata on the cache device, so with write policy {} every FLUSH must \
             write all dirty lines back and a crash loses the cache; choose all or dirty, or add --force",
            v.key("persistence"),
            v.write_policy
        );
    }
    let mut backends = Vec::with_capacity(members.len());
    // Backends that existed before this start (they may have been served
    // through this cache before).
    let mut existing_backends = Vec::new();
    for &i in members {
        let m = &config.volumes[i];
        let (backend, created) = open_backend(
            &m.backend,
            m.backend_create_bytes,
            &m.export,
            files,
            &m.key("backend"),
            own,
            None,
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
    let create_bytes = layout::device_bytes_for(line_bytes, v.cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES))
        .map_err(|e| anyhow!("{}: {e}", v.key("cache_size")))?;
    // A missing cache device is refused before anything is created.
    let missing = std::iter::once(&v.cache)
        .chain(&v.cache_array)
        .all(|p| std::fs::symlink_metadata(p).is_err());
    if missing && !start.init && !existing_backends.is_empty() {
        bail!(refuse_empty_cache(v, &existing_backends, "does not exist"));
    }
    check_claim(files, &v.cache, "cache", &v.key("cache"))?;
    let mut cache_file = Some(
        open_cache_file(
            &v.cache,
            create_bytes,
            v.direct,
            own.no_follow(&v.cache),
            config.map_cache,
        )
        .with_context(|| v.key("cache"))?,
    );
    let canonical = record_claim(files, &v.cache, &v.export, "cache");
    // ReCA's line size from the last run, while the configuration still
    // says what it said then (one device only: an array's geometry is its
    // members').
    let configured_line_size = v.line_size;
    let recorded = match (&v.reca, v.cache_array.is_empty(), start.init, &cache_file) {
        (Some(_), true, false, Some(file)) => crate::reca_cli::line_size_to_start_with(file, v)?,
        _ => None,
    };
    let with_reca_line;
    let v = match recorded {
        Some(line_size) => {
            with_reca_line = VolumeConfig {
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
            v.cache.display().to_string(),
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
            .with_context(|| v.key("cache_array"))?;
            record_claim(files, path, &v.export, "cache");
            members.push((path.display().to_string(), Some(Arc::new(dev))));
        }
        Some(Arc::new(
            CacheArray::open_or_create(members, line_bytes, v.mirror_percent)
                .with_context(|| v.key("cache_array"))?,
        ))
    };
    let cache_dev: Arc<dyn BlockDevice> = match (&array, v.slow_cache) {
        (Some(_), Some(_)) => bail!("--slow-cache: not with a cache array"),
        (Some(array), None) => array.clone(),
        (None, None) => Arc::new(cache_file.take().expect("opened above")),
        (None, Some(slow)) => {
            let dev = iocache_device::FaultDevice::new(cache_file.take().expect("opened above"));
            dev.set_journal(false);
            dev.set_latency(Duration::from_nanos(slow.latency_ns));
            dev.set_servers(slow.servers);
            log::warn!(
                "{}: slowed down for an experiment: {} per I/O through {} servers",
                v.cache.display(),
                iocache_core::units::format_duration_ns(slow.latency_ns),
                slow.servers
            );
            Arc::new(dev)
        }
    };
    if array.is_none() && !(start.init && start.force) {
        // Before sizing a cache from the device: a device smaller than the
        // cache it holds was truncated (growing it would serve zeroes).
        iocache_engine::check_not_shrunk(cache_dev.as_ref()).map_err(with_acknowledgement_flag)?;
    }
    let capacity_lines = match &array {
        Some(array) => array.geometry().slots(),
        None => cache_lines(v, cache_dev.len_bytes(), line_bytes)?,
    };
    let cache_bytes = match (&array, v.cache_bytes) {
        (None, Some(bytes)) => bytes,
        _ => capacity_lines * line_bytes,
    };
    if !start.init
        && !existing_backends.is_empty()
        && iocache_engine::is_blank(cache_dev.as_ref())
            .with_context(|| format!("reading the superblocks of {}", cache_dev.name()))?
    {
        bail!(refuse_empty_cache(
            v,
            &existing_backends,
            "holds no cache (blank)"
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
    let engine = Engine::with_volumes(config_of_engine, cache_dev, backends)
        .map_err(with_acknowledgement_flag)
        .with_context(|| match &v.origin {
            Origin::Flags => "building the cache".to_string(),
            Origin::File(path) if members.len() == 1 => format!("{path}: volume `{}`", v.export),
            Origin::File(path) => format!(
                "{path}: cache {} of volumes {}",
                v.cache.display(),
                members
                    .iter()
                    .map(|&i| format!("`{}`", config.volumes[i].export))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?;
    report_start(config, members, &engine, v);
    if let Some(adapt) = &v.adapt {
        log::info!("cache {}: load balancer {}", v.cache.display(), adapt.text);
    }
    if let Some(reca) = &v.reca {
        crate::reca_cli::start_live(&engine, reca, &v.cache, configured_line_size, line_size_live)
            .with_context(|| match &v.origin {
                Origin::Flags => "--reca-table".to_string(),
                Origin::File(path) => format!("{path}: volume `{}`: reca_table", v.export),
            })?;
    }
    Ok(CacheGroup {
        path: v.cache.clone(),
        canonical,
        cell: Arc::new(EngineCell::new(Arc::new(engine))),
        broken: std::sync::atomic::AtomicBool::new(false),
        config: v.clone(),
        cache_bytes,
        capacity_lines,
    })
}

/// The engine's error with the flag that gives the acknowledgement it
/// asks for, where it asks for one (the engine names no flag).
pub(crate) fn with_acknowledgement_flag(e: EngineError) -> anyhow::Error {
    let flag = match e.acknowledgement() {
        Some(Acknowledgement::FormatLosingData) => "--init --force",
        Some(Acknowledgement::AcceptDamage) => "--accept-damaged-metadata",
        Some(Acknowledgement::Rebind) => "--rebind-backend",
        None => return anyhow::Error::new(e),
    };
    anyhow!("{e} ({flag})")
}

/// Lines of `line_bytes` the cache of `v` holds on a device of
/// `device_bytes` (not a cache array): `cache_size`'s whole lines if they
/// and their records fit the device (smaller lines need more records),
/// else an error saying how to grow it; without `cache_size`, as many as
/// fit. The one rule for a start, a recorded ReCA line size
/// (`reca_cli.rs`) and a line size changed while serving
/// (`live_relayout.rs`).
pub(crate) fn cache_lines(v: &VolumeConfig, device_bytes: u64, line_bytes: u64) -> Result<u64> {
    let (lines, bytes) = match v.cache_bytes {
        Some(bytes) => match layout::fit_bytes(line_bytes, bytes, device_bytes) {
            Ok(_) => (bytes / line_bytes, bytes),
            Err(LayoutError::DoesNotFit {
                needed_bytes,
                device_bytes,
                ..
            }) => bail!(
                "{} with lines of {}: {} of lines and their metadata need {}, more than the cache device {} \
                 ({}); to grow the cache, grow the device first (a file: truncate -s {} {}), or give a size \
                 that fits (docs/ops.md, \"Growing or shrinking a cache\")",
                v.key("cache_size"),
                format_byte_size(line_bytes),
                format_byte_size(bytes),
                format_byte_size(needed_bytes),
                v.cache.display(),
                format_byte_size(device_bytes),
                needed_bytes,
                v.cache.display()
            ),
            Err(e) => bail!("{}: {e}", v.key("cache_size")),
        },
        None => {
            let lines = layout::slots_fitting(line_bytes, device_bytes)
                .map_err(|e| anyhow!("{}: {e}", v.key("cache")))?;
            (lines, lines * line_bytes)
        }
    };
    if lines == 0 {
        bail!(
            "{}: the cache ({}) holds no line of {}",
            v.key("cache_size"),
            format_byte_size(bytes),
            format_byte_size(line_bytes)
        );
    }
    Ok(lines)
}

/// The engine's configuration for the cache of `v` (its line size), with
/// `capacity_lines` lines.
pub(crate) fn engine_config(
    v: &VolumeConfig,
    capacity_lines: u64,
    init: InitMode,
    array: Option<Arc<CacheArray>>,
) -> EngineConfig {
    let mut cache = CacheConfig::new(capacity_lines, v.line_size, v.policy.clone());
    cache.write_policy = v.write_policy;
    cache.promotion = v.promotion;
    cache.cleaning = v.cleaning;
    cache.write_miss_bypass = v.write_miss_bypass;
    cache.seq_cutoff = v.seq_cutoff;
    cache.max_dirty_lines = v.max_dirty_lines;
    EngineConfig {
        cache,
        lookup: v.lookup,
        shards: 0,
        io: v.io,
        persistence: v.persistence,
        init,
        volume_name: v.export.clone(),
        array,
        balance: v.adapt.as_ref().map(|a| a.config),
        dirty_checksums: true,
        clean_check_budget: Duration::from_nanos(v.clean_check_budget_ns),
        rebind_backends: false,
    }
}

/// Why a new (missing or blank) cache device is not formatted over
/// backends that existed before this start, and the way out.
fn refuse_empty_cache(v: &VolumeConfig, existing_backends: &[String], found: &str) -> String {
    format!(
        "{}: {} {found}, but the backend {} existed before: if it was served through a cache \
         before, that cache may hold its newest writes (lost if the cache device was deleted, \
         replaced or mistyped). Check the path; start with --init to begin with an empty cache \
         over it",
        v.key("cache"),
        v.cache.display(),
        existing_backends.join(", ")
    )
}

/// Tells what opening a cache device found (for every volume sharing it).
fn report_start(config: &ServeConfig, members: &[usize], engine: &Engine, v: &VolumeConfig) {
    let who = if members.len() == 1 {
        format!("volume `{}`", v.export)
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
        None => v.cache.display().to_string(),
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
                "{who}: started over damaged metadata (--accept-damaged-metadata): {} slots \
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
#[derive(Clone, Copy)]
struct StartMode {
    init: bool,
    force: bool,
    accept_damage: bool,
    rebind: bool,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let start = StartMode {
        init: args.init,
        force: args.force,
        accept_damage: args.accept_damaged_metadata,
        rebind: args.rebind_backend,
    };
    let config = match args.config.clone() {
        Some(path) => ServeConfig::from_file(&path)?,
        None => args.into_config()?,
    };
    serve(config, start)
}

/// Raises the soft limit on open files to the hard one, as servers do: a
/// file device holds several open descriptions of its file (one per
/// thread stripe), and every client connection and backend connection is
/// a descriptor too. Best effort: the limit stays as it was on failure.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Serves every volume of `config` until SIGINT or SIGTERM.
fn serve(config: ServeConfig, start: StartMode) -> Result<()> {
    raise_open_file_limit();
    if let Some(dir) = &config.private_dir {
        ensure_private_dir(dir)?;
    }
    // Listeners first: a busy port, or a server already answering on one
    // of the socket paths, stops this start before any device is opened
    // (and so before anything on them is read or changed).
    if let Some(socket) = &config.socket {
        create_parent(socket)?;
    }
    let socket_group = config
        .socket_group
        .as_deref()
        .map(|g| group_id(g).with_context(|| config.origin.server_key("socket_group")))
        .transpose()?;
    let tls = if config.tls == iocache_nbd::TlsMode::Off {
        None
    } else {
        if config.tls_certificates.is_none() && config.tls_psk.is_none() {
            bail!(
                "{}: TLS {} needs credentials: give {} (the server's certificate and key), {} \
                 (pre-shared keys), or both",
                config.origin.server_key("tls"),
                config.tls,
                config.origin.server_key("tls_certificates"),
                config.origin.server_key("tls_psk")
            );
        }
        if config.tls_verify_peer && config.tls_certificates.is_none() {
            bail!(
                "{} needs {} (its ca-cert.pem signs the clients' certificates)",
                config.origin.server_key("tls_verify_peer"),
                config.origin.server_key("tls_certificates")
            );
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
        Some(key.map_err(|(e, key)| anyhow!(e).context(config.origin.server_key(key)))?)
    };
    if config.tls == iocache_nbd::TlsMode::Off && (config.tls_psk.is_some() || config.tls_verify_peer) {
        log::warn!(
            "{} and {} have no effect without {} on or require",
            config.origin.server_key("tls_psk"),
            config.origin.server_key("tls_verify_peer"),
            config.origin.server_key("tls")
        );
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
            create_parent(path)?;
            Some(
                iocache_nbd::bind_unix_socket(path, 0o600, None)
                    .with_context(|| config.origin.server_key("admin_socket"))?,
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
        return Err(anyhow!(e).context(config.origin.server_key(key)));
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
                 and trusts the certificate may read and write every export; --tls-verify-peer \
                 requires client certificates)"
            );
        } else {
            log::warn!(
                "listening on {addr}, beyond this machine's loopback, without \
                 --tls require: any host that reaches it can read and write every export, in the \
                 clear; prefer the Unix socket, a loopback address behind an SSH tunnel, or \
                 --tls require"
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
        .map(crate::service::PidFile::create)
        .transpose()?;
    let metrics = config
        .metrics
        .map(|address| crate::metrics::bind(&address.to_string()))
        .transpose()?;

    let mut files = Vec::new();
    let mut caches = Vec::new();
    let mut volumes = Vec::new();
    for members in config.cache_groups() {
        let group = open_cache_group(&config, &members, &mut files, start, &own)?;
        for &i in &members {
            let v = &config.volumes[i];
            let volume = group
                .engine()
                .volume_named(&v.export)
                .ok_or_else(|| anyhow!("volume `{}` is not in its engine", v.export))?;
            volumes.push(ServedVolume {
                export: v.export.clone(),
                backend: volume.backend().name().to_string(),
                cache: caches.len(),
                volume,
                read_only: v.read_only,
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
                    .with_read_only(v.read_only),
                ),
            )
            .with_context(|| {
                config
                    .volumes
                    .iter()
                    .find(|c| c.export == v.export)
                    .map_or_else(String::new, |c| c.key("export"))
            })?;
    }
    install_signal_handlers();
    let running = server.start()?;
    let state = Arc::new(Running::new(caches, volumes, running.exports(), files, own));
    if state.caches.iter().any(|g| g.config.reca.is_some()) {
        let state = Arc::clone(&state);
        std::thread::Builder::new()
            .name("iocache-relayout".into())
            .spawn(move || crate::live_relayout::watch(state))
            .context("starting the line size watcher")?;
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
    print_banner(&config, &state, running.tcp_addr(), admin_path.as_deref());
    crate::service::notify(&format!(
        "READY=1\nSTATUS=serving {}\nMAINPID={}",
        iocache_report::count(config.volumes.len() as u64, "volume"),
        std::process::id()
    ));

    while !STOP.load(Ordering::SeqCst) {
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
        log::info!(
            "volume `{}`: {} requests, {:.2} % line hit ratio, {} failed requests, {} I/O errors in its cache",
            v.export,
            stats.requests(),
            stats.hit_ratio() * 100.0,
            stats.errors,
            engine.stats().io_errors
        );
    }
    log::info!(
        "stopped after {}",
        iocache_report::count(server_stats.connections, "connection")
    );
    match failed {
        Some(e) => bail!(e),
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

/// Tells how to reach every export.
fn print_banner(
    config: &ServeConfig,
    state: &Running,
    tcp: Option<std::net::SocketAddr>,
    admin: Option<&Path>,
) {
    let socket = config
        .socket
        .as_ref()
        .map(|s| std::fs::canonicalize(s).unwrap_or_else(|_| s.clone()));
    let mut out = String::new();
    let volumes = lock(&state.volumes);
    for (i, v) in volumes.iter().enumerate() {
        let group = &state.caches[v.cache];
        let name = &v.export;
        let shared = volumes.iter().filter(|o| o.cache == v.cache).count();
        out += &format!(
            "iocache: serving export `{name}` ({}{}{} volume over {}, {} cache{}, {} lines of {}, {}, lookup {}) on\n",
            if i == 0 { "the default export; " } else { "" },
            if v.read_only {
                "read-only "
            } else {
                ""
            },
            format_byte_size(v.volume.size_bytes()),
            v.backend,
            format_byte_size(group.cache_bytes),
            if shared > 1 {
                format!(" {} shared by {shared} volumes", group.path.display())
            } else {
                String::new()
            },
            group.capacity_lines,
            format_byte_size(group.config.line_size.bytes()),
            group.engine().write_policy(),
            group.config.lookup
        );
        if let Some(socket) = &socket {
            out += &format!("  nbd+unix:///{name}?socket={}\n", socket.display());
        }
        if let Some(tcp) = tcp {
            out += &format!("  nbd://{tcp}/{name}\n");
        }
    }
    let first = &volumes[0].export;
    out += "Connect with, for example:\n";
    if let Some(socket) = &socket {
        out += &format!(
            "  nbdinfo 'nbd+unix:///{first}?socket={}'\n  nbdfuse DIR/disk --unix {}\n",
            socket.display(),
            socket.display()
        );
    }
    if let Some(tcp) = tcp {
        out += &format!("  qemu-io -f raw -c 'read -v 0 512' 'nbd://{tcp}/{first}'\n");
    }
    if let Some(admin) = admin {
        out += &format!(
            "Statistics: iocache stats --admin-socket {0}\nVolumes: iocache ctl --admin-socket {0} attach|detach|flush|stats ...\n",
            admin.display()
        );
    }
    out += "Stop with Ctrl-C (dirty lines are written back first).";
    println!("{out}");
}

/// Makes sure the default data directory is this user's alone: created
/// 0700 if missing; refused if it is a symbolic link, another user's, or
/// writable by others (where someone else could plant links to files this
/// server would format); tightened to 0700 otherwise.
fn ensure_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating the data directory {}", dir.display())),
        Err(e) => Err(e).with_context(|| format!("examining the data directory {}", dir.display())),
        Ok(meta) => {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            let problem = if meta.file_type().is_symlink() {
                Some("is a symbolic link".to_string())
            } else if !meta.is_dir() {
                Some("is not a directory".to_string())
            } else if meta.uid() != me {
                Some(format!("belongs to user {}, not to this user ({me})", meta.uid()))
            } else if meta.mode() & 0o022 != 0 {
                Some(format!("is writable by others (mode {:o})", meta.mode() & 0o7777))
            } else {
                None
            };
            if let Some(problem) = problem {
                bail!(
                    "the data directory {} {problem}: files in it could be replaced by links to \
                     files this server would format. Remove it, or name every file and socket with \
                     --backend, --cache, --socket and --admin-socket",
                    dir.display()
                );
            }
            if meta.mode() & 0o077 != 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .with_context(|| format!("making {} private (0700)", dir.display()))?;
            }
            Ok(())
        }
    }
}

/// The id of a group given by name or number.
fn group_id(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group).map_err(|_| anyhow!("group `{group}`: contains NUL"))?;
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrnam_r writes into `entry` and `buf`, which outlive the
    // call, and sets `found` to `&mut entry` or null.
    let rc = unsafe { libc::getgrnam_r(name.as_ptr(), &mut entry, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() {
        bail!("no group named `{group}` on this system");
    }
    Ok(entry.gr_gid)
}

impl ServeArgs {
    /// The flags as a one-volume configuration (defaults in ./iocache-data).
    fn into_config(self) -> Result<ServeConfig> {
        let dir = Path::new(DEFAULT_DIR);
        let backend_defaulted = self.backend.is_none();
        let cache_defaulted = self.cache.is_none();
        let backend = self
            .backend
            .unwrap_or_else(|| dir.join("backend.img").display().to_string());
        // As a flag, --backend-size only matters when a file is created, and
        // is ignored for a remote backend (the file rejects it).
        let backend_size = self
            .backend_size
            .filter(|_| !backend.starts_with("nbd://") && !backend.starts_with("nbd+unix://"));
        let text = VolumeText {
            export: self.export,
            backend,
            backend_size: backend_size.map(SizeText),
            backend_id: self.backend_id,
            cache: self.cache.clone().unwrap_or_else(|| dir.join("cache.img")),
            cache_array: self.cache_array,
            mirror_percent: self.mirror_percent,
            cache_size: self.cache_size.map(SizeText),
            line_size: SizeText(self.line_size),
            write_policy: self.write_policy,
            promotion: self.promotion,
            policy: self.policy,
            lookup: self.lookup,
            flush: self.flush,
            write_miss_bypass: self.write_miss_bypass,
            max_dirty_lines: self.max_dirty_lines,
            seq_cutoff: self.seq_cutoff,
            io_engine: self.io_engine,
            direct: self.direct,
            persistence: self.persistence,
            clean_check_budget: self.clean_check_budget,
            read_only: self.read_only,
            adapt: self.adapt,
            adapt_interval: self.adapt_interval,
            reca_table: self.reca_table,
            reca_window: self.reca_window,
            reca_line_size: self.reca_line_size,
        };
        let mut volume = text.validate(&Origin::Flags)?;
        volume.slow_cache = self
            .slow_cache
            .as_deref()
            .map(crate::config::SlowCache::parse)
            .transpose()
            .context("--slow-cache")?;
        // Only the embedded default creates its backend unasked: a named
        // backend that does not exist is a mistyped path until
        // --backend-size says otherwise.
        if backend_defaulted && volume.backend_create_bytes.is_none() {
            volume.backend_create_bytes = Some(DEFAULT_BACKEND_BYTES);
        }
        let defaulted =
            backend_defaulted || cache_defaulted || self.socket.is_none() || self.admin_socket.is_none();
        let private_dir = defaulted.then(|| dir.to_path_buf());
        let attach_dirs = if self.attach_dir.is_empty() {
            private_dir.iter().cloned().collect()
        } else {
            self.attach_dir
        };
        ServeConfig {
            origin: Origin::Flags,
            socket: Some(self.socket.unwrap_or_else(|| dir.join("iocache.sock"))),
            listen: self
                .listen
                .as_deref()
                .map(|l| parse_listen(l, "--listen"))
                .transpose()?,
            admin_socket: Some(self.admin_socket.unwrap_or_else(|| dir.join("admin.sock"))),
            metrics: self
                .metrics
                .as_deref()
                .map(|m| parse_listen(m, "--metrics"))
                .transpose()?,
            pid_file: self.pid_file,
            socket_group: self.socket_group,
            max_connections_per_peer: self.max_connections_per_peer,
            max_handshakes_per_peer: self.max_handshakes_per_peer,
            threads_per_connection: self.threads_per_connection,
            poll_before_sleep_us: self.poll_before_sleep_us,
            map_cache: !self.no_map_cache,
            tls: self.tls.parse().map_err(|e| anyhow!("--tls: {e}"))?,
            tls_certificates: self.tls_certificates,
            tls_psk: self.tls_psk,
            tls_verify_peer: self.tls_verify_peer,
            attach_dirs,
            private_dir,
            volumes: vec![volume],
        }
        .check()
    }
}

#[cfg(test)]
mod tests {
    use super::raise_open_file_limit;

    fn open_file_limit() -> libc::rlimit {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a pointer to a local rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        limit
    }

    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        let mut lowered = open_file_limit();
        // One below the hard limit: lower, so the test can see a raise, yet
        // high enough for whatever else this test binary runs meanwhile.
        lowered.rlim_cur = lowered.rlim_max - 1;
        // SAFETY: setrlimit with a pointer to a local rlimit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        assert_eq!(open_file_limit().rlim_cur, lowered.rlim_max - 1);
        raise_open_file_limit();
        let raised = open_file_limit();
        assert_eq!(raised.rlim_cur, raised.rlim_max);
    }
}
