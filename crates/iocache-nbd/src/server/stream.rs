//! The byte streams a connection runs over (TCP, Unix, TLS) behind one
//! trait, the listeners that accept them, and reads and writes bounded by
//! a deadline.

use super::*;

#[derive(Debug)]
pub(super) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    pub(super) fn try_clone(&self) -> io::Result<Listener> {
        Ok(match self {
            Listener::Tcp(l) => Listener::Tcp(l.try_clone()?),
            Listener::Unix(l) => Listener::Unix(l.try_clone()?),
        })
    }

    /// Shuts the listening socket down, so accept calls on it fail.
    pub(super) fn shutdown_listening(&self) {
        let fd = match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        };
        // SAFETY: shutdown on a socket descriptor this handle owns.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    }

    pub(super) fn family(&self) -> Family {
        match self {
            Listener::Tcp(_) => Family::Tcp,
            Listener::Unix(_) => Family::Unix,
        }
    }

    /// The next connection and the peer it comes from.
    pub(super) fn accept(&self) -> io::Result<(Stream, Peer)> {
        match self {
            Listener::Tcp(l) => {
                let (s, addr) = l.accept()?;
                // NBD replies are latency-bound; the spec asks for no Nagle.
                let _ = s.set_nodelay(true);
                Ok((Stream::Tcp(s), Peer::of_ip(addr.ip())))
            }
            Listener::Unix(l) => {
                let s = l.accept()?.0;
                let peer = Peer::of_unix(&s);
                Ok((Stream::Unix(s), peer))
            }
        }
    }
}

/// A connected byte stream the server can serve one client over: a TCP or
/// Unix socket, or an in-memory stream in tests and fuzz targets (see
/// [`Server::serve_stream`]).
///
/// The connection's reader owns the stream; its workers write replies
/// through a second handle from [`ConnectionStream::try_clone`].
pub trait ConnectionStream: Read + Write + Send + Sized {
    /// A second handle to the same stream (reads and writes of either go
    /// to the same connection).
    fn try_clone(&self) -> io::Result<Self>;

    /// Shuts down the read side, the write side or both: later reads see
    /// end of file, later writes fail. The server uses it to stop reading
    /// requests and to close the connection.
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;

    /// Bounds each read (the handshake's); `None` waits forever. Streams
    /// that cannot block may ignore it (the default).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        let _ = timeout;
        Ok(())
    }

    /// Bounds each write (a reply's); `None` waits forever. Streams that
    /// cannot block may ignore it (the default).
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        let _ = timeout;
        Ok(())
    }

    /// Reads into `bufs`, in order, only what has already arrived: fails
    /// with `WouldBlock` rather than wait. Streams that cannot block read
    /// as usual (the default).
    fn read_vectored_now(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.read_vectored(bufs)
    }

    /// Writes what the stream takes of `buf` without waiting: fails with
    /// `WouldBlock` rather than wait. Streams that cannot block write as
    /// usual (the default).
    fn write_now(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write(buf)
    }

    /// [`ConnectionStream::write_now`] of `bufs` one after the other, in
    /// one call where the stream can (the default writes the first that is
    /// not empty).
    fn write_vectored_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(b) => self.write_now(b),
            None => Ok(0),
        }
    }

    /// Waits at most `timeout` until a write would take something; false
    /// if it would not by then. Streams that cannot block say false (the
    /// default).
    fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
        let _ = timeout;
        Ok(false)
    }

    /// Runs the server side of a TLS handshake on the stream (after
    /// NBD_OPT_STARTTLS was acknowledged) within `timeout`, and returns the
    /// plaintext end of the session (see `tls.rs`). Streams without a
    /// socket cannot (the default).
    fn start_tls(self, tls: &TlsServer, timeout: Option<Duration>) -> io::Result<UnixStream> {
        let _ = (tls, timeout);
        Err(io::Error::new(io::ErrorKind::Unsupported, "TLS needs a socket"))
    }

    /// Who is at the other end, for the log ("a client" by default).
    fn peer_name(&self) -> String {
        "a client".into()
    }
}

impl ConnectionStream for Stream {
    fn try_clone(&self) -> io::Result<Self> {
        Stream::try_clone(self)
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        Stream::shutdown(self, how)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        Stream::set_read_timeout(self, timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        Stream::set_write_timeout(self, timeout)
    }
    fn read_vectored_now(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_vectored_now(bufs),
            Stream::Unix(s) => s.read_vectored_now(bufs),
        }
    }
    fn write_now(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_now(buf),
            Stream::Unix(s) => s.write_now(buf),
        }
    }
    fn write_vectored_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored_now(bufs),
            Stream::Unix(s) => s.write_vectored_now(bufs),
        }
    }
    fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
        match self {
            Stream::Tcp(s) => s.wait_writable(timeout),
            Stream::Unix(s) => s.wait_writable(timeout),
        }
    }
    fn start_tls(self, tls: &TlsServer, timeout: Option<Duration>) -> io::Result<UnixStream> {
        match self {
            Stream::Tcp(s) => crate::tls::upgrade(s, tls, timeout),
            Stream::Unix(s) => crate::tls::upgrade(s, tls, timeout),
        }
    }
    fn peer_name(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_name(),
            Stream::Unix(s) => s.peer_name(),
        }
    }
}

/// `recvmsg(MSG_DONTWAIT)` into `bufs`: what has arrived, or `WouldBlock`.
pub(super) fn recv_now(fd: RawFd, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data);
    // `IoSliceMut` is ABI-compatible with `iovec` on Unix, and `bufs`
    // outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = bufs.as_mut_ptr().cast();
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: `msg` points at `bufs.len()` valid, writable iovecs.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `send(MSG_DONTWAIT)` of `buf`: what the socket took, or `WouldBlock`.
pub(super) fn send_now(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes for the whole call.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `sendmsg(MSG_DONTWAIT)` of `bufs` (at most `IOV_MAX` of them at once):
/// what the socket took, or `WouldBlock`.
pub(super) fn send_vectored_now(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    const IOV_MAX: usize = 1024;
    let bufs = &bufs[..bufs.len().min(IOV_MAX)];
    // SAFETY: a zeroed msghdr is valid (no name, no control data);
    // `IoSlice` is ABI-compatible with `iovec` on Unix, and `bufs` outlives
    // the call (the kernel only reads them).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = bufs.as_ptr().cast_mut().cast();
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: `msg` points at `bufs.len()` valid iovecs.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `poll(POLLOUT)` on `fd` for at most `timeout`: whether a write would
/// take something now (an error or hang-up counts, for the write to say).
pub(super) fn poll_writable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd for the whole call.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    match n {
        n if n < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(true)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// A connected socket of either family.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// Whether an I/O error is a timeout (`SO_RCVTIMEO` / `SO_SNDTIMEO` make a
/// blocked call fail with `EAGAIN`).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

pub(crate) fn deadline_passed() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "deadline passed")
}

/// What is left until `deadline`, or an error if it has passed.
pub(super) fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(deadline_passed())
    } else {
        Ok(left)
    }
}

/// The handshake's view of a stream: every read and write is bounded by
/// what is left of one deadline for the whole handshake, so a client
/// trickling a byte at a time cannot stretch it.
pub(super) struct Deadlined<'a, S: ConnectionStream> {
    pub(super) stream: &'a mut S,
    pub(super) deadline: Option<Instant>,
}

impl<S: ConnectionStream> Read for Deadlined<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            self.stream.set_read_timeout(Some(time_left(d)?))?;
        }
        self.stream.read(buf)
    }
}

impl<S: ConnectionStream> Write for Deadlined<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            self.stream.set_write_timeout(Some(time_left(d)?))?;
        }
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// Writes all of `bytes` within `timeout` in total. The stream's write
/// timeout is `min(timeout, stall)` (set once after the handshake), so a
/// write call blocks at most that long without progress; the deadline is
/// checked after each call, and a call that made no progress fails the
/// reply at once when `pressure` says other connections are waiting for the
/// shared budget.
pub(super) fn write_all_within<S: ConnectionStream>(
    w: &mut S,
    mut bytes: &[u8],
    timeout: Option<Duration>,
    pressure: impl Fn() -> bool,
) -> io::Result<()> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        match w.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => {
                if pressure() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
        if bytes.is_empty() {
            return w.flush();
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(deadline_passed());
        }
    }
}
