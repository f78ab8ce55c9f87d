//! The admin socket of a running server (its clients use
//! [`crate::admin_client`]).
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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::{refused, Result, Within};

use crate::running::{AttachRequest, Running};

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
        return Err(refused!("no export `{name}` is served"));
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
                    .map_or(Value::Null, |r| crate::reca::status_json(&r)),
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

/// Runs one admin request.
fn dispatch(state: &Running, line: &str) -> Result<Value> {
    match line {
        "stats" | "" => return stats_json(state, None),
        text if !text.starts_with('{') => {
            return Err(refused!(
                "unknown command `{}`; expected `stats` or a JSON request",
                shortened(text)
            ))
        }
        _ => {}
    }
    let request: Value = serde_json::from_str(line).within(|| "the request is not JSON".to_string())?;
    let field = |name: &str| request.get(name).and_then(Value::as_str);
    let needed = |name: &str| field(name).ok_or_else(|| refused!("the request needs `{name}`"));
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
                .ok_or_else(|| refused!("the request needs `settings`: a list of \"KEY=VALUE\""))?
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| refused!("`settings` must be a list of strings"))?;
            state.set_settings(field("export"), &changes)
        }
        Some("reca-reload") => state.reca_reload(field("export"), field("table")),
        Some(other) => Err(refused!(
            "unknown command `{}`; expected stats, attach, detach, flush, get, set or reca-reload",
            shortened(other)
        )),
        None => Err(refused!("the request needs a `command`")),
    }
}

/// Longest request line read (64 KiB, far above any real request: an
/// attach with two 4 KiB paths is about 8.3 KiB).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Admin connections served at once. A connection holds a thread and at
/// most `MAX_REQUEST_BYTES` of request for at most `REQUEST_DEADLINE`
/// (then the time its request takes to run).
pub const MAX_CONNECTIONS: usize = 16;
/// Time a client has to send its whole request line, counted from the
/// moment its connection is taken up (every real client writes the line in
/// one go right after connecting).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
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
            Err(e) => json!({ "error": crate::error_chain_text(&e) }),
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
pub fn serve_admin(listener: UnixListener, state: Arc<Running>) {
    let active = Arc::new(AtomicUsize::new(0));
    let last_log = Mutex::new(None);
    loop {
        let accepted = listener.accept();
        if state.stopping() {
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
