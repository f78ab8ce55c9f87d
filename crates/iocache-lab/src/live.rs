//! The lab's live target (docs/lab.md
//! "Live target"). The same experiment points that `lab run` simulates are
//! run against the real engine: for each point this starts `iocache serve`
//! (this very binary) with the point's configuration on a cache file and a
//! backend file, drives it with fio over NBD (fio's nbd engine on the Unix
//! socket) using the job `iocache gen` writes for the workload's spec, and
//! returns fio's IOPS, MB/s and latency percentiles beside the server's own
//! hit ratio. `measure` is also what `lab reproduce asplos23-live` runs.
//! Every server (and nbdkit backend) started here is stopped when its point
//! ends, on error and on Ctrl-C alike (the guards' `Drop`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{invalid, LabError, Result, Within};
use iocache_core::units::{parse_byte_size, parse_duration_ns};
use iocache_sim::workload::WorkloadSpec;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::tool;

/// The server a live run starts, and the flag that stops it.
#[derive(Clone, Copy)]
pub struct Server<'a> {
    /// The `iocache` program (`iocache serve` runs each point).
    pub program: &'a Path,
    /// Set (by a signal handler) to stop between steps.
    pub stop: &'a AtomicBool,
}

/// Which engines an experiment targets (`target = ["sim", "live"]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Targets {
    pub sim: bool,
    pub live: bool,
}

/// Reads `target`: absent means the simulator only.
pub fn targets(list: Option<&[String]>, file: &str) -> Result<Targets> {
    let Some(list) = list else {
        return Ok(Targets {
            sim: true,
            live: false,
        });
    };
    let mut t = Targets {
        sim: false,
        live: false,
    };
    for name in list {
        match name.as_str() {
            "sim" => t.sim = true,
            "live" => t.live = true,
            other => return Err(invalid!("{file}: target: `{other}` is not a target (sim, live)")),
        }
    }
    if !(t.sim || t.live) {
        return Err(invalid!(
            "{file}: target: an empty list (give \"sim\", \"live\" or both)"
        ));
    }
    Ok(t)
}

/// The `[live]` section: how points are run against `iocache serve`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveSettings {
    /// Where each point's cache file goes (a RAM disk by default).
    #[serde(default = "default_dir")]
    pub dir: PathBuf,
    /// Where each point's backend file goes [default: `dir`].
    #[serde(default)]
    pub backend_dir: Option<PathBuf>,
    /// How long fio drives each phase of the workload after warm-up.
    #[serde(default = "default_duration")]
    pub duration: String,
    /// How long the same job runs first, unmeasured, to warm the cache
    /// ("0s": measure a cold cache).
    #[serde(default = "default_warmup")]
    pub warmup: String,
    /// fio's iodepth (requests in flight).
    #[serde(default = "default_iodepth")]
    pub iodepth: u32,
    /// "max": closed loop at `iodepth`, as fast as the server answers;
    /// "spec": the spec's request rate (fio's rate_iops).
    #[serde(default = "default_rate")]
    pub rate: String,
    /// A delay per backend request (whole milliseconds, e.g. "1ms"): the
    /// backend is then served by nbdkit's file plugin with its delay filter.
    #[serde(default)]
    pub backend_delay: Option<String>,
    /// `iocache serve --slow-cache` (LATENCY[:servers=N]): a slower cache device.
    #[serde(default)]
    pub slow_cache: Option<String>,
    /// `iocache serve --adapt` (reca, lbica, sib[:...]).
    #[serde(default)]
    pub adapt: Option<String>,
    /// `iocache serve --lookup` (fine, coarse, single).
    #[serde(default = "default_lookup")]
    pub lookup: String,
    /// The fio program.
    #[serde(default = "default_fio")]
    pub fio: PathBuf,
}

fn default_dir() -> PathBuf {
    PathBuf::from("/dev/shm")
}
fn default_duration() -> String {
    "5s".into()
}
fn default_warmup() -> String {
    "2s".into()
}
fn default_iodepth() -> u32 {
    16
}
fn default_rate() -> String {
    "max".into()
}
fn default_lookup() -> String {
    "fine".into()
}
fn default_fio() -> PathBuf {
    PathBuf::from("fio")
}

impl Default for LiveSettings {
    fn default() -> Self {
        toml::from_str("").expect("every key has a default")
    }
}

impl LiveSettings {
    /// Checks the values (before any server starts), naming the key.
    pub fn check(&self, file: &str) -> Result<()> {
        let at = |key: &str, e: String| invalid!("{file}: live.{key}: {e}");
        seconds(&self.duration).map_err(|e| at("duration", e.to_string()))?;
        seconds(&self.warmup).map_err(|e| at("warmup", e.to_string()))?;
        if seconds(&self.duration)? < 1 {
            return Err(at("duration", "at least 1s".into()));
        }
        if self.iodepth == 0 || self.iodepth > 1024 {
            return Err(at("iodepth", format!("{}: 1 to 1024", self.iodepth)));
        }
        if !matches!(self.rate.as_str(), "max" | "spec") {
            return Err(at("rate", format!("`{}`: max or spec", self.rate)));
        }
        if let Some(d) = &self.backend_delay {
            delay_ms(d).map_err(|e| at("backend_delay", e.to_string()))?;
        }
        Ok(())
    }
}

/// Whole seconds of a duration ("5s", "1500ms" rounds up).
fn seconds(text: &str) -> Result<u64> {
    let ns = parse_duration_ns(text)?;
    Ok(ns.div_ceil(1_000_000_000))
}

/// nbdkit's delay filter takes whole milliseconds.
fn delay_ms(text: &str) -> Result<u64> {
    let ns = parse_duration_ns(text)?;
    if ns == 0 || ns % 1_000_000 != 0 {
        return Err(invalid!(
            "`{text}`: whole milliseconds above 0 (nbdkit's delay filter takes NNms)"
        ));
    }
    Ok(ns / 1_000_000)
}

/// fio must be there before anything starts.
pub fn check_fio(fio: &Path) -> Result<String> {
    let out = Command::new(fio)
        .arg("--version")
        .output()
        .map_err(|e| {
            tool!(
                "the live target needs fio (`{}`: {e}); install it (apt-get install fio) or name it with live.fio",
                fio.display()
            )
        })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One side (reads or writes) of a live measurement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Side {
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    pub mbps: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p99_9_ns: u64,
    pub p99_99_ns: u64,
}

/// What one measured fio run against a server gave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    pub read: Side,
    pub write: Side,
    /// fio's runtime over every phase, in seconds.
    pub seconds: f64,
    /// The server's full line hits and line accesses during the run.
    pub hits: u64,
    pub accesses: u64,
    pub promotions: u64,
}

impl Measured {
    pub fn iops(&self) -> f64 {
        self.read.iops + self.write.iops
    }

    pub fn hit_ratio(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            self.hits as f64 / self.accesses as f64
        }
    }

    /// The row's measured columns.
    pub fn columns(&self) -> Value {
        let mut map = serde_json::Map::new();
        for (name, s) in [("read", &self.read), ("write", &self.write)] {
            map.insert(format!("{name}_ios"), json!(s.ios));
            map.insert(format!("{name}_iops"), json!(s.iops));
            map.insert(format!("{name}_mbps"), json!(s.mbps));
            map.insert(format!("{name}_p50_ns"), json!(s.p50_ns));
            map.insert(format!("{name}_p99_ns"), json!(s.p99_ns));
            map.insert(format!("{name}_p999_ns"), json!(s.p99_9_ns));
            map.insert(format!("{name}_p9999_ns"), json!(s.p99_99_ns));
        }
        map.insert("iops".into(), json!(self.iops()));
        map.insert("mbps".into(), json!(self.read.mbps + self.write.mbps));
        map.insert("accesses".into(), json!(self.accesses));
        map.insert("hits".into(), json!(self.hits));
        map.insert("hit_ratio".into(), json!(self.hit_ratio()));
        map.insert("promotions".into(), json!(self.promotions));
        map.insert("seconds".into(), json!(self.seconds));
        Value::Object(map)
    }
}

/// The cache configuration of one live run, as `iocache serve` flags.
#[derive(Clone, Debug)]
pub struct ServeSetup {
    pub policy: String,
    pub cache_bytes: u64,
    pub line_bytes: u64,
    pub write_policy: String,
    pub promotion: String,
    pub flush: String,
    pub write_miss_bypass: bool,
    pub seq_cutoff: String,
    pub readahead: String,
    pub fill: String,
    /// `--adapt` and, for ReCA, `--reca-window` and `--reca-table`.
    pub adapt: Option<String>,
    pub reca_window: Option<String>,
    pub reca_table: Option<PathBuf>,
}

impl ServeSetup {
    /// From a lab point's knobs (the names of the `[grid]` keys; a ReCA
    /// table's path is relative to `dir`, the experiment's directory). The
    /// grid's `adapt` goes to `serve --adapt` (`observe`, which only
    /// watches, is none); the simulator-only knobs (devices, speed, closed
    /// loop, warmup, restarts) have no live counterpart.
    pub fn from_knobs(
        knobs: &BTreeMap<&'static str, String>,
        cache_lines: u64,
        line_bytes: u64,
        dir: &Path,
    ) -> ServeSetup {
        let knob = |k: &str, default: &str| knobs.get(k).cloned().unwrap_or_else(|| default.to_string());
        let adapt = knobs
            .get("adapt")
            .filter(|a| !matches!(a.as_str(), "none" | "off" | "observe") && !a.starts_with("observe:"))
            .cloned();
        let reca = adapt.as_deref() == Some("reca");
        ServeSetup {
            adapt,
            reca_window: knobs.get("reca_window").filter(|_| reca).cloned(),
            reca_table: knobs
                .get("reca_table")
                .filter(|t| reca && t.as_str() != iocache_core::reca::BUILTIN_TABLE_SOURCE)
                .map(|t| dir.join(t)),
            policy: knob("policy", "lru"),
            cache_bytes: cache_lines * line_bytes,
            line_bytes,
            write_policy: knob("write_policy", "wb"),
            promotion: knob("promotion", "always"),
            flush: knob("flush", "nop"),
            write_miss_bypass: knob("write_miss_bypass", "false") == "true",
            seq_cutoff: knob("seq_cutoff", "off"),
            readahead: knob("readahead", "off"),
            fill: knob("fill", "request"),
        }
    }

    fn flags(&self) -> Vec<String> {
        let mut f = vec![
            "--policy".into(),
            self.policy.clone(),
            "--cache-size".into(),
            format!("{}B", self.cache_bytes),
            "--line-size".into(),
            format!("{}B", self.line_bytes),
            "--write-policy".into(),
            self.write_policy.clone(),
            "--promotion".into(),
            self.promotion.clone(),
            "--flush".into(),
            self.flush.clone(),
            "--seq-cutoff".into(),
            self.seq_cutoff.clone(),
        ];
        if self.write_miss_bypass {
            f.push("--write-miss-bypass".into());
        }
        if self.readahead != "off" {
            f.extend(["--readahead".into(), self.readahead.clone()]);
        }
        if self.fill != "request" {
            f.extend(["--fill".into(), self.fill.clone()]);
        }
        if let Some(adapt) = &self.adapt {
            f.extend(["--adapt".into(), adapt.clone()]);
        }
        if let Some(window) = &self.reca_window {
            f.extend(["--reca-window".into(), window.clone()]);
        }
        if let Some(table) = &self.reca_table {
            f.extend(["--reca-table".into(), table.display().to_string()]);
        }
        f
    }
}

/// A child process stopped when dropped: SIGTERM (a server writes dirty
/// lines back and exits), then SIGKILL after a grace period.
struct Guard {
    child: Option<Child>,
    what: String,
}

impl Guard {
    /// Stops the child (if it still runs) and returns how it exited
    /// (`None`: it was stopped already).
    fn stop(&mut self) -> Result<Option<std::process::ExitStatus>> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        // SAFETY: kill(2) on the id of a child we have not reaped yet.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(Some(status));
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(tool!("{} did not stop within 60 s of SIGTERM: killed", self.what));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::warn!("{e}");
        }
    }
}

/// A directory of one run's files (cache, backend, sockets, logs),
/// removed when dropped.
pub(crate) struct WorkDir(PathBuf);

impl WorkDir {
    pub(crate) fn new(parent: &Path, prefix: &str) -> Result<WorkDir> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = parent.join(format!("{prefix}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).at_file(&path)?;
        Ok(WorkDir(path))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The last lines of a log file, for an error message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

fn interrupted(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        return Err(LabError::Interrupted);
    }
    Ok(())
}

/// Waits, while `guard`'s process runs and for at most 60 s, until
/// `ready` says it is done (`Err` says why not yet). `goal` completes
/// "did not ..." in the error, e.g. "open /path/nbd.sock".
fn wait_until(
    stop: &AtomicBool,
    guard: &mut Guard,
    log: &Path,
    goal: &str,
    mut ready: impl FnMut() -> std::result::Result<(), String>,
) -> Result<()> {
    let started = Instant::now();
    loop {
        interrupted(stop)?;
        let not_yet = match ready() {
            Ok(()) => return Ok(()),
            Err(why) => why,
        };
        let child = guard.child.as_mut().expect("running");
        if let Some(status) = child.try_wait()? {
            return Err(tool!(
                "{} exited ({status}) before it could {goal}:\n{}",
                guard.what,
                tail(log)
            ));
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(tool!(
                "{} did not {goal} within 60 s ({not_yet}):\n{}",
                guard.what,
                tail(log)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a Unix socket to appear while its process runs.
fn wait_socket(stop: &AtomicBool, socket: &Path, guard: &mut Guard, log: &Path) -> Result<()> {
    wait_until(
        stop,
        guard,
        log,
        &format!("open {}", socket.display()),
        || match socket.exists() {
            true => Ok(()),
            false => Err("no such file".into()),
        },
    )
}

/// Runs a command to its end, stopping it on Ctrl-C.
fn run_to_end(stop: &AtomicBool, mut command: Command, what: &str) -> Result<std::process::ExitStatus> {
    let child = command.spawn().within(|| format!("starting {what}"))?;
    let mut guard = Guard {
        child: Some(child),
        what: what.to_string(),
    };
    loop {
        interrupted(stop)?;
        if let Some(status) = guard.child.as_mut().expect("running").try_wait()? {
            guard.child = None;
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The fio job for a spec, run closed loop (or at the spec's rate) for
/// `seconds` per phase at `iodepth`, against `uri`.
pub fn fio_job(spec: &WorkloadSpec, uri: &str, seconds: u64, settings: &LiveSettings) -> Result<String> {
    let job = spec.fio_job(uri)?;
    let mut out = String::new();
    for line in job.lines() {
        let drop = line.starts_with("number_ios=")
            || line.starts_with("time_based=")
            || (settings.rate == "max" && line.starts_with("rate_iops="));
        if !drop {
            out += line;
            out += "\n";
        }
        if line == "[global]" {
            out += &format!(
                "time_based=1\nruntime={seconds}\niodepth={}\npercentile_list=50:99:99.9:99.99\n",
                settings.iodepth
            );
        }
    }
    Ok(out)
}

/// Percentile `p` (0-100) of fio's latency bins (ns → count).
fn percentile(bins: &BTreeMap<u64, u64>, p: f64) -> u64 {
    let total: u64 = bins.values().sum();
    if total == 0 {
        return 0;
    }
    let want = (p / 100.0 * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (&ns, &n) in bins {
        seen += n;
        if seen >= want {
            return ns;
        }
    }
    *bins.keys().next_back().unwrap_or(&0)
}

/// Reads fio's `json+` output: every job (phase) joined, each side's
/// latency percentiles from the merged completion-latency bins.
pub fn parse_fio(text: &str) -> Result<Measured> {
    // fio may print notes before the JSON object.
    let start = text.find('{').ok_or_else(|| invalid!("fio printed no JSON"))?;
    let json: Value = serde_json::from_str(&text[start..]).within(|| "fio's JSON output".to_string())?;
    let jobs = json["jobs"]
        .as_array()
        .filter(|j| !j.is_empty())
        .ok_or_else(|| invalid!("fio's JSON has no jobs"))?;
    let mut m = Measured::default();
    let mut runtime_ms = 0u64;
    let mut bins: [BTreeMap<u64, u64>; 2] = Default::default();
    for job in jobs {
        let name = job["jobname"].as_str().unwrap_or("?");
        if job["error"].as_i64().unwrap_or(0) != 0 {
            return Err(invalid!("fio job `{name}` failed: error {}", job["error"]));
        }
        runtime_ms += job["job_runtime"].as_u64().unwrap_or(0);
        for (i, kind) in ["read", "write"].into_iter().enumerate() {
            let k = &job[kind];
            let side = if i == 0 { &mut m.read } else { &mut m.write };
            side.ios += k["total_ios"].as_u64().unwrap_or(0);
            side.bytes += k["io_bytes"].as_u64().unwrap_or(0);
            if let Some(b) = k["clat_ns"]["bins"].as_object() {
                for (ns, n) in b {
                    let ns: u64 = ns
                        .parse()
                        .map_err(|_| invalid!("fio latency bin `{ns}`: not a number"))?;
                    *bins[i].entry(ns).or_default() += n.as_u64().unwrap_or(0);
                }
            }
        }
    }
    m.seconds = runtime_ms as f64 / 1e3;
    for (i, side) in [&mut m.read, &mut m.write].into_iter().enumerate() {
        if m.seconds > 0.0 {
            side.iops = side.ios as f64 / m.seconds;
            side.mbps = side.bytes as f64 / 1e6 / m.seconds;
        }
        side.p50_ns = percentile(&bins[i], 50.0);
        side.p99_ns = percentile(&bins[i], 99.0);
        side.p99_9_ns = percentile(&bins[i], 99.9);
        side.p99_99_ns = percentile(&bins[i], 99.99);
    }
    Ok(m)
}

/// Waits until the server answers on its admin socket, which it does once
/// it serves (the NBD socket is bound earlier, before the devices open).
fn wait_answering(stop: &AtomicBool, admin: &Path, guard: &mut Guard, log: &Path) -> Result<()> {
    wait_until(
        stop,
        guard,
        log,
        &format!("answer on {}", admin.display()),
        || server_counts(admin).map(|_| ()).map_err(|e| e.to_string()),
    )
}

/// The server's line hits, line accesses and promotions so far.
fn server_counts(admin: &Path) -> Result<(u64, u64, u64)> {
    let stats = iocache_serving::admin_client::request(admin, "stats", Some(Duration::from_secs(10)))?;
    let v = stats["volumes"]
        .as_array()
        .and_then(|v| v.first())
        .ok_or_else(|| invalid!("the server's stats list no volume"))?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    Ok((
        n("read_hits") + n("write_hits"),
        n("line_accesses"),
        n("promotions"),
    ))
}

/// A running `iocache serve` of one live run, with its files: stopped
/// (and its files removed) when dropped, the server first.
struct Serving {
    server: Guard,
    _nbdkit: Option<Guard>,
    socket: PathBuf,
    admin: PathBuf,
    log: PathBuf,
    work: WorkDir,
    _backend_work: Option<WorkDir>,
}

impl Serving {
    /// A fresh server with `setup` in front of a backend of
    /// `volume_bytes`, answering on its admin socket. `label` names the
    /// run in errors.
    fn start(
        server_program: Server,
        settings: &LiveSettings,
        setup: &ServeSetup,
        volume_bytes: u64,
        label: &str,
    ) -> Result<Serving> {
        let work = WorkDir::new(&settings.dir, "iocache-live").within(|| "live.dir".to_string())?;
        let backend_work = match &settings.backend_dir {
            Some(dir) => {
                Some(WorkDir::new(dir, "iocache-live-backend").within(|| "live.backend_dir".to_string())?)
            }
            None => None,
        };
        let backend_file = backend_work
            .as_ref()
            .map_or(work.path(), |d| d.path())
            .join("backend.img");
        let mut nbdkit = None;
        let backend = match &settings.backend_delay {
            None => backend_file.display().to_string(),
            Some(delay) => {
                let ms = delay_ms(delay)?;
                std::fs::File::create(&backend_file)?.set_len(volume_bytes)?;
                let socket = work.path().join("backend.sock");
                let log = work.path().join("nbdkit.log");
                let child = Command::new("nbdkit")
                    .args(["-f", "-U"])
                    .arg(&socket)
                    .args(["--filter=delay", "file"])
                    .arg(&backend_file)
                    .args([format!("delay-read={ms}ms"), format!("delay-write={ms}ms")])
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log)?)
                    .spawn()
                    .map_err(|e| tool!("live.backend_delay needs nbdkit (apt-get install nbdkit): {e}"))?;
                let mut guard = Guard {
                    child: Some(child),
                    what: "nbdkit (the delayed backend)".into(),
                };
                wait_socket(server_program.stop, &socket, &mut guard, &log)?;
                nbdkit = Some(guard);
                format!("nbd+unix:///?socket={}", socket.display())
            }
        };
        let socket = work.path().join("nbd.sock");
        let admin = work.path().join("admin.sock");
        let log = work.path().join("serve.log");
        let mut command = Command::new(server_program.program);
        command
            .arg("serve")
            .args(["--backend", &backend])
            .arg("--cache")
            .arg(work.path().join("cache.img"))
            .arg("--socket")
            .arg(&socket)
            .arg("--admin-socket")
            .arg(&admin)
            .args(["--lookup", &settings.lookup, "--init"])
            .args(setup.flags());
        if settings.backend_delay.is_none() {
            command.args(["--backend-size", &format!("{volume_bytes}B")]);
        }
        if let Some(slow) = &settings.slow_cache {
            command.args(["--slow-cache", slow]);
        }
        if let Some(adapt) = settings.adapt.as_ref().filter(|_| setup.adapt.is_none()) {
            command.args(["--adapt", adapt]);
        }
        command
            .current_dir(work.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let child = command.spawn().within(|| "starting iocache serve".to_string())?;
        let mut server = Guard {
            child: Some(child),
            what: format!("iocache serve for {label}"),
        };
        wait_socket(server_program.stop, &socket, &mut server, &log)?;
        wait_answering(server_program.stop, &admin, &mut server, &log)?;
        Ok(Serving {
            server,
            _nbdkit: nbdkit,
            socket,
            admin,
            log,
            work,
            _backend_work: backend_work,
        })
    }

    /// The server's line hits, line accesses and promotions so far.
    fn counts(&self) -> Result<(u64, u64, u64)> {
        server_counts(&self.admin)
    }

    /// Stops the server. It writes dirty lines back as it stops: a
    /// failure there is the run's failure too.
    fn stop(mut self) -> Result<()> {
        if let Some(status) = self.server.stop()?.filter(|s| !s.success()) {
            return Err(tool!(
                "{} exited with {status} when stopped:\n{}",
                self.server.what,
                tail(&self.log)
            ));
        }
        Ok(())
    }
}

/// `measured` with the server's counts between `before` and `after`.
fn with_counts(mut measured: Measured, before: (u64, u64, u64), after: (u64, u64, u64)) -> Measured {
    measured.hits = after.0.saturating_sub(before.0);
    measured.accesses = after.1.saturating_sub(before.1);
    measured.promotions = after.2.saturating_sub(before.2);
    measured
}

/// One live run: a fresh server with `setup` in front of a backend of
/// `volume_bytes`, warmed and measured with the fio job of `spec`.
/// `label` names the run in errors.
pub fn measure(
    server_program: Server,
    settings: &LiveSettings,
    setup: &ServeSetup,
    spec: &WorkloadSpec,
    label: &str,
) -> Result<Measured> {
    let volume_bytes = parse_byte_size(&spec.volume_size)?;
    let serving = Serving::start(server_program, settings, setup, volume_bytes, label)?;
    let work = serving.work.path();
    let uri = format!("nbd+unix:///iocache?socket={}", serving.socket.display());
    let fio = |secs: u64, name: &str| -> Result<Option<Measured>> {
        if secs == 0 {
            return Ok(None);
        }
        let job = work.join(format!("{name}.fio"));
        std::fs::write(&job, fio_job(spec, &uri, secs, settings)?)?;
        let output = work.join(format!("{name}.json"));
        let errors = work.join(format!("{name}.err"));
        let mut command = Command::new(&settings.fio);
        command
            .arg("--output-format=json+")
            .arg(format!("--output={}", output.display()))
            .arg(&job)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&errors)?);
        let status = run_to_end(server_program.stop, command, "fio")?;
        if !status.success() {
            return Err(tool!("fio ({name} run) failed ({status}):\n{}", tail(&errors)));
        }
        let text = std::fs::read_to_string(&output).at_file(&output)?;
        Ok(Some(parse_fio(&text).within(|| format!("fio's {name} run"))?))
    };
    fio(seconds(&settings.warmup)?, "warmup")?;
    let before = serving.counts()?;
    let measured = fio(seconds(&settings.duration)?, "measure")?.expect("duration ≥ 1 s");
    let after = serving.counts()?;
    serving.stop()?;
    Ok(with_counts(measured, before, after))
}

/// One live run on a real trace: a fresh server with `setup` in front of
/// a backend of the trace's span, its first `warmup` requests replayed
/// unmeasured, then the rest measured, each time by `connections`
/// connections of our own NBD client in a closed loop
/// ([`crate::replay::replay_nbd`]). `settings.duration`, `warmup`,
/// `iodepth` and `fio` do not apply. `label` names the run in errors.
pub fn measure_trace(
    server_program: Server,
    settings: &LiveSettings,
    setup: &ServeSetup,
    trace: &crate::replay::TraceRequests,
    warmup: usize,
    connections: usize,
    label: &str,
) -> Result<Measured> {
    let serving = Serving::start(server_program, settings, setup, trace.span_bytes, label)?;
    let (first, rest) = trace.ios.split_at(warmup.min(trace.ios.len()));
    let replay = |ios| {
        crate::replay::replay_nbd(&serving.socket, "iocache", ios, connections, server_program.stop)
            .within(|| format!("replaying the trace on {label}"))
    };
    if !first.is_empty() {
        replay(first)?;
    }
    let before = serving.counts()?;
    let replayed = replay(rest)?;
    let after = serving.counts()?;
    serving.stop()?;
    let measured = Measured {
        read: replayed.read,
        write: replayed.write,
        seconds: replayed.seconds,
        ..Measured::default()
    };
    Ok(with_counts(measured, before, after))
}

/// One point of an experiment to run live.
pub struct LivePoint<'a> {
    pub index: usize,
    pub id: String,
    pub workload: &'a str,
    /// The workload's `iocache gen` spec; `None` for a trace workload.
    pub spec: Option<PathBuf>,
    pub knobs: &'a BTreeMap<&'static str, String>,
    pub cache_lines: u64,
    pub line_bytes: u64,
    /// The experiment file's directory (relative paths in knobs).
    pub dir: &'a Path,
}

/// Runs `points` live, appending one row per point to `results` as each
/// finishes (so an interrupted run keeps what it finished).
pub fn run(
    settings: &LiveSettings,
    server: Server,
    points: &[LivePoint],
    results: &mut std::fs::File,
) -> Result<()> {
    if points.is_empty() {
        return Ok(());
    }
    if let Some(point) = points.iter().find(|p| p.spec.is_none()) {
        return Err(invalid!(
            "live point {} ({}): workload `{}` is a trace; the live target runs `iocache gen` specs only (fio would not replay a trace's timing and mix)",
            point.index,
            point.id,
            point.workload
        ));
    }
    let version = check_fio(&settings.fio)?;
    log::info!(
        "live target: {} to run with {version}",
        iocache_core::units::count(points.len() as u64, "point")
    );
    for (n, point) in points.iter().enumerate() {
        let what = format!("live point {} ({})", point.index, point.id);
        let Some(spec_path) = &point.spec else {
            return Err(invalid!("{what}: not a generated workload"));
        };
        let text =
            std::fs::read_to_string(spec_path).within(|| format!("{what}: {}", spec_path.display()))?;
        let spec: WorkloadSpec =
            toml::from_str(&text).map_err(|e| invalid!("{}: {e}", spec_path.display()))?;
        let setup = ServeSetup::from_knobs(point.knobs, point.cache_lines, point.line_bytes, point.dir);
        log::info!("[{}/{}] {what}", n + 1, points.len());
        let measured = measure(server, settings, &setup, &spec, &format!("point {}", point.index))
            .within(|| what.clone())?;
        let mut row = json!({
            "point": point.index,
            "point_id": point.id,
            "target": "live",
            "workload": point.workload,
            "cache_lines": point.cache_lines,
            "live_duration_s": seconds(&settings.duration)?,
            "live_warmup_s": seconds(&settings.warmup)?,
            "live_iodepth": settings.iodepth,
        });
        if let (Some(map), Value::Object(extra)) = (row.as_object_mut(), measured.columns()) {
            map.extend(extra);
            for (k, v) in point.knobs {
                map.insert((*k).to_string(), Value::String(v.clone()));
            }
        }
        writeln!(results, "{row}")?;
        results.flush()?;
    }
    Ok(())
}

/// A row's key in a results file: its point id, and the target when it is
/// not the simulator (a point has a simulated and a live row).
pub fn row_key(row: &Value) -> Option<String> {
    let id = row["point_id"].as_str()?;
    Some(match row["target"].as_str() {
        None | Some("sim") => id.to_string(),
        Some(t) => format!("{id}@{t}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_default_to_the_simulator_and_reject_typos() {
        assert_eq!(
            targets(None, "e").unwrap(),
            Targets {
                sim: true,
                live: false
            }
        );
        let both = ["sim".to_string(), "live".to_string()];
        assert_eq!(
            targets(Some(&both), "e").unwrap(),
            Targets {
                sim: true,
                live: true
            }
        );
        let err = targets(Some(&["lve".to_string()]), "e.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("e.toml: target: `lve`"), "{err}");
        assert!(targets(Some(&[]), "e").is_err());
    }

    #[test]
    fn settings_are_checked_with_their_key() {
        let mut s = LiveSettings::default();
        s.check("e").unwrap();
        s.backend_delay = Some("250us".into());
        let err = s.check("e.toml").unwrap_err().to_string();
        assert!(err.contains("live.backend_delay"), "{err}");
        s.backend_delay = Some("2ms".into());
        s.check("e").unwrap();
        s.rate = "fast".into();
        assert!(s.check("e").unwrap_err().to_string().contains("live.rate"));
    }

    #[test]
    fn the_fio_job_runs_for_the_duration_closed_loop() {
        let spec: WorkloadSpec = toml::from_str(
            "volume_size = \"64MiB\"\n[[phase]]\nrequests = 100\nrate = 500\nread_percent = 100\ndistribution = \"zoned:85/10:15/90\"\n",
        )
        .unwrap();
        let job = fio_job(&spec, "nbd+unix:///x?socket=/s", 3, &LiveSettings::default()).unwrap();
        assert!(
            job.contains("runtime=3\n") && job.contains("time_based=1\n"),
            "{job}"
        );
        assert!(job.contains("iodepth=16\n") && job.contains("random_distribution=zoned:85/10:15/90"));
        assert!(!job.contains("number_ios") && !job.contains("rate_iops") && !job.contains("time_based=0"));
        let paced = LiveSettings {
            rate: "spec".into(),
            ..LiveSettings::default()
        };
        assert!(fio_job(&spec, "nbd+unix:///x?socket=/s", 3, &paced)
            .unwrap()
            .contains("rate_iops=500"));
    }

    #[test]
    fn fio_json_phases_are_joined_and_percentiles_come_from_the_bins() {
        // Two phases of 1 s each: 100 and 300 reads (and 10 writes), their
        // completion latencies as fio's json+ bins (ns: count).
        let text = r#"note: a line fio prints first
{"jobs": [
 {"jobname": "a", "error": 0, "job_runtime": 1000,
  "read": {"total_ios": 100, "io_bytes": 409600, "clat_ns": {"bins": {"10000": 99, "5000000": 1}}},
  "write": {"total_ios": 0, "io_bytes": 0, "clat_ns": {}}},
 {"jobname": "b", "error": 0, "job_runtime": 1000,
  "read": {"total_ios": 300, "io_bytes": 1228800, "clat_ns": {"bins": {"20000": 300}}},
  "write": {"total_ios": 10, "io_bytes": 40960, "clat_ns": {"bins": {"30000": 10}}}}
]}"#;
        let m = parse_fio(text).unwrap();
        assert_eq!(m.seconds, 2.0);
        assert_eq!(m.read.ios, 400);
        assert_eq!(m.read.iops, 200.0);
        assert!((m.read.mbps - 1.6384 / 2.0).abs() < 1e-9);
        // 99 at 10 µs, 300 at 20 µs, 1 at 5 ms: the median 20 µs, p99.9 5 ms.
        assert_eq!(m.read.p50_ns, 20_000);
        assert_eq!(m.read.p99_ns, 20_000);
        assert_eq!(m.read.p99_9_ns, 5_000_000);
        assert_eq!(m.write.iops, 5.0);
        assert_eq!(m.write.p99_99_ns, 30_000);
        let failed = text.replace(
            "\"error\": 0, \"job_runtime\": 1000,\n  \"read\": {\"total_ios\": 300",
            "\"error\": 5, \"job_runtime\": 1000,\n  \"read\": {\"total_ios\": 300",
        );
        assert!(parse_fio(&failed)
            .unwrap_err()
            .to_string()
            .contains("job `b` failed"));
    }

    #[test]
    fn the_grid_knobs_become_serve_flags() {
        let knobs = BTreeMap::from([
            ("policy", "arc".to_string()),
            ("promotion", "nhit:2".to_string()),
            ("write_miss_bypass", "true".to_string()),
            ("adapt", "reca".to_string()),
            ("reca_window", "5000".to_string()),
            ("reca_table", "t.toml".to_string()),
            ("cache_device", "optane".to_string()),
        ]);
        let flags = ServeSetup::from_knobs(&knobs, 256, 8192, Path::new("/e"))
            .flags()
            .join(" ");
        assert!(
            flags.contains("--policy arc --cache-size 2097152B --line-size 8192B"),
            "{flags}"
        );
        assert!(
            flags.contains("--promotion nhit:2") && flags.contains("--write-miss-bypass"),
            "{flags}"
        );
        assert!(
            flags.contains("--adapt reca --reca-window 5000 --reca-table /e/t.toml"),
            "{flags}"
        );
        assert!(!flags.contains("optane"), "{flags}");
        let observe = BTreeMap::from([("adapt", "observe".to_string()), ("reca_window", "5".to_string())]);
        let flags = ServeSetup::from_knobs(&observe, 1, 4096, Path::new("."))
            .flags()
            .join(" ");
        assert!(!flags.contains("--adapt") && !flags.contains("--reca"), "{flags}");
    }

    #[test]
    fn live_rows_are_keyed_apart_from_simulated_ones() {
        assert_eq!(row_key(&json!({"point_id": "w|x"})).unwrap(), "w|x");
        assert_eq!(
            row_key(&json!({"point_id": "w|x", "target": "sim"})).unwrap(),
            "w|x"
        );
        assert_eq!(
            row_key(&json!({"point_id": "w|x", "target": "live"})).unwrap(),
            "w|x@live"
        );
    }
}
