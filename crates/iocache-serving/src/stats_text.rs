//! The statistics snapshot as the text table `iocache stats` prints: one
//! block per volume (its cache device, decisions, metadata, health, queues,
//! latency) and a line for the server.

use std::fmt::Write;

use iocache_core::reca::FEATURE_NAMES;
use iocache_core::units::format_byte_size;

use crate::stats::{DeviceQueue, RecaSnapshot, Snapshot};

/// One line into `out` (a `String`: writing cannot fail).
macro_rules! put {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

/// One device's queue as text: each class's count, in flight and mean
/// latency, in `order`.
fn queue_text(q: &DeviceQueue, order: &[&str]) -> String {
    let parts: Vec<String> = order
        .iter()
        .filter_map(|name| {
            let c = q.classes.get(*name)?;
            Some(format!(
                "{name} {} ({} in flight, {:.1} µs)",
                c.completed, c.in_flight, c.mean_latency_us
            ))
        })
        .collect();
    format!("{}; {} in flight", parts.join(", "), q.in_flight)
}

/// `iocache stats`' table: each volume, its cache, and the server.
pub fn render(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    for v in &snapshot.volumes {
        let d = &v.device;
        put!(
            out,
            "volume {} ({} bytes) over {}",
            v.export,
            v.size_bytes,
            v.backend
        );
        let sharing = d.cache.volumes.len();
        // The write policy in force, and why when it is not the configured one.
        let write_policy = if d.effective_write_policy == d.write_policy {
            d.write_policy.clone()
        } else {
            format!(
                "{} (configured {}; {})",
                d.effective_write_policy, d.write_policy, d.effective_write_policy_cause
            )
        };
        put!(
            out,
            "  cache      {} ({}), {} policy, {} write policy, lookup {} ({} shards)",
            d.cache.path,
            if sharing > 1 {
                format!("shared by {sharing} volumes")
            } else {
                "its own".to_string()
            },
            d.policy,
            write_policy,
            d.lookup,
            d.shards
        );
        // An older server's JSON has no `lines_in_service`: all of them.
        let in_service = match d.lines_in_service {
            0 => d.capacity_lines,
            n => n,
        };
        put!(
            out,
            "  occupancy  {} / {} lines ({:.1} %), {} clean, {} dirty{}",
            v.resident_lines,
            in_service,
            v.occupancy * 100.0,
            v.clean_lines,
            v.dirty_lines,
            if in_service < d.capacity_lines {
                format!(
                    "; {} lines formatted, {} out of service",
                    d.capacity_lines,
                    d.capacity_lines - in_service
                )
            } else {
                String::new()
            }
        );
        put!(
            out,
            "  requests   {} ({} reads, {} writes, {} failed); line hit ratio {:.2} %",
            v.requests,
            v.read_requests,
            v.write_requests,
            v.failed_requests,
            v.hit_ratio * 100.0
        );
        put!(
            out,
            "  lines      {} read hits, {} write hits, {} partial hits, {} full misses",
            v.read_hits,
            v.write_hits,
            v.partial_hits,
            v.full_misses
        );
        put!(
            out,
            "  cache-wide {} promotions, {} evictions, {} write-backs, {} bypassed, {} I/O errors",
            d.promotions,
            d.evictions,
            d.write_backs,
            d.bypassed_accesses,
            d.io_errors
        );
        put!(
            out,
            "  discards   {} trims, {} zeroings; {} lines dropped, {} of them dirty (never written back)",
            d.block_commands.discards,
            d.block_commands.zeroings,
            d.block_commands.dropped_lines,
            d.block_commands.dropped_dirty_lines
        );
        if let Some(o) = &d.ordered {
            put!(
                out,
                "  ordered    epoch {}, the backend holds everything before epoch {} ({} behind); {} writes waited, {} backend flushes",
                o.epoch,
                o.durable_before,
                o.epochs_behind,
                o.waits,
                o.backend_flushes
            );
        }
        if d.block_commands.warm_requested_bytes > 0 {
            put!(
                out,
                "  warm-up    {} of {} read through the cache (NBD_CMD_CACHE, ctl warm)",
                iocache_core::units::format_size_readably(d.block_commands.warmed_bytes),
                iocache_core::units::format_size_readably(d.block_commands.warm_requested_bytes)
            );
        }
        if d.readahead_fills + d.readahead_dropped_fills > 0 {
            put!(
                out,
                "  readahead  {} fills brought {} lines in: {} used, {} left unused; {} fills dropped (queue full), {} failed",
                d.readahead_fills,
                d.readahead_lines,
                d.readahead_used_lines,
                d.readahead_unused_lines,
                d.readahead_dropped_fills,
                d.readahead_failed_fills
            );
        }
        let r = &d.recovery;
        put!(out,
            "  metadata   persistence {}, {} barriers, {} records written, {} intents; at start: {} dirty and {} clean lines loaded, {} dropped ({} older than the backend, {} unchecked), {} corrupt copies",
            d.persistence.as_deref().unwrap_or("?"),
            d.barriers,
            d.records_written,
            d.intents_written,
            r.dirty_lines,
            r.clean_lines,
            r.dropped_clean_lines,
            r.stale_clean_lines,
            r.unchecked_clean_lines,
            r.corrupt_copies
        );
        put!(
            out,
            "  health     cache device {} ({} errors), {} backend errors, {} failed write-backs",
            if d.cache_device_failed {
                "FAILED: pass-through"
            } else {
                "ok"
            },
            d.cache_device_errors,
            d.backend_errors,
            d.failed_writebacks
        );
        if let Some(a) = &d.array {
            let listed: Vec<String> = a
                .members
                .iter()
                .map(|m| format!("{} {}", m.device, m.state))
                .collect();
            put!(
                out,
                "  array      {}{}: {}",
                if a.degraded { "DEGRADED" } else { "healthy" },
                if a.rebuild_pending > 0 {
                    format!(" (rebuilding: {} slots left)", a.rebuild_pending)
                } else if a.degraded && !a.evacuated {
                    " (writing back lines that lost a copy)".to_string()
                } else {
                    String::new()
                },
                listed.join(", ")
            );
            put!(out,
                "  mirrors    {} / {} mirror slots used, dirty cap {} lines ({} writes written through at the cap), {} mirror reads, {} lines evacuated, {} lost, {} members replaced",
                a.mirror_slots_used,
                a.mirror_slots,
                a.dirty_cap,
                a.dirty_cap_write_throughs,
                a.mirror_reads,
                a.evacuated_lines,
                a.lost_lines,
                a.replacements
            );
        }
        put!(
            out,
            "  cache I/O  {}",
            queue_text(&d.queues.cache, &["R", "W", "P", "E"])
        );
        put!(
            out,
            "  backend IO {}",
            queue_text(&d.queues.backend, &["read", "write", "writeback"])
        );
        if let Some(b) = &d.balance {
            put!(out,
                "  balance    {}: {}{} ({} switches in {} intervals), {} requests sent to the backend ({} refused: dirty)",
                b.spec.as_deref().unwrap_or("?"),
                b.action,
                if b.policy.is_none() {
                    ""
                } else {
                    " set by the controller"
                },
                b.switches,
                b.intervals,
                b.bypassed_requests,
                b.bypasses_refused_dirty
            );
            if let Some(last) = &b.last {
                put!(out,
                    "  last       interval {}: T_cache {:.3} ms (Q {:.1}), T_backend {:.3} ms (Q {:.1}), R/W/P/E {:.0}/{:.0}/{:.0}/{:.0} %, {}group {}",
                    last.interval,
                    last.cache.queue_time_ms,
                    last.cache.queued,
                    last.backend.queue_time_ms,
                    last.backend.queued,
                    last.shares.R * 100.0,
                    last.shares.W * 100.0,
                    last.shares.P * 100.0,
                    last.shares.E * 100.0,
                    if last.bottleneck {
                        "cache bottleneck, "
                    } else {
                        ""
                    },
                    last.group.as_deref().unwrap_or("-")
                );
            }
        }
        if let Some(reca) = &d.reca {
            out += &reca_status(reca, "  ");
        }
        for (kind, l) in [("read", &v.latency.read), ("write", &v.latency.write)] {
            if l.count == 0 {
                put!(out, "  {kind:<5} µs  no {kind}s yet");
                continue;
            }
            put!(
                out,
                "  {kind:<5} µs  p50 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  ({})",
                l.p50_us,
                l.p99_us,
                l.p99_9_us,
                l.p99_99_us,
                iocache_core::units::count(l.count, "request")
            );
        }
    }
    let s = &snapshot.server;
    put!(out,
        "server: {} connections now ({} accepted, {} reached transmission); refused {} (listener full) and {} (peer's \
         share), evicted {}, {} handshake timeouts, {} TLS failures, {} thread failures; payload held {} B (peak {} B)",
        s.active_connections,
        s.connections,
        s.transmissions,
        s.refused_connections,
        s.refused_per_peer,
        s.evicted_connections,
        s.handshake_timeouts,
        s.tls_failures,
        s.spawn_failures,
        s.inflight_bytes,
        s.peak_inflight_bytes
    );
    out
}

/// ReCA's status as text (`iocache stats`, `ctl get`), each line indented
/// by `indent`.
pub fn reca_status(r: &RecaSnapshot, indent: &str) -> String {
    let mut out = String::new();
    let category = match (&r.category, r.since_s) {
        (Some(name), Some(since)) => format!("{name} since {since:.1}s"),
        _ => "none yet".into(),
    };
    put!(
        out,
        "{indent}reca       category {category} ({} changes, {} windows of {} requests; table {})",
        r.category_changes,
        r.windows,
        r.window_requests,
        r.table
    );
    if let Some(vector) = &r.vector {
        let v: Vec<String> = FEATURE_NAMES
            .iter()
            .filter_map(|k| Some(format!("{k} {:.2}", vector.get(*k)?)))
            .collect();
        put!(out, "{indent}           last vector: {}", v.join(", "));
    }
    let mut line_size = format!("line size {}", format_byte_size(r.line_bytes));
    if r.line_bytes != r.configured_line_bytes {
        line_size += &format!(
            " (ReCA's; configured {})",
            format_byte_size(r.configured_line_bytes)
        );
    }
    if let Some(p) = r.pending_line_bytes {
        line_size += &format!(" -> {} PENDING (taken at the next start)", format_byte_size(p));
    }
    match (&r.write_policy, &r.policy) {
        (Some(write_policy), Some(policy)) => {
            put!(
                out,
                "{indent}           in force: write policy {write_policy}, policy {policy}; {line_size}"
            )
        }
        _ => put!(
            out,
            "{indent}           in force: the configured policies until a category; {line_size}"
        ),
    }
    put!(
        out,
        "{indent}           {} requests characterized, {} skipped (over {} per second), {} dropped",
        r.observed_requests,
        r.skipped_requests,
        r.max_requests_per_second
            .map_or_else(|| "no limit".to_string(), |n| n.to_string()),
        r.dropped_requests
    );
    out
}
