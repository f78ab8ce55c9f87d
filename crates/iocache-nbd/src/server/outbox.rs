//! A connection's replies on their way to the socket: written at once when
//! the socket takes them without waiting, else queued for the connection's
//! writer thread. So no thread that reads or serves requests ever blocks on
//! a client that reads its replies late; reading stops only when the
//! requests' budget (which queued replies keep) or the queue's own bound
//! is spent.

use std::collections::VecDeque;

use super::*;

/// Replies waiting for the writer thread, in the order they are written.
#[derive(Default)]
pub(super) struct Outbox {
    queue: VecDeque<Queued>,
    /// Bytes in `queue`.
    queued_bytes: usize,
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
    /// The connection has a writer thread: without one (it could not be
    /// created) every reply is written by the thread that served it,
    /// waiting for the client as long as it must.
    pub(super) has_writer: AtomicBool,
}

impl Replies {
    /// Closes the outbox: the writer thread writes what is queued, then
    /// leaves.
    pub(super) fn close(&self) {
        lock(&self.outbox).closed = true;
        self.queued.notify_all();
    }
}

impl<S: ConnectionStream> Conn<'_, S> {
    /// Writes a reply answering requests of budget `costs` (given back
    /// once it is written, or when the connection broke): at once if the
    /// socket takes all of it without waiting and no reply is queued,
    /// else (the rest of it) queued for the writer thread. Never blocks
    /// on the client.
    pub(super) fn send(&self, bytes: &[u8], costs: &[usize]) {
        if self.broken.load(Ordering::Relaxed) {
            self.done_many(costs);
            return;
        }
        if !self.replies.has_writer.load(Ordering::Relaxed) {
            let mut w = lock(&self.writer);
            let pressure = || self.shared.global.contended();
            if write_all_within(&mut *w, bytes, self.shared.config.reply_timeout, pressure).is_err() {
                self.break_connection();
            }
            drop(w);
            self.done_many(costs);
            return;
        }
        // The writer lock, taken without waiting, makes this thread the
        // only one writing; an empty queue (checked under it) means no
        // reply goes before this one.
        if let Ok(mut w) = self.writer.try_lock() {
            if lock(&self.replies.outbox).queue.is_empty() {
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

    fn enqueue(&self, bytes: &[u8], costs: &[usize], first: bool) {
        let queued = Queued {
            bytes: bytes.to_vec(),
            costs: costs.to_vec(),
        };
        let mut out = lock(&self.replies.outbox);
        out.queued_bytes += queued.bytes.len();
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
        lock(&self.replies.outbox).queued_bytes <= self.shared.config.max_inflight_bytes
    }

    /// Waits until [`Conn::has_room`], or the connection broke.
    pub(super) fn wait_for_room(&self) {
        let limit = self.shared.config.max_inflight_bytes;
        let mut out = lock(&self.replies.outbox);
        while out.queued_bytes > limit && !self.broken.load(Ordering::Relaxed) {
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

    /// Writes one queued reply (unless the connection broke), then gives
    /// its budget back; the caller holds the writer's lock.
    fn write_queued(&self, w: &mut S, queued: Queued) {
        if !self.broken.load(Ordering::Relaxed) {
            let pressure = || self.shared.global.contended();
            if write_all_within(w, &queued.bytes, self.shared.config.reply_timeout, pressure).is_err() {
                self.break_connection();
            }
        }
        lock(&self.replies.outbox).queued_bytes -= queued.bytes.len();
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
        while let Some(queued) = lock(&self.replies.outbox).queue.pop_front() {
            self.write_queued(&mut w, queued);
        }
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
fn write_now<S: ConnectionStream>(w: &mut S, bytes: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < bytes.len() {
        match w.write_now(&bytes[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}
