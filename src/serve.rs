//! `iocache serve`: cache devices in front of backends, served over NBD.
//!
//! With no arguments it creates `./iocache-data/backend.img` (1 GiB, sparse)
//! and `./iocache-data/cache.img` (128 MiB) if absent and serves them on a
//! Unix socket in that directory and on 127.0.0.1:10809. With `--config
//! FILE` it serves every volume the TOML file describes (docs/config.md),
//! each with its own cache device and `Engine`, all on one NBD server. The
//! flags and the file both become a [`ServeConfig`]. SIGINT or SIGTERM stops
//! accepting connections, finishes requests in flight, writes every volume's
//! dirty lines back and exits 0.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use iocache_core::units::format_byte_size;
use iocache_core::{CacheConfig, WritePolicy};
use iocache_device::{BlockDevice, FileDevice, OpenOptions};
use iocache_engine::{Engine, EngineConfig, EngineExport, InitMode, NbdBackend, Persistence};
use iocache_format::Layout;
use iocache_nbd::{Server, ServerConfig};

use crate::config::{
    parse_listen, Origin, ServeConfig, SizeText, VolumeConfig, VolumeText, DEFAULT_BACKEND_BYTES,
    DEFAULT_CACHE_BYTES,
};

const DEFAULT_DIR: &str = "iocache-data";

#[derive(Args)]
pub struct ServeArgs {
    /// Serve the volumes a TOML file describes (docs/config.md) instead of
    /// the one the flags below describe.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "backend", "backend_size", "cache", "cache_size", "line_size", "write_policy",
        "promotion", "policy", "lookup", "flush", "write_miss_bypass", "seq_cutoff", "io_engine", "direct",
        "persistence", "socket",
        "listen", "export",
        "admin_socket",
    ])]
    config: Option<PathBuf>,
    /// Backend: a file or block device, or a remote NBD export
    /// (nbd://host:port/name, nbd+unix:///name?socket=PATH)
    /// [default: ./iocache-data/backend.img, created with 1 GiB].
    #[arg(long, value_name = "PATH|URI")]
    backend: Option<String>,
    /// Size of a backend file to create when it does not exist [default: 1GiB].
    #[arg(long, value_name = "SIZE")]
    backend_size: Option<String>,
    /// Cache device: a file or block device [default: ./iocache-data/cache.img].
    #[arg(long, value_name = "PATH")]
    cache: Option<PathBuf>,
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
    #[arg(long, default_value = "dirty", value_name = "MODE")]
    persistence: String,
    /// Format the cache devices instead of loading the caches they hold (refused when one holds
    /// dirty lines, unless --force).
    #[arg(long)]
    init: bool,
    /// Allow what loses data on purpose: --init over dirty lines, --persistence none with
    /// write-back.
    #[arg(long)]
    force: bool,
    /// Unix socket to listen on [default: ./iocache-data/iocache.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// TCP address to listen on.
    #[arg(long, default_value = "127.0.0.1:10809", value_name = "ADDR:PORT")]
    listen: String,
    /// Export name (the export is also reachable under the empty name).
    #[arg(long, default_value = "iocache")]
    export: String,
    /// Unix socket answering `iocache stats` [default: ./iocache-data/admin.sock].
    #[arg(long, value_name = "PATH")]
    admin_socket: Option<PathBuf>,
}

/// A volume being served, as the admin socket reports it.
struct ServedVolume {
    export: String,
    backend: String,
    policy: String,
    engine: Arc<Engine>,
}

/// The statistics `iocache stats` shows, as JSON (one entry per volume).
fn stats_json(volumes: &[ServedVolume]) -> serde_json::Value {
    let latency = |p: &iocache_engine::LatencyPercentiles| {
        serde_json::json!({
            "count": p.count,
            "p50_us": p.p50_ns as f64 / 1e3,
            "p99_us": p.p99_ns as f64 / 1e3,
            "p99_9_us": p.p999_ns as f64 / 1e3,
            "p99_99_us": p.p9999_ns as f64 / 1e3,
            "max_us": p.max_ns as f64 / 1e3,
        })
    };
    let entries: Vec<serde_json::Value> = volumes
        .iter()
        .map(|v| {
            let engine = &v.engine;
            let s = engine.stats();
            let c = &s.cache;
            let entry = serde_json::json!({
                "export": v.export,
                "backend": v.backend,
                "size_bytes": engine.size_bytes(),
                "write_policy": engine.write_policy().to_string(),
                "policy": v.policy,
                "lookup": engine.lookup().to_string(),
                "shards": s.shards,
                "capacity_lines": s.capacity_lines,
                "resident_lines": s.resident_lines,
                "dirty_lines": s.dirty_lines,
                "clean_lines": s.resident_lines - s.dirty_lines,
                "occupancy": if s.capacity_lines == 0 { 0.0 } else { s.resident_lines as f64 / s.capacity_lines as f64 },
                "requests": c.requests,
                "read_requests": c.read_requests,
                "write_requests": c.write_requests,
                "line_accesses": c.accesses,
                "read_hits": c.read_hits,
                "write_hits": c.write_hits,
                "partial_hits": c.partial_hits,
                "full_misses": c.misses,
                "hit_ratio": c.hit_ratio(),
                "promotions": c.promotions,
                "evictions": c.evictions,
                "write_backs": c.dirty_writebacks + c.flushed_lines,
                "bypassed_accesses": c.bypassed_accesses,
                "seq_cutoff_requests": c.seq_cutoff_requests,
                "write_miss_bypasses": c.write_miss_bypasses,
                "io_errors": s.io_errors,
                "forgotten_lines": s.forgotten_lines,
                "latency": { "read": latency(&s.read_latency), "write": latency(&s.write_latency) },
            });
            let extra = serde_json::json!({
                "dirty_victims_kept": c.dirty_victims_kept,
                "cache_device_errors": s.cache_device_errors,
                "backend_errors": s.backend_errors,
                "failed_writebacks": s.failed_writebacks,
                "cache_device_failed": s.cache_device_failed,
                "persistence": s.persistence.map(|p| p.to_string()),
                "barriers": s.barriers,
                "records_written": s.records_written,
                "recovery": {
                    "loaded": s.recovery.loaded,
                    "clean_shutdown": s.recovery.clean_shutdown,
                    "dirty_lines": s.recovery.dirty_lines,
                    "clean_lines": s.recovery.clean_lines,
                    "dropped_clean_lines": s.recovery.dropped_clean_lines,
                    "corrupt_copies": s.recovery.corrupt_copies,
                    "duplicate_lines": s.recovery.duplicate_lines,
                    "written_back_lines": s.recovery.written_back_lines,
                },
            });
            let mut entry = entry;
            if let (Some(entry), serde_json::Value::Object(extra)) = (entry.as_object_mut(), extra) {
                entry.extend(extra);
            }
            entry
        })
        .collect();
    serde_json::json!({ "volumes": entries })
}

/// Answers every connection on the admin socket with the statistics as JSON.
fn serve_admin(listener: UnixListener, volumes: Arc<Vec<ServedVolume>>) {
    for stream in listener.incoming() {
        if STOP.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut line = String::new();
        let _ = BufReader::new(&stream).read_line(&mut line);
        let reply = match line.trim() {
            "stats" | "" => stats_json(&volumes).to_string(),
            other => serde_json::json!({ "error": format!("unknown command `{other}`; expected `stats`") })
                .to_string(),
        };
        let _ = writeln!(stream, "{reply}");
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Creates the directory `path` will be in, if missing.
fn create_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// Opens (creating a sparse file of `create_bytes` if missing, and its
/// directory) a file device.
fn open_file(path: &Path, create_bytes: u64, direct: bool) -> Result<FileDevice> {
    let exists = path.exists();
    if !exists {
        create_parent(path)?;
    }
    let device = FileDevice::open(
        path,
        OpenOptions {
            direct,
            create_size: (!exists).then_some(create_bytes),
            read_only: false,
        },
    )
    .with_context(|| format!("opening {}", path.display()))?;
    if !exists {
        eprintln!(
            "iocache: created {} ({})",
            path.display(),
            format_byte_size(create_bytes)
        );
    }
    Ok(device)
}

#[derive(Args)]
pub struct StatsArgs {
    /// The admin socket of a running `iocache serve`.
    #[arg(long, value_name = "PATH", default_value = "iocache-data/admin.sock")]
    admin_socket: PathBuf,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
}

/// `iocache stats`: asks a running server for its statistics.
pub fn stats(args: StatsArgs) -> Result<()> {
    let mut stream = UnixStream::connect(&args.admin_socket)
        .with_context(|| format!("connecting to the admin socket {}", args.admin_socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    writeln!(stream, "stats")?;
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply)?;
    let json: serde_json::Value = serde_json::from_str(reply.trim())
        .with_context(|| format!("the server's reply is not JSON: {reply}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    for v in json["volumes"].as_array().into_iter().flatten() {
        println!(
            "volume {} ({} bytes) over {}",
            v["export"], v["size_bytes"], v["backend"]
        );
        println!(
            "  cache      {} policy, {} write policy, lookup {} ({} shards)",
            v["policy"], v["write_policy"], v["lookup"], v["shards"]
        );
        println!(
            "  occupancy  {} / {} lines ({:.1} %), {} clean, {} dirty",
            v["resident_lines"],
            v["capacity_lines"],
            v["occupancy"].as_f64().unwrap_or(0.0) * 100.0,
            v["clean_lines"],
            v["dirty_lines"]
        );
        println!(
            "  requests   {} ({} reads, {} writes); line hit ratio {:.2} %",
            v["requests"],
            v["read_requests"],
            v["write_requests"],
            v["hit_ratio"].as_f64().unwrap_or(0.0) * 100.0
        );
        println!(
            "  lines      {} read hits, {} write hits, {} partial hits, {} full misses",
            v["read_hits"], v["write_hits"], v["partial_hits"], v["full_misses"]
        );
        println!(
            "  decisions  {} promotions, {} evictions, {} write-backs, {} bypassed, {} I/O errors",
            v["promotions"], v["evictions"], v["write_backs"], v["bypassed_accesses"], v["io_errors"]
        );
        let r = &v["recovery"];
        println!(
            "  metadata   persistence {}, {} barriers, {} records written; at start: {} dirty and {} clean lines loaded, {} dropped, {} corrupt copies",
            v["persistence"].as_str().unwrap_or("?"),
            v["barriers"],
            v["records_written"],
            r["dirty_lines"],
            r["clean_lines"],
            r["dropped_clean_lines"],
            r["corrupt_copies"]
        );
        println!(
            "  health     cache device {} ({} errors), {} backend errors, {} failed write-backs",
            if v["cache_device_failed"].as_bool().unwrap_or(false) {
                "FAILED: pass-through"
            } else {
                "ok"
            },
            v["cache_device_errors"],
            v["backend_errors"],
            v["failed_writebacks"]
        );
        for kind in ["read", "write"] {
            let l = &v["latency"][kind];
            println!(
                "  {kind:<5} µs  p50 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  ({} requests)",
                l["p50_us"].as_f64().unwrap_or(0.0),
                l["p99_us"].as_f64().unwrap_or(0.0),
                l["p99_9_us"].as_f64().unwrap_or(0.0),
                l["p99_99_us"].as_f64().unwrap_or(0.0),
                l["count"]
            );
        }
    }
    Ok(())
}

impl ServeArgs {
    /// The flags as a one-volume configuration (defaults in ./iocache-data).
    fn into_config(self) -> Result<ServeConfig> {
        let dir = Path::new(DEFAULT_DIR);
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
            cache: self.cache.unwrap_or_else(|| dir.join("cache.img")),
            cache_size: self.cache_size.map(SizeText),
            line_size: SizeText(self.line_size),
            write_policy: self.write_policy,
            promotion: self.promotion,
            policy: self.policy,
            lookup: self.lookup,
            flush: self.flush,
            write_miss_bypass: self.write_miss_bypass,
            seq_cutoff: self.seq_cutoff,
            io_engine: self.io_engine,
            direct: self.direct,
            persistence: self.persistence,
        };
        let mut volume = text.validate(&Origin::Flags)?;
        if volume.backend_create_bytes.is_none() && !volume.backend_is_nbd() {
            volume.backend_create_bytes = Some(DEFAULT_BACKEND_BYTES);
        }
        ServeConfig {
            origin: Origin::Flags,
            socket: Some(self.socket.unwrap_or_else(|| dir.join("iocache.sock"))),
            listen: Some(parse_listen(&self.listen, "--listen")?),
            admin_socket: Some(self.admin_socket.unwrap_or_else(|| dir.join("admin.sock"))),
            volumes: vec![volume],
        }
        .check()
    }
}

/// A volume opened and ready to serve.
struct OpenVolume {
    config: VolumeConfig,
    engine: Arc<Engine>,
    backend_name: String,
    backend_bytes: u64,
    cache_bytes: u64,
    capacity_lines: u64,
}

/// Opens a volume's backend and cache device and builds its engine. `opened`
/// holds the canonical paths of the files earlier volumes opened (with whose
/// and what they are), so that no file serves twice under another name.
fn open_volume(
    v: &VolumeConfig,
    opened: &mut Vec<(PathBuf, String, &'static str)>,
    start: StartMode,
) -> Result<OpenVolume> {
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
    let mut claim = |path: &Path, role: &'static str| -> Result<()> {
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Some((_, export, other_role)) = opened.iter().find(|(p, _, _)| *p == canonical) {
            bail!(
                "{}: {} is the same file as volume `{export}`'s {other_role}",
                v.key(role),
                path.display()
            );
        }
        opened.push((canonical, v.export.clone(), role));
        Ok(())
    };
    let backend: Arc<dyn BlockDevice> = if v.backend_is_nbd() {
        Arc::new(
            NbdBackend::connect(&v.backend).with_context(|| format!("{} {}", v.key("backend"), v.backend))?,
        )
    } else {
        let path = Path::new(&v.backend);
        if !path.exists() && v.backend_create_bytes.is_none() {
            bail!(
                "{}: {} does not exist (set backend_size to create it)",
                v.key("backend"),
                path.display()
            );
        }
        let device =
            open_file(path, v.backend_create_bytes.unwrap_or(0), false).with_context(|| v.key("backend"))?;
        claim(path, "backend")?;
        Arc::new(device)
    };
    // The cache device holds a superblock and metadata records before the
    // lines (docs/format.md): a new file gets room for both.
    let line_bytes = v.line_size.bytes();
    let layout_for = |data_bytes: u64| {
        Layout::for_slots(line_bytes, (data_bytes / line_bytes).max(1))
            .map_err(|e| anyhow::anyhow!("{}: {e}", v.key("cache_size")))
    };
    let create_bytes = layout_for(v.cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES))?.device_bytes();
    let cache_dev = open_file(&v.cache, create_bytes, v.direct).with_context(|| v.key("cache"))?;
    claim(&v.cache, "cache")?;
    let cache_bytes = match v.cache_bytes {
        Some(bytes) => {
            let needed = layout_for(bytes)?.device_bytes();
            if needed > cache_dev.len_bytes() {
                bail!(
                    "{}: {} of lines and their metadata need {}, more than the cache device {} ({})",
                    v.key("cache_size"),
                    format_byte_size(bytes),
                    format_byte_size(needed),
                    v.cache.display(),
                    format_byte_size(cache_dev.len_bytes())
                );
            }
            bytes
        }
        None => {
            Layout::fitting(line_bytes, cache_dev.len_bytes())
                .map_err(|e| anyhow::anyhow!("{}: {e}", v.key("cache")))?
                .slots
                * line_bytes
        }
    };
    let capacity_lines = cache_bytes / v.line_size.bytes();
    if capacity_lines == 0 {
        bail!(
            "{}: the cache ({}) holds no line of {}",
            v.key("cache_size"),
            format_byte_size(cache_bytes),
            format_byte_size(v.line_size.bytes())
        );
    }
    let mut cache = CacheConfig::new(capacity_lines, v.line_size, v.policy.clone());
    cache.write_policy = v.write_policy;
    cache.promotion = v.promotion;
    cache.cleaning = v.cleaning;
    cache.write_miss_bypass = v.write_miss_bypass;
    cache.seq_cutoff = v.seq_cutoff;
    let engine = Engine::new(
        EngineConfig {
            cache,
            lookup: v.lookup,
            shards: 0,
            io: v.io,
            persistence: v.persistence,
            init: if start.init {
                InitMode::Format {
                    discard_dirty: start.force,
                }
            } else {
                InitMode::Load
            },
            volume_name: v.export.clone(),
        },
        Arc::new(cache_dev),
        Arc::clone(&backend),
    )
    .with_context(|| match &v.origin {
        Origin::Flags => "building the cache".to_string(),
        Origin::File(path) => format!("{path}: volume `{}`", v.export),
    })?;
    let r = engine.stats().recovery;
    if r.loaded {
        eprintln!(
            "iocache: volume `{}`: loaded the cache on {} ({}): {} dirty and {} clean lines, {} clean lines dropped, \
             {} corrupt record copies, {} lines written back",
            v.export,
            v.cache.display(),
            if r.clean_shutdown { "shut down cleanly" } else { "not shut down cleanly: recovered" },
            r.dirty_lines,
            r.clean_lines,
            r.dropped_clean_lines,
            r.corrupt_copies,
            r.written_back_lines
        );
        for (offset, reason) in r.corrupt_examples.iter().take(4) {
            eprintln!(
                "iocache: volume `{}`: corrupt metadata at offset {offset}: {reason}",
                v.export
            );
        }
    } else {
        eprintln!(
            "iocache: volume `{}`: formatted a new cache on {} (persistence {})",
            v.export,
            v.cache.display(),
            v.persistence
        );
    }
    Ok(OpenVolume {
        config: v.clone(),
        engine: Arc::new(engine),
        backend_name: backend.name().to_string(),
        backend_bytes: backend.len_bytes(),
        cache_bytes,
        capacity_lines,
    })
}

/// How the cache devices are opened, for every volume.
#[derive(Clone, Copy)]
struct StartMode {
    init: bool,
    force: bool,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let start = StartMode {
        init: args.init,
        force: args.force,
    };
    let config = match args.config.clone() {
        Some(path) => ServeConfig::from_file(&path)?,
        None => args.into_config()?,
    };
    serve(config, start)
}

/// Serves every volume of `config` until SIGINT or SIGTERM.
fn serve(config: ServeConfig, start: StartMode) -> Result<()> {
    let mut opened = Vec::new();
    let volumes = config
        .volumes
        .iter()
        .map(|v| open_volume(v, &mut opened, start))
        .collect::<Result<Vec<_>>>()?;

    if let Some(socket) = &config.socket {
        create_parent(socket)?;
    }
    let mut server = Server::new(ServerConfig {
        unix_socket: config.socket.clone(),
        tcp: config.listen,
        ..ServerConfig::default()
    });
    for v in &volumes {
        let description = format!(
            "iocache: {} cache of {} lines of {} over {}",
            v.engine.write_policy(),
            v.capacity_lines,
            format_byte_size(v.config.line_size.bytes()),
            v.backend_name
        );
        // The first export added is also the default one (the empty name).
        server
            .add_export(
                v.config.export.clone(),
                Arc::new(EngineExport::new(Arc::clone(&v.engine), Some(description))),
            )
            .with_context(|| v.config.key("export"))?;
    }
    let admin_path = config.admin_socket.clone();
    if let Some(path) = &admin_path {
        create_parent(path)?;
        let _ = std::fs::remove_file(path);
        let admin = UnixListener::bind(path)
            .with_context(|| format!("{} {}", config.origin.server_key("admin_socket"), path.display()))?;
        let served: Vec<ServedVolume> = volumes
            .iter()
            .map(|v| ServedVolume {
                export: v.config.export.clone(),
                backend: v.backend_name.clone(),
                policy: v.config.policy.to_string(),
                engine: Arc::clone(&v.engine),
            })
            .collect();
        let served = Arc::new(served);
        std::thread::spawn(move || serve_admin(admin, served));
    }
    install_signal_handlers();
    let running = server.start()?;
    print_banner(&config, &volumes, running.tcp_addr(), admin_path.as_deref());

    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("iocache: stopping: finishing requests in flight");
    let server_stats = running.shutdown();
    let mut failed = None;
    for v in &volumes {
        let dirty = v.engine.stats().dirty_lines;
        eprintln!(
            "iocache: volume `{}`: writing back {dirty} dirty lines",
            v.config.export
        );
        if let Err(e) = v.engine.shutdown() {
            eprintln!("iocache: volume `{}`: write-back failed: {e}", v.config.export);
            failed.get_or_insert_with(|| {
                format!("volume `{}`: writing back dirty lines: {e}", v.config.export)
            });
        }
    }
    if let Some(path) = &admin_path {
        let _ = std::fs::remove_file(path);
    }
    for v in &volumes {
        let stats = v.engine.stats();
        eprintln!(
            "iocache: volume `{}`: {} requests, {:.2} % line hit ratio, {} I/O errors",
            v.config.export,
            stats.cache.requests,
            stats.cache.hit_ratio() * 100.0,
            stats.io_errors
        );
    }
    eprintln!("iocache: stopped after {} connections", server_stats.connections);
    match failed {
        Some(e) => bail!(e),
        None => Ok(()),
    }
}

/// Tells how to reach every export.
fn print_banner(
    config: &ServeConfig,
    volumes: &[OpenVolume],
    tcp: Option<std::net::SocketAddr>,
    admin: Option<&Path>,
) {
    let socket = config
        .socket
        .as_ref()
        .map(|s| std::fs::canonicalize(s).unwrap_or_else(|_| s.clone()));
    let mut out = String::new();
    for (i, v) in volumes.iter().enumerate() {
        let name = &v.config.export;
        out += &format!(
            "iocache: serving export `{name}` ({}{} volume over {}, {} cache, {} lines of {}, {}, lookup {}) on\n",
            if i == 0 { "the default export; " } else { "" },
            format_byte_size(v.backend_bytes),
            v.backend_name,
            format_byte_size(v.cache_bytes),
            v.capacity_lines,
            format_byte_size(v.config.line_size.bytes()),
            v.config.write_policy,
            v.config.lookup
        );
        if let Some(socket) = &socket {
            out += &format!("  nbd+unix:///{name}?socket={}\n", socket.display());
        }
        if let Some(tcp) = tcp {
            out += &format!("  nbd://{tcp}/{name}\n");
        }
    }
    let first = &volumes[0].config.export;
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
        out += &format!("Statistics: iocache stats --admin-socket {}\n", admin.display());
    }
    out += "Stop with Ctrl-C (dirty lines are written back first).";
    println!("{out}");
}
