//! A connection's replies on their way to the socket. A serving thread
//! writes its reply itself, waiting for the client, only while another of
//! the connection's threads is left to read requests; otherwise (and for
//! the thread holding the reader role) a reply is written at once if the
//! socket takes it without waiting, else queued for the connection's
//! writer thread. So a client that reads its replies late never stops the
//! server reading its requests: reading stops only when the requests'
//! budget (which queued replies keep) or the queue's own bound is spent.
//! And a client that reads promptly gets large replies written straight
//! from the serving thread's buffer, with no copy.

use std::collections::VecDeque;

use super::*;

/// Replies waiting for the writer thread, in the order they are written.
#[derive(Default)]
pub(super) struct Outbox {
    queue: VecDeque<Queued>,
    /// No more replies will come: the writer thread leaves once the queue
    /// is empty.
    closed: bool,
}

/// One reply (or the rest of one) and the budget of the requests it
/// answers, given back once it is written.
struct Queued {
    bytes: Vec<u8>,
    costs: Vec<usize>,
}

/// The outbox, the writer's wake-up and the readers' wait for room.
#[derive(Default)]
pub(super) struct Replies {
    outbox: Mutex<Outbox>,
    /// Signalled when a reply is queued or the outbox closes.
    queued: Condvar,
    /// Signalled when the writer thread wrote a reply (or gave up).
    written: Condvar,
    /// Bytes queued and not yet written: read without the queue's lock on
    /// every request and reply, changed only under it (so a waiter for
    /// room misses no change). Under the writer's lock, 0 means the queue
    /// is empty: a reply leaves the queue only under that lock.
    queued_bytes: AtomicUsize,
    /// The connection has a writer thread: without one (it could not be
    /// created) every reply is written by the thread that served it,
    /// waiting for the client as long as it must.
    pub(super) has_writer: AtomicBool,
    /// The connection's serving threads (0 until they are all started).
    pub(super) threads: AtomicUsize,
    /// Serving threads writing a reply themselves (or waiting to).
    waiting_writers: AtomicUsize,
}

impl Replies {
    /// Counts this thread among those writing their replies themselves,
    /// if that leaves a thread to read requests.
    fn reserve_waiting_writer(&self) -> bool {
        let threads = self.threads.load(Ordering::Relaxed);
        self.waiting_writers
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                (w + 1 < threads).then_some(w + 1)
            })
            .is_ok()
    }

    /// Closes the outbox: the writer thread writes what is queued, then
    /// leaves.
    pub(super) fn close(&self) {
        lock(&self.outbox).closed = true;
        self.queued.notify_all();
    }
}

impl<S: ConnectionStream> Conn<'_, S> {
    /// Writes a reply answering requests of budget `costs` (given back
    /// once it is written, or when the connection broke) from a serving
    /// thread that does not hold the reader role: waiting for the client
    /// while another thread is left to read, else as
    /// [`Conn::send_without_waiting`].
    pub(super) fn send(&self, bytes: &[u8], costs: &[usize]) {
        if self.broken.load(Ordering::Relaxed) {
            self.done_many(costs);
            return;
        }
        if self.replies.has_writer.load(Ordering::Relaxed) && self.replies.reserve_waiting_writer() {
            let mut w = lock(&self.writer);
            // Replies queued go first (the head may be the rest of one
            // begun at once).
            self.write_all_queued(&mut w);
            self.write_waiting(&mut w, bytes);
            drop(w);
            self.replies.waiting_writers.fetch_sub(1, Ordering::AcqRel);
            self.done_many(costs);
            return;
        }
        self.send_without_waiting(bytes, costs);
    }

    /// Writes `bytes` within the reply timeout, or breaks the connection;
    /// the caller holds the writer's lock.
    fn write_waiting(&self, w: &mut S, bytes: &[u8]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        let pressure = || self.shared.global.contended();
        if write_all_within(w, bytes, self.shared.config.reply_timeout, pressure).is_err() {
            self.break_connection();
        }
    }

    /// Writes a reply answering requests of budget `costs` (given back
    /// once it is written, or when the connection broke): at once if the
    /// socket takes all of it without waiting and no reply is queued,
    /// else (the rest of it) queued for the writer thread. Never waits for
    /// the client (unless the connection has no writer thread).
    pub(super) fn send_without_waiting(&self, bytes: &[u8], costs: &[usize]) {
        if self.broken.load(Ordering::Relaxed) {
            self.done_many(costs);
            return;
        }
        if !self.replies.has_writer.load(Ordering::Relaxed) {
            let mut w = lock(&self.writer);
            self.write_waiting(&mut w, bytes);
            drop(w);
            self.done_many(costs);
            return;
        }
        // The writer lock, taken without waiting, makes this thread the
        // only one writing; an empty queue (checked under it) means no
        // reply goes before this one.
        if let Ok(mut w) = self.writer.try_lock() {
            if self.replies.queued_bytes.load(Ordering::Acquire) == 0 {
                let written = match write_now(&mut *w, bytes) {
                    Ok(n) => n,
                    Err(_) => {
                        self.break_connection();
                        drop(w);
                        self.done_many(costs);
                        return;
                    }
                };
                if written == bytes.len() {
                    drop(w);
                    self.done_many(costs);
                    return;
                }
                // The rest goes first: nothing may be written between
                // the two parts of one reply.
                self.enqueue(&bytes[written..], costs, true);
                return;
            }
        }
        self.enqueue(bytes, costs, false);
    }

    /// Begins writing a reply made of `parts` (bytes of the export read in
    /// place, which must not be kept) now: if the connection has a writer
    /// thread, no reply is queued and the writer's lock comes within
    /// `patience`, writes what the socket takes with at most the brief
    /// waits of [`write_now`] and keeps the lock, so nothing else is written
    /// before the reply's rest ([`Conn::finish_begun`]). `None`: nothing
    /// was written. A failed write breaks the connection (and counts as
    /// all written).
    pub(super) fn begin_parts_now(&self, parts: &[&[u8]], patience: Duration) -> Option<Begun<'_, S>> {
        let nothing_queued = || self.replies.queued_bytes.load(Ordering::Acquire) == 0;
        if !self.replies.has_writer.load(Ordering::Relaxed) || !nothing_queued() {
            return None;
        }
        // Under the lock, an empty queue means no reply goes before this one.
        let mut w = self.writer_within(patience).filter(|_| nothing_queued())?;
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let written = write_parts_now(&mut *w, parts).unwrap_or_else(|_| {
            self.break_connection();
            total
        });
        Some(Begun {
            w,
            written,
            waiting: false,
        })
    }

    /// Lets `begun` be finished waiting for the client, if that leaves
    /// another of the connection's threads to read requests (as
    /// [`Conn::send`] does); counted until [`Conn::finish_begun`].
    pub(super) fn may_finish_waiting(&self, begun: &mut Begun<'_, S>) -> bool {
        begun.waiting = self.replies.reserve_waiting_writer();
        begun.waiting
    }

    /// Ends a reply begun by [`Conn::begin_parts_now`]: `rest`, what is
    /// left of it, written waiting for the client if
    /// [`Conn::may_finish_waiting`] allowed it, else copied to the head of
    /// the queue; then (or once the queue has written it) `costs` given
    /// back.
    pub(super) fn finish_begun(&self, begun: Begun<'_, S>, rest: &[u8], costs: &[usize]) {
        let Begun { mut w, waiting, .. } = begun;
        if waiting {
            self.write_waiting(&mut w, rest);
            drop(w);
            self.replies.waiting_writers.fetch_sub(1, Ordering::AcqRel);
            self.done_many(costs);
        } else if rest.is_empty() || self.broken.load(Ordering::Relaxed) {
            drop(w);
            self.done_many(costs);
        } else {
            // The rest goes first: nothing may be written between the two
            // parts of one reply.
            self.enqueue(rest, costs, true);
        }
    }

    /// The writer's lock, if it comes within `patience`.
    fn writer_within(&self, patience: Duration) -> Option<std::sync::MutexGuard<'_, S>> {
        let started = Instant::now();
        loop {
            match self.writer.try_lock() {
                Ok(w) => return Some(w),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if started.elapsed() >= patience {
                return None;
            }
            std::thread::yield_now();
        }
    }

    pub(super) fn enqueue(&self, bytes: &[u8], costs: &[usize], first: bool) {
        let queued = Queued {
            bytes: bytes.to_vec(),
            costs: costs.to_vec(),
        };
        let mut out = lock(&self.replies.outbox);
        self.replies
            .queued_bytes
            .fetch_add(queued.bytes.len(), Ordering::AcqRel);
        if first {
            out.queue.push_front(queued);
        } else {
            out.queue.push_back(queued);
        }
        drop(out);
        self.shared.stats.replies_queued.fetch_add(1, Ordering::Relaxed);
        self.replies.queued.notify_one();
    }

    /// Whether the queued replies hold at most the connection's budget of
    /// bytes. Replies without a payload have no budget of their own: a
    /// client sending FLUSHes and reading nothing would otherwise grow the
    /// queue without end.
    pub(super) fn has_room(&self) -> bool {
        self.replies.queued_bytes.load(Ordering::Acquire) <= self.shared.config.max_inflight_bytes
    }

    /// Waits until [`Conn::has_room`], or the connection broke.
    pub(super) fn wait_for_room(&self) {
        let limit = self.shared.config.max_inflight_bytes;
        let mut out = lock(&self.replies.outbox);
        while self.replies.queued_bytes.load(Ordering::Acquire) > limit
            && !self.broken.load(Ordering::Relaxed)
        {
            out = self
                .replies
                .written
                .wait_timeout(out, Duration::from_millis(100))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// The connection's writer thread: writes the queued replies in order
    /// (each within `reply_timeout`, as a reply written at once would be),
    /// until the outbox is closed and empty. A failed write breaks the
    /// connection; the replies left are dropped with their budget given
    /// back.
    pub(super) fn write_queued_replies(&self) {
        loop {
            {
                let mut out = lock(&self.replies.outbox);
                while out.queue.is_empty() && !out.closed {
                    out = self
                        .replies
                        .queued
                        .wait(out)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                if out.queue.is_empty() {
                    return;
                }
            }
            // The writer lock before the reply leaves the queue: a thread
            // writing at once checks the queue under this lock, so nothing
            // is written between the parts of a reply begun at once (the
            // rest was pushed to the head under this lock).
            let mut w = lock(&self.writer);
            let Some(queued) = lock(&self.replies.outbox).queue.pop_front() else {
                continue; // only this thread takes from the queue
            };
            self.write_queued(&mut w, queued);
        }
    }

    /// Writes every queued reply, in order; the caller holds the writer's
    /// lock.
    fn write_all_queued(&self, w: &mut S) {
        loop {
            // Popped in a statement of its own: the queue's lock is not
            // held while the reply is written.
            let next = lock(&self.replies.outbox).queue.pop_front();
            let Some(queued) = next else {
                return;
            };
            self.write_queued(w, queued);
        }
    }

    /// Writes one queued reply (unless the connection broke), then gives
    /// its budget back; the caller holds the writer's lock.
    fn write_queued(&self, w: &mut S, queued: Queued) {
        self.write_waiting(w, &queued.bytes);
        {
            let _queue = lock(&self.replies.outbox);
            self.replies
                .queued_bytes
                .fetch_sub(queued.bytes.len(), Ordering::AcqRel);
        }
        self.done_many(&queued.costs);
        self.replies.written.notify_all();
    }

    /// Writes one reply made of parts that `body` produces and writes in
    /// turn (a large read, a piece at a time), nothing else written in
    /// between: the replies queued before it go first, the others wait.
    /// A failed write or a failed `body` closes the connection. Then gives
    /// `cost` back.
    pub(super) fn send_exclusive(
        &self,
        cost: usize,
        body: impl FnOnce(&mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()>,
    ) {
        let mut w = lock(&self.writer);
        // The queue's head may be the rest of a reply begun at once.
        self.write_all_queued(&mut w);
        if !self.broken.load(Ordering::Relaxed) {
            let pressure = || self.shared.global.contended();
            let timeout = self.shared.config.reply_timeout;
            let mut write = |bytes: &[u8]| write_all_within(&mut *w, bytes, timeout, pressure);
            if body(&mut write).is_err() {
                self.break_connection();
            }
        }
        drop(w);
        self.done(cost);
    }

    /// The client is gone or too slow: nobody will read the replies.
    pub(super) fn break_connection(&self) {
        self.broken.store(true, Ordering::Relaxed);
        // Wakes the reader and any write in progress (through a handle of
        // its own: the writer's lock may be held by a blocked write).
        let _ = lock(&self.closer).shutdown(Shutdown::Both);
        self.replies.written.notify_all();
    }
}

/// Writes what the stream takes of `bytes` without waiting (retrying an
/// interrupted call); 0 when it takes nothing now.
///
/// A client reading promptly drains the socket within microseconds, so
/// when the socket is full this waits for room as long as each wait is
/// shorter than [`BRIEF_WAIT`] and all of them together shorter than
/// [`BRIEF_WAITS_IN_ALL`]: a large reply then leaves from the caller's
/// buffer with no copy into the queue, while a client that stopped
/// reading costs the caller at most those few milliseconds.
fn write_now<S: ConnectionStream>(w: &mut S, bytes: &[u8]) -> io::Result<usize> {
    write_slices_now(w, &mut [io::IoSlice::new(bytes)])
}

/// A reply begun at once ([`Conn::begin_parts_now`]): the writer's lock,
/// held until the rest is written or queued, and the bytes written.
pub(super) struct Begun<'a, S> {
    w: std::sync::MutexGuard<'a, S>,
    pub(super) written: usize,
    /// Counted among the threads waiting for the client.
    waiting: bool,
}

/// [`write_now`] of `parts`, one after the other, in as few calls as the
/// stream allows.
fn write_parts_now<S: ConnectionStream>(w: &mut S, parts: &[&[u8]]) -> io::Result<usize> {
    let mut slices: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
    write_slices_now(w, &mut slices)
}

/// The loop of [`write_now`] over `left`: one slice is sent as it is, more
/// with one vectored call each time.
fn write_slices_now<S: ConnectionStream>(w: &mut S, mut left: &mut [io::IoSlice<'_>]) -> io::Result<usize> {
    let started = Instant::now();
    let mut written = 0;
    // Empty slices first are dropped: nothing to write is no write at all.
    io::IoSlice::advance_slices(&mut left, 0);
    while !left.is_empty() {
        let sent = match left {
            [one] => w.write_now(one),
            _ => w.write_vectored_now(left),
        };
        match sent {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                written += n;
                io::IoSlice::advance_slices(&mut left, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let wait = BRIEF_WAITS_IN_ALL.saturating_sub(started.elapsed());
                if wait.is_zero() || !w.wait_writable(wait.min(BRIEF_WAIT))? {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// The longest wait for room in the socket without progress before the
/// rest of a reply is queued.
const BRIEF_WAIT: Duration = Duration::from_millis(1);
/// The longest a reply is written by a thread that must not wait for
/// the client, in all.
const BRIEF_WAITS_IN_ALL: Duration = Duration::from_millis(5);
