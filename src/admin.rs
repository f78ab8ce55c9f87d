//! The admin socket of `iocache serve` and its clients, `iocache stats` and
//! `iocache ctl`.
//!
//! The protocol is one request line and one reply line per connection. The
//! line `stats` (or an empty line) asks for the statistics of every volume;
//! any other request is a JSON object with a `command`:
//!
//! - `{"command":"stats","export":NAME?}`: statistics, of one volume if named;
//! - `{"command":"attach","export":NAME,"backend":PATH|URI,"backend_size":SIZE?,"cache":PATH?}`:
//!   adds a volume to a cache device (the only one, or the one named) and
//!   serves it as a new export; `backend_size` creates a missing file;
//! - `{"command":"flush","export":NAME}`: writes back the volume's dirty lines;
//! - `{"command":"detach","export":NAME}`: stops serving the volume, after
//!   writing back its dirty lines and dropping its lines from the cache.
//! - `{"command":"get","export":NAME?}`: the knobs of the cache the volume
//!   uses (or the only one), configured and current, and the write policy
//!   in force with its cause;
//! - `{"command":"set","export":NAME?,"settings":["KEY=VALUE",...]}`:
//!   changes knobs while the cache serves (`iocache_core::Setting`), and
//!   answers as `get`.
//!
//! The reply is a JSON object: the statistics (`{"volumes":[...]}`), what
//! was done, or `{"error": MESSAGE}`.
//!
//! What a client can make the server hold is bounded:
//! a request line is read up to [`MAX_REQUEST_BYTES`] (a longer one is
//! answered with an error naming the limit, after reading at most one byte
//! more, and is never echoed); the whole line must arrive within
//! [`REQUEST_DEADLINE`] (a client trickling bytes gets an error when it
//! passes); at most [`MAX_CONNECTIONS`] connections are served at once
//! (more are answered with a one-line error and closed by the accept thread
//! itself); and a thread that cannot be created refuses that one
//! connection (a line on stderr at most every ten seconds), never panics
//! the accept thread.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::running::{AttachRequest, Running, STOP};

/// The statistics as JSON: one entry per volume (of `export` only, if given).
fn stats_json(state: &Running, export: Option<&str>) -> Result<Value> {
    let latency = |p: &iocache_engine::LatencyPercentiles| {
        json!({
            "count": p.count,
            "p50_us": p.p50_ns as f64 / 1e3,
            "p99_us": p.p99_ns as f64 / 1e3,
            "p99_9_us": p.p999_ns as f64 / 1e3,
            "p99_99_us": p.p9999_ns as f64 / 1e3,
            "max_us": p.max_ns as f64 / 1e3,
        })
    };
    let volumes: Vec<(String, String, usize, iocache_engine::Volume)> = state
        .volumes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|v| export.is_none_or(|e| e == v.export))
        .map(|v| (v.export.clone(), v.backend.clone(), v.cache, v.volume.clone()))
        .collect();
    if let (Some(name), true) = (export, volumes.is_empty()) {
        bail!("no export `{name}` is served");
    }
    let mut entries = Vec::new();
    for (name, backend, cache, volume) in volumes {
        let group = &state.caches[cache];
        let engine = group.engine();
        // Detached meanwhile: not listed.
        let Ok(v) = engine.volume_stats(volume.id()) else {
            continue;
        };
        let s = engine.stats();
        let effective = engine.effective_mode();
        let c = &s.cache;
        let sharing: Vec<String> = engine.volumes().into_iter().map(|v| v.name).collect();
        let mut entry = json!({
            "export": name,
            "backend": backend,
            "volume_id": v.id,
            "size_bytes": v.size_bytes,
            "write_policy": engine.write_policy().to_string(),
            "effective_write_policy": effective.policy.to_string(),
            "effective_write_policy_cause": effective.cause.name(),
            // The replacement policy in force (`ctl set policy=` changes it).
            "policy": engine
                .settings()
                .into_iter()
                .find(|k| k.key == "policy")
                .map_or_else(|| group.config.policy.to_string(), |k| k.current),
            "lookup": engine.lookup().to_string(),
            "shards": s.shards,
            "capacity_lines": s.capacity_lines,
            "resident_lines": v.resident_lines,
            "dirty_lines": v.dirty_lines,
            "clean_lines": v.resident_lines - v.dirty_lines,
            "occupancy": if s.capacity_lines == 0 { 0.0 } else { v.resident_lines as f64 / s.capacity_lines as f64 },
            "requests": v.requests(),
            "read_requests": v.read_requests,
            "write_requests": v.write_requests,
            "read_bytes": v.read_bytes,
            "write_bytes": v.write_bytes,
            "line_accesses": v.line_accesses,
            "read_hits": v.read_hits,
            "write_hits": v.write_hits,
            "partial_hits": v.partial_hits,
            "full_misses": v.misses,
            "hit_ratio": v.hit_ratio(),
            "failed_requests": v.errors,
            "latency": { "read": latency(&v.read_latency), "write": latency(&v.write_latency) },
        });
        // The cache device as a whole (all its volumes): decisions, health,
        // metadata and what opening it found. (Two objects: one is past the
        // json! macro's recursion limit.)
        let cache_wide = json!({
            "promotions": c.promotions,
            "evictions": c.evictions,
            "write_backs": c.dirty_writebacks + c.flushed_lines,
            "bypassed_accesses": c.bypassed_accesses,
            "seq_cutoff_requests": c.seq_cutoff_requests,
            "write_miss_bypasses": c.write_miss_bypasses,
            "io_errors": s.io_errors,
            "forgotten_lines": s.forgotten_lines,
            "dirty_victims_kept": c.dirty_victims_kept,
            "cache_device_errors": s.cache_device_errors,
            "backend_errors": s.backend_errors,
            "failed_writebacks": s.failed_writebacks,
            "cache_device_failed": s.cache_device_failed,
            "persistence": s.persistence.map(|p| p.to_string()),
            "barriers": s.barriers,
            "records_written": s.records_written,
            "intents_written": s.intents_written,
            "intent_flushes": s.intent_flushes,
            "recovery": {
                "loaded": s.recovery.loaded,
                "clean_shutdown": s.recovery.clean_shutdown,
                "dirty_lines": s.recovery.dirty_lines,
                "clean_lines": s.recovery.clean_lines,
                "dropped_clean_lines": s.recovery.dropped_clean_lines,
                "checked_clean_lines": s.recovery.checked_clean_lines,
                "stale_clean_lines": s.recovery.stale_clean_lines,
                "unchecked_clean_lines": s.recovery.unchecked_clean_lines,
                "verified_dirty_lines": s.recovery.verified_dirty_lines,
                "verified_with_intents": s.recovery.verified_with_intents,
                "repaired_from_mirror": s.recovery.repaired_from_mirror,
                "corrupt_copies": s.recovery.corrupt_copies,
                "duplicate_lines": s.recovery.duplicate_lines,
                "written_back_lines": s.recovery.written_back_lines,
            },
            "cache": {
                "path": group.path.display().to_string(),
                "volumes": sharing,
                "resident_lines": s.resident_lines,
                "dirty_lines": s.dirty_lines,
                "requests": c.requests,
                "hit_ratio": c.hit_ratio(),
            },
        });
        if let (Some(entry), Value::Object(extra)) = (entry.as_object_mut(), cache_wide) {
            entry.extend(extra);
        }
        let array = match &s.array {
            None => Value::Null,
            Some(a) => json!({
                "members": a.array.members.iter().map(|(name, failed)| json!({
                    "device": name,
                    "state": if *failed { "failed" } else { "ok" },
                })).collect::<Vec<_>>(),
                "degraded": a.degraded,
                "evacuated": a.evacuated,
                "dirty_cap": a.dirty_cap,
                "dirty_cap_write_throughs": c.dirty_cap_write_throughs,
                "mirror_slots": a.array.mirror_slots,
                "mirror_slots_used": a.array.mirror_slots_used,
                "mirror_writes": a.array.mirror_writes,
                "mirror_reads": a.array.mirror_reads,
                "through_writes": a.array.through_writes,
                "evacuated_lines": a.evacuated_lines,
                "retired_slots": a.retired_slots,
                "lost_lines": a.lost_lines,
            }),
        };
        if let Some(entry) = entry.as_object_mut() {
            entry.insert("array".into(), array);
            entry.insert(
                "queues".into(),
                json!({
                    "cache": queue_json(&s.cache_queue),
                    "backend": queue_json(&s.backend_queue),
                }),
            );
            entry.insert("balance".into(), balance_json(&s, &group.config));
            entry.insert(
                "reca".into(),
                engine
                    .reca_status()
                    .map_or(Value::Null, |r| crate::reca_cli::status_json(&r)),
            );
            entry.insert("line_bytes".into(), json!(engine.line_bytes()));
            let changes: Vec<Value> = state
                .relayouts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|r| r.cache == cache)
                .map(|r| {
                    json!({
                        "old_line_bytes": r.old_line_bytes,
                        "new_line_bytes": r.new_line_bytes,
                        "dirty_lines_written_back_first": r.written_back_before,
                        "paused_ms": r.paused.as_secs_f64() * 1e3,
                        "warm_ranges": r.warm_ranges,
                        "warm_bytes": r.warm_bytes,
                    })
                })
                .collect();
            entry.insert("line_size_changes".into(), Value::Array(changes));
        }
        entries.push(entry);
    }
    let s = state.server_stats();
    Ok(json!({
        "volumes": entries,
        "server": {
            "connections": s.connections,
            "active_connections": s.active_connections,
            "transmissions": s.transmissions,
            "requests": s.requests,
            "errors": s.errors,
            "served_inline": s.served_inline,
            "inflight_bytes": s.inflight_bytes,
            "peak_inflight_bytes": s.peak_inflight_bytes,
            "refused_connections": s.refused_connections,
            "refused_per_peer": s.refused_per_peer,
            "evicted_connections": s.evicted_connections,
            "handshake_timeouts": s.handshake_timeouts,
            "tls_failures": s.tls_failures,
            "spawn_failures": s.spawn_failures,
        },
    }))
}

/// The I/O the engine issued to one device, by class (`queues.rs`).
fn queue_json(q: &iocache_engine::DeviceQueueStats) -> Value {
    let classes: serde_json::Map<String, Value> = q
        .classes
        .iter()
        .map(|c| {
            (
                c.class.to_string(),
                json!({
                    "issued": c.issued,
                    "completed": c.completed,
                    "in_flight": c.in_flight,
                    "mean_latency_us": c.mean_latency_ns() as f64 / 1e3,
                }),
            )
        })
        .collect();
    json!({ "in_flight": q.in_flight, "classes": classes })
}

/// The load balancer's state (null when none runs).
fn balance_json(s: &iocache_engine::EngineStats, config: &crate::config::VolumeConfig) -> Value {
    let Some(b) = &s.balance else {
        return Value::Null;
    };
    let load = |l: &iocache_engine::BalanceLoad| {
        json!({
            "queued": l.queued,
            "per_request_us": l.per_request_ns / 1e3,
            "service_us": l.service_ns / 1e3,
            "queue_time_ms": l.queue_time_ns / 1e6,
            "completed": l.completed,
        })
    };
    let last = b.last.as_ref().map(|d| {
        json!({
            "interval": d.interval,
            "cache": load(&d.cache),
            "backend": load(&d.backend),
            "shares": { "R": d.shares[0], "W": d.shares[1], "P": d.shares[2], "E": d.shares[3] },
            "arrivals": d.arrivals,
            "bypassed": d.bypassed,
            "bottleneck": d.bottleneck,
            "group": d.group,
        })
    });
    json!({
        "controller": b.controller,
        "spec": config.adapt.as_ref().map(|a| a.text.clone()),
        "interval_ms": b.interval_ns as f64 / 1e6,
        "policy": b.policy.map(|p| p.to_string()),
        "bypass": b.bypass,
        "action": b.action,
        "intervals": b.intervals,
        "switches": b.switches,
        "bypassed_requests": s.cache.balance_bypasses,
        "bypasses_refused_dirty": s.cache.balance_bypasses_refused_dirty,
        "last": last,
    })
}

/// The text lines of `queue_json`: each class's count, in flight and mean
/// latency.
fn queue_text(q: &Value, order: &[&str]) -> String {
    let mut parts = Vec::new();
    for name in order {
        let c = &q["classes"][name];
        if c.is_null() {
            continue;
        }
        parts.push(format!(
            "{name} {} ({} in flight, {:.1} µs)",
            c["completed"],
            c["in_flight"],
            c["mean_latency_us"].as_f64().unwrap_or(0.0)
        ));
    }
    format!("{}; {} in flight", parts.join(", "), q["in_flight"])
}

/// Runs one admin request.
fn dispatch(state: &Running, line: &str) -> Result<Value> {
    match line {
        "stats" | "" => return stats_json(state, None),
        text if !text.starts_with('{') => {
            bail!(
                "unknown command `{}`; expected `stats` or a JSON request",
                shortened(text)
            )
        }
        _ => {}
    }
    let request: Value = serde_json::from_str(line).context("the request is not JSON")?;
    let field = |name: &str| request.get(name).and_then(Value::as_str);
    let needed = |name: &str| field(name).ok_or_else(|| anyhow::anyhow!("the request needs `{name}`"));
    match field("command") {
        Some("stats") => stats_json(state, field("export")),
        Some("attach") => state.attach(&AttachRequest {
            export: needed("export")?,
            backend: needed("backend")?,
            backend_size: field("backend_size"),
            cache: field("cache"),
        }),
        Some("detach") => state.detach(needed("export")?),
        Some("flush") => state.flush(needed("export")?),
        Some("get") => state.get_settings(field("export")),
        Some("set") => {
            let changes: Vec<String> = request
                .get("settings")
                .and_then(Value::as_array)
                .ok_or_else(|| anyhow::anyhow!("the request needs `settings`: a list of \"KEY=VALUE\""))?
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| anyhow::anyhow!("`settings` must be a list of strings"))?;
            state.set_settings(field("export"), &changes)
        }
        Some("reca-reload") => state.reca_reload(field("export"), field("table")),
        Some(other) => bail!(
            "unknown command `{}`; expected stats, attach, detach, flush, get, set or reca-reload",
            shortened(other)
        ),
        None => bail!("the request needs a `command`"),
    }
}

/// Longest request line read (64 KiB, far above any real request: an
/// attach with two 4 KiB paths is about 8.3 KiB).
pub(crate) const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Admin connections served at once. A connection holds a thread and at
/// most `MAX_REQUEST_BYTES` of request for at most `REQUEST_DEADLINE`
/// (then the time its request takes to run).
pub(crate) const MAX_CONNECTIONS: usize = 16;
/// Time a client has to send its whole request line, counted from the
/// moment its connection is taken up (every real client writes the line in
/// one go right after connecting).
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Time the reply may take to be written (a client that does not read it
/// cannot keep its thread).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Characters of an unknown command echoed in the error.
const ECHO_CHARS: usize = 64;

/// The start of `text`, for an error message.
fn shortened(text: &str) -> String {
    match text.char_indices().nth(ECHO_CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// Why no request could be read.
#[derive(Debug)]
enum BadRequest {
    TooLong,
    Deadline,
    NotUtf8,
    Io(std::io::Error),
}

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadRequest::TooLong => write!(
                f,
                "the request line is longer than {MAX_REQUEST_BYTES} bytes (the limit); it was not read"
            ),
            BadRequest::Deadline => write!(
                f,
                "no complete request line within {} s",
                REQUEST_DEADLINE.as_secs_f64()
            ),
            BadRequest::NotUtf8 => write!(f, "the request is not UTF-8"),
            BadRequest::Io(e) => write!(f, "cannot read the request: {e}"),
        }
    }
}

/// Whether a read failed because its timeout passed.
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Reads one request line (up to a newline or the end of the stream),
/// reading at most `MAX_REQUEST_BYTES + 1` bytes and giving up at
/// `deadline`. Bytes after the newline are ignored.
fn read_request(stream: &UnixStream, deadline: Instant) -> Result<String, BadRequest> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BadRequest::Deadline);
        }
        stream.set_read_timeout(Some(left)).map_err(BadRequest::Io)?;
        let want = (MAX_REQUEST_BYTES + 1 - line.len()).min(chunk.len());
        let n = match (&*stream).read(&mut chunk[..want]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if is_timeout(&e) => return Err(BadRequest::Deadline),
            Err(e) => return Err(BadRequest::Io(e)),
        };
        if n == 0 {
            break;
        }
        if let Some(end) = chunk[..n].iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&chunk[..end]);
            if line.len() > MAX_REQUEST_BYTES {
                return Err(BadRequest::TooLong);
            }
            break;
        }
        line.extend_from_slice(&chunk[..n]);
        if line.len() > MAX_REQUEST_BYTES {
            return Err(BadRequest::TooLong);
        }
    }
    String::from_utf8(line).map_err(|_| BadRequest::NotUtf8)
}

/// Answers one admin connection.
fn answer(mut stream: UnixStream, state: &Running) {
    let reply = match read_request(&stream, Instant::now() + REQUEST_DEADLINE) {
        Ok(line) => match dispatch(state, line.trim()) {
            Ok(value) => value,
            Err(e) => json!({ "error": format!("{e:#}") }),
        },
        Err(e) => json!({ "error": e.to_string() }),
    };
    let _ = stream.set_write_timeout(Some(REPLY_TIMEOUT));
    let _ = writeln!(stream, "{reply}");
}

/// Tells a client there is no room for it, without ever blocking the
/// accept thread, and closes the connection.
fn refuse(stream: UnixStream, why: &str) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = writeln!(&stream, "{}", json!({ "error": why }));
    }
}

/// One of the `MAX_CONNECTIONS` places, given back when dropped (also
/// when the thread it was moved into could not be created).
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Writes `message` on stderr unless a line went out less than ten
/// seconds ago.
fn log_rate_limited(last: &Mutex<Option<Instant>>, message: &str) {
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
        *last = Some(Instant::now());
        log::warn!("admin socket: {message}");
    }
}

/// Answers the admin socket until the server stops: one thread per
/// connection, so a long detach does not hold up `iocache stats`; at most
/// `MAX_CONNECTIONS` at once.
pub(crate) fn serve_admin(listener: UnixListener, state: Arc<Running>) {
    let active = Arc::new(AtomicUsize::new(0));
    let last_log = Mutex::new(None);
    loop {
        let accepted = listener.accept();
        if STOP.load(Ordering::SeqCst) {
            return;
        }
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                // EMFILE and friends: do not spin.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            refuse(
                stream,
                &format!("too many admin connections (at most {MAX_CONNECTIONS} at once); try again"),
            );
            continue;
        }
        let place = Place(Arc::clone(&active));
        let state = Arc::clone(&state);
        let spawned = std::thread::Builder::new().name("admin".into()).spawn(move || {
            let _place = place;
            answer(stream, &state);
        });
        if let Err(e) = spawned {
            // The closure, with the stream and the place, was dropped: the
            // connection is closed and its place free.
            log_rate_limited(
                &last_log,
                &format!("cannot start a thread ({e}); connection refused"),
            );
        }
    }
}

/// Sends one request and returns the reply, failing with the server's
/// error; when no server answers, says what to do in this program's words.
pub(crate) fn request(socket: &Path, line: &str, timeout: Option<Duration>) -> Result<Value> {
    use iocache_serving::admin_client::AdminError;
    iocache_serving::admin_client::request(socket, line, timeout).map_err(|e| {
        let way_out = match &e {
            AdminError::NoSuchSocket { .. } | AdminError::Stale { .. } => {
                "start it with `iocache serve`, or name the socket it uses with --admin-socket PATH"
            }
            AdminError::NotASocket { .. } => "name the server's admin socket with --admin-socket PATH",
            AdminError::PermissionDenied { .. } => {
                "run as the user that started the server, or one in its --socket-group"
            }
            _ => return anyhow::Error::new(e),
        };
        anyhow!("{e}; {way_out}")
    })
}

#[derive(Args)]
pub struct StatsArgs {
    /// The admin socket of a running `iocache serve`.
    #[arg(long, value_name = "PATH", default_value = "iocache-data/admin.sock")]
    admin_socket: PathBuf,
    /// Print the raw JSON.
    #[arg(long, conflicts_with_all = ["watch", "csv"])]
    json: bool,
    /// Every SECONDS (decimals allowed), print each volume's rates over the interval, as iostat
    /// does: requests and MiB per second, the line hit ratio, dirty and cached lines.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
    /// With --watch: stop after N intervals.
    #[arg(long, value_name = "N", requires = "watch")]
    count: Option<u64>,
    /// Print CSV (a header, then one row per volume; per interval with --watch).
    #[arg(long)]
    csv: bool,
}

/// `iocache stats`: asks a running server for its statistics.
pub fn stats(args: StatsArgs) -> Result<()> {
    let ask = || request(&args.admin_socket, "stats", Some(Duration::from_secs(10)));
    let Some(seconds) = args.watch else {
        let json = ask()?;
        if args.csv {
            print!("{}", totals_csv(&json));
            return Ok(());
        }
        return print_stats(&json, args.json);
    };
    if !(seconds.is_finite() && (0.01..=86_400.0).contains(&seconds)) {
        bail!("--watch {seconds}: an interval of 0.01 to 86400 seconds");
    }
    let interval = Duration::from_secs_f64(seconds);
    let mut previous = ask()?;
    let mut previous_at = Instant::now();
    if args.csv {
        println!("{}", WatchRow::CSV_HEADER);
    }
    let mut printed = 0u64;
    while args.count.is_none_or(|n| printed < n) {
        std::thread::sleep(interval);
        let now = ask()?;
        let now_at = Instant::now();
        let rows = watch_rows(&previous, &now, now_at.duration_since(previous_at).as_secs_f64());
        if args.csv {
            for row in &rows {
                println!("{}", row.csv());
            }
        } else {
            print_watch(&rows, printed);
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        (previous, previous_at) = (now, now_at);
        printed += 1;
    }
    Ok(())
}

/// One volume over one interval of `stats --watch`.
struct WatchRow {
    time: String,
    export: String,
    reads_per_second: f64,
    writes_per_second: f64,
    read_mib_per_second: f64,
    write_mib_per_second: f64,
    /// Full line hits over line accesses in the interval (none: no access).
    line_hit_ratio: Option<f64>,
    dirty_lines: u64,
    resident_lines: u64,
    failed_requests: u64,
}

impl WatchRow {
    const CSV_HEADER: &str = "time,export,reads_per_s,writes_per_s,read_mib_per_s,write_mib_per_s,line_hit_ratio,dirty_lines,resident_lines,failed_requests";

    fn csv(&self) -> String {
        format!(
            "{},{},{:.1},{:.1},{:.3},{:.3},{},{},{},{}",
            self.time,
            self.export,
            self.reads_per_second,
            self.writes_per_second,
            self.read_mib_per_second,
            self.write_mib_per_second,
            self.line_hit_ratio.map_or(String::new(), |r| format!("{r:.4}")),
            self.dirty_lines,
            self.resident_lines,
            self.failed_requests
        )
    }
}

/// Each volume's rates between two `stats` replies `seconds` apart (a
/// volume attached meanwhile counts from zero).
fn watch_rows(before: &Value, after: &Value, seconds: f64) -> Vec<WatchRow> {
    let time = time_of_day_utc();
    let seconds = seconds.max(1e-9);
    let mut rows = Vec::new();
    for v in after["volumes"].as_array().into_iter().flatten() {
        let export = v["export"].as_str().unwrap_or("").to_string();
        let old = before["volumes"].as_array().and_then(|vs| {
            vs.iter()
                .find(|o| o["export"] == v["export"] && o["volume_id"] == v["volume_id"])
        });
        let delta = |key: &str| {
            let now = v[key].as_u64().unwrap_or(0);
            now.saturating_sub(old.and_then(|o| o[key].as_u64()).unwrap_or(0))
        };
        let accesses = delta("line_accesses");
        let hits = delta("read_hits") + delta("write_hits");
        rows.push(WatchRow {
            time: time.clone(),
            export,
            reads_per_second: delta("read_requests") as f64 / seconds,
            writes_per_second: delta("write_requests") as f64 / seconds,
            read_mib_per_second: delta("read_bytes") as f64 / seconds / (1 << 20) as f64,
            write_mib_per_second: delta("write_bytes") as f64 / seconds / (1 << 20) as f64,
            line_hit_ratio: (accesses > 0).then(|| hits as f64 / accesses as f64),
            dirty_lines: v["dirty_lines"].as_u64().unwrap_or(0),
            resident_lines: v["resident_lines"].as_u64().unwrap_or(0),
            failed_requests: delta("failed_requests"),
        });
    }
    rows
}

/// The time of day (UTC), `HH:MM:SS`.
fn time_of_day_utc() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        % 86_400;
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

fn print_watch(rows: &[WatchRow], printed: u64) {
    if printed.is_multiple_of(20) {
        println!(
            "{:<8} {:<16} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10} {:>10} {:>6}",
            "time(UTC)", "export", "r/s", "w/s", "rMiB/s", "wMiB/s", "hit%", "dirty", "cached", "failed"
        );
    }
    for r in rows {
        println!(
            "{:<8} {:<16} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>7} {:>10} {:>10} {:>6}",
            r.time,
            r.export,
            r.reads_per_second,
            r.writes_per_second,
            r.read_mib_per_second,
            r.write_mib_per_second,
            r.line_hit_ratio
                .map_or("-".to_string(), |h| format!("{:.2}", h * 100.0)),
            r.dirty_lines,
            r.resident_lines,
            r.failed_requests
        );
    }
}

/// `stats --csv`: each volume's counters since the server started.
fn totals_csv(json: &Value) -> String {
    const KEYS: [&str; 14] = [
        "read_requests",
        "write_requests",
        "read_bytes",
        "write_bytes",
        "line_accesses",
        "read_hits",
        "write_hits",
        "partial_hits",
        "full_misses",
        "failed_requests",
        "resident_lines",
        "dirty_lines",
        "promotions",
        "evictions",
    ];
    let mut out = format!("export,{}\n", KEYS.join(","));
    for v in json["volumes"].as_array().into_iter().flatten() {
        let values: Vec<String> = KEYS
            .iter()
            .map(|k| v[*k].as_u64().unwrap_or(0).to_string())
            .collect();
        out += &format!("{},{}\n", v["export"].as_str().unwrap_or(""), values.join(","));
    }
    out
}

/// A JSON value as the text table shows it: a string without its quotes.
fn plain(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_string)
}

fn print_stats(json: &Value, raw: bool) -> Result<()> {
    if raw {
        println!("{}", serde_json::to_string_pretty(json)?);
        return Ok(());
    }
    for v in json["volumes"].as_array().into_iter().flatten() {
        println!(
            "volume {} ({} bytes) over {}",
            plain(&v["export"]),
            v["size_bytes"],
            plain(&v["backend"])
        );
        let sharing = v["cache"]["volumes"].as_array().map_or(0, Vec::len);
        // The write policy in force, and why when it is not the configured one.
        let write_policy = if v["effective_write_policy"] == v["write_policy"] {
            plain(&v["write_policy"])
        } else {
            format!(
                "{} (configured {}; {})",
                plain(&v["effective_write_policy"]),
                plain(&v["write_policy"]),
                plain(&v["effective_write_policy_cause"])
            )
        };
        println!(
            "  cache      {} ({}), {} policy, {} write policy, lookup {} ({} shards)",
            plain(&v["cache"]["path"]),
            if sharing > 1 {
                format!("shared by {sharing} volumes")
            } else {
                "its own".to_string()
            },
            plain(&v["policy"]),
            write_policy,
            plain(&v["lookup"]),
            v["shards"]
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
            "  requests   {} ({} reads, {} writes, {} failed); line hit ratio {:.2} %",
            v["requests"],
            v["read_requests"],
            v["write_requests"],
            v["failed_requests"],
            v["hit_ratio"].as_f64().unwrap_or(0.0) * 100.0
        );
        println!(
            "  lines      {} read hits, {} write hits, {} partial hits, {} full misses",
            v["read_hits"], v["write_hits"], v["partial_hits"], v["full_misses"]
        );
        println!(
            "  cache-wide {} promotions, {} evictions, {} write-backs, {} bypassed, {} I/O errors",
            v["promotions"], v["evictions"], v["write_backs"], v["bypassed_accesses"], v["io_errors"]
        );
        let r = &v["recovery"];
        println!(
            "  metadata   persistence {}, {} barriers, {} records written, {} intents; at start: {} dirty and {} clean lines loaded, {} dropped ({} older than the backend, {} unchecked), {} corrupt copies",
            v["persistence"].as_str().unwrap_or("?"),
            v["barriers"],
            v["records_written"],
            v["intents_written"],
            r["dirty_lines"],
            r["clean_lines"],
            r["dropped_clean_lines"],
            r["stale_clean_lines"],
            r["unchecked_clean_lines"],
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
        let a = &v["array"];
        if let Some(members) = a["members"].as_array() {
            let listed: Vec<String> = members
                .iter()
                .map(|m| {
                    format!(
                        "{} {}",
                        m["device"].as_str().unwrap_or("?"),
                        m["state"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            println!(
                "  array      {}{}: {}",
                if a["degraded"].as_bool().unwrap_or(false) {
                    "DEGRADED"
                } else {
                    "healthy"
                },
                if a["degraded"].as_bool().unwrap_or(false) && !a["evacuated"].as_bool().unwrap_or(false) {
                    " (writing back lines that lost a copy)"
                } else {
                    ""
                },
                listed.join(", ")
            );
            println!(
                "  mirrors    {} / {} mirror slots used, dirty cap {} lines ({} writes written through at the cap), {} mirror reads, {} lines evacuated, {} lost",
                a["mirror_slots_used"],
                a["mirror_slots"],
                a["dirty_cap"],
                a["dirty_cap_write_throughs"],
                a["mirror_reads"],
                a["evacuated_lines"],
                a["lost_lines"]
            );
        }
        if v["queues"].is_object() {
            println!(
                "  cache I/O  {}",
                queue_text(&v["queues"]["cache"], &["R", "W", "P", "E"])
            );
            println!(
                "  backend IO {}",
                queue_text(&v["queues"]["backend"], &["read", "write", "writeback"])
            );
        }
        let b = &v["balance"];
        if b.is_object() {
            println!(
                "  balance    {}: {}{} ({} switches in {} intervals), {} requests sent to the backend ({} refused: dirty)",
                b["spec"].as_str().unwrap_or("?"),
                b["action"].as_str().unwrap_or("?"),
                if b["policy"].is_null() {
                    ""
                } else {
                    " set by the controller"
                },
                b["switches"],
                b["intervals"],
                b["bypassed_requests"],
                b["bypasses_refused_dirty"]
            );
            let d = &b["last"];
            if d.is_object() {
                let f = |x: &Value| x.as_f64().unwrap_or(0.0);
                println!(
                    "  last       interval {}: T_cache {:.3} ms (Q {:.1}), T_backend {:.3} ms (Q {:.1}), R/W/P/E {:.0}/{:.0}/{:.0}/{:.0} %, {}group {}",
                    d["interval"],
                    f(&d["cache"]["queue_time_ms"]),
                    f(&d["cache"]["queued"]),
                    f(&d["backend"]["queue_time_ms"]),
                    f(&d["backend"]["queued"]),
                    f(&d["shares"]["R"]) * 100.0,
                    f(&d["shares"]["W"]) * 100.0,
                    f(&d["shares"]["P"]) * 100.0,
                    f(&d["shares"]["E"]) * 100.0,
                    if d["bottleneck"].as_bool().unwrap_or(false) {
                        "cache bottleneck, "
                    } else {
                        ""
                    },
                    d["group"].as_str().unwrap_or("-")
                );
            }
        }
        crate::reca_cli::print_status(&v["reca"], "  ");
        for kind in ["read", "write"] {
            let l = &v["latency"][kind];
            let requests = l["count"].as_u64().unwrap_or(0);
            if requests == 0 {
                println!("  {kind:<5} µs  no {kind}s yet");
                continue;
            }
            println!(
                "  {kind:<5} µs  p50 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  ({})",
                l["p50_us"].as_f64().unwrap_or(0.0),
                l["p99_us"].as_f64().unwrap_or(0.0),
                l["p99_9_us"].as_f64().unwrap_or(0.0),
                l["p99_99_us"].as_f64().unwrap_or(0.0),
                iocache_report::count(requests, "request")
            );
        }
    }
    let s = &json["server"];
    if s.is_object() {
        println!(
            "server: {} connections now ({} accepted, {} reached transmission); refused {} (listener full) and {} (peer's \
             share), evicted {}, {} handshake timeouts, {} TLS failures, {} thread failures; payload held {} B (peak {} B)",
            s["active_connections"],
            s["connections"],
            s["transmissions"],
            s["refused_connections"],
            s["refused_per_peer"],
            s["evicted_connections"],
            s["handshake_timeouts"],
            s["tls_failures"],
            s["spawn_failures"],
            s["inflight_bytes"],
            s["peak_inflight_bytes"]
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct CtlArgs {
    /// The admin socket of a running `iocache serve`.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "iocache-data/admin.sock",
        global = true
    )]
    admin_socket: PathBuf,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// Add a volume to a cache device and serve it as a new export.
    Attach {
        /// The new export's name.
        export: String,
        /// Its backend: a file or block device, or nbd://host:port/name, nbd+unix:///name?socket=PATH.
        backend: String,
        /// Create a missing backend file with this size (sparse).
        #[arg(long, value_name = "SIZE")]
        backend_size: Option<String>,
        /// The cache device to share (needed when the server has several).
        #[arg(long, value_name = "PATH")]
        cache: Option<PathBuf>,
    },
    /// Stop serving an export: write back its dirty lines, drop its lines from the cache.
    Detach { export: String },
    /// Write back an export's dirty lines (it keeps serving).
    Flush { export: String },
    /// Change knobs of a running cache (KEY=VALUE with the configuration file's keys:
    /// write_policy, promotion, policy, flush, write_miss_bypass, seq_cutoff, max_dirty_lines).
    /// No cached or dirty line is lost; leaving wb/wo for a policy that keeps no dirty data
    /// writes the dirty lines back in the background. Changes survive restarts.
    Set {
        /// The export whose cache to change (needed when the server has several caches).
        #[arg(long, value_name = "NAME")]
        export: Option<String>,
        /// KEY=VALUE, one or more.
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Show the knobs of a running cache: configured and current values.
    Get {
        /// The export whose cache to show (needed when the server has several caches).
        #[arg(long, value_name = "NAME")]
        export: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Reload ReCA's category table in a running server (serve --adapt reca): FILE, or the
    /// file in use. The category in force stays if the new table has it (with its new
    /// configuration); a table with errors is refused, naming the file, line and field.
    RecaReload {
        /// The export whose cache to change (needed when the server has several caches).
        #[arg(long, value_name = "NAME")]
        export: Option<String>,
        /// The new table (TOML, the fields of crates/iocache-core/data/reca-categories.toml).
        #[arg(long, value_name = "FILE")]
        table: Option<PathBuf>,
    },
    /// Show the statistics of every export, or of one.
    Stats {
        export: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Prints a cache's knobs: one line each, the current value and, when it
/// differs, the configured one; then the write policy in force.
fn print_settings(reply: &Value) {
    println!("cache {} (volumes {})", reply["cache"], reply["volumes"]);
    for k in reply["settings"].as_array().into_iter().flatten() {
        let current = k["current"].as_str().unwrap_or("?");
        let configured = k["configured"].as_str().unwrap_or("?");
        if current == configured {
            println!("  {:<18} {current}", k["key"].as_str().unwrap_or("?"));
        } else {
            println!(
                "  {:<18} {current} (configured {configured})",
                k["key"].as_str().unwrap_or("?")
            );
        }
    }
    println!(
        "  in force: {} write policy ({}); {} dirty lines",
        reply["effective_write_policy"].as_str().unwrap_or("?"),
        reply["effective_write_policy_cause"].as_str().unwrap_or("?"),
        reply["dirty_lines"]
    );
    crate::reca_cli::print_status(&reply["reca"], "  ");
}

/// A path given to `ctl`, as the server (which may run elsewhere) must see it.
fn absolute(path: &str) -> Result<String> {
    if path.starts_with("nbd://") || path.starts_with("nbd+unix://") {
        return Ok(path.to_string());
    }
    Ok(std::path::absolute(path)
        .with_context(|| format!("resolving {path}"))?
        .display()
        .to_string())
}

/// `iocache ctl`: attach, detach, flush or show one volume of a running server.
pub fn ctl(args: CtlArgs) -> Result<()> {
    let socket = &args.admin_socket;
    match args.command {
        CtlCommand::Attach {
            export,
            backend,
            backend_size,
            cache,
        } => {
            let mut req = json!({
                "command": "attach",
                "export": export,
                "backend": absolute(&backend)?,
            });
            if let Some(size) = backend_size {
                req["backend_size"] = json!(size);
            }
            if let Some(cache) = cache {
                req["cache"] = json!(absolute(&cache.display().to_string())?);
            }
            let reply = request(socket, &req.to_string(), None)?;
            println!(
                "attached export {} (volume {}, {} bytes over {}) to the cache {}",
                reply["export"], reply["volume_id"], reply["size_bytes"], reply["backend"], reply["cache"]
            );
        }
        CtlCommand::Detach { export } => {
            let reply = request(
                socket,
                &json!({"command": "detach", "export": export}).to_string(),
                None,
            )?;
            println!(
                "detached export {}: its {} dirty lines are on its backend, its lines left the cache",
                reply["export"], reply["dirty_lines_written_back"]
            );
        }
        CtlCommand::Flush { export } => {
            let reply = request(
                socket,
                &json!({"command": "flush", "export": export}).to_string(),
                None,
            )?;
            println!(
                "flushed export {}: {} written back",
                reply["export"],
                iocache_report::count(reply["written_back_lines"].as_u64().unwrap_or(0), "line")
            );
        }
        CtlCommand::Set { export, settings } => {
            let mut req = json!({"command": "set", "settings": settings});
            if let Some(export) = export {
                req["export"] = json!(export);
            }
            let reply = request(socket, &req.to_string(), Some(Duration::from_secs(30)))?;
            print_settings(&reply);
        }
        CtlCommand::Get { export, json } => {
            let mut req = json!({"command": "get"});
            if let Some(export) = export {
                req["export"] = json!(export);
            }
            let reply = request(socket, &req.to_string(), Some(Duration::from_secs(10)))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reply)?);
            } else {
                print_settings(&reply);
            }
        }
        CtlCommand::RecaReload { export, table } => {
            let mut req = json!({"command": "reca-reload"});
            if let Some(export) = export {
                req["export"] = json!(export);
            }
            if let Some(table) = table {
                req["table"] = json!(absolute(&table.display().to_string())?);
            }
            let reply = request(socket, &req.to_string(), Some(Duration::from_secs(30)))?;
            println!(
                "reloaded ReCA's table from {} ({} categories)",
                reply["table"].as_str().unwrap_or("?"),
                reply["categories"].as_array().map_or(0, Vec::len)
            );
            crate::reca_cli::print_status(&reply, "  ");
        }
        CtlCommand::Stats { export, json } => {
            let mut req = json!({"command": "stats"});
            if let Some(export) = export {
                req["export"] = json!(export);
            }
            let reply = request(socket, &req.to_string(), Some(Duration::from_secs(10)))?;
            print_stats(&reply, json)?;
        }
    }
    Ok(())
}
