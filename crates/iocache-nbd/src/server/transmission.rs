//! The transmission phase: the threads of one connection taking turns to
//! read requests (leader and followers), serving them on the export and
//! writing the replies.

use super::*;

/// What a connection's workers share.
pub(super) struct Conn<'a, S> {
    pub(super) shared: &'a Shared,
    pub(super) neg: Negotiated,
    pub(super) writer: Mutex<S>,
    /// A handle that shuts the stream down without the writer's lock.
    pub(super) closer: Mutex<S>,
    /// Replies the socket did not take at once (`outbox.rs`).
    pub(super) replies: Replies,
    /// Set when a reply could not be written: the client is gone.
    pub(super) broken: AtomicBool,
    pub(super) budget: Budget,
    pub(super) activity: Arc<Activity>,
}

/// A request read from the socket, served by the thread that read it.
pub(super) struct Job {
    pub(super) req: Request,
    /// Bytes of budget held until the reply is sent.
    pub(super) cost: usize,
}

/// The reader role (leader/follower): the thread holding the lock reads
/// the next request; the others wait for it.
pub(super) struct ReaderRole<S> {
    pub(super) reader: RequestReader<S>,
    /// Why the connection stopped reading (EOF, DISC, an error, shutdown);
    /// threads that find it set exit.
    pub(super) end: Option<ConnEnd>,
}

pub(super) fn transmission<S: ConnectionStream>(
    shared: &Shared,
    stream: S,
    neg: Negotiated,
    activity: Arc<Activity>,
) -> ConnEnd {
    let (writer, closer) = match (stream.try_clone(), stream.try_clone()) {
        (Ok(w), Ok(c)) => (w, c),
        (Err(e), _) | (_, Err(e)) => return ConnEnd::Io(e),
    };
    let conn = Conn {
        shared,
        neg,
        writer: Mutex::new(writer),
        closer: Mutex::new(closer),
        replies: Replies::default(),
        broken: AtomicBool::new(false),
        budget: Budget {
            available: Mutex::new((shared.config.max_inflight_bytes, 0)),
            freed: Condvar::new(),
        },
        activity,
    };
    let role = Mutex::new(ReaderRole {
        reader: RequestReader::new(
            stream,
            shared.config.poll_before_sleep,
            Arc::clone(&shared.busy_readers),
        ),
        end: None,
    });
    thread::scope(|scope| {
        // The writer of the replies the socket did not take at once;
        // without one, the serving threads write every reply themselves.
        let conn_ref = &conn;
        let writer = thread::Builder::new()
            .spawn_scoped(scope, move || conn_ref.write_queued_replies())
            .inspect_err(|_| {
                shared.stats.spawn_failures.fetch_add(1, Ordering::Relaxed);
            })
            .ok();
        conn.replies.has_writer.store(writer.is_some(), Ordering::Relaxed);
        let mut followers = Vec::new();
        // This thread is one of them.
        for _ in 1..shared.config.workers_per_connection {
            let (conn, role) = (&conn, &role);
            match thread::Builder::new().spawn_scoped(scope, move || serve_requests(conn, role)) {
                Ok(t) => followers.push(t),
                Err(_) => {
                    // Served by the threads there are (this one at least).
                    shared.stats.spawn_failures.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
        conn.replies.threads.store(followers.len() + 1, Ordering::Relaxed);
        serve_requests(&conn, &role);
        // Joined explicitly: the scope alone waits only for the closures,
        // and the threads could still be running their thread-local
        // destructors when the connection ends. A thread's panic is passed
        // on, as the scope would. The writer goes last: it writes the
        // replies the others queued.
        let mut panic = None;
        for t in followers {
            if let Err(p) = t.join() {
                panic.get_or_insert(p);
            }
        }
        conn.replies.close();
        if let Some(Err(p)) = writer.map(|w| w.join()) {
            panic.get_or_insert(p);
        }
        if let Some(p) = panic {
            std::panic::resume_unwind(p);
        }
    });
    let end = role
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .end
        .unwrap_or(ConnEnd::Eof);
    let w = lock(&conn.writer);
    let _ = w.shutdown(Shutdown::Both);
    end
}

/// One thread of a connection: takes the reader role, reads a request,
/// gives the role up (a waiting thread reads the next one meanwhile) and
/// serves the request; until the connection stops reading.
pub(super) fn serve_requests<S: ConnectionStream>(conn: &Conn<'_, S>, role: &Mutex<ReaderRole<S>>) {
    // Reused from one request to the next: no allocation per request.
    let mut buffer = KeptBuffer::new(&conn.shared.kept);
    // Replies to reads served inline, written together (see below).
    let mut batch = ReplyBatch::new(&conn.shared.kept);
    loop {
        let mut held = lock(role);
        let job = loop {
            // Replies wait in the batch only while the next request can be
            // read without waiting for the client, which may be waiting
            // for them.
            if !batch.is_empty() && (batch.is_full() || !request_buffered(held.reader.buffer())) {
                batch.send(conn);
            }
            if held.end.is_some() {
                batch.send(conn);
                return;
            }
            let job = match read_request(conn, &mut held.reader, &mut buffer, &mut batch) {
                Ok(Some(job)) => job,
                Ok(None) => continue,
                Err(end) => {
                    held.end = Some(end);
                    batch.send(conn);
                    // Nothing more is read: wake nobody, let the others
                    // finish what they serve.
                    let _ = held.reader.get_ref().shutdown(Shutdown::Read);
                    return;
                }
            };
            // A read the export serves at once (a cache hit): serve it
            // here and keep the reader role, instead of waking a thread to
            // read the next one (a wake-up, and the follower's sleep in
            // the socket read, cost more than a hit). Its reply joins the
            // batch while the next request is already buffered (one write
            // for all, and one wake-up of the client); with nothing
            // buffered it leaves at once, at the top of the loop. Requests
            // that may wait (misses, writes, flushes) hand the role on.
            if conn.is_quick(&job.req) {
                conn.run_inline(job, &mut buffer, &mut batch);
                if batch.is_full() {
                    batch.send(conn);
                }
                continue;
            }
            // A WRITE above the largest piece: its payload is still on the
            // socket, so the reader serves it piece by piece.
            if conn.is_split_write(&job.req) {
                batch.send(conn);
                if let Err(e) = conn.write_in_pieces(job, &mut held.reader, &mut buffer) {
                    held.end = Some(ConnEnd::Io(e));
                    let _ = held.reader.get_ref().shutdown(Shutdown::Read);
                    return;
                }
                continue;
            }
            break job;
        };
        drop(held);
        batch.send(conn);
        conn.run(job, &mut buffer);
    }
}

/// Whether `buffered` holds a whole request (its header, and a WRITE's
/// payload): reading it will not wait for the client.
pub(super) fn request_buffered(buffered: &[u8]) -> bool {
    let Some(header) = buffered.get(..REQUEST_HEADER_LEN) else {
        return false;
    };
    let command = u16::from_be_bytes([header[6], header[7]]);
    let length = u32::from_be_bytes([header[24], header[25], header[26], header[27]]) as usize;
    command != crate::proto::NBD_CMD_WRITE || buffered.len() - REQUEST_HEADER_LEN >= length
}

/// Reads above this size are never served inline: a batch holds a few
/// small replies, not a large one (which gains nothing from sharing a
/// write).
pub(super) const INLINE_READ_MAX_BYTES: usize = 64 << 10;

/// What is left of the bytes of `parts`, one after the other, once the
/// first `written` are gone: a copy.
fn rest_of(parts: &[&[u8]], written: usize) -> Vec<u8> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut rest = Vec::with_capacity(total.saturating_sub(written));
    let mut skip = written;
    for part in parts {
        let from = skip.min(part.len());
        rest.extend_from_slice(&part[from..]);
        skip -= from;
    }
    rest
}

/// The bytes before a read's data in its reply (see
/// [`Conn::read_reply_header`]).
pub(super) struct ReadHeader {
    bytes: [u8; STRUCTURED_HEADER_LEN + 8],
    len: usize,
}

impl std::ops::Deref for ReadHeader {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Reads from this size on are sent from where the export's bytes lie when
/// it can hand them over (see [`Conn::read_in_place`]): smaller replies
/// gain less from a copy saved than they lose from not sharing a write.
pub(super) const IN_PLACE_MIN_BYTES: usize = 32 << 10;

/// How long a serving thread (not the reader) waits for the connection's
/// writer to be free before it copies a reply read in place instead: the
/// read's lines stay locked meanwhile, so a reply being written to a slow
/// client must not hold them up for long.
pub(super) const IN_PLACE_WRITER_PATIENCE: Duration = Duration::from_millis(2);

/// Replies of reads served inline, sent with one write. Their requests'
/// budget is given back when the batch is sent, so what it holds counts in
/// the connection's and the server's payload budgets.
pub(super) struct ReplyBatch<'a> {
    /// Budget taken by each request whose reply is held (header errors
    /// hold none and are not listed).
    pub(super) costs: Vec<usize>,
    /// The replies are `bytes[..used]` (what follows is old, kept so a
    /// batch does not zero its buffer again).
    pub(super) bytes: KeptBuffer<'a>,
    pub(super) used: usize,
    pub(super) replies: usize,
}

impl<'a> ReplyBatch<'a> {
    pub(super) fn new(kept: &'a KeptAllowance) -> ReplyBatch<'a> {
        ReplyBatch {
            costs: Vec::new(),
            bytes: KeptBuffer::new(kept),
            used: 0,
            replies: 0,
        }
    }

    /// Replies kept at most before they are sent.
    const MAX_REPLIES: usize = 32;
    /// Bytes kept at most before they are sent.
    const MAX_BYTES: usize = 256 << 10;

    pub(super) fn is_empty(&self) -> bool {
        self.replies == 0
    }

    pub(super) fn is_full(&self) -> bool {
        self.replies >= Self::MAX_REPLIES || self.used >= Self::MAX_BYTES
    }

    /// Appends a whole reply.
    pub(super) fn push(&mut self, reply: &[u8]) {
        let end = self.used + reply.len();
        sized(&mut self.bytes, end)[self.used..].copy_from_slice(reply);
        self.used = end;
        self.replies += 1;
    }

    pub(super) fn send<S: ConnectionStream>(&mut self, conn: &Conn<'_, S>) {
        if self.replies > 0 {
            conn.send_without_waiting(&self.bytes[..self.used], &self.costs);
            self.used = 0;
            self.replies = 0;
        } else if !self.costs.is_empty() {
            conn.done_many(&self.costs);
        }
        self.costs.clear();
        self.bytes.recycle();
    }
}

pub(super) fn read_exact_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<bool, io::Error> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads one request (its header, and a WRITE's payload, into `data`,
/// after taking its budget). `Ok(None)`: a request the header parser
/// refused was answered with an error; read the next. `Err`: the
/// connection stops reading.
pub(super) fn read_request<S: ConnectionStream>(
    conn: &Conn<'_, S>,
    reader: &mut RequestReader<S>,
    data: &mut Vec<u8>,
    batch: &mut ReplyBatch,
) -> Result<Option<Job>, ConnEnd> {
    let max_request = conn.shared.config.max_request_bytes;
    if conn.broken.load(Ordering::Relaxed) {
        return Err(ConnEnd::Eof);
    }
    // Replies queued past the connection's budget pause reading (the
    // writer thread still drains them).
    if !conn.has_room() {
        batch.send(conn);
        conn.wait_for_room();
    }
    let mut hb = [0u8; REQUEST_HEADER_LEN];
    match read_exact_or_eof(reader, &mut hb) {
        Ok(true) => {}
        Ok(false) => return Err(ConnEnd::Eof),
        Err(e) => return Err(ConnEnd::Io(e)),
    }
    let req = match RequestHeader::parse(&hb, max_request) {
        Ok(r) => r,
        Err(e) if e.is_fatal() => return Err(ConnEnd::Fatal(e)),
        Err(e) => {
            if let Err(io) = discard_payload(conn, reader, data, e.payload_to_discard()) {
                return Err(ConnEnd::Io(io));
            }
            // Answered after the replies this thread holds, as it read them.
            let handle = e.handle().unwrap_or(0);
            batch.push(&conn.error_reply(handle, e.errno(), &e.to_string()));
            return Ok(None);
        }
    };
    if req.command == Command::Disc {
        return Err(ConnEnd::Disconnect);
    }
    // One piece's budget: a request above the largest piece is served a
    // piece at a time.
    let cost = match req.command {
        Command::Read | Command::Write => (req.length as usize).min(conn.piece_bytes()),
        _ => 0,
    };
    conn.activity.in_flight.fetch_add(1, Ordering::SeqCst);
    conn.activity.touch(conn.shared);
    // The connection's budget, then the server's: a reader waiting for
    // either stops reading its socket. Replies this thread holds keep their
    // budget until they are sent: it sends them rather than wait for budget
    // they may be holding.
    if !conn.budget.try_acquire(cost) {
        batch.send(conn);
        conn.budget.acquire(cost);
    }
    if !conn.shared.global.try_acquire(cost) {
        batch.send(conn);
        conn.shared.global.acquire(cost);
    }
    if req.command == Command::Write && !conn.is_split_write(&req) {
        let payload = sized(data, req.length as usize);
        let config = &conn.shared.config;
        let pressure = || conn.shared.global.contended();
        if let Err(e) = reader.read_payload(payload, config.reply_timeout, config.stall_timeout, pressure) {
            conn.done(cost);
            return Err(ConnEnd::Io(e));
        }
    }
    Ok(Some(Job { req, cost }))
}

/// Reads and drops `length` bytes of a refused WRITE's payload through
/// `scratch`, a piece at a time, all within one `reply_timeout` (a client
/// announcing gigabytes and sending nothing is closed then).
fn discard_payload<S: ConnectionStream>(
    conn: &Conn<'_, S>,
    reader: &mut RequestReader<S>,
    scratch: &mut Vec<u8>,
    length: u32,
) -> io::Result<()> {
    let config = &conn.shared.config;
    let deadline = config.reply_timeout.map(|t| Instant::now() + t);
    let pressure = || conn.shared.global.contended();
    let mut left = length as usize;
    while left > 0 {
        let piece = sized(scratch, left.min(DISCARD_PIECE_BYTES));
        let timeout = deadline.map(time_left).transpose()?;
        reader.read_payload(piece, timeout, config.stall_timeout, pressure)?;
        left -= piece.len();
    }
    Ok(())
}

/// The scratch a refused payload is read into, piece by piece.
const DISCARD_PIECE_BYTES: usize = 1 << 20;

/// The first `len` bytes of `buffer`, grown (zeroed) if it is shorter. What
/// it held before is not cleared: the caller overwrites all `len` bytes
/// (a payload read in full, an export read that fills its buffer) before
/// they are used, and zeroing a megabyte per request showed in profiles.
pub(super) fn sized(buffer: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buffer.len() < len {
        if buffer.capacity() < len {
            // Doubling (a batch grows reply by reply), but not past what a
            // thread may keep: a 1 MiB reply's buffer doubled from 600 KiB
            // would be dropped after every use (kept.rs).
            let capacity = (buffer.capacity() * 2).min(LARGEST_KEPT_BYTES).max(len);
            buffer.reserve_exact(capacity - buffer.len());
        }
        buffer.resize(len, 0);
    }
    &mut buffer[..len]
}

impl<S: ConnectionStream> Conn<'_, S> {
    /// A request is over (answered, or dropped with its connection): its
    /// budget goes back.
    pub(super) fn done(&self, cost: usize) {
        self.done_many(&[cost]);
    }

    /// Requests of these costs are answered: their budget is given back,
    /// each cost on its own (the server's budget has a pool per request
    /// size: a sum would go back to the wrong pool).
    pub(super) fn done_many(&self, costs: &[usize]) {
        for &cost in costs {
            self.shared.global.release(cost);
        }
        self.budget.release(costs.iter().sum());
        self.activity.in_flight.fetch_sub(costs.len(), Ordering::SeqCst);
        self.activity.touch(self.shared);
    }

    /// Checks a request against the export before running it.
    pub(super) fn check(&self, req: &Request) -> Result<(), (u32, String)> {
        let export = &self.neg.export;
        if req.command.has_range() {
            let end = req.offset + u64::from(req.length); // checked by the parser
            if end > export.size_bytes() {
                let errno = match req.command {
                    Command::Write | Command::WriteZeroes => NBD_ENOSPC,
                    _ => NBD_EINVAL,
                };
                return Err((
                    errno,
                    format!("range {}+{} is past the end", req.offset, req.length),
                ));
            }
            let min = u64::from(self.neg.block_sizes.0);
            if !req.offset.is_multiple_of(min) || !u64::from(req.length).is_multiple_of(min) {
                return Err((
                    NBD_EINVAL,
                    format!(
                        "range {}+{} is not aligned to {min} bytes",
                        req.offset, req.length
                    ),
                ));
            }
        }
        if self.neg.flags & NBD_FLAG_READ_ONLY != 0
            && matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes)
        {
            return Err((NBD_EPERM, "export is read-only".into()));
        }
        if req.command == Command::BlockStatus && !self.neg.block_status {
            return Err((NBD_EINVAL, "BLOCK_STATUS without base:allocation selected".into()));
        }
        if req.command == Command::BlockStatus && req.length == 0 {
            return Err((NBD_EINVAL, "BLOCK_STATUS of no bytes".into()));
        }
        if req.command == Command::Cache && self.neg.flags & NBD_FLAG_SEND_CACHE == 0 {
            return Err((NBD_EINVAL, "CACHE is not offered by this export".into()));
        }
        if req.flags.df() && !self.neg.structured {
            return Err((NBD_EINVAL, "DF without structured replies".into()));
        }
        Ok(())
    }

    /// Serves one request and writes its reply; `buffer` is the thread's:
    /// a WRITE's payload as read, and for a READ the reply to fill.
    /// Executes `job` (unless the connection broke: nobody would read the
    /// reply) and gives its budget back.
    pub(super) fn run(&self, job: Job, buffer: &mut KeptBuffer<'_>) {
        if self.broken.load(Ordering::Relaxed) {
            self.done(job.cost);
        } else {
            self.execute(job, buffer);
        }
        buffer.recycle();
    }

    /// Serves a quick read (see [`Conn::is_quick`]), its reply appended to
    /// `batch`; an error is answered at once.
    pub(super) fn run_inline(&self, job: Job, buffer: &mut Vec<u8>, batch: &mut ReplyBatch) {
        let cost = job.cost;
        let req = job.req;
        if req.length as usize >= IN_PLACE_MIN_BYTES && self.check(&req).is_ok() {
            // Large enough to go from where it lies: the replies held go
            // first, then this one, which does not wait for the client.
            batch.send(self);
            self.shared.stats.served_inline.fetch_add(1, Ordering::Relaxed);
            self.read_in_place(&*self.neg.export, &req, cost, buffer, false);
            return;
        }
        if !self.broken.load(Ordering::Relaxed) {
            // Every reply of this thread goes into the batch, in order.
            let result = self
                .check(&req)
                .and_then(|()| self.read_reply(&*self.neg.export, &req, &mut batch.bytes, batch.used));
            match result {
                Ok(end) => {
                    batch.used = end;
                    batch.replies += 1;
                }
                Err((errno, msg)) => batch.push(&self.error_reply(req.handle, errno, &msg)),
            }
        }
        self.shared.stats.served_inline.fetch_add(1, Ordering::Relaxed);
        // The request stays in flight, its budget taken, while its reply
        // waits in the batch.
        batch.costs.push(cost);
    }

    /// Whether `req` is a read of at most [`INLINE_READ_MAX_BYTES`] the
    /// export says it serves at once.
    pub(super) fn is_quick(&self, req: &Request) -> bool {
        req.command == Command::Read
            && req.length as usize <= INLINE_READ_MAX_BYTES
            && self.neg.export.read_is_quick(req.offset, u64::from(req.length))
    }

    /// Serves `job` and sends its reply, which gives its budget back.
    pub(super) fn execute(&self, job: Job, buffer: &mut Vec<u8>) {
        let (req, cost) = (job.req, job.cost);
        if let Err((errno, msg)) = self.check(&req) {
            self.reply_error(req.handle, cost, errno, &msg);
            return;
        }
        let export = &*self.neg.export;
        if req.command == Command::Read && req.length as usize > self.piece_bytes() {
            self.read_in_pieces(export, &req, cost, buffer);
            return;
        }
        if req.command == Command::Read {
            self.read(export, &req, cost, buffer);
            return;
        }
        if req.command == Command::BlockStatus {
            self.block_status(export, &req, cost);
            return;
        }
        let result = guarded(|| match req.command {
            Command::Write => export.write(req.offset, &buffer[..req.length as usize], req.flags.fua()),
            Command::Flush => export.flush(),
            Command::Trim => {
                export.trim(req.offset, u64::from(req.length))?;
                if req.flags.fua() {
                    export.flush()?;
                }
                Ok(())
            }
            Command::WriteZeroes if req.flags.fast_zero() && !export.zeroes_fast() => {
                Err(ExportError::NotSupported)
            }
            Command::WriteZeroes => export.write_zeroes(
                req.offset,
                u64::from(req.length),
                req.flags.fua(),
                req.flags.no_hole(),
            ),
            Command::Cache => export.cache(req.offset, u64::from(req.length)),
            Command::Read | Command::Disc | Command::BlockStatus => Ok(()),
        });
        match result {
            Ok(()) => {
                self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
                self.send(&encode_simple_reply(req.handle, 0), &[cost]);
            }
            Err(e) => self.reply_error(req.handle, cost, e.nbd_errno(), &e.to_string()),
        }
    }

    /// Answers BLOCK_STATUS with one `base:allocation` chunk: the export's
    /// extents, kept within the request (one with REQ_ONE).
    fn block_status(&self, export: &dyn Export, req: &Request, cost: usize) {
        let mut extents = Vec::new();
        let result = guarded(|| {
            extents = export.block_status(req.offset, req.length)?;
            Ok(())
        });
        if let Err(e) = result {
            self.reply_error(req.handle, cost, e.nbd_errno(), &e.to_string());
            return;
        }
        let mut left = req.length;
        let mut kept = Vec::with_capacity(extents.len());
        for e in extents {
            if left == 0 || (req.flags.req_one() && !kept.is_empty()) {
                break;
            }
            if e.length == 0 {
                continue;
            }
            let length = e.length.min(left);
            left -= length;
            kept.push(Extent {
                length,
                flags: e.flags,
            });
        }
        if kept.is_empty() {
            self.reply_error(req.handle, cost, NBD_EIO, "the export described no extent");
            return;
        }
        self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        self.send(
            &encode_block_status_reply(req.handle, BASE_ALLOCATION_ID, &kept),
            &[cost],
        );
    }

    pub(super) fn read(&self, export: &dyn Export, req: &Request, cost: usize, buf: &mut Vec<u8>) {
        if req.length as usize >= IN_PLACE_MIN_BYTES {
            self.read_in_place(export, req, cost, buf, true);
            return;
        }
        match self.read_reply(export, req, buf, 0) {
            Ok(end) => self.send(&buf[..end], &[cost]),
            Err((errno, msg)) => self.reply_error(req.handle, cost, errno, &msg),
        }
    }

    /// Writes the whole reply to the READ `req` (header and data in one
    /// buffer: one write, no copy) into `out` from `start` on, growing it
    /// as needed (without zeroing what it held: the read fills it all), and
    /// returns where the reply ends; the error to answer with when the
    /// read failed.
    pub(super) fn read_reply(
        &self,
        export: &dyn Export,
        req: &Request,
        out: &mut Vec<u8>,
        start: usize,
    ) -> Result<usize, (u32, String)> {
        let len = req.length as usize;
        let header = self.read_reply_header(req);
        let reply = &mut sized(out, start + header.len() + len)[start..];
        let result = guarded(|| export.read(req.offset, &mut reply[header.len()..]));
        if let Err(e) = result {
            return Err((e.nbd_errno(), e.to_string()));
        }
        self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        if self.neg.structured && len == 0 {
            // A zero-length read has no content chunk.
            let chunk = encode_chunk_none(req.handle);
            sized(out, start + chunk.len())[start..].copy_from_slice(&chunk);
            return Ok(start + chunk.len());
        }
        reply[..header.len()].copy_from_slice(&header);
        Ok(start + header.len() + len)
    }

    /// What goes before a successful read's data: a simple reply, or the
    /// header of a structured reply's one data chunk.
    fn read_reply_header(&self, req: &Request) -> ReadHeader {
        let mut bytes = [0; STRUCTURED_HEADER_LEN + 8];
        if !self.neg.structured {
            bytes[..SIMPLE_REPLY_LEN].copy_from_slice(&encode_simple_reply(req.handle, 0));
            return ReadHeader {
                bytes,
                len: SIMPLE_REPLY_LEN,
            };
        }
        // Cannot fail for 0 < len <= MAX_MAX_PAYLOAD (a zero-length read
        // has no data chunk: its header is not used).
        if let Some(h) = encode_chunk_offset_data_header(req.handle, req.offset, req.length, true) {
            bytes = h;
        }
        ReadHeader {
            bytes,
            len: bytes.len(),
        }
    }

    /// Serves a read of at least [`IN_PLACE_MIN_BYTES`] and sends its
    /// reply: straight from where the export's bytes lie when it can hand
    /// them over in place and the socket takes them now, else from a copy,
    /// waiting for the client if `may_wait` (see [`Conn::send`]).
    pub(super) fn read_in_place(
        &self,
        export: &dyn Export,
        req: &Request,
        cost: usize,
        buf: &mut Vec<u8>,
        may_wait: bool,
    ) {
        let send = |bytes: &[u8]| match may_wait {
            true => self.send(bytes, &[cost]),
            false => self.send_without_waiting(bytes, &[cost]),
        };
        // The thread holding the reader role does not wait for the
        // writer's lock: while another reply is being written, this one is
        // copied into the queue (as `send_without_waiting` does).
        let patience = if may_wait {
            IN_PLACE_WRITER_PATIENCE
        } else {
            Duration::ZERO
        };
        let header = self.read_reply_header(req);
        let len = req.length as usize;
        let reply = sized(buf, header.len() + len);
        let (head, data) = reply.split_at_mut(header.len());
        let (mut called, mut sent) = (false, false);
        // A reply begun from the cache's bytes that the socket did not take
        // whole, on a thread that may wait for the client: its bytes are
        // copied into `reply` (declined) and the rest written from there,
        // the writer's lock held throughout.
        let mut pending = None;
        let result = guarded(|| {
            export
                .read_in_place(req.offset, data, &mut |parts| {
                    let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
                    all.push(&header);
                    all.extend_from_slice(parts);
                    // Counted before the client can see the reply.
                    called = true;
                    self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
                    if self.broken.load(Ordering::Relaxed) {
                        self.done(cost);
                        sent = true;
                        return true;
                    }
                    let total = header.len() + len;
                    match self.begin_parts_now(&all, patience) {
                        Some(mut begun) => {
                            if begun.written < total && may_wait && self.may_finish_waiting(&mut begun) {
                                pending = Some(begun);
                            } else {
                                let rest = rest_of(&all, begun.written);
                                self.finish_begun(begun, &rest, &[cost]);
                                sent = true;
                            }
                        }
                        // The reader does not wait: the reply is queued.
                        None if !may_wait && self.replies.has_writer.load(Ordering::Relaxed) => {
                            self.enqueue(&all.concat(), &[cost], false);
                            sent = true;
                        }
                        None => {}
                    }
                    sent
                })
                .map(|_| ())
        });
        match (result, pending) {
            (Ok(()), Some(begun)) => {
                head.copy_from_slice(&header);
                let rest = &reply[begun.written..];
                self.finish_begun(begun, rest, &[cost]);
            }
            (Ok(()), None) if !sent => {
                if !called {
                    self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
                }
                head.copy_from_slice(&header);
                send(reply);
            }
            (Ok(()), None) => {}
            // Part of the reply went out from bytes that then proved
            // unsound (a fault in the cache's memory): the client may hold
            // zeroes it takes for data, and nothing can take them back.
            (Err(_), Some(begun)) => {
                self.break_connection();
                self.finish_begun(begun, &[], &[cost]);
            }
            (Err(_), None) if sent => self.break_connection(),
            (Err(e), None) => {
                let error = self.error_reply(req.handle, e.nbd_errno(), &e.to_string());
                send(&error);
            }
        }
    }

    /// Answers a request with an error: a structured error chunk when
    /// structured replies are on (required for reads), a simple reply
    /// otherwise.
    pub(super) fn reply_error(&self, handle: u64, cost: usize, errno: u32, message: &str) {
        self.send(&self.error_reply(handle, errno, message), &[cost]);
    }

    /// The bytes of an error reply (counted as answered, and as an error).
    pub(super) fn error_reply(&self, handle: u64, errno: u32, message: &str) -> Vec<u8> {
        self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        self.shared.stats.errors.fetch_add(1, Ordering::Relaxed);
        if self.neg.structured {
            encode_chunk_error(handle, errno, message, true)
        } else {
            encode_simple_reply(handle, errno).to_vec()
        }
    }
}

/// Runs an export call, turning a panic into EIO so one bad request cannot
/// take a worker (and with it the connection's progress) down.
pub(super) fn guarded<F: FnOnce() -> Result<(), ExportError>>(f: F) -> Result<(), ExportError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => Err(ExportError::Io(io::Error::other("export panicked"))),
    }
}
