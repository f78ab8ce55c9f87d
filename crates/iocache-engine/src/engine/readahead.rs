//! Readahead in the engine: the core's decisions ([`Readaheader`]) made on
//! whole client reads (a shard sees only its spans of a stream), and a
//! worker thread that reads the chosen lines from the backend into the
//! cache while the client's reply goes out.
//!
//! A fill is a read whose misses are admitted whatever the promotion
//! policy says and whose cached lines are left alone
//! ([`AccessHints::prefetch`]); it goes through the same plan, tickets and
//! metadata as a client's read miss. Fills wait in a short queue; when it
//! is full a fill is dropped (counted), never waited for. In single-thread
//! lookup the worker decides under the shard locks itself rather than
//! through the lookup thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use iocache_core::{AccessHints, IoKind, Readahead, ReadaheadFeedback, Readaheader, Request};

use super::planning::Plan;
use super::volumes::VolumeState;
use super::{lock, Buffer, EngineError, Inner};

/// Fills that may wait for the worker.
const QUEUE_FILLS: usize = 16;

/// One fill: a volume and the range to bring in.
pub(super) struct Fill {
    volume: Arc<VolumeState>,
    request: Request,
}

/// The engine's readahead: the decisions, the worker's queue, and what
/// the cores last said about fetched lines.
pub(super) struct ReadaheadDriver {
    /// Whether the setting is on (read before anything is locked).
    on: AtomicBool,
    decisions: Mutex<Readaheader>,
    /// The worker's queue; taken away when the engine stops.
    queue: Mutex<Option<SyncSender<Fill>>>,
    used_lines: AtomicU64,
    unused_lines: AtomicU64,
    /// Fills dropped because the queue was full, and fills that failed.
    pub dropped_fills: AtomicU64,
    pub failed_fills: AtomicU64,
}

impl ReadaheadDriver {
    /// The driver and the receiving end of its queue (for
    /// [`Inner::run_readahead`]).
    pub(super) fn new(config: Readahead, line: iocache_core::LineSize) -> (Self, mpsc::Receiver<Fill>) {
        let (tx, rx) = mpsc::sync_channel(QUEUE_FILLS);
        let driver = ReadaheadDriver {
            on: AtomicBool::new(config != Readahead::Off),
            decisions: Mutex::new(Readaheader::new(config, line)),
            queue: Mutex::new(Some(tx)),
            used_lines: AtomicU64::new(0),
            unused_lines: AtomicU64::new(0),
            dropped_fills: AtomicU64::new(0),
            failed_fills: AtomicU64::new(0),
        };
        (driver, rx)
    }

    /// Takes a new setting (the streams are detected afresh).
    pub(super) fn set(&self, config: Readahead) {
        let mut decisions = lock(&self.decisions);
        if decisions.config() != config {
            *decisions = Readaheader::new(config, decisions.line());
        }
        self.on.store(config != Readahead::Off, Ordering::Release);
    }

    /// Stops taking fills: the worker ends once the queue is empty.
    pub(super) fn close(&self) {
        lock(&self.queue).take();
    }
}

impl Inner {
    /// After a client's read of `length` bytes at `offset` of `volume`:
    /// queues the fill the readahead asks for, if any.
    #[inline]
    pub(super) fn read_ahead(&self, volume: &Arc<VolumeState>, offset: u64, length: u64, now_ns: u64) {
        let driver = &self.readahead;
        if !driver.on.load(Ordering::Acquire) {
            return;
        }
        let feedback = ReadaheadFeedback {
            used_lines: driver.used_lines.load(Ordering::Relaxed),
            unused_lines: driver.unused_lines.load(Ordering::Relaxed),
        };
        let read = Request {
            volume: volume.id,
            offset_bytes: offset,
            length_bytes: length,
            kind: IoKind::Read,
            now_ns,
            process: 0,
        };
        let Some(mut fill) = lock(&driver.decisions).on_request(&read, feedback) else {
            return;
        };
        let end = (fill.offset_bytes + fill.length_bytes).min(volume.size_bytes);
        if fill.offset_bytes >= end {
            return;
        }
        fill.length_bytes = end - fill.offset_bytes;
        let queue = lock(&driver.queue);
        let Some(queue) = queue.as_ref() else { return };
        let sent = queue.try_send(Fill {
            volume: Arc::clone(volume),
            request: fill,
        });
        if let Err(TrySendError::Full(_)) = sent {
            driver.dropped_fills.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The worker: runs each fill, then reads the cores' counts of fetched
    /// lines used and unused for the next decisions.
    pub(super) fn run_readahead(&self, fills: mpsc::Receiver<Fill>) {
        let mut scratch = Vec::new();
        for fill in fills {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            if self.fill_ahead(&fill, &mut scratch).is_err() {
                self.readahead.failed_fills.fetch_add(1, Ordering::Relaxed);
            }
            let (mut used, mut unused) = (0, 0);
            for shard in &self.shards {
                let feedback = lock(&shard.state).cache.readahead_feedback();
                used += feedback.used_lines;
                unused += feedback.unused_lines;
            }
            self.readahead.used_lines.store(used, Ordering::Relaxed);
            self.readahead.unused_lines.store(unused, Ordering::Relaxed);
        }
    }

    /// Brings the lines of `fill` that are not cached into the cache.
    fn fill_ahead(&self, fill: &Fill, scratch: &mut Vec<u8>) -> Result<(), EngineError> {
        let volume = &fill.volume;
        let _serving = volume.enter()?;
        let r = &fill.request;
        let segments = self.segments(
            volume.id,
            volume.size_bytes,
            IoKind::Read,
            r.offset_bytes,
            r.length_bytes,
            self.clock.now_ns(),
        )?;
        let mut plan = Plan::default();
        let hints = AccessHints {
            prefetch: true,
            ..AccessHints::default()
        };
        self.decide_into_with(&segments, &mut plan, hints)?;
        scratch.resize(r.length_bytes as usize, 0);
        self.run(&plan, Buffer::Read(&mut scratch[..r.length_bytes as usize]))
    }
}
