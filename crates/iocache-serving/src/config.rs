//! What a server serves, validated: [`ServeConfig`], one [`CacheDeviceConfig`]
//! per cache device and one [`VolumeConfig`] per volume, which refers to
//! its cache. The command line and configuration files
//! are read elsewhere (the binary); everything here is typed, and every
//! key is named in errors as its [`Origin`] says.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};

use iocache_core::{
    CleaningPolicy, Fill, LineSize, PolicySpec, Promotion, Readahead, SeqCutoff, WritePolicy,
};
use iocache_engine::{BalanceConfig, IoMode, Lookup, Persistence};

/// Size of a new cache file when no cache size is given.
pub const DEFAULT_CACHE_BYTES: u64 = 128 << 20;

/// Where a configuration came from, to name keys in errors.
#[derive(Clone, Debug)]
pub enum Origin {
    /// The command line: keys are named as flags (`--line-size`).
    Flags,
    /// A TOML file: keys are named with the file and the volume.
    File(String),
}

impl Origin {
    /// How to name `key` of the `[server]` table.
    pub fn server_key(&self, key: &str) -> String {
        match self {
            Origin::Flags => format!("--{}", key.replace('_', "-")),
            Origin::File(path) => format!("{path}: server.{key}"),
        }
    }

    /// How to name `key` where the volume is clear from the context: as a
    /// flag, or as the key of a `[[volume]]` table.
    pub fn short_key(&self, key: &str) -> String {
        match self {
            Origin::Flags => format!("--{}", key.replace('_', "-")),
            Origin::File(_) => key.to_string(),
        }
    }

    /// How to name `key` of the volume exported as `export`.
    pub fn volume_key(&self, export: &str, key: &str) -> String {
        self.owned_key(&KeyOwner::Volume(export.to_string()), key)
    }

    /// How to name `key` written in the table of `owner`.
    pub fn owned_key(&self, owner: &KeyOwner, key: &str) -> String {
        match (self, owner) {
            (Origin::Flags, _) => format!("--{}", key.replace('_', "-")),
            (Origin::File(path), KeyOwner::Volume(export)) => format!("{path}: volume `{export}`: {key}"),
            (Origin::File(path), KeyOwner::Cache(cache)) => format!("{path}: cache `{cache}`: {key}"),
        }
    }
}

/// Which table a cache's keys were written in: a volume's (the first
/// that wrote them), or the cache's own `[[cache]]` table (by its path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyOwner {
    Volume(String),
    Cache(String),
}

/// Everything `iocache serve` needs to start, validated.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub origin: Origin,
    /// Unix socket for NBD clients.
    pub socket: Option<PathBuf>,
    /// TCP address for NBD clients.
    pub listen: Option<SocketAddr>,
    /// Unix socket answering `iocache stats`.
    pub admin_socket: Option<PathBuf>,
    /// TCP address answering Prometheus scrapes on /metrics.
    pub metrics: Option<SocketAddr>,
    /// A file to write this process's id to while it runs.
    pub pid_file: Option<PathBuf>,
    /// TLS for NBD clients (STARTTLS): off, on (offered) or require.
    pub tls: iocache_nbd::TlsMode,
    /// The directory holding server-cert.pem and server-key.pem (and
    /// ca-cert.pem with `tls_verify_peer`).
    pub tls_certificates: Option<PathBuf>,
    /// A file of TLS pre-shared keys (`identity:hexkey` lines, psktool's).
    pub tls_psk: Option<PathBuf>,
    /// Require client certificates signed by tls_certificates/ca-cert.pem.
    pub tls_verify_peer: bool,
    /// A group whose members may connect to the NBD Unix socket (mode
    /// 0660 then); none: the socket is its owner's only (0600).
    pub socket_group: Option<String>,
    /// Connections one peer (a user on the Unix socket, an address or an
    /// IPv6 /64 on TCP) may hold on each listener; `None`: the server's
    /// default (16 of the 64).
    pub max_connections_per_peer: Option<usize>,
    /// Connections one peer may have in the handshake at once on each
    /// listener; `None`: the server's default (16, the listener's own limit).
    pub max_handshakes_per_peer: Option<usize>,
    /// Threads serving one connection's requests (leader and followers);
    /// `None`: the server's default (4).
    pub threads_per_connection: Option<usize>,
    /// Microseconds a connection's reader polls for the next request
    /// before it sleeps (0: never); `None`: the server's default (20).
    pub poll_before_sleep_us: Option<u64>,
    /// Map cache files that live in memory (tmpfs, ramfs) and copy to and
    /// from them (`FileDevice::map_if_in_memory`); false: `pread`/`pwrite`.
    pub map_cache: bool,
    /// Directories under which `iocache ctl attach` may open (or create)
    /// backend files; none: only NBD backends can be attached.
    pub attach_dirs: Vec<PathBuf>,
    /// The default data directory, when some path was defaulted into it:
    /// it must be this user's alone (created 0700), and files in it are
    /// opened without following symbolic links.
    pub private_dir: Option<PathBuf>,
    /// The cache devices, each once; volumes refer to them by index.
    pub caches: Vec<CacheDeviceConfig>,
    /// At least one; the first is also the default export (the empty name).
    pub volumes: Vec<VolumeConfig>,
}

/// One cached volume: a backend, served through a cache device.
#[derive(Clone, Debug)]
pub struct VolumeConfig {
    pub origin: Origin,
    pub export: String,
    /// A file or block device path, or an `nbd://` / `nbd+unix://` URI.
    pub backend: String,
    /// Create a missing backend file with this size.
    pub backend_create_bytes: Option<u64>,
    /// The backend's identity as the operator gives it, instead of the one
    /// the device says (docs/format.md, "Backend identity").
    pub backend_id: Option<String>,
    /// Its cache device: an index into [`ServeConfig::caches`].
    pub cache: usize,
    /// Clients may only read this export (NBD_FLAG_READ_ONLY; writes,
    /// trims and write-zeroes get EPERM). Dirty lines from an earlier run
    /// are still written back, so the backend stays open for writing.
    pub read_only: bool,
    /// What a client's TRIM does.
    pub discard: DiscardMode,
}

/// What a client's TRIM (discard) does to the cache and the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiscardMode {
    /// The range's lines leave the cache (dirty data discarded, never
    /// written back) and the backend discards the range: a hole punched,
    /// `BLKDISCARD`, NBD_CMD_TRIM (dm-cache's `discard_passdown`).
    #[default]
    PassDown,
    /// The range's lines leave the cache; the backend keeps its data.
    Cache,
    /// Nothing happens (a TRIM is advisory).
    Ignore,
}

impl DiscardMode {
    pub const NAMES: [&'static str; 3] = ["passdown", "cache", "ignore"];
}

impl fmt::Display for DiscardMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DiscardMode::PassDown => "passdown",
            DiscardMode::Cache => "cache",
            DiscardMode::Ignore => "ignore",
        })
    }
}

impl std::str::FromStr for DiscardMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "passdown" => Ok(DiscardMode::PassDown),
            "cache" => Ok(DiscardMode::Cache),
            "ignore" => Ok(DiscardMode::Ignore),
            other => Err(format!("`{other}` is not {}", DiscardMode::NAMES.join(", "))),
        }
    }
}

/// One cache device and its policies, shared by the volumes that refer to it.
#[derive(Clone)]
pub struct CacheDeviceConfig {
    pub origin: Origin,
    /// Where its keys were written (names them in errors).
    pub owner: KeyOwner,
    /// The cache device: a file or block device.
    pub path: PathBuf,
    /// Cache RAID: the other devices of an array with `path` (clean lines
    /// striped over all, dirty lines mirrored); empty for one device.
    pub cache_array: Vec<PathBuf>,
    /// Share of each array device's line slots kept for mirrors of dirty lines.
    pub mirror_percent: u32,
    /// The cache's size; `None` uses the whole device (a new file gets
    /// [`DEFAULT_CACHE_BYTES`]).
    pub cache_bytes: Option<u64>,
    /// The size the cache device is formatted for, when more than
    /// `cache_bytes`: the cache can grow to it while it serves.
    pub cache_max_bytes: Option<u64>,
    pub line_size: LineSize,
    pub write_policy: WritePolicy,
    pub promotion: Promotion,
    pub policy: PolicySpec,
    pub lookup: Lookup,
    pub cleaning: CleaningPolicy,
    /// Send write misses to the backend when every line is dirty.
    pub write_miss_bypass: bool,
    /// Write back in FLUSH order ([`iocache_core::CacheConfig::ordered_write_back`]).
    pub ordered_write_back: bool,
    pub seq_cutoff: SeqCutoff,
    pub readahead: Readahead,
    pub fill: Fill,
    /// At most this many dirty lines in the whole cache (a write that
    /// would make one more is written through); `None`: no cap.
    pub max_dirty_lines: Option<u64>,
    /// How cache reads of several lines are issued.
    pub io: IoMode,
    /// `io_engine` was `auto`: `io` follows `direct`.
    pub io_auto: bool,
    /// Open the cache device with O_DIRECT.
    pub direct: bool,
    /// Which lines' metadata the cache device keeps across restarts.
    pub persistence: Persistence,
    /// After a crash (persistence `all`), how long the recovered clean
    /// lines may be compared with the backend; the rest are dropped.
    pub clean_check_budget_ns: u64,
    /// With persistent metadata, the longest an acknowledged write waits
    /// for its record when the client never flushes (0: no limit, only
    /// FLUSH and FUA record).
    pub commit_interval_ns: u64,
    /// Write-back fills gaps of up to this many bytes between dirty runs
    /// with the backend's data, to write both in one request (0: never).
    pub write_back_gap_bytes: u64,
    /// An adaptive controller beside the cache: `Some` for ReCA.
    pub reca: Option<RecaConfig>,
    /// A load balancer between the cache device and the backends
    /// (`adapt = "lbica"`), with the text it was given.
    pub adapt: Option<Adapt>,
    /// For experiments (`serve --slow-cache`, a hidden flag): the cache
    /// device slowed down.
    pub slow_cache: Option<SlowCache>,
}

impl ServeConfig {
    /// The volumes of cache `cache`: indices into `volumes`, in order.
    pub fn members(&self, cache: usize) -> Vec<usize> {
        (0..self.volumes.len())
            .filter(|&i| self.volumes[i].cache == cache)
            .collect()
    }
}

/// `--slow-cache LATENCY[:servers=N]`: latency added to every cache-device
/// I/O, through `servers` at once (0: no limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowCache {
    pub latency_ns: u64,
    pub servers: u64,
}

/// `adapt` and `adapt_interval`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Adapt {
    /// The controller and its interval, as `iocache stats` shows them.
    pub text: String,
    pub config: BalanceConfig,
}

impl fmt::Debug for CacheDeviceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheDeviceConfig")
            .field("path", &self.path)
            .field("cache_bytes", &self.cache_bytes)
            .field("cache_max_bytes", &self.cache_max_bytes)
            .field("line_bytes", &self.line_size.bytes())
            .field("write_policy", &self.write_policy)
            .field("policy", &self.policy.to_string())
            .field("lookup", &self.lookup)
            .finish_non_exhaustive()
    }
}

impl VolumeConfig {
    /// How to name `key` of this volume in an error.
    pub fn key(&self, key: &str) -> String {
        self.origin.volume_key(&self.export, key)
    }

    /// Whether the backend is a remote NBD export rather than a path.
    pub fn backend_is_nbd(&self) -> bool {
        is_nbd_uri(&self.backend)
    }
}

impl CacheDeviceConfig {
    /// How to name `key` of this cache in an error.
    pub fn key(&self, key: &str) -> String {
        self.origin.owned_key(&self.owner, key)
    }
}

/// `adapt = "reca"`: ReCA's category table and window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecaConfig {
    /// The category table's file; `None`: the built-in table.
    pub table: Option<PathBuf>,
    pub window_requests: u64,
    /// `reca_line_size = "live"` (the default): a category's line size is
    /// put in force while serving (`relayout.rs`); `"next_start"`: it
    /// is recorded and taken at the next start.
    pub line_size_live: bool,
}

/// Whether a backend names a remote NBD export rather than a path.
pub fn is_nbd_uri(text: &str) -> bool {
    text.starts_with("nbd://") || text.starts_with("nbd+unix://")
}

/// `path` without `.` components and with `a/..` folded, for comparing paths
/// before the files exist.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.components().next_back(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}
