//! `iocache serve`: a cache device in front of a backend, served over NBD.
//!
//! With no arguments it creates `./iocache-data/backend.img` (1 GiB, sparse)
//! and `./iocache-data/cache.img` (128 MiB) if absent and serves them on a
//! Unix socket in that directory and on 127.0.0.1:10809. SIGINT or SIGTERM
//! stops accepting connections, finishes requests in flight, writes every
//! dirty line back and exits 0.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use iocache_core::units::{format_byte_size, parse_byte_size};
use iocache_core::{CacheConfig, LineSize, PolicySpec};
use iocache_device::{BlockDevice, FileDevice, OpenOptions};
use iocache_engine::{Engine, EngineConfig, EngineExport, Lookup, NbdBackend};
use iocache_nbd::{Server, ServerConfig};

const DEFAULT_DIR: &str = "iocache-data";
const DEFAULT_BACKEND_BYTES: u64 = 1 << 30;
const DEFAULT_CACHE_BYTES: u64 = 128 << 20;

#[derive(Args)]
pub struct ServeArgs {
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
    /// Open the cache device with O_DIRECT.
    #[arg(long)]
    direct: bool,
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

/// The statistics `iocache stats` shows, as JSON (one volume per entry).
fn stats_json(engine: &Engine, export: &str, backend: &str, policy: &str) -> serde_json::Value {
    let s = engine.stats();
    let c = &s.cache;
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
    serde_json::json!({
        "volumes": [{
            "export": export,
            "backend": backend,
            "size_bytes": engine.size_bytes(),
            "write_policy": engine.write_policy().to_string(),
            "policy": policy,
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
        }]
    })
}

/// Answers every connection on the admin socket with the statistics as JSON.
fn serve_admin(listener: UnixListener, engine: Arc<Engine>, export: String, backend: String, policy: String) {
    for stream in listener.incoming() {
        if STOP.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut line = String::new();
        let _ = BufReader::new(&stream).read_line(&mut line);
        let reply = match line.trim() {
            "stats" | "" => stats_json(&engine, &export, &backend, &policy).to_string(),
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

fn size_arg(flag: &str, text: &str) -> Result<u64> {
    parse_byte_size(text).map_err(|e| anyhow::anyhow!("--{flag}: {e}"))
}

/// Opens (creating a sparse file of `create_bytes` if missing) a file device.
fn open_file(path: &PathBuf, create_bytes: u64, direct: bool) -> Result<FileDevice> {
    let exists = path.exists();
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

pub fn run(args: ServeArgs) -> Result<()> {
    let dir = PathBuf::from(DEFAULT_DIR);
    let uses_default_dir = args.backend.is_none() || args.cache.is_none() || args.socket.is_none();
    if uses_default_dir {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let line_size = LineSize::new(size_arg("line-size", &args.line_size)?)
        .map_err(|e| anyhow::anyhow!("--line-size: {e}"))?;

    let backend: Arc<dyn BlockDevice> = match args.backend.as_deref() {
        Some(uri) if uri.starts_with("nbd://") || uri.starts_with("nbd+unix://") => {
            Arc::new(NbdBackend::connect(uri).with_context(|| format!("--backend {uri}"))?)
        }
        given => {
            let path = given.map_or_else(|| dir.join("backend.img"), PathBuf::from);
            let create = match args.backend_size.as_deref() {
                Some(text) => size_arg("backend-size", text)?,
                None => DEFAULT_BACKEND_BYTES,
            };
            Arc::new(open_file(&path, create, false)?)
        }
    };
    let cache_path = args.cache.clone().unwrap_or_else(|| dir.join("cache.img"));
    let requested_cache = args
        .cache_size
        .as_deref()
        .map(|text| size_arg("cache-size", text))
        .transpose()?;
    let cache_dev = open_file(
        &cache_path,
        requested_cache.unwrap_or(DEFAULT_CACHE_BYTES),
        args.direct,
    )?;
    let cache_bytes = requested_cache.unwrap_or(cache_dev.len_bytes());
    if cache_bytes > cache_dev.len_bytes() {
        bail!(
            "--cache-size {} is larger than the cache device {} ({})",
            format_byte_size(cache_bytes),
            cache_path.display(),
            format_byte_size(cache_dev.len_bytes())
        );
    }
    let capacity_lines = cache_bytes / line_size.bytes();
    if capacity_lines == 0 {
        bail!("the cache holds no {}-byte line", line_size.bytes());
    }
    let policy: PolicySpec = args
        .policy
        .parse()
        .map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    let mut cache = CacheConfig::new(capacity_lines, line_size, policy);
    cache.write_policy = args
        .write_policy
        .parse()
        .map_err(|e| anyhow::anyhow!("--write-policy: {e}"))?;
    cache.promotion = args
        .promotion
        .parse()
        .map_err(|e| anyhow::anyhow!("--promotion: {e}"))?;
    cache.cleaning = args.flush.parse().map_err(|e| anyhow::anyhow!("--flush: {e}"))?;
    let lookup: Lookup = args
        .lookup
        .parse()
        .map_err(|e| anyhow::anyhow!("--lookup: {e}"))?;
    let engine = Arc::new(Engine::new(
        EngineConfig {
            cache,
            lookup,
            shards: 0,
        },
        Arc::new(cache_dev),
        Arc::clone(&backend),
    )?);

    let socket = args.socket.clone().unwrap_or_else(|| dir.join("iocache.sock"));
    let listen: SocketAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {}: expected ADDR:PORT", args.listen))?;
    let mut server = Server::new(ServerConfig {
        unix_socket: Some(socket.clone()),
        tcp: Some(listen),
        ..ServerConfig::default()
    });
    let description = format!(
        "iocache: {} cache of {} lines of {} over {}",
        engine.write_policy(),
        capacity_lines,
        format_byte_size(line_size.bytes()),
        backend.name()
    );
    server.add_export(
        args.export.clone(),
        Arc::new(EngineExport::new(Arc::clone(&engine), Some(description))),
    )?;
    let admin_path = args
        .admin_socket
        .clone()
        .unwrap_or_else(|| dir.join("admin.sock"));
    let _ = std::fs::remove_file(&admin_path);
    let admin = UnixListener::bind(&admin_path)
        .with_context(|| format!("--admin-socket {}", admin_path.display()))?;
    {
        let engine = Arc::clone(&engine);
        let (export, backend_name, policy) = (
            args.export.clone(),
            backend.name().to_string(),
            args.policy.clone(),
        );
        std::thread::spawn(move || serve_admin(admin, engine, export, backend_name, policy));
    }
    install_signal_handlers();
    let running = server.start()?;
    let tcp = running
        .tcp_addr()
        .map_or_else(|| listen.to_string(), |a| a.to_string());
    let socket_abs = std::fs::canonicalize(&socket).unwrap_or(socket.clone());
    println!(
        "iocache: serving export `{}` ({} volume, {} cache, {} lines, lookup {}) on\n  \
         nbd+unix:///{}?socket={}\n  nbd://{}/{}\nConnect with, for example:\n  \
         nbdinfo 'nbd+unix:///{}?socket={}'\n  qemu-io -f raw -c 'read -v 0 512' 'nbd://{}/{}'\n  \
         nbdfuse DIR/disk --unix {}\nStatistics: iocache stats --admin-socket {}\n\
         Stop with Ctrl-C (dirty lines are written back first).",
        args.export,
        format_byte_size(backend.len_bytes()),
        format_byte_size(cache_bytes),
        capacity_lines,
        lookup,
        args.export,
        socket_abs.display(),
        tcp,
        args.export,
        args.export,
        socket_abs.display(),
        tcp,
        args.export,
        socket_abs.display(),
        admin_path.display()
    );
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("iocache: stopping: finishing requests in flight");
    let server_stats = running.shutdown();
    let dirty = engine.stats().dirty_lines;
    eprintln!("iocache: writing back {dirty} dirty lines");
    engine.shutdown().context("writing back dirty lines")?;
    let _ = std::fs::remove_file(&admin_path);
    let stats = engine.stats();
    eprintln!(
        "iocache: stopped after {} connections; {} requests, {:.2} % line hit ratio, {} I/O errors",
        server_stats.connections,
        stats.cache.requests,
        stats.cache.hit_ratio() * 100.0,
        stats.io_errors
    );
    Ok(())
}
