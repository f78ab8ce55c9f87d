//! Operators watch a daemon with Prometheus, not by
//! polling `iocache stats`. A server with a metrics address answers
//! `GET /metrics` with the counters `iocache stats` shows, per volume and
//! per cache device, and the request latency histograms, in the
//! OpenMetrics text format (written by the Prometheus project's own Rust
//! client, `prometheus-client`). Each scrape renders one
//! [`crate::stats::Snapshot`], as the admin socket does; nothing is kept
//! here. The HTTP side is deliberately tiny:
//! one request per connection, a bounded request head, a deadline for the
//! whole request, and a few connections served at once, each on its own
//! thread, so one slow client never holds up another scrape.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Result, Within};
use iocache_engine::{LatencyPercentiles, LATENCY_BOUNDS_NS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::running::Running;
use crate::stats::Snapshot;

/// The longest request head read (a scraper sends a few hundred bytes).
const MAX_REQUEST_HEAD_BYTES: u64 = 16 << 10;
/// How long a client may take to send its whole request head, and then to
/// take the whole reply (not per read or write: a client moving a byte at
/// a time cannot stretch it).
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Connections answered at once; more are closed at once.
const MAX_CONCURRENT_SCRAPES: usize = 8;

/// Binds the metrics listener (before any device is opened, as the other
/// listeners are).
pub fn bind(address: &str) -> Result<TcpListener> {
    TcpListener::bind(address).within(|| format!("cannot listen on {address}"))
}

/// Answers scrapes until the process exits.
pub fn serve(listener: TcpListener, state: Arc<Running>) {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(EngineCollector { state }));
    let registry = Arc::new(registry);
    let busy = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONCURRENT_SCRAPES {
            busy.fetch_sub(1, Ordering::SeqCst);
            log::debug!("metrics: {MAX_CONCURRENT_SCRAPES} scrapes in progress; a connection closed");
            continue;
        }
        let (registry, done) = (Arc::clone(&registry), Arc::clone(&busy));
        let spawned = std::thread::Builder::new()
            .name("iocache-metrics".into())
            .spawn(move || {
                if let Err(e) = answer(stream, &registry) {
                    log::debug!("metrics: a scrape failed: {e}");
                }
                done.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            busy.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Reads from a stream until a deadline for the whole request: each read
/// waits at most the time left.
struct DeadlineReader<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the request head took longer than its deadline",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        (&*self.stream).read(buf)
    }
}

/// Writes the whole reply before a deadline: each write waits at most the
/// time left (a client that reads slowly cannot hold a thread longer).
fn write_before(stream: &TcpStream, mut bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the reply took longer than its deadline",
            ));
        }
        stream.set_write_timeout(Some(left))?;
        match (&*stream).write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn answer(stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    let reader = DeadlineReader {
        stream: &stream,
        deadline: Instant::now() + REQUEST_DEADLINE,
    };
    let mut head = BufReader::new(reader.take(MAX_REQUEST_HEAD_BYTES));
    let mut request_line = String::new();
    head.read_line(&mut request_line)?;
    // The rest of the head, up to the empty line.
    loop {
        let mut line = String::new();
        if head.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(_) => (
                    "500 Internal Server Error",
                    "text/plain",
                    "encoding failed\n".into(),
                ),
            }
        }
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "the metrics are at /metrics\n".into(),
        ),
        _ => ("405 Method Not Allowed", "text/plain", "GET /metrics\n".into()),
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        reply.push_str(&body);
    }
    write_before(&stream, reply.as_bytes(), Instant::now() + REQUEST_DEADLINE)
}

/// Reads the engines at each scrape.
struct EngineCollector {
    state: Arc<Running>,
}

impl std::fmt::Debug for EngineCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineCollector")
    }
}

/// One metric family: its name (without `iocache_` and, for counters,
/// `_total`), help and type, and its samples as (labels, value).
struct Family<'a> {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Vec<(&'static str, String)>, Sample<'a>)>,
}

enum Sample<'a> {
    Count(u64),
    Level(i64),
    Latency(&'a LatencyPercentiles),
}

impl<'a> Family<'a> {
    fn new(name: &'static str, help: &'static str, kind: MetricType) -> Family<'a> {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, labels: Vec<(&'static str, String)>, sample: Sample<'a>) {
        self.samples.push((labels, sample));
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let name = format!("iocache_{}", self.name);
        let mut metric = encoder.encode_descriptor(&name, self.help, None, self.kind)?;
        for (labels, sample) in &self.samples {
            let mut one = metric.encode_family(labels)?;
            encode_sample(&mut one, sample)?;
        }
        Ok(())
    }
}

fn encode_sample(encoder: &mut MetricEncoder<'_>, sample: &Sample<'_>) -> Result<(), std::fmt::Error> {
    match sample {
        Sample::Count(v) => encoder.encode_counter::<NoLabelSet, u64, u64>(v, None),
        Sample::Level(v) => encoder.encode_gauge(v),
        Sample::Latency(p) => {
            let mut buckets = Vec::with_capacity(LATENCY_BOUNDS_NS.len() + 1);
            let mut below = 0;
            for (bound_ns, at_most) in LATENCY_BOUNDS_NS.iter().zip(p.at_most) {
                buckets.push((*bound_ns as f64 / 1e9, at_most - below));
                below = at_most;
            }
            buckets.push((f64::MAX, p.count - below));
            encoder.encode_histogram::<NoLabelSet>(p.sum_ns as f64 / 1e9, p.count, &buckets, None)
        }
    }
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge, Histogram};
        use Sample::{Count, Latency, Level};
        // One reading of the engines for the whole scrape.
        let snapshot = Snapshot::take(&self.state, None).map_err(|_| std::fmt::Error)?;
        let mut requests = Family::new("volume_requests", "Requests served.", Counter);
        let mut bytes = Family::new("volume_bytes", "Bytes read and written by clients.", Counter);
        let mut accesses = Family::new(
            "volume_line_accesses",
            "Cache lines the requests touched (one per line per request).",
            Counter,
        );
        let mut hits = Family::new(
            "volume_line_hits",
            "Line accesses whose sectors were all cached.",
            Counter,
        );
        let mut partial = Family::new(
            "volume_line_partial_hits",
            "Line accesses with some sectors cached.",
            Counter,
        );
        let mut misses = Family::new(
            "volume_line_misses",
            "Line accesses with no sector cached.",
            Counter,
        );
        let mut failed = Family::new("volume_failed_requests", "Requests that failed.", Counter);
        let mut lines = Family::new("volume_lines", "The volume's lines in the cache.", Gauge);
        let mut latency = Family::new(
            "volume_request_duration_seconds",
            "Time from a request's arrival at the engine to its completion.",
            Histogram,
        );
        for v in &snapshot.volumes {
            let e = || ("export", v.export.clone());
            for (kind, n, b, h) in [
                ("read", v.read_requests, v.read_bytes, v.read_hits),
                ("write", v.write_requests, v.write_bytes, v.write_hits),
            ] {
                requests.add(vec![e(), ("kind", kind.into())], Count(n));
                bytes.add(vec![e(), ("kind", kind.into())], Count(b));
                hits.add(vec![e(), ("kind", kind.into())], Count(h));
            }
            accesses.add(vec![e()], Count(v.line_accesses));
            partial.add(vec![e()], Count(v.partial_hits));
            misses.add(vec![e()], Count(v.full_misses));
            failed.add(vec![e()], Count(v.failed_requests));
            lines.add(vec![e(), ("state", "clean".into())], Level(v.clean_lines as i64));
            lines.add(vec![e(), ("state", "dirty".into())], Level(v.dirty_lines as i64));
            latency.add(
                vec![e(), ("kind", "read".into())],
                Latency(&v.latency.read.histogram),
            );
            latency.add(
                vec![e(), ("kind", "write".into())],
                Latency(&v.latency.write.histogram),
            );
        }
        for family in [
            &requests, &bytes, &accesses, &hits, &partial, &misses, &failed, &lines, &latency,
        ] {
            family.encode(&mut encoder)?;
        }

        // The cache devices, each once however many volumes share it.
        let mut capacity = Family::new("cache_capacity_lines", "Lines the cache device holds.", Gauge);
        let mut in_service = Family::new(
            "cache_lines_in_service",
            "Lines in service: the capacity less those out of service (a resize, a failed array member).",
            Gauge,
        );
        let mut resident = Family::new("cache_lines", "Lines in the cache, by state.", Gauge);
        let mut decisions = Family::new(
            "cache_decisions",
            "The policy core's decisions: promotions, evictions, write-backs, bypassed accesses.",
            Counter,
        );
        let mut errors = Family::new("cache_errors", "Errors, by where they happened.", Counter);
        let mut fallback = Family::new(
            "cache_device_failed",
            "1 while the cache device is failed and requests pass through to the backend.",
            Gauge,
        );
        let mut barriers = Family::new("cache_metadata_barriers", "Metadata barriers run.", Counter);
        let mut ordered_behind = Family::new(
            "cache_ordered_epochs_behind",
            "Ordered write-back: FLUSH epochs the backend is behind the clients.",
            Gauge,
        );
        let mut ordered_waits = Family::new(
            "cache_ordered_waits",
            "Ordered write-back: writes that waited for an older epoch or for room.",
            Counter,
        );
        let mut discards = Family::new(
            "cache_discards",
            "Discard (kind=trim) and zeroing (kind=zero) requests served.",
            Counter,
        );
        let mut dropped = Family::new(
            "cache_discarded_lines",
            "Lines dropped by discards and zeroings (dirty=1: their dirty data discarded, never written back).",
            Counter,
        );
        let mut records = Family::new(
            "cache_metadata_records_written",
            "Metadata records written.",
            Counter,
        );
        let mut intents = Family::new(
            "cache_metadata_intents_written",
            "Intents written before a write in place on checksummed dirty data (writers at once share a flush).",
            Counter,
        );
        let mut intent_flushes = Family::new(
            "cache_metadata_intent_flushes",
            "Cache-device flushes the intents took.",
            Counter,
        );
        let mut mode = Family::new(
            "cache_write_policy",
            "1 for the write policy in force, labelled with why (configured, controller, fall-back).",
            Gauge,
        );
        let mut io = Family::new(
            "device_io",
            "I/Os completed on the cache device (class R, W, P, E) and the backends (read, write, writeback).",
            Counter,
        );
        let mut io_in_flight = Family::new(
            "device_io_in_flight",
            "I/Os issued and not completed, by device and class.",
            Gauge,
        );
        let mut io_latency = Family::new(
            "device_io_latency_microseconds",
            "The sum of the completed I/Os' latencies, by device and class.",
            Counter,
        );
        let mut balance_switches = Family::new(
            "balance_switches",
            "Changes of the load balancer's action (write policy or bypass).",
            Counter,
        );
        let mut balance_queue_time = Family::new(
            "balance_queue_time_microseconds",
            "Eq. 1's T = Q x L of each device over the load balancer's last interval.",
            Gauge,
        );
        let mut reca_category = Family::new(
            "cache_reca_category",
            "ReCA (adapt = reca): 1 for the workload category in force.",
            Gauge,
        );
        let mut reca_changes =
            Family::new("cache_reca_category_changes", "ReCA's category changes.", Counter);
        let mut reca_requests = Family::new(
            "cache_reca_requests",
            "Requests ReCA characterized, skipped (over its budget) or dropped (a full buffer).",
            Counter,
        );
        let mut reca_line = Family::new(
            "cache_reca_line_bytes",
            "The line size in force and, when ReCA wants another, the pending one (taken at the next start).",
            Gauge,
        );
        let mut array_members = Family::new(
            "cache_array_members",
            "Cache-array members, by state (ok; failed: a failed or retired member; rebuilding: a replacement being rebuilt).",
            Gauge,
        );
        let mut array_lines = Family::new(
            "cache_array_lines",
            "Cache-array lines evacuated from failed members (their dirty data written back) and lost (both copies).",
            Counter,
        );
        let mut array_replacements = Family::new(
            "cache_array_replacements",
            "Cache-array members replaced by another device while serving.",
            Counter,
        );
        let mut array_rebuild = Family::new(
            "cache_array_rebuild_pending",
            "Line slots and mirror slots of a replacement member still to rebuild from the other copies.",
            Gauge,
        );
        for s in &snapshot.caches {
            let c = || ("cache", s.cache.path.clone());
            if let Some(a) = &s.array {
                for state in ["ok", "failed", "rebuilding"] {
                    let n = a.members.iter().filter(|m| m.state == state).count();
                    array_members.add(vec![c(), ("state", state.into())], Level(n as i64));
                }
                array_lines.add(vec![c(), ("fate", "evacuated".into())], Count(a.evacuated_lines));
                array_lines.add(vec![c(), ("fate", "lost".into())], Count(a.lost_lines));
                array_replacements.add(vec![c()], Count(a.replacements));
                array_rebuild.add(vec![c()], Level(a.rebuild_pending as i64));
            }
            for (device, q) in [("cache", &s.queues.cache), ("backend", &s.queues.backend)] {
                for (name, class) in &q.classes {
                    let labels = || vec![c(), ("device", device.into()), ("class", name.clone())];
                    io.add(labels(), Count(class.completed));
                    io_in_flight.add(labels(), Level(class.in_flight as i64));
                    io_latency.add(labels(), Count(class.latency_ns_total / 1000));
                }
            }
            if let Some(b) = &s.balance {
                let controller = || ("controller", b.controller.clone());
                balance_switches.add(vec![c(), controller()], Count(b.switches));
                if let Some(last) = &b.last {
                    for (device, load) in [("cache", &last.cache), ("backend", &last.backend)] {
                        balance_queue_time.add(
                            vec![c(), controller(), ("device", device.into())],
                            Level((load.queue_time_ms * 1e3) as i64),
                        );
                    }
                }
            }
            capacity.add(vec![c()], Level(s.capacity_lines as i64));
            in_service.add(vec![c()], Level(s.lines_in_service as i64));
            let summary = &s.cache;
            let clean = summary.resident_lines.saturating_sub(summary.dirty_lines);
            resident.add(vec![c(), ("state", "clean".into())], Level(clean as i64));
            resident.add(
                vec![c(), ("state", "dirty".into())],
                Level(summary.dirty_lines as i64),
            );
            for (what, n) in [
                ("promotion", s.promotions),
                ("eviction", s.evictions),
                ("write_back", s.write_backs),
                ("bypass", s.bypassed_accesses),
                ("seq_cutoff", s.seq_cutoff_requests),
                ("readahead_fill", s.readahead_fills),
                ("readahead_line", s.readahead_lines),
                ("readahead_line_used", s.readahead_used_lines),
                ("readahead_line_unused", s.readahead_unused_lines),
                ("readahead_fill_dropped", s.readahead_dropped_fills),
                ("write_miss_bypass", s.write_miss_bypasses),
                ("balance_bypass", s.balance_bypasses.0),
                ("balance_bypass_refused_dirty", s.balance_bypasses.1),
            ] {
                decisions.add(vec![c(), ("decision", what.into())], Count(n));
            }
            for (place, n) in [
                ("cache_device", s.cache_device_errors),
                ("backend", s.backend_errors),
                ("write_back", s.failed_writebacks),
                ("request", s.io_errors),
            ] {
                errors.add(vec![c(), ("place", place.into())], Count(n));
            }
            fallback.add(vec![c()], Level(i64::from(s.cache_device_failed)));
            barriers.add(vec![c()], Count(s.barriers));
            if let Some(o) = &s.ordered {
                ordered_behind.add(vec![c()], Level(o.epochs_behind as i64));
                ordered_waits.add(vec![c()], Count(o.waits));
            }
            let b = &s.block_commands;
            discards.add(vec![c(), ("kind", "trim".into())], Count(b.discards));
            discards.add(vec![c(), ("kind", "zero".into())], Count(b.zeroings));
            dropped.add(
                vec![c(), ("dirty", "0".into())],
                Count(b.dropped_lines - b.dropped_dirty_lines),
            );
            dropped.add(vec![c(), ("dirty", "1".into())], Count(b.dropped_dirty_lines));
            records.add(vec![c()], Count(s.records_written));
            intents.add(vec![c()], Count(s.intents_written));
            intent_flushes.add(vec![c()], Count(s.intent_flushes));
            mode.add(
                vec![
                    c(),
                    ("policy", s.effective_write_policy.clone()),
                    ("cause", s.effective_write_policy_cause.replace(' ', "_")),
                ],
                Level(1),
            );
            if let Some(r) = &s.reca {
                if let Some(category) = &r.category {
                    reca_category.add(vec![c(), ("category", category.clone())], Level(1));
                }
                reca_changes.add(vec![c()], Count(r.category_changes));
                for (outcome, n) in [
                    ("characterized", r.observed_requests),
                    ("skipped", r.skipped_requests),
                    ("dropped", r.dropped_requests),
                ] {
                    reca_requests.add(vec![c(), ("outcome", outcome.into())], Count(n));
                }
                reca_line.add(
                    vec![c(), ("state", "in_force".into())],
                    Level(r.line_bytes as i64),
                );
                if let Some(pending) = r.pending_line_bytes {
                    reca_line.add(vec![c(), ("state", "pending".into())], Level(pending as i64));
                }
            }
        }
        for family in [
            &capacity,
            &in_service,
            &resident,
            &decisions,
            &errors,
            &fallback,
            &barriers,
            &ordered_behind,
            &ordered_waits,
            &discards,
            &dropped,
            &records,
            &intents,
            &intent_flushes,
            &mode,
            &io,
            &io_in_flight,
            &io_latency,
            &balance_switches,
            &balance_queue_time,
            &reca_category,
            &reca_changes,
            &reca_requests,
            &reca_line,
            &array_members,
            &array_lines,
            &array_replacements,
            &array_rebuild,
        ] {
            family.encode(&mut encoder)?;
        }
        // The NBD server: connections and what its limits did.
        let s = &snapshot.server;
        let mut connections = Family::new("nbd_connections", "NBD connections being served now.", Gauge);
        connections.add(Vec::new(), Level(s.active_connections as i64));
        let mut accepted = Family::new("nbd_accepted_connections", "NBD connections accepted.", Counter);
        accepted.add(Vec::new(), Count(s.connections));
        let mut closed = Family::new(
            "nbd_closed_connections",
            "NBD connections closed by a limit, by why: listener full, the peer's share, evicted to make room, handshake too slow, TLS handshake failed, no thread.",
            Counter,
        );
        for (why, n) in [
            ("listener_full", s.refused_connections),
            ("peer_share", s.refused_per_peer),
            ("evicted", s.evicted_connections),
            ("handshake_timeout", s.handshake_timeouts),
            ("tls_failure", s.tls_failures),
            ("no_thread", s.spawn_failures),
        ] {
            closed.add(vec![("why", why.into())], Count(n));
        }
        let mut held = Family::new(
            "nbd_payload_bytes",
            "Request payload bytes held now, all connections.",
            Gauge,
        );
        held.add(Vec::new(), Level(s.inflight_bytes as i64));
        for family in [&connections, &accepted, &closed, &held] {
            family.encode(&mut encoder)?;
        }
        Ok(())
    }
}
