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

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use iocache_core::units::format_byte_size;
use iocache_serving::running::lock;
use iocache_serving::start::{Reach, StartMode};
use iocache_serving::{Acknowledgement, ServeError};

use crate::config::{
    parse_optional_listen, Origin, ServeConfig, SizeText, VolumeText, DEFAULT_BACKEND_BYTES,
};

const DEFAULT_DIR: &str = "iocache-data";

#[derive(Args)]
pub struct ServeArgs {
    /// Serve the volumes a TOML file describes (docs/config.md) instead of
    /// the one the flags below describe.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "backend", "backend_size", "backend_id", "cache", "cache_array", "mirror_percent", "cache_size", "cache_size_max", "line_size", "write_policy",
        "promotion", "policy", "lookup", "flush", "write_miss_bypass", "ordered_write_back", "seq_cutoff", "readahead", "fill", "max_dirty_lines", "io_engine", "direct",
        "persistence", "clean_check_budget", "commit_interval", "write_back_gap", "read_only", "discard", "socket", "adapt", "adapt_interval", "slow_cache", "reca_table", "reca_window", "reca_line_size",
        "listen", "export",
        "admin_socket", "metrics", "pid_file", "attach_dir", "socket_group", "tls", "tls_certificates",
        "tls_psk", "tls_verify_peer", "max_connections_per_peer", "max_handshakes_per_peer",
        "threads_per_connection", "poll_before_sleep_us", "no_map_cache",
    ])]
    config: Option<PathBuf>,
    /// Backend: a file or block device, or a remote NBD export (nbd://host:port/name,
    /// nbd+unix:///name?socket=PATH) [default: ./iocache-data/backend.img, created with 1 GiB].
    #[arg(long, value_name = "PATH|URI")]
    backend: Option<String>,
    /// Size of the backend file to create when it does not exist; needed to create a named
    /// --backend (a mistyped path is refused) [default: 1GiB for the default backend].
    /// Sizes take a unit: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024; 1.5GiB allowed).
    #[arg(long, value_name = "SIZE")]
    backend_size: Option<String>,
    /// The backend's identity, as you name it (a UUID, a label), recorded on the cache device instead of the
    /// one the device gives (a file's inode and birth time, a disk's serial): for a disk without serial or
    /// WWN. A cache holding dirty lines is refused in front of a backend of another identity.
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
    /// Format the cache for up to this size, so that it can grow to it while it serves
    /// (`ctl set cache_size=`) [default: --cache-size].
    #[arg(long, value_name = "SIZE", requires = "cache_size")]
    cache_size_max: Option<String>,
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
    /// Write back in FLUSH order: the backend alone stays a FLUSH's state (docs/ops.md).
    #[arg(long)]
    ordered_write_back: bool,
    /// Sequential cutoff: off, or a stream length after which requests bypass (1MiB[:streams=16]).
    #[arg(long, default_value = "off", value_name = "BYTES|off")]
    seq_cutoff: String,
    /// Sequential readahead: off, or seq[:min=64KiB][:max=1MiB][:streams=16]. A read that continues a stream
    /// has the lines after it read from the backend into the cache in the background.
    #[arg(long, default_value = "off", value_name = "off|seq[:...]")]
    readahead: String,
    /// What a read miss fills: request (the sectors asked for) or line (the whole line, read
    /// from the backend in the same request).
    #[arg(long, default_value = "request", value_name = "request|line")]
    fill: String,
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
    /// With --persistence all or dirty: the longest an acknowledged write waits for its metadata
    /// record when the client never flushes, so that a killed server or a power cut loses at most
    /// this much (a barrier runs this long after the first unrecorded write; FLUSH and FUA keep
    /// their meaning). 0s: only FLUSH and FUA [default: 1s].
    #[arg(long, value_name = "DURATION")]
    commit_interval: Option<String>,
    /// Write-back: a gap of at most SIZE between two dirty runs is read from the backend and
    /// written back with them in one request, so a backend that pays per request (a disk that
    /// seeks) pays once. 0 never reads the backend for a write-back [default: 0].
    #[arg(long, value_name = "SIZE")]
    write_back_gap: Option<String>,
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
    #[arg(short = 'r', long)]
    read_only: bool,
    /// What a client's TRIM does: passdown (the lines leave the cache, dirty data discarded, and
    /// the backend discards the range: a hole punched, BLKDISCARD, NBD trim), cache (the lines
    /// leave the cache, the backend keeps its data) or ignore. Default passdown.
    #[arg(long, value_name = "MODE")]
    discard: Option<String>,
    /// An adaptive controller beside the cache (one at a time; default off). reca: every request is
    /// characterized, and each window of --reca-window requests puts the nearest workload category's write
    /// policy and reca replacement policy in force, and its line size when --reca-line-size says (live by
    /// default; docs/results/reca.md). lbica: a load balancer that changes the write policy while the cache
    /// device is the bottleneck and sends the tail of its queue to the backend; sib: sends single requests to
    /// the backend when they would complete there sooner (docs/results/lbica.md), with the simulator's knobs:
    /// lbica[:enter=1:floor=0.1:own-floor=1:hold=2:...], sib[:margin=1]. Requests whose sectors are dirty in
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
    #[arg(short = 'U', long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Also listen on TCP (none by default: only the Unix socket, whose mode limits who may
    /// connect; any local user can connect to a TCP port unless --tls require asks for a
    /// certificate or a pre-shared key), e.g. 127.0.0.1:10809.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
    /// Captive mode (nbdkit's --run): once the server serves, run CMD with `sh -c`, the default export's URI
    /// in $nbd and $uri; when CMD exits, stop the server as SIGTERM does (dirty lines written back) and exit
    /// with CMD's status. For example: --run 'qemu-img convert -O qcow2 "$nbd" out.qcow2'.
    #[arg(long, value_name = "CMD")]
    run: Option<String>,
    /// Not a flag of iocache: said as such, with the way to listen on a TCP port.
    #[arg(long, hide = true, value_name = "PORT")]
    port: Option<String>,
    /// Export name (the export is also reachable under the empty name).
    #[arg(short = 'e', long, default_value = "iocache")]
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
    #[arg(short = 'P', long, value_name = "PATH")]
    pid_file: Option<PathBuf>,
    /// TLS for NBD clients (NBD_OPT_STARTTLS): off, on (offered to clients that ask) or require
    /// (every client, on TCP and on the Unix socket, must upgrade before any other option).
    #[arg(long, default_value = "off", value_name = "off|on|require")]
    tls: String,
    /// The directory holding the server's certificate chain and key (server-cert.pem and server-key.pem, as
    /// nbdkit and qemu-nbd name them); with --tls on|require, this or --tls-psk (or both) is needed.
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
    /// TLS-PSK: a file of pre-shared keys, one `identity:hexkey` a line (as GnuTLS's psktool writes; nbdkit's
    /// --tls-psk, qemu's tls-creds-psk). It must be its owner's only (0600). Usable alone or with
    /// --tls-certificates: a client offering a key from it needs no certificate.
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
    /// Threads serving one connection's requests, taking turns reading them (leader and followers, as
    /// nbdkit's --threads); also the most requests of one connection served at once [default: 4].
    #[arg(short = 't', long, value_name = "N")]
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
    /// A directory under which `iocache ctl attach` may open or create backend files (repeatable) [default:
    /// ./iocache-data when it is the data directory; none otherwise: only NBD backends can be attached].
    #[arg(long, value_name = "DIR")]
    attach_dir: Vec<PathBuf>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    if let Some(port) = &args.port {
        return Err(crate::exit::usage(anyhow!(
            "--port: iocache has no such flag; to listen on TCP port {port}, give --listen 127.0.0.1:{port} \
             (or an address of this host instead of 127.0.0.1)"
        )));
    }
    let captive = args.run.clone();
    let start = StartMode {
        init: args.init,
        force: args.force,
        accept_damage: args.accept_damaged_metadata,
        rebind: args.rebind_backend,
    };
    let config = match args.config.clone() {
        Some(path) => crate::config::from_file(&path),
        None => args.into_config(),
    }
    .map_err(crate::exit::usage)?;
    raise_open_file_limit();
    if let Some(dir) = &config.private_dir {
        ensure_private_dir(dir)?;
    }
    crate::signals::install_handlers();
    let status = std::sync::Arc::new(std::sync::Mutex::new(None));
    let mut banner = |reach: Reach<'_>| {
        print_banner(&config, &reach);
        if let Some(command) = &captive {
            run_captive(
                command,
                &default_uri(&config, &reach),
                std::sync::Arc::clone(&status),
            );
        }
    };
    iocache_serving::start::serve(&config, start, &crate::signals::STOP, &mut banner)
        .map_err(with_way_out)?;
    if captive.is_some() {
        // The server stopped cleanly: the command's status is the process's.
        let code = lock(&status).unwrap_or(1);
        std::process::exit(code);
    }
    Ok(())
}

/// The URI of the default export: over the Unix socket if there is one.
fn default_uri(config: &ServeConfig, reach: &Reach<'_>) -> String {
    let tls = config.tls == iocache_nbd::TlsMode::Require;
    let export = lock(&reach.state.volumes)
        .first()
        .map(|v| v.export.clone())
        .unwrap_or_default();
    match (&config.socket, reach.tcp) {
        (Some(socket), _) => {
            let socket = std::fs::canonicalize(socket).unwrap_or_else(|_| socket.clone());
            let scheme = if tls { "nbds+unix" } else { "nbd+unix" };
            format!("{scheme}:///{export}?socket={}", socket.display())
        }
        (None, Some(tcp)) => format!("{}://{tcp}/{export}", if tls { "nbds" } else { "nbd" }),
        (None, None) => String::new(),
    }
}

/// Runs the captive command in the background; when it exits, keeps its
/// status in `status` and stops the server.
fn run_captive(command: &str, uri: &str, status: std::sync::Arc<std::sync::Mutex<Option<i32>>>) {
    let child = std::process::Command::new("sh")
        .args(["-c", command])
        .env("nbd", uri)
        .env("uri", uri)
        .spawn();
    let stop = || crate::signals::STOP.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            log::error!("--run: cannot start `sh -c {command}`: {e}");
            *lock(&status) = Some(crate::exit::USAGE);
            stop();
            return;
        }
    };
    std::thread::spawn(move || {
        let code = match child.wait() {
            // Killed by a signal: 128 + its number, as a shell says.
            Ok(s) => s
                .code()
                .unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0)),
            Err(_) => 1,
        };
        *lock(&status) = Some(code);
        stop();
    });
}

/// A refusal with the flag that acknowledges it, where it asks for one
/// (the serving layer names no flag).
fn with_way_out(e: ServeError) -> anyhow::Error {
    use iocache_engine::Acknowledgement as Engine;
    let way_out = match e.acknowledgement() {
        Some(Acknowledgement::Engine(Engine::FormatLosingData)) => " (--init --force)",
        Some(Acknowledgement::Engine(Engine::AcceptDamage)) => " (--accept-damaged-metadata)",
        Some(Acknowledgement::Engine(Engine::Rebind)) => " (--rebind-backend)",
        Some(Acknowledgement::Init) => "; start with --init to begin with an empty cache over it",
        Some(Acknowledgement::Force) => ", or add --force",
        None => return crate::exit::classified(e),
    };
    crate::exit::usage(anyhow!("{}{way_out}", iocache_serving::error_chain_text(&e)))
}

/// Raises the soft limit on open files to the hard one, as servers do: a file device holds several open
/// descriptions of its file (one per thread stripe), and every client connection and backend connection is a
/// descriptor too. Best effort: the limit stays as it was on failure.
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

/// Tells how to reach every export.
fn print_banner(config: &ServeConfig, reach: &Reach<'_>) {
    let (state, tcp, admin) = (reach.state, reach.tcp, reach.admin_socket);
    let socket = config
        .socket
        .as_ref()
        .map(|s| std::fs::canonicalize(s).unwrap_or_else(|_| s.clone()));
    let (unix, tcp_scheme) = match config.tls {
        iocache_nbd::TlsMode::Require => ("nbds+unix", "nbds"),
        _ => ("nbd+unix", "nbd"),
    };
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
            iocache_core::units::format_size_readably(v.volume.size_bytes()),
            v.backend,
            iocache_core::units::format_size_readably(group.cache_bytes),
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
            out += &format!("  {unix}:///{name}?socket={}\n", socket.display());
        }
        if let Some(tcp) = tcp {
            out += &format!("  {tcp_scheme}://{tcp}/{name}\n");
        }
    }
    let first = &volumes[0].export;
    if config.tls == iocache_nbd::TlsMode::Require {
        // Plain clients are refused: name the TLS schemes and what a
        // client needs.
        out += "TLS is required: clients connect with nbds:// or nbds+unix:// and need the server's CA \
                certificate or a pre-shared key, for example:\n";
        if let Some(socket) = &socket {
            out += &format!(
                "  nbdinfo 'nbds+unix:///{first}?socket={}&tls-psk-file=KEYS'\n",
                socket.display()
            );
        }
        if let Some(tcp) = tcp {
            out += &format!("  nbdinfo 'nbds://{tcp}/{first}?tls-certificates=DIR'\n");
        }
    } else {
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
    }
    if let Some(admin) = admin {
        out += &format!(
            "Statistics: iocache stats --admin-socket {0}\nVolumes: iocache ctl --admin-socket {0} attach|detach|flush|stats ...\n",
            admin.display()
        );
    }
    out += "Stop with Ctrl-C (dirty lines are written back first).";
    // Never a panic for a stdout nobody reads any more: the server goes on.
    let _ = writeln!(std::io::stdout().lock(), "{out}");
}

/// Makes sure the default data directory is this user's alone: created 0700 if missing; refused if it is a
/// symbolic link, another user's, or writable by others (where someone else could plant links to files this
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
            cache_size_max: self.cache_size_max.map(SizeText),
            line_size: SizeText(self.line_size),
            write_policy: self.write_policy,
            promotion: self.promotion,
            policy: self.policy,
            lookup: self.lookup,
            flush: self.flush,
            write_miss_bypass: self.write_miss_bypass,
            ordered_write_back: self.ordered_write_back,
            max_dirty_lines: self.max_dirty_lines,
            seq_cutoff: self.seq_cutoff,
            readahead: self.readahead,
            fill: self.fill,
            io_engine: self.io_engine,
            direct: self.direct,
            persistence: self.persistence,
            clean_check_budget: self.clean_check_budget,
            commit_interval: self.commit_interval,
            write_back_gap: self.write_back_gap,
            read_only: self.read_only,
            discard: self.discard,
            adapt: self.adapt,
            adapt_interval: self.adapt_interval,
            reca_table: self.reca_table,
            reca_window: self.reca_window,
            reca_line_size: self.reca_line_size,
        };
        let (mut volume, mut cache) = text.validate(&Origin::Flags)?;
        cache.slow_cache = self
            .slow_cache
            .as_deref()
            .map(crate::config::parse_slow_cache)
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
        crate::config::check(ServeConfig {
            origin: Origin::Flags,
            socket: Some(self.socket.unwrap_or_else(|| dir.join("iocache.sock"))),
            listen: parse_optional_listen(self.listen.as_deref(), "--listen")?,
            admin_socket: Some(self.admin_socket.unwrap_or_else(|| dir.join("admin.sock"))),
            metrics: parse_optional_listen(self.metrics.as_deref(), "--metrics")?,
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
            caches: vec![cache],
            volumes: vec![volume],
        })
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
