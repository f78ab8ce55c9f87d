//! The receive side of a connection: a read-ahead buffer for request
//! headers that lands a large WRITE's payload in the caller's buffer.
//!
//! Request headers are small and come in bursts: reading ahead (one system
//! call for many headers) is what makes pipelined small requests cheap. A
//! large WRITE's payload is the opposite: whatever of it was read ahead
//! must be copied out of the buffer. So the payload's remainder is read
//! straight into the caller's buffer, together with what follows it (the
//! next header) into the read-ahead buffer, in one vectored read; and after
//! a large payload the read-ahead window shrinks to a few KiB, so the next
//! large payload is not read into the buffer and copied again. Profiled on
//! 64 KiB writes: the copy out of a 64 KiB read-ahead buffer was
//! 4.6 % of the server's CPU, and the two `setsockopt` calls bounding each
//! payload read 2.4 %; the remainder is now read first without waiting
//! (`ConnectionStream::read_vectored_now`), and the read timeout is set
//! only when it must wait.
//!
//! When the buffer is empty and the next request has not arrived, the
//! reader first polls the socket for a few microseconds
//! ([`crate::ServerConfig::poll_before_sleep`]) before it sleeps in the
//! read: a client at low queue depth sends its next request moments after
//! a reply, and a sleeping reader costs it a wake-up (a scheduler round
//! trip) on every request. On 4 KiB cache hits at QD 1 this took IOPS from
//! 28.0k to 33.9k on the Unix socket and 20.9k to 31.3k on TCP
//! (docs/results/engine.md, "Polling before sleep"). It polls only while waits
//! are short: after a wait longer than a few polling spans (an idle or
//! slow client) it sleeps at once, until a wait is short again, so an
//! idle connection costs at most one span per long wait.
//!
//! A reader polls only while few connections are busy ([`BusyReaders`]:
//! no more than the cores but one, counting the connections whose waits
//! are short). A polling reader keeps its core busy; with more busy
//! connections than spare cores, its spin takes the CPU that the other
//! connections' requests (and their clients) need. Measured on two cores
//! with 4 KiB hits at QD 16 on four connections, readers that all polled
//! served 228k IOPS with p99.99 of 7.4 ms against 281k and 2.1 ms without
//! polling, while one connection at QD 1 or QD 16 gained from it
//! (docs/results/engine.md, "Polling before sleep").
//!
//! Bounds: one buffer of [`READ_AHEAD_BYTES`] per connection, allocated
//! once.

use std::io::{self, IoSliceMut, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::server::ConnectionStream;

/// The read-ahead buffer's size (and its window for small requests).
const READ_AHEAD_BYTES: usize = 64 << 10;

/// The window after a large WRITE's payload: room for the next header and
/// a little of what follows, not for the next large payload.
const READ_AHEAD_AFTER_LARGE_WRITE_BYTES: usize = 4 << 10;

/// A WRITE's payload from this size on is "large" (see the module doc).
const LARGE_WRITE_BYTES: usize = 32 << 10;

/// A wait for a request longer than this many polling spans ends polling
/// until a wait is short again.
const LONG_WAIT_SPANS: u32 = 4;

/// How many of a server's connections are busy (their readers' waits are
/// short), and how many may be for their readers to poll (see the module
/// doc).
#[derive(Debug)]
pub(crate) struct BusyReaders {
    busy: AtomicUsize,
    polling_up_to: usize,
}

impl BusyReaders {
    pub(crate) fn new(polling_up_to: usize) -> BusyReaders {
        BusyReaders {
            busy: AtomicUsize::new(0),
            polling_up_to,
        }
    }

    /// Readers poll while no more connections are busy than the cores but
    /// one (the clients' threads need a core too), and at least while one is.
    pub(crate) fn for_this_machine() -> BusyReaders {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        BusyReaders::new(cores.saturating_sub(1).max(1))
    }

    fn polling_pays(&self) -> bool {
        self.busy.load(Ordering::Relaxed) <= self.polling_up_to
    }

    fn became_busy(&self) {
        self.busy.fetch_add(1, Ordering::Relaxed);
    }

    fn became_idle(&self) {
        let before = self.busy.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "a reader counted idle twice");
    }
}

/// A connection's stream with its read-ahead buffer (see the module doc).
pub(crate) struct RequestReader<S> {
    stream: S,
    buf: Box<[u8]>,
    /// What is buffered: `buf[pos..filled]`.
    pos: usize,
    filled: usize,
    /// Read ahead at most this many bytes per system call.
    window: usize,
    /// How long to poll for the next request before sleeping (zero: never).
    poll_span: Duration,
    /// Whether the last wait for a request was short (polling pays): the
    /// connection is counted busy in `busy_readers` while it is.
    polling: bool,
    busy_readers: Arc<BusyReaders>,
    /// Requests read by a poll that had found the socket empty at least
    /// once (so not by the first try): what the polling test checks.
    #[cfg(test)]
    caught_by_poll: u64,
}

impl<S: ConnectionStream> RequestReader<S> {
    pub(crate) fn new(stream: S, poll_span: Duration, busy_readers: Arc<BusyReaders>) -> RequestReader<S> {
        let polling = !poll_span.is_zero();
        if polling {
            busy_readers.became_busy();
        }
        RequestReader {
            stream,
            buf: vec![0u8; READ_AHEAD_BYTES].into_boxed_slice(),
            pos: 0,
            filled: 0,
            window: READ_AHEAD_BYTES,
            poll_span,
            polling,
            busy_readers,
            #[cfg(test)]
            caught_by_poll: 0,
        }
    }

    /// Fills the empty buffer with what arrives next: polls for up to
    /// `poll_span` while waits are short, then sleeps in the read. The
    /// clock is read only when the first poll finds nothing, or around a
    /// sleep that decides whether to poll next time.
    fn fill(&mut self) -> io::Result<()> {
        debug_assert_eq!(self.pos, self.filled);
        if self.polling && self.busy_readers.polling_pays() {
            let mut until = None;
            loop {
                let mut bufs = [IoSliceMut::new(&mut self.buf[..self.window])];
                match self.stream.read_vectored_now(&mut bufs) {
                    Ok(n) => {
                        self.filled = n;
                        #[cfg(test)]
                        {
                            self.caught_by_poll += u64::from(until.is_some());
                        }
                        return Ok(());
                    }
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                    Err(e) => return Err(e),
                }
                let now = Instant::now();
                if now >= *until.get_or_insert(now + self.poll_span) {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        if self.poll_span.is_zero() {
            self.filled = self.stream.read(&mut self.buf[..self.window])?;
            return Ok(());
        }
        let started = Instant::now();
        self.filled = self.stream.read(&mut self.buf[..self.window])?;
        let polling = started.elapsed() <= self.poll_span * LONG_WAIT_SPANS;
        match (self.polling, polling) {
            (false, true) => self.busy_readers.became_busy(),
            (true, false) => self.busy_readers.became_idle(),
            _ => {}
        }
        self.polling = polling;
        Ok(())
    }

    /// What was read ahead and not yet taken.
    pub(crate) fn buffer(&self) -> &[u8] {
        &self.buf[self.pos..self.filled]
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.stream
    }

    /// Copies what is buffered into the front of `out`; how much.
    fn take_buffered(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.filled - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        n
    }

    /// Fills `out` (a WRITE's payload) within `timeout` in total: each read
    /// blocks at most `min(timeout, stall)`, and one that brought nothing
    /// fails at once under `pressure` (the rule replies are written by,
    /// `server.rs`'s `write_all_within`). What was read ahead is taken
    /// first; the rest is read into `out` directly, what follows it into
    /// the read-ahead buffer, first without waiting: the stream's read
    /// timeout is set (and cleared after) only when the rest has not all
    /// arrived.
    pub(crate) fn read_payload(
        &mut self,
        out: &mut [u8],
        timeout: Option<Duration>,
        stall: Duration,
        pressure: impl Fn() -> bool,
    ) -> io::Result<()> {
        let mut got = self.take_buffered(out);
        let large = out.len() >= LARGE_WRITE_BYTES;
        self.window = if large {
            READ_AHEAD_AFTER_LARGE_WRITE_BYTES
        } else {
            READ_AHEAD_BYTES
        };
        if got == out.len() {
            return Ok(());
        }
        // The buffer is empty: what a read brings past the payload starts
        // it again.
        debug_assert_eq!(self.pos, self.filled);
        self.pos = 0;
        self.filled = 0;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut timed = false;
        let mut result = Ok(());
        while got < out.len() {
            let mut bufs = [
                IoSliceMut::new(&mut out[got..]),
                IoSliceMut::new(&mut self.buf[..self.window]),
            ];
            let read = if timed {
                self.stream.read_vectored(&mut bufs)
            } else {
                self.stream.read_vectored_now(&mut bufs)
            };
            match read {
                Ok(0) => {
                    result = Err(io::ErrorKind::UnexpectedEof.into());
                    break;
                }
                Ok(n) => {
                    let into_out = n.min(out.len() - got);
                    got += into_out;
                    self.filled = n - into_out;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if !timed && e.kind() == io::ErrorKind::WouldBlock => {
                    let step = timeout.map_or(stall, |t| t.min(stall));
                    if let Err(e) = self.stream.set_read_timeout(Some(step)) {
                        result = Err(e);
                        break;
                    }
                    timed = true;
                }
                Err(e) if timed && crate::server::is_timeout(&e) && !pressure() => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            if got < out.len() && deadline.is_some_and(|d| Instant::now() >= d) {
                result = Err(crate::server::deadline_passed());
                break;
            }
        }
        if timed {
            let _ = self.stream.set_read_timeout(None);
        }
        result
    }
}

/// Reads through the buffer: a header, or a refused request's payload to
/// discard. Waits as long as the stream does (no timeout: a connection may
/// be idle between requests).
impl<S: ConnectionStream> Read for RequestReader<S> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.filled {
            self.pos = 0;
            self.filled = 0;
            if out.len() >= self.window {
                return self.stream.read(out);
            }
            self.fill()?;
        }
        Ok(self.take_buffered(out))
    }
}

impl<S> Drop for RequestReader<S> {
    fn drop(&mut self) {
        if self.polling {
            self.busy_readers.became_idle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::Shutdown;
    use std::os::unix::net::UnixStream;

    fn pair() -> (RequestReader<UnixStream>, UnixStream) {
        let (a, b) = UnixStream::pair().expect("socketpair");
        (
            RequestReader::new(a, Duration::ZERO, Arc::new(BusyReaders::new(1))),
            b,
        )
    }

    fn read_payload_within_5s(reader: &mut RequestReader<UnixStream>, p: &mut [u8]) {
        let five = Duration::from_secs(5);
        reader
            .read_payload(p, Some(five), five, || false)
            .expect("payload");
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn a_large_payload_lands_whole_and_what_follows_stays_buffered() {
        let (mut reader, mut client) = pair();
        let header = bytes(28, 1);
        let payload = bytes(64 << 10, 2);
        let next = bytes(28, 3);
        let mut sent = header.clone();
        sent.extend_from_slice(&payload);
        sent.extend_from_slice(&next);
        client.write_all(&sent).expect("send");
        let mut h = [0u8; 28];
        reader.read_exact(&mut h).expect("header");
        assert_eq!(h[..], header[..]);
        let mut p = vec![0u8; payload.len()];
        read_payload_within_5s(&mut reader, &mut p);
        assert_eq!(p, payload);
        assert_eq!(reader.buffer(), &next[..], "the next header was read ahead");
        // After a large payload the window is small: the next header read
        // leaves a following large payload mostly unread.
        assert_eq!(reader.window, READ_AHEAD_AFTER_LARGE_WRITE_BYTES);
    }

    #[test]
    fn a_payload_sent_in_pieces_waits_for_the_rest_and_clears_the_timeout() {
        let (mut reader, mut client) = pair();
        let payload = bytes(100_000, 7);
        let (first, rest) = payload.split_at(30_000);
        client.write_all(first).expect("send");
        let rest = rest.to_vec();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            client.write_all(&rest).expect("send the rest");
            client
        });
        let mut p = vec![0u8; payload.len()];
        read_payload_within_5s(&mut reader, &mut p);
        assert_eq!(p, payload);
        assert_eq!(reader.get_ref().read_timeout().expect("timeout"), None);
        drop(sender.join());
    }

    #[test]
    fn a_payload_that_never_comes_fails_within_its_deadline() {
        let (mut reader, mut client) = pair();
        client.write_all(&bytes(10, 0)).expect("send");
        let mut p = vec![0u8; 4096];
        let started = Instant::now();
        let e = reader
            .read_payload(
                &mut p,
                Some(Duration::from_millis(200)),
                Duration::from_millis(50),
                || false,
            )
            .expect_err("the payload never came");
        assert!(crate::server::is_timeout(&e), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(reader.get_ref().read_timeout().expect("timeout"), None);
        drop(client);
    }

    #[test]
    fn a_payload_cut_short_by_the_client_is_an_error() {
        let (mut reader, mut client) = pair();
        client.write_all(&bytes(1000, 0)).expect("send");
        client.shutdown(Shutdown::Write).expect("shutdown");
        let mut p = vec![0u8; 4096];
        let e = reader
            .read_payload(&mut p, None, Duration::from_secs(5), || false)
            .expect_err("cut short");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn small_requests_are_read_ahead_together() {
        let (mut reader, mut client) = pair();
        let sent = bytes(28 * 10, 5);
        client.write_all(&sent).expect("send");
        let mut h = [0u8; 28];
        reader.read_exact(&mut h).expect("first");
        // All ten arrived before the first read: nine are buffered.
        assert_eq!(reader.buffer().len(), 28 * 9);
        for i in 1..10 {
            reader.read_exact(&mut h).expect("next");
            assert_eq!(h[..], sent[28 * i..28 * (i + 1)]);
        }
        assert!(reader.buffer().is_empty());
    }

    /// A reader that polls before sleeping reads what comes soon and what
    /// comes late alike; it stops polling after a long wait and polls
    /// again once a wait is short.
    #[test]
    fn polling_reads_early_and_late_requests_and_stops_after_a_long_wait() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let span = Duration::from_millis(2);
        let mut reader = RequestReader::new(a, span, Arc::new(BusyReaders::new(1)));
        assert!(reader.polling);
        let mut h = [0u8; 28];
        // Sent while the reader polls: caught by a poll, still polling.
        let sender = std::thread::spawn(move || {
            b.write_all(&bytes(28, 1)).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            b.write_all(&bytes(28, 2)).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            b.write_all(&bytes(28, 3)).unwrap();
            b
        });
        reader.read_exact(&mut h).unwrap();
        assert_eq!(h[..], bytes(28, 1)[..]);
        // The second comes 100 ms later: far past the span, read in the
        // sleep after it; polling then stops.
        reader.read_exact(&mut h).unwrap();
        assert_eq!(h[..], bytes(28, 2)[..]);
        assert!(!reader.polling, "a long wait ends polling");
        reader.read_exact(&mut h).unwrap();
        assert_eq!(h[..], bytes(28, 3)[..]);
        let mut b = sender.join().unwrap();
        // A short wait (the request already there) turns polling back on.
        b.write_all(&bytes(28, 4)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        reader.read_exact(&mut h).unwrap();
        assert_eq!(h[..], bytes(28, 4)[..]);
        assert!(reader.polling, "a short wait resumes polling");
    }

    #[test]
    fn a_request_sent_while_the_reader_polls_is_caught_by_the_poll() {
        let (a, mut b) = UnixStream::pair().unwrap();
        // A span far longer than the sender's delay: the request must
        // arrive while the reader is still polling, not in a sleep.
        let busy = Arc::new(BusyReaders::new(1));
        let mut reader = RequestReader::new(a, Duration::from_secs(5), Arc::clone(&busy));
        let mut h = [0u8; 28];
        // The delay starts when the reader is about to read, and is long
        // enough that a reader late to its first try still finds nothing.
        let reading = std::sync::Arc::new(std::sync::Barrier::new(2));
        let sender = std::thread::spawn({
            let reading = std::sync::Arc::clone(&reading);
            move || {
                reading.wait();
                std::thread::sleep(Duration::from_millis(200));
                b.write_all(&bytes(28, 1)).unwrap();
                b
            }
        });
        reading.wait();
        reader.read_exact(&mut h).unwrap();
        assert_eq!(h[..], bytes(28, 1)[..]);
        assert_eq!(
            reader.caught_by_poll, 1,
            "the request was read by a poll after empty tries"
        );
        // With polling off the same request is read in a sleep.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut reader = RequestReader::new(a, Duration::ZERO, Arc::clone(&busy));
        let sender_off = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            b.write_all(&bytes(28, 2)).unwrap();
            b
        });
        reader.read_exact(&mut h).unwrap();
        assert_eq!(h[..], bytes(28, 2)[..]);
        assert_eq!(reader.caught_by_poll, 0);
        drop((sender.join().unwrap(), sender_off.join().unwrap()));
    }

    #[test]
    fn a_reader_sleeps_instead_of_polling_while_more_connections_are_busy_than_allowed() {
        let busy = Arc::new(BusyReaders::new(1));
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut reader = RequestReader::new(a, Duration::from_secs(5), Arc::clone(&busy));
        assert_eq!(busy.busy.load(Ordering::Relaxed), 1, "a new reader counts busy");
        // Another busy connection: two busy, polling for one only.
        busy.became_busy();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            b.write_all(&bytes(28, 1)).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            b.write_all(&bytes(28, 2)).unwrap();
            b
        });
        let mut h = [0u8; 28];
        reader.read_exact(&mut h).unwrap();
        assert_eq!(h[..], bytes(28, 1)[..]);
        assert_eq!(reader.caught_by_poll, 0, "two busy: read in a sleep");
        assert!(reader.polling, "a short wait: still busy");
        // The other connection idle again: this reader polls.
        busy.became_idle();
        reader.read_exact(&mut h).unwrap();
        assert_eq!(h[..], bytes(28, 2)[..]);
        assert_eq!(reader.caught_by_poll, 1);
        let b = sender.join().unwrap();
        drop(reader);
        assert_eq!(
            busy.busy.load(Ordering::Relaxed),
            0,
            "a dropped reader is not busy"
        );
        drop(b);
    }

    #[test]
    fn a_long_wait_counts_the_connection_idle_and_a_short_one_busy_again() {
        let busy = Arc::new(BusyReaders::new(1));
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut reader = RequestReader::new(a, Duration::from_millis(1), Arc::clone(&busy));
        let mut h = [0u8; 28];
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            b.write_all(&bytes(28, 1)).unwrap();
            b
        });
        reader.read_exact(&mut h).unwrap();
        assert!(!reader.polling);
        assert_eq!(busy.busy.load(Ordering::Relaxed), 0, "idle after a long wait");
        let mut b = sender.join().unwrap();
        b.write_all(&bytes(28, 2)).unwrap();
        reader.read_exact(&mut h).unwrap();
        assert!(reader.polling);
        assert_eq!(busy.busy.load(Ordering::Relaxed), 1, "busy after a short wait");
        // Polling off: never counted.
        let (c, _d) = UnixStream::pair().unwrap();
        let off = RequestReader::new(c, Duration::ZERO, Arc::clone(&busy));
        assert_eq!(busy.busy.load(Ordering::Relaxed), 1);
        drop((off, reader));
        assert_eq!(busy.busy.load(Ordering::Relaxed), 0);
        assert!(BusyReaders::for_this_machine().polling_up_to >= 1);
    }
}
