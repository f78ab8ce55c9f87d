//! A running server's statistics as one typed value, [`Snapshot`], taken
//! once per question. The admin socket answers it as JSON (these types
//! are its schema), `iocache stats` reads that JSON back into the same type
//! to print its table, CSV and rates, and the Prometheus endpoint renders
//! it too: one reading of the engines, one set of names.
//!
//! A few fields only the metrics need (histogram buckets, latency sums,
//! every cache device even with no volume left) stay in memory and are
//! not part of the JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{refused, Result};
use crate::running::{lock, CacheGroup, Running};

/// Everything `iocache stats` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// One entry per served volume (of one export when asked), in the
    /// configuration's order.
    pub volumes: Vec<VolumeSnapshot>,
    pub server: ServerSnapshot,
    /// Every cache device once, with or without volumes (the metrics').
    #[serde(skip)]
    pub caches: Vec<CacheDeviceSnapshot>,
}

/// One volume, with the cache device it uses (its fields flattened in).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VolumeSnapshot {
    pub export: String,
    /// The backend's name (path or URI).
    pub backend: String,
    pub volume_id: u32,
    pub size_bytes: u64,
    pub resident_lines: u64,
    pub dirty_lines: u64,
    pub clean_lines: u64,
    /// The volume's resident lines over the cache's capacity.
    pub occupancy: f64,
    pub requests: u64,
    pub read_requests: u64,
    pub write_requests: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub line_accesses: u64,
    pub read_hits: u64,
    pub write_hits: u64,
    pub partial_hits: u64,
    pub full_misses: u64,
    /// Full line hits over line accesses.
    pub hit_ratio: f64,
    pub failed_requests: u64,
    pub latency: ReadWriteLatency,
    #[serde(flatten)]
    pub device: CacheDeviceSnapshot,
}

/// Request latency percentiles of reads and of writes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReadWriteLatency {
    pub read: Latency,
    pub write: Latency,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p99_9_us: f64,
    pub p99_99_us: f64,
    pub max_us: f64,
    /// The histogram behind them (the metrics').
    #[serde(skip)]
    pub histogram: iocache_engine::LatencyPercentiles,
}

impl From<&iocache_engine::LatencyPercentiles> for Latency {
    fn from(p: &iocache_engine::LatencyPercentiles) -> Latency {
        let us = |ns: u64| ns as f64 / 1e3;
        Latency {
            count: p.count,
            p50_us: us(p.p50_ns),
            p99_us: us(p.p99_ns),
            p99_9_us: us(p.p999_ns),
            p99_99_us: us(p.p9999_ns),
            max_us: us(p.max_ns),
            histogram: *p,
        }
    }
}

/// A cache device as a whole (all its volumes): policies, decisions,
/// health, metadata, what opening it found, and its controllers.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CacheDeviceSnapshot {
    pub write_policy: String,
    /// The write policy in force, and why (configured, a controller, a
    /// fall-back).
    pub effective_write_policy: String,
    pub effective_write_policy_cause: String,
    /// The replacement policy in force (`ctl set policy=` changes it).
    pub policy: String,
    pub lookup: String,
    pub shards: u64,
    pub capacity_lines: u64,
    /// Lines in service: `capacity_lines` less those out of service (taken
    /// out by a resize, or on a failed cache-array member).
    #[serde(default)]
    pub lines_in_service: u64,
    pub line_bytes: u64,
    pub promotions: u64,
    pub evictions: u64,
    pub write_backs: u64,
    pub bypassed_accesses: u64,
    pub seq_cutoff_requests: u64,
    pub write_miss_bypasses: u64,
    pub io_errors: u64,
    pub forgotten_lines: u64,
    pub dirty_victims_kept: u64,
    pub cache_device_errors: u64,
    pub backend_errors: u64,
    pub failed_writebacks: u64,
    /// Requests pass through to the backend: the cache device failed.
    pub cache_device_failed: bool,
    pub persistence: Option<String>,
    pub barriers: u64,
    pub records_written: u64,
    pub intents_written: u64,
    pub intent_flushes: u64,
    /// Discard (TRIM) and zeroing requests, the lines they dropped, and
    /// warming (the engine's own counters, their fields flattened in).
    #[serde(flatten)]
    pub block_commands: iocache_engine::BlockCommandStats,
    /// Readahead: fills run, lines they brought in, of those lines used
    /// and lines that left unused; fills dropped (queue full) and failed.
    pub readahead_fills: u64,
    pub readahead_lines: u64,
    pub readahead_used_lines: u64,
    pub readahead_unused_lines: u64,
    pub readahead_dropped_fills: u64,
    pub readahead_failed_fills: u64,
    pub recovery: RecoverySnapshot,
    pub cache: CacheSummary,
    pub array: Option<ArraySnapshot>,
    pub queues: Queues,
    pub balance: Option<BalanceSnapshot>,
    pub reca: Option<RecaSnapshot>,
    pub line_size_changes: Vec<LineSizeChange>,
    /// Ordered write-back, when it is on.
    pub ordered: Option<OrderedSnapshot>,
    /// Requests the load balancer sent around the cache, and those it
    /// could not (dirty data); counted with or without a balancer (the
    /// metrics').
    #[serde(skip)]
    pub balance_bypasses: (u64, u64),
}

/// Ordered write-back: the FLUSH epoch writes join, the epoch before which
/// the backend holds everything, and the cost so far (the engine's own
/// counters).
pub type OrderedSnapshot = iocache_engine::OrderedStats;

/// What opening the cache device found (the engine's own report, its
/// counters serialized).
pub type RecoverySnapshot = iocache_engine::RecoveryReport;

/// The cache device: where, whose, and its totals.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CacheSummary {
    pub path: String,
    /// The volumes sharing it.
    pub volumes: Vec<String>,
    pub resident_lines: u64,
    pub dirty_lines: u64,
    pub requests: u64,
    pub hit_ratio: f64,
}

/// A cache array's members and mirrors.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ArraySnapshot {
    pub members: Vec<ArrayMember>,
    pub degraded: bool,
    pub evacuated: bool,
    pub dirty_cap: u64,
    pub dirty_cap_write_throughs: u64,
    pub mirror_slots: u64,
    pub mirror_slots_used: u64,
    pub mirror_writes: u64,
    pub mirror_reads: u64,
    pub through_writes: u64,
    pub evacuated_lines: u64,
    pub retired_slots: u64,
    pub lost_lines: u64,
    /// Members replaced by another device while serving.
    #[serde(default)]
    pub replacements: u64,
    /// Line slots and mirror slots of a replacement still to rebuild (its
    /// member's state is `rebuilding`).
    #[serde(default)]
    pub rebuild_pending: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ArrayMember {
    pub device: String,
    /// `ok` or `failed`.
    pub state: String,
}

/// The I/O the engine issued to each side.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Queues {
    pub cache: DeviceQueue,
    pub backend: DeviceQueue,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeviceQueue {
    pub in_flight: u64,
    /// By class: the cache device's R, W, P and E; the backends' read,
    /// write and writeback.
    pub classes: BTreeMap<String, QueueClass>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct QueueClass {
    pub issued: u64,
    pub completed: u64,
    pub in_flight: u64,
    pub mean_latency_us: f64,
    /// The completed I/Os' latencies summed (the metrics').
    #[serde(skip)]
    pub latency_ns_total: u64,
}

impl From<&iocache_engine::DeviceQueueStats> for DeviceQueue {
    fn from(q: &iocache_engine::DeviceQueueStats) -> DeviceQueue {
        DeviceQueue {
            in_flight: q.in_flight,
            classes: q
                .classes
                .iter()
                .map(|c| {
                    let class = QueueClass {
                        issued: c.issued,
                        completed: c.completed,
                        in_flight: c.in_flight,
                        mean_latency_us: c.mean_latency_ns() as f64 / 1e3,
                        latency_ns_total: c.latency_ns_total,
                    };
                    (c.class.to_string(), class)
                })
                .collect(),
        }
    }
}

/// The load balancer (LBICA or SIB) and its last interval.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BalanceSnapshot {
    pub controller: String,
    /// The controller and its interval as configured.
    pub spec: Option<String>,
    pub interval_ms: f64,
    /// The write policy the controller set, if it set one.
    pub policy: Option<String>,
    pub bypass: bool,
    pub action: String,
    pub intervals: u64,
    pub switches: u64,
    pub bypassed_requests: u64,
    pub bypasses_refused_dirty: u64,
    pub last: Option<BalanceInterval>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BalanceInterval {
    pub interval: u64,
    pub cache: BalanceLoad,
    pub backend: BalanceLoad,
    /// The cache queue's shares of R, W, P and E requests.
    pub shares: Shares,
    pub arrivals: u64,
    pub bypassed: u64,
    pub bottleneck: bool,
    pub group: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[allow(non_snake_case)]
pub struct Shares {
    pub R: f64,
    pub W: f64,
    pub P: f64,
    pub E: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BalanceLoad {
    pub queued: f64,
    pub per_request_us: f64,
    pub service_us: f64,
    pub queue_time_ms: f64,
    pub completed: u64,
}

impl From<&iocache_engine::BalanceLoad> for BalanceLoad {
    fn from(l: &iocache_engine::BalanceLoad) -> BalanceLoad {
        BalanceLoad {
            queued: l.queued,
            per_request_us: l.per_request_ns / 1e3,
            service_us: l.service_ns / 1e3,
            queue_time_ms: l.queue_time_ns / 1e6,
            completed: l.completed,
        }
    }
}

/// What ReCA is doing on a serving cache.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RecaSnapshot {
    /// Where the category table came from (a path, or `built-in`).
    pub table: String,
    pub categories: Vec<String>,
    pub window_requests: u64,
    pub max_requests_per_second: Option<u64>,
    pub observed_requests: u64,
    pub skipped_requests: u64,
    pub dropped_requests: u64,
    pub windows: u64,
    pub category_changes: u64,
    pub category: Option<String>,
    /// Seconds since the category came into force, on the engine's clock.
    pub since_s: Option<f64>,
    /// The last window's workload vector, by feature name.
    pub vector: Option<BTreeMap<String, f64>>,
    /// The last window's distance to every category.
    pub distances: BTreeMap<String, f64>,
    pub write_policy: Option<String>,
    pub policy: Option<String>,
    pub line_bytes: u64,
    pub configured_line_bytes: u64,
    /// The line size wanted for the next start, when it differs.
    pub pending_line_bytes: Option<u64>,
    pub last_event: Option<String>,
}

impl From<&iocache_engine::RecaStatus> for RecaSnapshot {
    fn from(s: &iocache_engine::RecaStatus) -> RecaSnapshot {
        RecaSnapshot {
            table: s.table_source.clone(),
            categories: s.categories.clone(),
            window_requests: s.window_requests,
            max_requests_per_second: s.max_requests_per_second,
            observed_requests: s.observed_requests,
            skipped_requests: s.skipped_requests,
            dropped_requests: s.dropped_requests,
            windows: s.windows,
            category_changes: s.category_changes,
            category: s.category.clone(),
            since_s: s.since_ns.map(|ns| ns as f64 / 1e9),
            vector: s.last_features.map(|f| {
                iocache_core::reca::FEATURE_NAMES
                    .iter()
                    .zip(f.0)
                    .map(|(name, v)| (name.to_string(), v))
                    .collect()
            }),
            distances: s.last_distances.iter().cloned().collect(),
            write_policy: s.write_policy.clone(),
            policy: s.policy.clone(),
            line_bytes: s.line_size,
            configured_line_bytes: s.configured_line_size,
            pending_line_bytes: s.pending_line_size,
            last_event: s.last_event.clone(),
        }
    }
}

/// A line size changed while serving.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LineSizeChange {
    pub old_line_bytes: u64,
    pub new_line_bytes: u64,
    pub dirty_lines_written_back_first: u64,
    pub paused_ms: f64,
    pub warm_ranges: u64,
    pub warm_bytes: u64,
    /// Of `warm_bytes`, those copied from the old cache (filled from
    /// memory, not read from the backend again).
    #[serde(default)]
    pub kept_bytes: u64,
}

/// The NBD server: connections and what its limits did (the server's own
/// counters).
pub type ServerSnapshot = iocache_nbd::ServerStats;

impl Snapshot {
    /// Reads the engines and the server once: every volume, or the one
    /// exported as `export` (an error if none is).
    pub fn take(state: &Running, export: Option<&str>) -> Result<Snapshot> {
        let caches: Vec<CacheDeviceSnapshot> = state
            .caches
            .iter()
            .enumerate()
            .map(|(index, group)| cache_device(state, index, group))
            .collect();
        let served: Vec<(String, String, usize, iocache_engine::Volume)> = lock(&state.volumes)
            .iter()
            .filter(|v| export.is_none_or(|e| e == v.export))
            .map(|v| (v.export.clone(), v.backend.clone(), v.cache, v.volume.clone()))
            .collect();
        if let (Some(name), true) = (export, served.is_empty()) {
            return Err(refused!("no export `{name}` is served"));
        }
        let mut volumes = Vec::with_capacity(served.len());
        for (export, backend, cache, volume) in served {
            let engine = state.caches[cache].engine();
            // Detached meanwhile: not listed.
            let Ok(v) = engine.volume_stats(volume.id()) else {
                continue;
            };
            let device = caches[cache].clone();
            let capacity = device.lines_in_service;
            volumes.push(VolumeSnapshot {
                export,
                backend,
                volume_id: v.id,
                size_bytes: v.size_bytes,
                resident_lines: v.resident_lines,
                dirty_lines: v.dirty_lines,
                clean_lines: v.resident_lines - v.dirty_lines,
                occupancy: if capacity == 0 {
                    0.0
                } else {
                    v.resident_lines as f64 / capacity as f64
                },
                requests: v.requests(),
                read_requests: v.read_requests,
                write_requests: v.write_requests,
                read_bytes: v.read_bytes,
                write_bytes: v.write_bytes,
                line_accesses: v.line_accesses,
                read_hits: v.read_hits,
                write_hits: v.write_hits,
                partial_hits: v.partial_hits,
                full_misses: v.misses,
                hit_ratio: v.hit_ratio(),
                failed_requests: v.errors,
                latency: ReadWriteLatency {
                    read: (&v.read_latency).into(),
                    write: (&v.write_latency).into(),
                },
                device,
            });
        }
        Ok(Snapshot {
            volumes,
            server: state.server_stats(),
            caches,
        })
    }
}

/// One cache device's part of the snapshot.
fn cache_device(state: &Running, index: usize, group: &CacheGroup) -> CacheDeviceSnapshot {
    let engine = group.engine();
    let s = engine.stats();
    let c = &s.cache;
    let effective = engine.effective_mode();
    let array = s.array.as_ref().map(|a| ArraySnapshot {
        members: a
            .array
            .members
            .iter()
            .enumerate()
            .map(|(i, (name, failed))| ArrayMember {
                device: name.clone(),
                state: match (*failed, a.array.rebuilding == Some(i)) {
                    (true, _) => "failed",
                    (false, true) => "rebuilding",
                    (false, false) => "ok",
                }
                .into(),
            })
            .collect(),
        degraded: a.degraded,
        evacuated: a.evacuated,
        dirty_cap: a.dirty_cap,
        dirty_cap_write_throughs: c.dirty_cap_write_throughs,
        mirror_slots: a.array.mirror_slots,
        mirror_slots_used: a.array.mirror_slots_used,
        mirror_writes: a.array.mirror_writes,
        mirror_reads: a.array.mirror_reads,
        through_writes: a.array.through_writes,
        evacuated_lines: a.evacuated_lines,
        retired_slots: a.retired_slots,
        lost_lines: a.lost_lines,
        replacements: a.array.replacements,
        rebuild_pending: a.array.rebuild_pending,
    });
    let balance = s.balance.as_ref().map(|b| BalanceSnapshot {
        controller: b.controller.to_string(),
        spec: group.config.adapt.as_ref().map(|a| a.text.clone()),
        interval_ms: b.interval_ns as f64 / 1e6,
        policy: b.policy.map(|p| p.to_string()),
        bypass: b.bypass,
        action: b.action.clone(),
        intervals: b.intervals,
        switches: b.switches,
        bypassed_requests: c.balance_bypasses,
        bypasses_refused_dirty: c.balance_bypasses_refused_dirty,
        last: b.last.as_ref().map(|d| BalanceInterval {
            interval: d.interval,
            cache: (&d.cache).into(),
            backend: (&d.backend).into(),
            shares: Shares {
                R: d.shares[0],
                W: d.shares[1],
                P: d.shares[2],
                E: d.shares[3],
            },
            arrivals: d.arrivals,
            bypassed: d.bypassed,
            bottleneck: d.bottleneck,
            group: d.group.map(str::to_string),
        }),
    });
    let line_size_changes = lock(&state.relayouts)
        .iter()
        .filter(|change| change.cache == index)
        .map(|change| LineSizeChange {
            old_line_bytes: change.old_line_bytes,
            new_line_bytes: change.new_line_bytes,
            dirty_lines_written_back_first: change.written_back_before,
            paused_ms: change.paused.as_secs_f64() * 1e3,
            warm_ranges: change.warm_ranges as u64,
            warm_bytes: change.warm_bytes,
            kept_bytes: change.kept_bytes,
        })
        .collect();
    CacheDeviceSnapshot {
        write_policy: engine.write_policy().to_string(),
        effective_write_policy: effective.policy.to_string(),
        effective_write_policy_cause: effective.cause.name().to_string(),
        policy: engine
            .settings()
            .into_iter()
            .find(|k| k.key == "policy")
            .map_or_else(|| group.config.policy.to_string(), |k| k.current),
        lookup: engine.lookup().to_string(),
        shards: s.shards as u64,
        capacity_lines: s.capacity_lines,
        lines_in_service: s.lines_in_service,
        line_bytes: engine.line_bytes(),
        promotions: c.promotions,
        evictions: c.evictions,
        write_backs: c.dirty_writebacks + c.flushed_lines,
        bypassed_accesses: c.bypassed_accesses,
        seq_cutoff_requests: c.seq_cutoff_requests,
        write_miss_bypasses: c.write_miss_bypasses,
        io_errors: s.io_errors,
        forgotten_lines: s.forgotten_lines,
        dirty_victims_kept: c.dirty_victims_kept,
        cache_device_errors: s.cache_device_errors,
        backend_errors: s.backend_errors,
        failed_writebacks: s.failed_writebacks,
        cache_device_failed: s.cache_device_failed,
        persistence: s.persistence.map(|p| p.to_string()),
        barriers: s.barriers,
        records_written: s.records_written,
        intents_written: s.intents_written,
        intent_flushes: s.intent_flushes,
        block_commands: s.block_commands.clone(),
        readahead_fills: s.cache.prefetch_requests,
        readahead_lines: s.cache.prefetched_lines,
        readahead_used_lines: s.cache.prefetch_used_lines,
        readahead_unused_lines: s.cache.prefetch_unused_lines,
        readahead_dropped_fills: s.readahead_dropped_fills,
        readahead_failed_fills: s.readahead_failed_fills,
        ordered: s.ordered.clone(),
        recovery: s.recovery.clone(),
        cache: CacheSummary {
            path: group.path.display().to_string(),
            volumes: engine.volumes().into_iter().map(|v| v.name).collect(),
            resident_lines: s.resident_lines,
            dirty_lines: s.dirty_lines,
            requests: c.requests,
            hit_ratio: c.hit_ratio(),
        },
        array,
        queues: Queues {
            cache: (&s.cache_queue).into(),
            backend: (&s.backend_queue).into(),
        },
        balance,
        reca: engine.reca_status().as_ref().map(RecaSnapshot::from),
        line_size_changes,
        balance_bypasses: (c.balance_bypasses, c.balance_bypasses_refused_dirty),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_reads_as_one_flat_object_and_back() {
        let mut v = VolumeSnapshot {
            export: "fast".into(),
            read_hits: 7,
            ..VolumeSnapshot::default()
        };
        v.device.promotions = 3;
        v.device.cache.path = "/dev/shm/cache.img".into();
        v.device.balance_bypasses = (5, 6);
        v.latency.read.histogram.count = 9;
        v.device.block_commands.discards = 2;
        v.device.recovery.verified_dirty_lines = 4;
        v.device.recovery.restored_settings = vec!["policy=arc".into()];
        let json = serde_json::to_value(&v).unwrap();
        // The engine's discard counters sit beside the device's too, and
        // its recovery report keeps only its counters, in their order.
        assert_eq!(json["discards"], 2);
        assert_eq!(json["recovery"]["verified_dirty_lines"], 4);
        let recovery = serde_json::to_string(&v.device.recovery).unwrap();
        assert_eq!(
            recovery,
            "{\"loaded\":false,\"clean_shutdown\":false,\"dirty_lines\":0,\"clean_lines\":0,\
             \"dropped_clean_lines\":0,\"checked_clean_lines\":0,\"stale_clean_lines\":0,\
             \"unchecked_clean_lines\":0,\"verified_dirty_lines\":4,\"verified_with_intents\":0,\
             \"repaired_from_mirror\":0,\"corrupt_copies\":0,\"duplicate_lines\":0,\
             \"written_back_lines\":0}"
        );
        // The cache device's fields sit beside the volume's, as they always did.
        assert_eq!(json["promotions"], 3);
        assert_eq!(json["read_hits"], 7);
        assert_eq!(json["cache"]["path"], "/dev/shm/cache.img");
        assert!(json["array"].is_null() && json["balance"].is_null() && json["reca"].is_null());
        // What only the metrics read is not in the JSON.
        assert!(json.get("balance_bypasses").is_none() && json["latency"]["read"].get("histogram").is_none());
        let back: VolumeSnapshot = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.device.promotions, 3);
        assert_eq!(back.device.balance_bypasses, (0, 0));
        assert_eq!(back.device.block_commands.discards, 2);
        assert!(back.device.recovery.restored_settings.is_empty());
        assert_eq!(serde_json::to_value(&back).unwrap(), json);
    }

    /// The server's and ordered write-back's counters are the NBD server's
    /// and the engine's own types; their JSON stays the admin socket's
    /// schema, field for field and in order (queued replies not in it).
    #[test]
    fn server_and_ordered_counters_keep_their_json() {
        let server = ServerSnapshot {
            connections: 1,
            served_inline: 2,
            replies_queued: 3,
            spawn_failures: 4,
            ..ServerSnapshot::default()
        };
        let json = serde_json::to_string(&server).unwrap();
        assert_eq!(
            json,
            "{\"connections\":1,\"active_connections\":0,\"transmissions\":0,\"requests\":0,\
             \"errors\":0,\"served_inline\":2,\"inflight_bytes\":0,\"peak_inflight_bytes\":0,\
             \"refused_connections\":0,\"refused_per_peer\":0,\"evicted_connections\":0,\
             \"handshake_timeouts\":0,\"tls_failures\":0,\"spawn_failures\":4}"
        );
        let back: ServerSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back.replies_queued, 0);
        assert_eq!(back.spawn_failures, 4);
        let ordered = OrderedSnapshot {
            epoch: 5,
            durable_before: 4,
            epochs_behind: 1,
            waits: 2,
            backend_flushes: 3,
        };
        let json = serde_json::to_string(&ordered).unwrap();
        assert_eq!(
            json,
            "{\"epoch\":5,\"durable_before\":4,\"epochs_behind\":1,\"waits\":2,\"backend_flushes\":3}"
        );
        assert_eq!(serde_json::from_str::<OrderedSnapshot>(&json).unwrap(), ordered);
    }
}
