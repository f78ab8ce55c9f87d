//! The discrete-event engine: turns each request's op list into device I/Os
//! with dependencies, runs them on the two devices in time order, and records
//! request latencies and device statistics.
//!
//! # What one request does
//!
//! Each [`Op`] becomes device I/Os:
//!
//! | op | device I/O |
//! |---|---|
//! | `ReadCache` | read on the cache device at `slot × line + offset` |
//! | `WriteCache` | write on the cache device |
//! | `ReadBackend` | read on the backend at the volume's offset |
//! | `WriteBackend` | write on the backend |
//! | `WriteBack` | read on the cache device, then write on the backend |
//! | `Invalidate` | nothing (metadata only) |
//!
//! Within one request (or one background batch) an I/O waits for the earlier
//! I/Os it depends on, and starts at the request's arrival otherwise:
//!
//! 1. the previous I/O on the same cache slot (so a victim's write-back,
//!    including its backend write, finishes before the slot is overwritten;
//!    a `WriteBack` counts as done on the slot when its backend write is);
//! 2. in a read request, a `WriteCache` (a fill) waits for the `ReadBackend`
//!    whose buffer range holds its data;
//! 3. a backend read or write waits for an earlier `WriteBack` of this
//!    request to an overlapping backend range (a line evicted and then read
//!    again by the same request).
//!
//! # What the client waits for
//!
//! A read request completes when all its `ReadCache` and `ReadBackend` I/Os
//! have (and so also whatever they waited for); fills and the write-backs
//! that only make room for fills go on in the background: they occupy the
//! devices, and delay other I/Os, but not this request. A write request
//! completes when all its `WriteCache` and `WriteBackend` I/Os have (so with
//! write-through it waits for both devices, and with write-back a write miss
//! waits for the victim's write-back before its own cache write).
//! [`TimingModel::submit_background`] runs ops that no client waits for
//! (a cleaner's flushes).
//!
//! # Time
//!
//! Events (an I/O becoming ready, an I/O finishing that others wait for, a
//! request completing) are kept in a heap ordered by (time, sequence number)
//! and processed in that order; an I/O reaches its device when it becomes
//! ready, so each device sees arrivals in time order and computes the I/O's
//! start and completion at once (see `device.rs`). Submitting a request at
//! time `t` first processes every event up to `t`. Arrivals must not go
//! back in time: an earlier arrival than the last one is moved to the current
//! time and counted in [`TimingReport::clamped_arrivals`].
//!
//! Memory: the in-flight requests and I/Os (in an open loop beyond the
//! devices' capacity the backlog grows without bound, as a real queue would),
//! two histograms, and the time series.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use iocache_core::fasthash::FxHashMap;
use iocache_core::policy::list::insert_reusing;
use iocache_core::{IoKind, Op};

use super::device::{Device, DeviceSpec, Dir};
use super::histogram::Histogram;
use super::queues::{cache_class, DeviceQueue, QueueTracker};
use super::report::{DeviceReport, TimingReport};
use super::series::{Series, Span};
use super::TimingError;

const NONE: u32 = u32::MAX;
const CACHE: u8 = 0;
const BACKEND: u8 = 1;

/// Where backend volume `v`'s offsets start in the backend device's address space.
const VOLUME_STRIDE: u64 = 1 << 44;

/// Where `offset` of `volume` lies in the one backend address space
/// (volumes `VOLUME_STRIDE` apart).
fn backend_address(volume: u32, offset: u64) -> u64 {
    (volume as u64).wrapping_mul(VOLUME_STRIDE).wrapping_add(offset)
}

/// The devices and options of a [`TimingModel`].
#[derive(Clone, Debug)]
pub struct TimingConfig {
    pub cache: DeviceSpec,
    pub backend: DeviceSpec,
    /// The cache's line size, to place slots on the cache device.
    pub line_bytes: u64,
    /// Interval of the time series; `None` for no series.
    pub series_interval_ns: Option<u64>,
}

/// A request's identity: its submission number, from 0.
pub type RequestId = u64;

/// A finished request, as returned by [`TimingModel::next_completion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub id: RequestId,
    pub kind: IoKind,
    pub arrival_ns: u64,
    pub completion_ns: u64,
}

impl Completion {
    pub fn latency_ns(&self) -> u64 {
        self.completion_ns - self.arrival_ns
    }
}

#[derive(Clone, Copy, Debug)]
struct Node {
    device: u8,
    dir: Dir,
    visible: bool,
    deps: u32,
    request: u32,
    first_edge: u32,
    address: u64,
    bytes: u64,
    ready: u64,
}

#[derive(Clone, Copy, Debug)]
struct Edge {
    to: u32,
    next: u32,
}

#[derive(Clone, Copy, Debug)]
struct Req {
    id: RequestId,
    kind: IoKind,
    arrival: u64,
    pending: u32,
    done: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum EventKind {
    /// The node may start.
    Ready = 0,
    /// The node finished; release what waits for it.
    Done = 1,
    /// The request completed.
    RequestDone = 2,
}

type Event = Reverse<(u64, u64, EventKind, u32)>;

/// Totals of one device.
#[derive(Clone, Copy, Debug, Default)]
struct DevAcc {
    reads: u64,
    writes: u64,
    bytes: u64,
    busy: u64,
    wait: u128,
    response: u128,
}

/// The device timing model; see the module doc.
#[derive(Debug)]
pub struct TimingModel {
    line_bytes: u64,
    specs: [DeviceSpec; 2],
    devices: [Device; 2],
    acc: [DevAcc; 2],
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    edges: Vec<Edge>,
    free_edges: Vec<u32>,
    requests: Vec<Req>,
    free_requests: Vec<u32>,
    heap: BinaryHeap<Event>,
    seq: u64,
    now: u64,
    next_id: RequestId,
    in_flight: usize,
    track: bool,
    completions: VecDeque<Completion>,
    last_completion: Option<Completion>,
    reads: Histogram,
    writes: Histogram,
    started: bool,
    measure_from: u64,
    /// Requests from this id on are measured.
    first_measured: RequestId,
    last_request_done: u64,
    horizon: u64,
    clamped: u64,
    background_ops: u64,
    series_interval: Option<u64>,
    series: Option<Series>,
    /// What each device holds, when a load balancer asks (`queues.rs`).
    queues: Option<QueueTracker>,
    // Scratch for building one op list's graph.
    slot_last: FxHashMap<u32, u32>,
    backend_reads: Vec<(u64, u64, u32)>,
    write_backs: Vec<(u64, u64, u32)>,
    built: Vec<u32>,
}

impl TimingModel {
    pub fn new(config: &TimingConfig) -> Result<Self, TimingError> {
        if config.line_bytes == 0 {
            return Err(TimingError::BadParameter("line size must be positive".into()));
        }
        if config.series_interval_ns == Some(0) {
            return Err(TimingError::BadParameter(
                "series interval must be positive".into(),
            ));
        }
        let devices = [Device::new(&config.cache)?, Device::new(&config.backend)?];
        let servers = [config.cache.servers(), config.backend.servers()];
        Ok(TimingModel {
            line_bytes: config.line_bytes,
            specs: [config.cache.clone(), config.backend.clone()],
            devices,
            acc: Default::default(),
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            edges: Vec::new(),
            free_edges: Vec::new(),
            requests: Vec::new(),
            free_requests: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            next_id: 0,
            in_flight: 0,
            track: false,
            completions: VecDeque::new(),
            last_completion: None,
            reads: Histogram::new(),
            writes: Histogram::new(),
            started: false,
            measure_from: 0,
            first_measured: 0,
            last_request_done: 0,
            horizon: 0,
            clamped: 0,
            background_ops: 0,
            series_interval: config.series_interval_ns,
            series: config.series_interval_ns.map(|i| Series::new(i, servers)),
            queues: None,
            slot_last: FxHashMap::default(),
            backend_reads: Vec::new(),
            write_backs: Vec::new(),
            built: Vec::new(),
        })
    }

    /// The model's clock: the time of the last event processed or request submitted.
    pub fn now_ns(&self) -> u64 {
        self.now
    }

    /// Starts keeping what each device holds, for [`Self::queues`].
    pub fn track_queues(&mut self) {
        self.queues.get_or_insert_with(QueueTracker::default);
    }

    /// What the cache device (`[0]`, by R/W/P/E class) and the backend
    /// (`[1]`, reads and writes) hold at the model's clock: I/Os waiting or
    /// in service. Empty unless [`Self::track_queues`] was called before
    /// they were scheduled.
    pub fn queues(&mut self) -> [DeviceQueue; 2] {
        let now = self.now;
        self.queues
            .as_mut()
            .map_or([DeviceQueue::default(); 2], |q| q.at(now))
    }

    /// Requests submitted and not yet completed (background work not counted).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Submits a client request arriving at `arrival_ns` whose cache decisions
    /// are `ops` (from `Cache::access`), and returns its id. Its completion
    /// is recorded when the model's clock reaches it; [`Self::next_completion`]
    /// reports it to a closed-loop driver.
    pub fn submit(&mut self, arrival_ns: u64, kind: IoKind, ops: &[Op]) -> RequestId {
        let at = self.arrive(arrival_ns);
        let id = self.next_id;
        self.next_id += 1;
        let r = match self.free_requests.pop() {
            Some(r) => r,
            None => {
                self.requests.push(Req {
                    id,
                    kind,
                    arrival: at,
                    pending: 0,
                    done: at,
                });
                (self.requests.len() - 1) as u32
            }
        };
        self.requests[r as usize] = Req {
            id,
            kind,
            arrival: at,
            pending: 0,
            done: at,
        };
        self.in_flight += 1;
        self.build(at, Some(kind), r, ops);
        id
    }

    /// Runs ops no client waits for (a cleaner's flush) from `at_ns` on.
    pub fn submit_background(&mut self, at_ns: u64, ops: &[Op]) {
        let at = self.arrive(at_ns);
        self.build(at, None, NONE, ops);
    }

    /// Processes events until a request completes and returns it; `None`
    /// when no event is left. Requests that complete while [`Self::submit`]
    /// or [`Self::advance_to`] process events are only recorded, not
    /// returned here, unless [`Self::track_completions`] is on: then every
    /// completion is queued and this returns them in order. A closed-loop
    /// driver needs only [`Self::in_flight`] and this.
    pub fn next_completion(&mut self) -> Option<Completion> {
        loop {
            if let Some(c) = self.completions.pop_front() {
                return Some(c);
            }
            self.last_completion = None;
            if !self.step() {
                return None;
            }
            if let Some(c) = self.last_completion.take() {
                return Some(c);
            }
        }
    }

    /// With `on`, every completion is queued for [`Self::next_completion`]
    /// (the caller must drain the queue, or it grows with the trace).
    pub fn track_completions(&mut self, on: bool) {
        self.track = on;
        if !on {
            self.completions.clear();
        }
    }

    /// Processes every event up to and including `t`, then sets the clock to
    /// `t` if it is later.
    pub fn advance_to(&mut self, t: u64) {
        while let Some(Reverse((time, ..))) = self.heap.peek() {
            if *time > t {
                break;
            }
            self.step();
        }
        self.now = self.now.max(t);
        if let Some(s) = &mut self.series {
            s.advance(self.now);
        }
    }

    /// Forgets the statistics gathered so far (latencies, device totals; not
    /// the time series) and measures from the current time on: the end of a
    /// warmup. Requests submitted before are not counted; device work
    /// scheduled before is not either, even the part that runs later.
    pub fn reset_stats(&mut self) {
        self.measure_from = self.now;
        self.first_measured = self.next_id;
        self.reads.clear();
        self.writes.clear();
        self.acc = Default::default();
        self.background_ops = 0;
        self.clamped = 0;
        self.last_request_done = self.now;
        self.horizon = self.now;
        for d in &mut self.devices {
            d.reset_counters();
        }
    }

    /// Runs everything still in flight and reports.
    pub fn finish(mut self) -> TimingReport {
        while self.step() {}
        let start = self.measure_from;
        let end = self.horizon.max(self.last_request_done).max(start);
        if let Some(s) = &mut self.series {
            s.finish(end);
        }
        let span = end - start;
        let request_span = self.last_request_done.saturating_sub(start);
        let mut all = self.reads.clone();
        all.merge(&self.writes);
        let devices: Vec<DeviceReport> = (0..2)
            .map(|d| {
                let acc = &self.acc[d];
                let ops = acc.reads + acc.writes;
                let servers = self.specs[d].servers();
                let span_f = span.max(1) as f64;
                DeviceReport {
                    name: self.specs[d].name.clone(),
                    servers,
                    ops,
                    read_ops: acc.reads,
                    write_ops: acc.writes,
                    bytes: acc.bytes,
                    busy_ns: acc.busy,
                    utilization: acc.busy as f64 / (servers as f64 * span_f),
                    mean_in_device: acc.response as f64 / span_f,
                    mean_waiting: acc.wait as f64 / span_f,
                    mean_wait_ns: if ops == 0 {
                        0.0
                    } else {
                        acc.wait as f64 / ops as f64
                    },
                    mean_response_ns: if ops == 0 {
                        0.0
                    } else {
                        acc.response as f64 / ops as f64
                    },
                    counters: self.devices[d]
                        .counters()
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect::<BTreeMap<_, _>>(),
                    spec: self.specs[d].clone(),
                }
            })
            .collect();
        let [cache_device, backend_device]: [DeviceReport; 2] = devices.try_into().expect("two devices");
        let requests = all.count();
        TimingReport {
            requests,
            reads: self.reads.count(),
            writes: self.writes.count(),
            start_ns: start,
            end_ns: end,
            span_ns: span,
            iops: if request_span == 0 {
                0.0
            } else {
                requests as f64 * 1e9 / request_span as f64
            },
            read: self.reads.summary(),
            write: self.writes.summary(),
            all: all.summary(),
            cache_device,
            backend_device,
            clamped_arrivals: self.clamped,
            background_ops: self.background_ops,
            series_interval_ns: self.series_interval,
            series: self.series.take().map(|s| s.rows).unwrap_or_default(),
            read_cdf: self.reads.cdf(),
            write_cdf: self.writes.cdf(),
        }
    }

    // ---- internals ----

    fn arrive(&mut self, t: u64) -> u64 {
        let at = if t < self.now {
            self.clamped += 1;
            self.now
        } else {
            t
        };
        self.advance_to(at);
        if !self.started {
            self.started = true;
            self.measure_from = at;
            self.last_request_done = at;
            self.horizon = at;
            if let Some(s) = &mut self.series {
                s.start(at);
            }
        }
        at
    }

    fn push(&mut self, time: u64, kind: EventKind, index: u32) {
        self.seq += 1;
        self.heap.push(Reverse((time, self.seq, kind, index)));
    }

    fn new_node(
        &mut self,
        device: u8,
        dir: Dir,
        address: u64,
        bytes: u64,
        visible: bool,
        request: u32,
    ) -> u32 {
        let node = Node {
            device,
            dir,
            visible,
            deps: 0,
            request,
            first_edge: NONE,
            address,
            bytes,
            ready: 0,
        };
        let n = insert_reusing(&mut self.nodes, &mut self.free_nodes, node);
        self.built.push(n);
        n
    }

    /// `to` waits for `from`.
    fn edge(&mut self, from: u32, to: u32) {
        if from == NONE || from == to {
            return;
        }
        let e = Edge {
            to,
            next: self.nodes[from as usize].first_edge,
        };
        let i = insert_reusing(&mut self.edges, &mut self.free_edges, e);
        self.nodes[from as usize].first_edge = i;
        self.nodes[to as usize].deps += 1;
    }

    fn after_slot(&mut self, slot: u32, n: u32) {
        let prev = self.slot_last.insert(slot, n).unwrap_or(NONE);
        self.edge(prev, n);
    }

    /// A node for `len` bytes of `slot`'s line from `offset`, after the
    /// slot's last node.
    fn slot_node(&mut self, dir: Dir, slot: u32, offset: u32, len: u32, visible: bool, request: u32) -> u32 {
        let addr = slot as u64 * self.line_bytes + offset as u64;
        let n = self.new_node(CACHE, dir, addr, len as u64, visible, request);
        self.after_slot(slot, n);
        n
    }

    /// A node for `len` bytes of the backend at `addr`, after the earlier
    /// write-backs it overlaps.
    fn backend_node(&mut self, dir: Dir, addr: u64, len: u64, visible: bool, request: u32) -> u32 {
        let n = self.new_node(BACKEND, dir, addr, len, visible, request);
        self.after_write_backs(addr, addr + len, n);
        n
    }

    /// Backend I/O `n` on `[a, b)` waits for overlapping earlier write-backs.
    fn after_write_backs(&mut self, a: u64, b: u64, n: u32) {
        for i in 0..self.write_backs.len() {
            let (wa, wb, w) = self.write_backs[i];
            if wa < b && a < wb {
                self.edge(w, n);
            }
        }
    }

    fn fill_source(&self, buffer: u64) -> u32 {
        let reads = &self.backend_reads;
        let i = reads.partition_point(|r| r.0 <= buffer);
        if i > 0 && buffer < reads[i - 1].1 {
            return reads[i - 1].2;
        }
        reads
            .iter()
            .find(|r| r.0 <= buffer && buffer < r.1)
            .map_or(NONE, |r| r.2)
    }

    /// Builds the I/O graph of one op list and starts what can start.
    fn build(&mut self, at: u64, kind: Option<IoKind>, request: u32, ops: &[Op]) {
        self.slot_last.clear();
        self.backend_reads.clear();
        self.write_backs.clear();
        self.built.clear();
        let reading = kind == Some(IoKind::Read);
        let writing = kind == Some(IoKind::Write);
        let mut visible = 0u32;
        for op in ops {
            match *op {
                Op::ReadCache {
                    slot,
                    line_offset_bytes,
                    length_bytes,
                    ..
                } => {
                    self.slot_node(Dir::Read, slot, line_offset_bytes, length_bytes, reading, request);
                    visible += reading as u32;
                }
                Op::WriteCache {
                    slot,
                    line_offset_bytes,
                    length_bytes,
                    buffer_offset_bytes,
                    ..
                } => {
                    let n = self.slot_node(
                        Dir::Write,
                        slot,
                        line_offset_bytes,
                        length_bytes,
                        writing,
                        request,
                    );
                    visible += writing as u32;
                    if reading {
                        let source = self.fill_source(buffer_offset_bytes);
                        self.edge(source, n);
                    }
                }
                Op::ReadBackend {
                    volume,
                    offset_bytes,
                    length_bytes,
                    buffer_offset_bytes,
                } => {
                    let addr = backend_address(volume, offset_bytes);
                    let n = self.backend_node(Dir::Read, addr, length_bytes, reading, request);
                    visible += reading as u32;
                    self.backend_reads
                        .push((buffer_offset_bytes, buffer_offset_bytes + length_bytes, n));
                }
                Op::WriteBackend {
                    volume,
                    offset_bytes,
                    length_bytes,
                    ..
                } => {
                    let addr = backend_address(volume, offset_bytes);
                    self.backend_node(Dir::Write, addr, length_bytes, writing, request);
                    visible += writing as u32;
                }
                Op::WriteBack {
                    slot,
                    line_offset_bytes,
                    length_bytes,
                    volume,
                    offset_bytes,
                } => {
                    let len = length_bytes as u64;
                    let r = self.slot_node(Dir::Read, slot, line_offset_bytes, length_bytes, false, request);
                    let baddr = backend_address(volume, offset_bytes);
                    let w = self.new_node(BACKEND, Dir::Write, baddr, len, false, request);
                    self.edge(r, w);
                    self.slot_last.insert(slot, w);
                    self.after_write_backs(baddr, baddr + len, w);
                    self.write_backs.push((baddr, baddr + len, w));
                    if kind.is_none() {
                        self.background_ops += 1;
                    }
                }
                Op::Invalidate { .. } => {}
            }
        }
        if request != NONE {
            let req = &mut self.requests[request as usize];
            req.pending = visible;
            if visible == 0 {
                self.push(at, EventKind::RequestDone, request);
            }
        }
        let built = std::mem::take(&mut self.built);
        for &n in &built {
            if self.nodes[n as usize].deps == 0 {
                self.schedule(n, at);
            }
        }
        self.built = built;
    }

    /// Runs node `n` on its device from `at`.
    fn schedule(&mut self, n: u32, at: u64) {
        let node = self.nodes[n as usize];
        let d = node.device as usize;
        let Self {
            devices,
            acc,
            series,
            measure_from,
            ..
        } = self;
        let from = *measure_from;
        let a = &mut acc[d];
        let s = devices[d].schedule(at, node.dir, node.address, node.bytes, &mut |s: u64, e: u64| {
            a.busy += e.saturating_sub(s.max(from));
            if let Some(series) = series.as_mut() {
                series.add(d, Span::Busy, s, e);
            }
        });
        match node.dir {
            Dir::Read => a.reads += 1,
            Dir::Write => a.writes += 1,
        }
        a.bytes += node.bytes;
        a.wait += (s.start_ns - at) as u128;
        a.response += (s.end_ns - at) as u128;
        if let Some(series) = series.as_mut() {
            series.add(d, Span::InDevice, at, s.end_ns);
            series.add(d, Span::Waiting, at, s.start_ns);
        }
        self.horizon = self.horizon.max(s.end_ns);
        if let Some(q) = &mut self.queues {
            let class = match (node.device, node.dir) {
                (CACHE, dir) => cache_class(dir, node.visible) as u8,
                (_, Dir::Read) => 0,
                (_, Dir::Write) => 1,
            };
            q.add(d, class, s.end_ns);
        }
        if node.first_edge != NONE {
            self.push(s.end_ns, EventKind::Done, n);
        } else {
            self.free_nodes.push(n);
        }
        if node.visible {
            let req = &mut self.requests[node.request as usize];
            req.done = req.done.max(s.end_ns);
            req.pending -= 1;
            if req.pending == 0 {
                let done = req.done;
                self.push(done, EventKind::RequestDone, node.request);
            }
        }
    }

    /// Processes one event; false when there is none.
    fn step(&mut self) -> bool {
        let Some(Reverse((time, _, kind, index))) = self.heap.pop() else {
            return false;
        };
        self.now = self.now.max(time);
        if let Some(s) = &mut self.series {
            s.advance(self.now);
        }
        match kind {
            EventKind::Ready => self.schedule(index, time),
            EventKind::Done => {
                let mut e = self.nodes[index as usize].first_edge;
                while e != NONE {
                    let Edge { to, next } = self.edges[e as usize];
                    self.free_edges.push(e);
                    let node = &mut self.nodes[to as usize];
                    node.ready = node.ready.max(time);
                    node.deps -= 1;
                    if node.deps == 0 {
                        let ready = node.ready;
                        self.push(ready, EventKind::Ready, to);
                    }
                    e = next;
                }
                self.free_nodes.push(index);
            }
            EventKind::RequestDone => {
                let req = self.requests[index as usize];
                self.free_requests.push(index);
                self.in_flight -= 1;
                let latency = time - req.arrival;
                let write = req.kind == IoKind::Write;
                if req.id >= self.first_measured {
                    if write {
                        self.writes.record(latency);
                    } else {
                        self.reads.record(latency);
                    }
                    self.last_request_done = self.last_request_done.max(time);
                }
                if let Some(s) = &mut self.series {
                    s.complete(write, latency);
                }
                let c = Completion {
                    id: req.id,
                    kind: req.kind,
                    arrival_ns: req.arrival,
                    completion_ns: time,
                };
                if self.track {
                    self.completions.push_back(c);
                } else {
                    self.last_completion = Some(c);
                }
            }
        }
        true
    }
}
