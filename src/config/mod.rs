//! What `iocache serve` serves: [`ServeConfig`], built either from the
//! command-line flags (one volume) or from a TOML file (`--config`, any
//! number of volumes; docs/config.md describes the format).
//!
//! Everything that can be checked without opening a device is checked here,
//! and every error names what it is about: the flag (`--line-size: ...`) or
//! the file, the volume and the key (`iocache.toml: volume `fast`:
//! line_size: ...`). Checks that need the devices (a cache size larger than
//! its device, two volumes on one cache file under different names) are made
//! by `serve` when it opens them, with the same names.
//!
//! Volumes whose `cache` is the same path share that cache device (one
//! engine): the keys that describe the cache ([`CACHE_KEYS`]) may be written
//! in any of them, and where written more than once must agree.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use iocache_core::units::{format_byte_size, format_duration_ns, parse_byte_size, parse_duration_ns};
use iocache_core::{
    CleaningPolicy, Fill, LineSize, PolicySpec, Promotion, Readahead, SeqCutoff, WritePolicy,
};
use iocache_engine::{BalanceConfig, BalanceController, IoMode, Lookup, Persistence};
pub use iocache_serving::config::{
    is_nbd_uri, normalize, Adapt, CacheDeviceConfig, DiscardMode, KeyOwner, Origin, RecaConfig, ServeConfig,
    SlowCache, VolumeConfig,
};
use iocache_sim::adapt::AdaptKind;
use iocache_sim::AdaptSpec;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// A key of a cache and its value as text.
type CacheKey = (&'static str, fn(&CacheDeviceConfig) -> String);

/// The keys that describe a cache device, each with its value as text (to
/// compare two volumes that write it): written in the cache's `[[cache]]`
/// table, or in the `[[volume]]` tables of the volumes that share it.
const CACHE_KEYS: [CacheKey; 27] = [
    ("cache_size", |c| {
        c.cache_bytes.map_or("the device's size".into(), format_byte_size)
    }),
    ("cache_size_max", |c| {
        c.cache_max_bytes.map_or("cache_size".into(), format_byte_size)
    }),
    ("cache_array", |c| format!("{:?}", c.cache_array)),
    ("mirror_percent", |c| c.mirror_percent.to_string()),
    ("line_size", |c| format_byte_size(c.line_size.bytes())),
    ("policy", |c| c.policy.to_string()),
    ("promotion", |c| c.promotion.to_string()),
    ("lookup", |c| c.lookup.to_string()),
    ("flush", |c| c.cleaning.to_string()),
    ("persistence", |c| c.persistence.to_string()),
    ("clean_check_budget", |c| {
        format_duration_ns(c.clean_check_budget_ns)
    }),
    ("commit_interval", |c| format_duration_ns(c.commit_interval_ns)),
    ("write_back_gap", |c| format_byte_size(c.write_back_gap_bytes)),
    ("write_policy", |c| c.write_policy.to_string()),
    ("seq_cutoff", |c| c.seq_cutoff.to_string()),
    ("readahead", |c| c.readahead.to_string()),
    ("fill", |c| c.fill.to_string()),
    ("write_miss_bypass", |c| c.write_miss_bypass.to_string()),
    ("ordered_write_back", |c| c.ordered_write_back.to_string()),
    ("max_dirty_lines", |c| {
        c.max_dirty_lines.map_or("off".into(), |n| n.to_string())
    }),
    ("direct", |c| c.direct.to_string()),
    ("io_engine", |c| match (c.io_auto, c.io) {
        (true, _) => "auto".into(),
        (false, IoMode::Psync) => "psync".into(),
        (false, IoMode::Uring) => "uring".into(),
    }),
    ("adapt", adapt_text),
    ("adapt_interval", adapt_text),
    ("reca_table", |c| {
        (c.reca.as_ref().and_then(|r| r.table.as_ref()))
            .map_or(iocache_core::reca::BUILTIN_TABLE_SOURCE.into(), |t| {
                t.display().to_string()
            })
    }),
    ("reca_window", |c| {
        c.reca
            .as_ref()
            .map_or(DEFAULT_RECA_WINDOW, |r| r.window_requests)
            .to_string()
    }),
    ("reca_line_size", |c| {
        match c.reca.as_ref().is_none_or(|r| r.line_size_live) {
            true => "live".into(),
            false => "next_start".into(),
        }
    }),
];

/// `adapt` (and its interval) as text.
fn adapt_text(c: &CacheDeviceConfig) -> String {
    match (&c.reca, &c.adapt) {
        (Some(_), _) => "reca".into(),
        (None, Some(a)) => a.text.clone(),
        (None, None) => "off".into(),
    }
}

/// The keys of a `[[volume]]` table that belong to the volume itself.
const VOLUME_KEYS: [&str; 7] = [
    "export",
    "backend",
    "backend_size",
    "backend_id",
    "cache",
    "read_only",
    "discard",
];

/// Size of a backend file `serve` creates when given no `--backend`.
pub const DEFAULT_BACKEND_BYTES: u64 = 1 << 30;
fn default_map_cache() -> bool {
    true
}

/// The longest `poll_before_sleep_us`: the server's own bound
/// ([`iocache_nbd::POLL_BEFORE_SLEEP_MAX`]), in microseconds.
pub const POLL_BEFORE_SLEEP_US_MAX: u64 = iocache_nbd::POLL_BEFORE_SLEEP_MAX.as_micros() as u64;

/// The most threads `threads_per_connection` may ask for: each connection
/// gets that many, and 64 connections per listener are allowed.
pub const THREADS_PER_CONNECTION_MAX: usize = 64;

/// `--slow-cache LATENCY[:servers=N]`: latency added to every cache-device
/// I/O, through `servers` at once (0: no limit).
pub fn parse_slow_cache(text: &str) -> Result<SlowCache> {
    let mut parts = text.split(':');
    let latency_ns = parse_duration_ns(parts.next().unwrap_or(""))?;
    let mut servers = 1;
    for part in parts {
        match part.split_once('=') {
            Some(("servers", n)) => {
                servers = n.parse().map_err(|_| anyhow!("servers: `{n}` is not a count"))?
            }
            _ => bail!("`{part}`: expected servers=N"),
        }
    }
    Ok(SlowCache { latency_ns, servers })
}

/// The controller interval when neither `adapt_interval` nor `interval=`
/// gives one.
pub const DEFAULT_ADAPT_INTERVAL_NS: u64 = 100_000_000;

/// Parses `adapt` (`lbica|sib[:KEY=VALUE...]`, the simulator's syntax) and
/// `adapt_interval` (a duration with a unit; `interval=` in the spec says
/// the same, and giving both is refused).
pub fn parse_adapt(spec: &str, interval: Option<&str>) -> Result<Adapt> {
    let parsed: AdaptSpec = spec.parse().map_err(|e: iocache_sim::SimError| anyhow!("{e}"))?;
    let controller = match parsed.kind {
        AdaptKind::Lbica(c) => BalanceController::Lbica(c),
        AdaptKind::Sib(c) => BalanceController::Sib(c),
        AdaptKind::Observe => bail!(
            "`observe` is for the simulator; a serving cache shows its queues in `iocache stats` \
             without a controller (serve knows lbica and sib)"
        ),
    };
    let interval_ns = match (parsed.interval_ns, interval) {
        (Some(_), Some(flag)) => {
            bail!("`{spec}` gives an interval and so does the interval setting ({flag}): give one")
        }
        (Some(ns), None) => ns,
        (None, Some(text)) => {
            let ns = parse_duration_ns(text).map_err(|e| anyhow!("interval: {e}"))?;
            if ns == 0 {
                bail!("interval: must be positive");
            }
            ns
        }
        (None, None) => DEFAULT_ADAPT_INTERVAL_NS,
    };
    let name = spec.trim().split(':').next().unwrap_or("");
    Ok(Adapt {
        text: format!(
            "{}{} every {}",
            name,
            spec.trim()
                .split(':')
                .skip(1)
                .filter(|p| !p.starts_with("interval="))
                .map(|p| format!(":{p}"))
                .collect::<String>(),
            format_duration_ns(interval_ns)
        ),
        config: BalanceConfig {
            controller,
            interval_ns,
        },
    })
}

/// ReCA's window when none is given (the paper's).
pub const DEFAULT_RECA_WINDOW: u64 = 100_000;

/// A volume's settings as text, before validation: the command line's flags
/// and a `[[volume]]` table both become one of these.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeText {
    pub export: String,
    pub backend: String,
    #[serde(default)]
    pub backend_size: Option<SizeText>,
    #[serde(default)]
    pub backend_id: Option<String>,
    pub cache: PathBuf,
    #[serde(default)]
    pub cache_array: Vec<PathBuf>,
    #[serde(default = "default_mirror_percent")]
    pub mirror_percent: u32,
    #[serde(default)]
    pub cache_size: Option<SizeText>,
    #[serde(default)]
    pub cache_size_max: Option<SizeText>,
    #[serde(default = "default_line_size")]
    pub line_size: SizeText,
    #[serde(default = "default_write_policy")]
    pub write_policy: String,
    #[serde(default = "default_promotion")]
    pub promotion: String,
    #[serde(default = "default_policy")]
    pub policy: String,
    #[serde(default = "default_lookup")]
    pub lookup: String,
    #[serde(default = "default_flush")]
    pub flush: String,
    #[serde(default)]
    pub write_miss_bypass: bool,
    #[serde(default)]
    pub ordered_write_back: bool,
    /// A number of lines (or absent: no cap).
    #[serde(default)]
    pub max_dirty_lines: Option<u64>,
    #[serde(default = "default_seq_cutoff")]
    pub seq_cutoff: String,
    #[serde(default = "default_seq_cutoff")]
    pub readahead: String,
    #[serde(default = "default_fill")]
    pub fill: String,
    #[serde(default = "default_io_engine")]
    pub io_engine: String,
    #[serde(default)]
    pub direct: bool,
    #[serde(default = "default_persistence")]
    pub persistence: String,
    /// A duration with a unit (or absent: the engine's default, 60 s).
    #[serde(default)]
    pub clean_check_budget: Option<String>,
    /// A duration with a unit (or absent: the engine's default, 1 s; `0s`
    /// records only at FLUSH and FUA).
    #[serde(default)]
    pub commit_interval: Option<String>,
    /// A size (or absent: 0, write-back never reads the backend).
    #[serde(default)]
    pub write_back_gap: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    /// What a client's TRIM does: `passdown` (the default), `cache` or
    /// `ignore`.
    #[serde(default)]
    pub discard: Option<String>,
    /// An adaptive controller: `off`, `reca`, or a load balancer
    /// (`lbica` or `sib`, with `:KEY=VALUE` knobs).
    #[serde(default)]
    pub adapt: Option<String>,
    /// The load balancer's interval (a duration with a unit).
    #[serde(default)]
    pub adapt_interval: Option<String>,
    /// ReCA's category table (with `adapt = "reca"`).
    #[serde(default)]
    pub reca_table: Option<PathBuf>,
    /// ReCA's window in requests (with `adapt = "reca"`).
    #[serde(default)]
    pub reca_window: Option<u64>,
    /// When ReCA's line size is put in force: `live` or `next_start`.
    #[serde(default)]
    pub reca_line_size: Option<String>,
}

fn default_mirror_percent() -> u32 {
    25
}

/// Persistence when none is given: `all`, so a restart finds a warm cache
/// (as dm-cache and Open CAS do); its cost is measured in
/// docs/results/durability.md.
pub const DEFAULT_PERSISTENCE: &str = "all";

fn default_line_size() -> SizeText {
    SizeText("4KiB".into())
}

/// Serde's defaults of the keys whose default is a fixed string, one
/// function each as `#[serde(default = "...")]` takes them.
macro_rules! string_defaults {
    ($($name:ident => $value:expr),* $(,)?) => {
        $(fn $name() -> String {
            $value.into()
        })*
    };
}

string_defaults! {
    default_persistence => DEFAULT_PERSISTENCE,
    default_seq_cutoff => "off",
    default_fill => "request",
    default_io_engine => "auto",
    default_write_policy => "wb",
    default_promotion => "always",
    default_policy => "lru",
    default_lookup => "fine",
    default_flush => "nop",
}

/// A size: a string with a unit (`"128MiB"`) or, in TOML, an integer of bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeText(pub String);

impl<'de> Deserialize<'de> for SizeText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = SizeText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"128MiB\" or a number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SizeText, E> {
                Ok(SizeText(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SizeText, E> {
                Ok(SizeText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SizeText, E> {
                u64::try_from(v)
                    .map(|v| SizeText(v.to_string()))
                    .map_err(|_| E::custom(format!("a size cannot be negative ({v})")))
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// The `[server]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerText {
    socket: Option<PathBuf>,
    listen: Option<String>,
    admin_socket: Option<PathBuf>,
    metrics: Option<String>,
    pid_file: Option<PathBuf>,
    socket_group: Option<String>,
    max_connections_per_peer: Option<usize>,
    max_handshakes_per_peer: Option<usize>,
    threads_per_connection: Option<usize>,
    poll_before_sleep_us: Option<u64>,
    #[serde(default = "default_map_cache")]
    map_cache: bool,
    #[serde(default)]
    attach_dirs: Vec<PathBuf>,
    tls: Option<String>,
    tls_certificates: Option<PathBuf>,
    tls_psk: Option<PathBuf>,
    #[serde(default)]
    tls_verify_peer: bool,
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileText {
    #[serde(default)]
    server: ServerText,
    #[serde(default)]
    volume: Vec<VolumeText>,
    /// `[[cache]]` tables, read by [`declared_cache`].
    #[serde(default)]
    cache: Vec<toml::Table>,
}

impl VolumeText {
    /// Validates the settings of one volume and of the cache it names (as
    /// if only this volume described it).
    pub fn validate(self, origin: &Origin) -> Result<(VolumeConfig, CacheDeviceConfig)> {
        let owner = KeyOwner::Volume(self.export.clone());
        self.validate_as(origin, owner)
    }

    /// [`VolumeText::validate`], naming the keys as written in `owner`'s table.
    fn validate_as(self, origin: &Origin, owner: KeyOwner) -> Result<(VolumeConfig, CacheDeviceConfig)> {
        let key = |k: &str| origin.owned_key(&owner, k);
        if self.export.is_empty() {
            bail!(
                "{}: an export name cannot be empty (the first volume is also reachable under the empty name)",
                key("export")
            );
        }
        if self.export.len() > 4096 || self.export.contains('\0') {
            bail!("{}: longer than 4096 bytes or containing NUL", key("export"));
        }
        if self.backend.is_empty() {
            bail!("{}: empty", key("backend"));
        }
        if self.cache.as_os_str().is_empty() {
            bail!("{}: empty", key("cache"));
        }
        if let Some(i) = self.cache_array.iter().position(|p| p.as_os_str().is_empty()) {
            bail!("{}: entry {} is empty", key("cache_array"), i + 1);
        }
        if self.cache_array.len() + 1 > iocache_engine::RAID_MEMBERS_MAX {
            bail!(
                "{}: {} devices with `cache`; an array has at most {}",
                key("cache_array"),
                self.cache_array.len() + 1,
                iocache_engine::RAID_MEMBERS_MAX
            );
        }
        if !(1..=50).contains(&self.mirror_percent) {
            bail!(
                "{}: {} is outside 1..=50 (percent of each array device kept for mirrors of dirty lines)",
                key("mirror_percent"),
                self.mirror_percent
            );
        }
        if !self.cache_array.is_empty() && self.cache_size.is_some() {
            bail!(
                "{}: a cache array uses its devices whole (with {}); leave it out",
                key("cache_size"),
                key("cache_array")
            );
        }
        let size = |k: &str, text: &SizeText| -> Result<u64> {
            parse_byte_size(&text.0).map_err(|e| anyhow!("{}: {e}", key(k)))
        };
        let backend_create_bytes = self
            .backend_size
            .as_ref()
            .map(|t| size("backend_size", t))
            .transpose()?;
        if backend_create_bytes.is_some() && is_nbd_uri(&self.backend) {
            bail!(
                "{}: only for a backend file; `{}` is an NBD export",
                key("backend_size"),
                self.backend
            );
        }
        if backend_create_bytes == Some(0) {
            bail!("{}: a backend cannot be empty", key("backend_size"));
        }
        let cache_bytes = self
            .cache_size
            .as_ref()
            .map(|t| size("cache_size", t))
            .transpose()?;
        let line_size = LineSize::new(size("line_size", &self.line_size)?)
            .map_err(|e| anyhow!("{}: {e}", key("line_size")))?;
        if let Some(bytes) = cache_bytes {
            if bytes < line_size.bytes() {
                bail!(
                    "{}: {} holds no line of {}",
                    key("cache_size"),
                    format_byte_size(bytes),
                    format_byte_size(line_size.bytes())
                );
            }
        }
        let cache_max_bytes = match (&self.cache_size_max, cache_bytes) {
            (None, _) => None,
            (Some(_), None) => bail!("{}: only with {}", key("cache_size_max"), key("cache_size")),
            (Some(t), Some(bytes)) => match size("cache_size_max", t)? {
                max if max < bytes => bail!(
                    "{}: {} is less than {} ({})",
                    key("cache_size_max"),
                    format_byte_size(max),
                    key("cache_size"),
                    format_byte_size(bytes)
                ),
                max => Some(max),
            },
        };
        // The parse errors quote the value they reject.
        let parse = |k: &str| key(k) + ": ";
        let write_policy: WritePolicy = self
            .write_policy
            .parse()
            .map_err(|e| anyhow!("{}{e}", parse("write_policy")))?;
        let promotion: Promotion = self
            .promotion
            .parse()
            .map_err(|e| anyhow!("{}{e}", parse("promotion")))?;
        let policy: PolicySpec = self
            .policy
            .parse()
            .map_err(|e| anyhow!("{}{e}", parse("policy")))?;
        let lookup: Lookup = self
            .lookup
            .parse()
            .map_err(|e| anyhow!("{}{e}", parse("lookup")))?;
        let cleaning: CleaningPolicy = self.flush.parse().map_err(|e| anyhow!("{}{e}", parse("flush")))?;
        // `auto`: io_uring batches where they pay (O_DIRECT devices: about 2x the
        // psync throughput at batch 16 in devbench), psync for buffered files.
        let io_auto = self.io_engine.trim() == "auto";
        let io: IoMode = match self.io_engine.trim() {
            "auto" if self.direct => IoMode::Uring,
            "auto" => IoMode::Psync,
            other => other.parse().map_err(|e| anyhow!("{}{e}", parse("io_engine")))?,
        };
        let seq_cutoff: SeqCutoff = self
            .seq_cutoff
            .parse()
            .map_err(|e| anyhow!("{}{e}", parse("seq_cutoff")))?;
        let readahead: Readahead = self
            .readahead
            .parse()
            .map_err(|e| anyhow!("{}{e}", parse("readahead")))?;
        let fill: Fill = self.fill.parse().map_err(|e| anyhow!("{}{e}", parse("fill")))?;
        let persistence: Persistence = self
            .persistence
            .parse()
            .map_err(|e| anyhow!("{}{e}", parse("persistence")))?;
        let commit_interval_ns = match self.commit_interval.as_deref() {
            None => iocache_engine::DEFAULT_COMMIT_INTERVAL.as_nanos() as u64,
            Some(text) => parse_duration_ns(text).map_err(|e| anyhow!("{}{e}", parse("commit_interval")))?,
        };
        let write_back_gap_bytes = match self.write_back_gap.as_deref() {
            None => 0,
            Some(text) => parse_byte_size(text).map_err(|e| anyhow!("{}{e}", parse("write_back_gap")))?,
        };
        let clean_check_budget_ns = match self.clean_check_budget.as_deref() {
            None => iocache_engine::DEFAULT_CLEAN_CHECK_BUDGET.as_nanos() as u64,
            Some(text) => {
                parse_duration_ns(text).map_err(|e| anyhow!("{}{e}", parse("clean_check_budget")))?
            }
        };
        // One controller at a time: `reca` or a load balancer.
        let adapt_text = self.adapt.as_deref().map_or("off", str::trim);
        let reca = match adapt_text {
            "reca" => {
                let window_requests = self.reca_window.unwrap_or(DEFAULT_RECA_WINDOW);
                if window_requests == 0 {
                    bail!("{}: a window holds at least 1 request", key("reca_window"));
                }
                let line_size_live = match self.reca_line_size.as_deref().map(str::trim) {
                    None | Some("live") => true,
                    Some("next_start") => false,
                    Some(other) => bail!("{}: `{other}` is not live or next_start", key("reca_line_size")),
                };
                Some(RecaConfig {
                    table: self.reca_table,
                    window_requests,
                    line_size_live,
                })
            }
            _ => {
                if self.reca_table.is_some() || self.reca_window.is_some() || self.reca_line_size.is_some() {
                    bail!(
                        "{}: only with ReCA ({} reca)",
                        key(if self.reca_table.is_some() {
                            "reca_table"
                        } else if self.reca_window.is_some() {
                            "reca_window"
                        } else {
                            "reca_line_size"
                        }),
                        key("adapt")
                    );
                }
                None
            }
        };
        if reca.is_some() && cache_max_bytes.is_some() {
            bail!(
                "{}: not with ReCA ({} reca), which formats the cache anew when it changes the line size",
                key("cache_size_max"),
                key("adapt")
            );
        }
        let adapt = match (adapt_text, &self.adapt_interval) {
            ("off" | "reca", Some(_)) => bail!(
                "{}: only with a load balancer ({} lbica or sib)",
                key("adapt_interval"),
                key("adapt")
            ),
            ("off" | "reca", None) => None,
            (spec, _) if !matches!(spec.split(':').next(), Some("lbica" | "sib")) => bail!(
                "{}: unknown controller `{spec}`; expected off, reca, lbica[:KEY=VALUE...] or sib[:KEY=VALUE...]",
                key("adapt")
            ),
            (spec, interval) => Some(parse_adapt(spec, interval.as_deref()).map_err(|e| anyhow!("{}{e}", parse("adapt")))?),
        };
        let backend_id = match self.backend_id {
            Some(id) if id.trim().is_empty() || id.len() > 255 => {
                bail!("{}: 1 to 255 bytes, not `{id}`", key("backend_id"))
            }
            other => other,
        };
        let discard = match self.discard.as_deref() {
            None => DiscardMode::default(),
            Some(text) => text.parse().map_err(|e| anyhow!("{}{e}", parse("discard")))?,
        };
        let volume = VolumeConfig {
            origin: origin.clone(),
            export: self.export,
            backend: self.backend,
            backend_create_bytes,
            backend_id,
            cache: 0,
            read_only: self.read_only,
            discard,
        };
        let cache = CacheDeviceConfig {
            origin: origin.clone(),
            owner,
            path: self.cache,
            cache_array: self.cache_array,
            mirror_percent: self.mirror_percent,
            cache_bytes,
            cache_max_bytes,
            line_size,
            write_policy,
            promotion,
            policy,
            lookup,
            cleaning,
            write_miss_bypass: self.write_miss_bypass,
            ordered_write_back: self.ordered_write_back,
            seq_cutoff,
            readahead,
            fill,
            max_dirty_lines: self.max_dirty_lines,
            io,
            io_auto,
            direct: self.direct,
            persistence,
            clean_check_budget_ns,
            commit_interval_ns,
            write_back_gap_bytes,
            reca,
            adapt,
            slow_cache: None,
        };
        Ok((volume, cache))
    }
}

/// A `[[cache]]` table (the `n`th): its `path` and keys of [`CACHE_KEYS`].
fn declared_cache(origin: &str, o: &Origin, n: usize, table: &toml::Table) -> Result<CacheDeviceConfig> {
    let Some(path) = table.get("path").and_then(toml::Value::as_str) else {
        bail!(
            "{origin}: cache {}: path: required (the cache device, as volumes name it with `cache`)",
            n + 1
        );
    };
    let owner = KeyOwner::Cache(path.to_string());
    for key in table.keys().filter(|k| *k != "path") {
        if CACHE_KEYS.iter().any(|(k, _)| k == key) {
            continue;
        }
        let why = if VOLUME_KEYS.contains(&key.as_str()) {
            "a key of a volume, written in its [[volume]] table"
        } else {
            "not a key of a cache"
        };
        let known: Vec<&str> = CACHE_KEYS.iter().map(|(k, _)| *k).collect();
        bail!(
            "{}: {why}; the keys of a cache are path, {}",
            o.owned_key(&owner, key),
            known.join(", ")
        );
    }
    // Validated as a volume's cache keys are, with the volume's own keys
    // standing in.
    let mut volume = table.clone();
    volume.remove("path");
    volume.insert("export".into(), path.into());
    volume.insert("backend".into(), "-".into());
    volume.insert("cache".into(), path.into());
    let text: VolumeText = toml::Value::Table(volume)
        .try_into()
        .map_err(|e| anyhow!("{origin}: cache `{path}`: {e}"))?;
    Ok(text.validate_as(o, owner)?.1)
}

/// The caches of a file's volumes, each once, and the volumes referring to
/// them. A cache with a `[[cache]]` table is described there alone; the
/// others by their volumes (volumes naming the same `cache` path share it).
fn caches_of(
    origin: &str,
    o: &Origin,
    declared: Vec<CacheDeviceConfig>,
    validated: Vec<(VolumeConfig, CacheDeviceConfig)>,
    tables: &[toml::Table],
) -> Result<(Vec<CacheDeviceConfig>, Vec<VolumeConfig>)> {
    let declared_paths: Vec<PathBuf> = declared.iter().map(|c| normalize(&c.path)).collect();
    if let Some(i) = (1..declared_paths.len()).find(|&i| declared_paths[..i].contains(&declared_paths[i])) {
        bail!(
            "{}: a second [[cache]] table for the same device",
            declared[i].key("path")
        );
    }
    let mut declared: Vec<Option<CacheDeviceConfig>> = declared.into_iter().map(Some).collect();
    let mut groups: Vec<(PathBuf, Vec<usize>)> = Vec::new();
    for (i, (_, c)) in validated.iter().enumerate() {
        let path = normalize(&c.path);
        match groups.iter_mut().find(|(p, _)| *p == path) {
            Some((_, members)) => members.push(i),
            None => groups.push((path, vec![i])),
        }
    }
    let wrote = |i: usize, key: &str| tables.get(i).is_some_and(|t| t.contains_key(key));
    let mut caches = Vec::new();
    let mut cache_of = vec![0; validated.len()];
    for (path, members) in &groups {
        let cache = match declared_paths.iter().position(|p| p == path) {
            Some(d) => {
                for &i in members {
                    if let Some((key, _)) = CACHE_KEYS.iter().find(|(k, _)| wrote(i, k)) {
                        bail!(
                            "{}: the cache {} has its own [[cache]] table; write its keys there",
                            validated[i].0.key(key),
                            path.display()
                        );
                    }
                }
                declared[d].take().expect("one table per device")
            }
            None if members.len() == 1 => validated[members[0]].1.clone(),
            None => shared_cache(origin, o, path, members, &validated, tables)?,
        };
        for &i in members {
            cache_of[i] = caches.len();
        }
        caches.push(cache);
    }
    if let Some(unused) = declared.into_iter().flatten().next() {
        bail!(
            "{}: no volume names this cache (with `cache = \"{}\"` in its [[volume]] table)",
            unused.key("path"),
            unused.path.display()
        );
    }
    let volumes = (validated.into_iter().zip(cache_of))
        .map(|((mut volume, _), cache)| {
            volume.cache = cache;
            volume
        })
        .collect();
    Ok((caches, volumes))
}

/// The cache that several volumes describe: each key of [`CACHE_KEYS`]
/// takes the value of the first volume that writes it, and every other
/// volume writing it must write the same value.
fn shared_cache(
    origin: &str,
    o: &Origin,
    path: &Path,
    members: &[usize],
    validated: &[(VolumeConfig, CacheDeviceConfig)],
    tables: &[toml::Table],
) -> Result<CacheDeviceConfig> {
    let mut merged = tables[members[0]].clone();
    for (key, text) in CACHE_KEYS {
        let writers: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&i| tables[i].contains_key(key))
            .collect();
        let Some(&writer) = writers.first() else {
            continue;
        };
        let value = text(&validated[writer].1);
        for &other in &writers[1..] {
            let theirs = text(&validated[other].1);
            if theirs != value {
                bail!(
                    "{origin}: volumes `{}` and `{}` share the cache {} but disagree on {key}: `{value}` and \
                     `{theirs}`; a key of a shared cache is written once, or with the same value in each volume",
                    validated[writer].0.export,
                    validated[other].0.export,
                    path.display()
                );
            }
        }
        merged.insert(key.to_string(), tables[writer][key].clone());
    }
    let text: VolumeText = toml::Value::Table(merged)
        .try_into()
        .map_err(|e| anyhow!("{origin}: {e}"))?;
    Ok(text.validate(o)?.1)
}

/// Parses a listener address.
pub fn parse_listen(text: &str, name: &str) -> Result<SocketAddr> {
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    // A host name (`localhost:10809`): its first address.
    use std::net::ToSocketAddrs;
    match text.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(address)) => Ok(address),
        _ => bail!(
            "{name}: `{text}`: expected ADDR:PORT or HOST:PORT, such as 127.0.0.1:10809 or localhost:10809"
        ),
    }
}

/// [`parse_listen`] of an address that may be absent.
pub fn parse_optional_listen(text: Option<&str>, name: &str) -> Result<Option<SocketAddr>> {
    text.map(|t| parse_listen(t, name)).transpose()
}

/// Reads and validates a TOML configuration file.
pub fn from_file(path: &Path) -> Result<ServeConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--config {}", path.display()))?;
    from_toml_str(&text, &path.display().to_string())
}

/// Parses and validates a TOML configuration; `origin` (the file's path)
/// prefixes every error. Opens nothing.
pub fn from_toml_str(text: &str, origin: &str) -> Result<ServeConfig> {
    let file: FileText =
        toml::from_str(text).map_err(|e| anyhow!("{origin}: {}", e.to_string().trim_end()))?;
    // The [[volume]] tables as written (the typed parse above filled in
    // defaults): volumes sharing a cache take its keys from whichever of
    // them writes them.
    let raw: toml::Table = toml::from_str(text).map_err(|e| anyhow!("{origin}: {e}"))?;
    let tables: Vec<toml::Table> = raw
        .get("volume")
        .and_then(|v| v.as_array())
        .map(|tables| {
            (tables.iter())
                .map(|t| t.as_table().cloned().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    let o = Origin::File(origin.to_string());
    let listen = parse_optional_listen(file.server.listen.as_deref(), &o.server_key("listen"))?;
    if file.server.socket.is_none() && listen.is_none() {
        bail!("{origin}: server: no listener: set server.socket (a Unix socket) and/or server.listen (ADDR:PORT)");
    }
    if file.volume.is_empty() {
        bail!("{origin}: no volume: add at least one [[volume]] table with export, backend and cache");
    }
    let validated = file
        .volume
        .into_iter()
        .map(|v| v.validate(&o))
        .collect::<Result<Vec<_>>>()?;
    let declared = (file.cache.iter().enumerate())
        .map(|(n, table)| declared_cache(origin, &o, n, table))
        .collect::<Result<Vec<_>>>()?;
    let (caches, volumes) = caches_of(origin, &o, declared, validated, &tables)?;
    let tls = file
        .server
        .tls
        .as_deref()
        .map(|t| {
            t.parse()
                .map_err(|e| anyhow::anyhow!("{}: {e}", o.server_key("tls")))
        })
        .transpose()?
        .unwrap_or_default();
    let metrics = parse_optional_listen(file.server.metrics.as_deref(), &o.server_key("metrics"))?;
    check(ServeConfig {
        origin: o,
        socket: file.server.socket,
        listen,
        admin_socket: file.server.admin_socket,
        metrics,
        pid_file: file.server.pid_file,
        tls,
        tls_certificates: file.server.tls_certificates,
        tls_psk: file.server.tls_psk,
        tls_verify_peer: file.server.tls_verify_peer,
        socket_group: file.server.socket_group,
        max_connections_per_peer: file.server.max_connections_per_peer,
        max_handshakes_per_peer: file.server.max_handshakes_per_peer,
        threads_per_connection: file.server.threads_per_connection,
        poll_before_sleep_us: file.server.poll_before_sleep_us,
        map_cache: file.server.map_cache,
        attach_dirs: file.server.attach_dirs,
        private_dir: None,
        caches,
        volumes,
    })
}

/// Checks what concerns several volumes or the server: unique exports,
/// no file both a cache and a backend, no backend used twice, sockets
/// apart.
pub fn check(config: ServeConfig) -> Result<ServeConfig> {
    if config.socket.is_none() && config.listen.is_none() {
        bail!("no listener: give a Unix socket and/or a TCP address");
    }
    let server = iocache_nbd::ServerConfig::default();
    let limits = [
        (
            "max_connections_per_peer",
            config.max_connections_per_peer,
            server.max_connections,
            "the connections a listener serves at once",
        ),
        (
            "max_handshakes_per_peer",
            config.max_handshakes_per_peer,
            server.max_handshakes,
            "the handshakes a listener serves at once",
        ),
        (
            "threads_per_connection",
            config.threads_per_connection,
            THREADS_PER_CONNECTION_MAX,
            "the threads a connection may have",
        ),
    ];
    for (key, value, most, what) in limits {
        if let Some(n) = value.filter(|n| !(1..=most).contains(n)) {
            bail!(
                "{}: {n} is not between 1 and {most} ({what})",
                config.origin.server_key(key)
            );
        }
    }
    if let Some(us) = config
        .poll_before_sleep_us
        .filter(|&us| us > POLL_BEFORE_SLEEP_US_MAX)
    {
        bail!(
            "{}: {us} is above {POLL_BEFORE_SLEEP_US_MAX} (microseconds a reader polls before it sleeps)",
            config.origin.server_key("poll_before_sleep_us")
        );
    }
    let mut exports: HashSet<&str> = HashSet::new();
    // Every file a volume opens: normalized path -> (volume, role).
    let mut files: HashMap<PathBuf, (&str, &str)> = HashMap::new();
    for v in &config.volumes {
        if !exports.insert(&v.export) {
            bail!(
                "{}: `{}` names two volumes; export names must be unique",
                v.key("export"),
                v.export
            );
        }
        let mut uses = vec![(normalize(&config.caches[v.cache].path), "cache")];
        if !v.backend_is_nbd() {
            uses.push((normalize(Path::new(&v.backend)), "backend"));
        }
        for (path, role) in uses {
            if let Some((other, other_role)) = files.get(&path) {
                if role == "cache" && *other_role == "cache" {
                    // A shared cache device (its keys were unified).
                    continue;
                }
                let whose = if *other == v.export.as_str() {
                    "this volume's".to_string()
                } else {
                    format!("volume `{other}`'s")
                };
                let why = if role == "cache" || *other_role == "cache" {
                    "a file cannot be both a cache device and a backend"
                } else {
                    "two volumes cannot share a backend"
                };
                bail!(
                    "{}: {} is also {whose} {other_role}; {why}",
                    v.key(role),
                    path.display()
                );
            }
            files.insert(path, (&v.export, role));
        }
    }
    let sockets = [
        ("socket", config.socket.as_ref()),
        ("admin_socket", config.admin_socket.as_ref()),
    ];
    if let (Some(a), Some(b)) = (sockets[0].1, sockets[1].1) {
        if normalize(a) == normalize(b) {
            bail!(
                "{}: {} is also the NBD socket",
                config.origin.server_key("admin_socket"),
                b.display()
            );
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests;
