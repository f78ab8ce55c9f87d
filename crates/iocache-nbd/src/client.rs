//! A minimal blocking NBD client and NBD URI parsing.
//!
//! The tests drive the server with it, and the cache will use it as a
//! remote backend (`nbd://host:port/name`, `nbd+unix:///name?socket=PATH`).
//! It speaks fixed newstyle, negotiates structured replies when asked,
//! enters transmission with NBD_OPT_GO (falling back to
//! NBD_OPT_EXPORT_NAME for servers without it), and sends one request at a
//! time, splitting reads and writes at the server's maximum block size.
//! Every length a server sends is checked before anything is allocated.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use crate::proto::*;
use crate::server::Stream;

/// The IANA port of NBD.
pub const NBD_DEFAULT_PORT: u16 = 10809;

/// Largest option reply or error chunk payload the client accepts.
const MAX_REPLY_DATA: u32 = 64 * 1024;

/// Why a URI is not an NBD URI this client can use.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UriError {
    #[error("not an NBD URI (expected nbd:// or nbd+unix://): {0}")]
    Scheme(String),
    #[error("TLS is not supported ({0})")]
    Tls(String),
    #[error("bad authority {0:?}")]
    Authority(String),
    #[error("bad port {0:?}")]
    Port(String),
    #[error("nbd+unix URI without a socket= parameter")]
    MissingSocket,
    #[error("unknown query parameter {0:?}")]
    UnknownParameter(String),
    #[error("bad percent-encoding in {0:?}")]
    Encoding(String),
}

/// Where an NBD server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddr {
    /// Host name or IP address (IPv6 without brackets) and port.
    Tcp { host: String, port: u16 },
    /// Path of a Unix domain socket.
    Unix { socket: PathBuf },
}

/// A parsed NBD URI: the server address and the export name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub addr: NbdAddr,
    pub export_name: String,
}

fn percent_decode(s: &str) -> Result<Vec<u8>, UriError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| UriError::Encoding(s.to_string()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn percent_decode_str(s: &str) -> Result<String, UriError> {
    String::from_utf8(percent_decode(s)?).map_err(|_| UriError::Encoding(s.to_string()))
}

/// Parses an NBD URI as described by the NBD project's `doc/uri.md`:
/// `nbd://host[:port][/export]` (port 10809 by default; IPv6 hosts in
/// brackets) and `nbd+unix:///[export]?socket=PATH`. The export name is the
/// percent-decoded path without its leading `/`. `nbds` schemes and
/// `tls-*` parameters are refused (no TLS); unknown parameters are errors
/// unless they start with `x-`.
pub fn parse_nbd_uri(uri: &str) -> Result<NbdUri, UriError> {
    let (scheme, rest) = uri
        .split_once("://")
        .ok_or_else(|| UriError::Scheme(uri.to_string()))?;
    let scheme = scheme.to_ascii_lowercase();
    let unix = match scheme.as_str() {
        "nbd" => false,
        "nbd+unix" => true,
        "nbds" | "nbds+unix" => return Err(UriError::Tls(scheme)),
        _ => return Err(UriError::Scheme(uri.to_string())),
    };
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => (&before_query[..i], &before_query[i + 1..]),
        None => (before_query, ""),
    };
    let export_name = percent_decode_str(path)?;

    let mut socket = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode_str(k)?;
        if k == "socket" && unix {
            socket = Some(PathBuf::from(OsString::from_vec(percent_decode(v)?)));
        } else if k.starts_with("tls-") {
            return Err(UriError::Tls(k));
        } else if !k.starts_with("x-") {
            return Err(UriError::UnknownParameter(k));
        }
    }

    if unix {
        if !authority.is_empty() {
            return Err(UriError::Authority(authority.to_string()));
        }
        let socket = socket.ok_or(UriError::MissingSocket)?;
        return Ok(NbdUri {
            addr: NbdAddr::Unix { socket },
            export_name,
        });
    }

    // userinfo is only meaningful for TLS authentication: ignore it.
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(after) = hostport.strip_prefix('[') {
        let (h, tail) = after
            .split_once(']')
            .ok_or_else(|| UriError::Authority(authority.to_string()))?;
        let port = match tail {
            "" => None,
            t => Some(
                t.strip_prefix(':')
                    .ok_or_else(|| UriError::Authority(authority.to_string()))?,
            ),
        };
        (h.to_string(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    let host = percent_decode_str(&host)?;
    if host.is_empty() {
        return Err(UriError::Authority(authority.to_string()));
    }
    let port = match port {
        None | Some("") => NBD_DEFAULT_PORT,
        Some(p) => p.parse().map_err(|_| UriError::Port(p.to_string()))?,
    };
    Ok(NbdUri {
        addr: NbdAddr::Tcp { host, port },
        export_name,
    })
}

/// Why a client operation failed.
#[derive(Debug, Error)]
pub enum ClientError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol error: {0}")]
    Proto(#[from] ProtoError),
    #[error(transparent)]
    Uri(#[from] UriError),
    #[error("server does not speak fixed newstyle negotiation")]
    NotFixedNewstyle,
    #[error("server has no export {0:?}")]
    UnknownExport(String),
    #[error("server rejected {}: {} {message}", option_name(*option), reply_type_name(*reply))]
    OptionRejected {
        option: u32,
        reply: u32,
        message: String,
    },
    #[error("server error {} ({errno}){}", errno_name(*errno), if message.is_empty() { String::new() } else { format!(": {message}") })]
    Server { errno: u32, message: String },
    #[error("server violated the protocol: {0}")]
    Unexpected(String),
    #[error("server does not support {0}")]
    Unsupported(&'static str),
    #[error("request out of range")]
    OutOfRange,
    #[error("connection is unusable after an earlier error")]
    Broken,
}

impl ClientError {
    /// The NBD error number if the server answered a request with an error.
    pub fn errno(&self) -> Option<u32> {
        match self {
            ClientError::Server { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// What to ask for when connecting.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Export name (empty: the server's default export).
    pub export_name: String,
    /// Ask for structured replies.
    pub structured_replies: bool,
    /// Select the `base:allocation` metadata context (with structured
    /// replies), for [`Client::block_status`].
    pub allocation: bool,
    /// Read and write timeout on the socket.
    pub timeout: Option<Duration>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            export_name: String::new(),
            structured_replies: true,
            allocation: false,
            timeout: Some(Duration::from_secs(60)),
        }
    }
}

impl ConnectOptions {
    /// Default options for the export `name`.
    pub fn export(name: impl Into<String>) -> ConnectOptions {
        ConnectOptions {
            export_name: name.into(),
            ..ConnectOptions::default()
        }
    }
}

/// A connection to one export in the transmission phase.
#[derive(Debug)]
pub struct Client {
    stream: Stream,
    size: u64,
    flags: u16,
    structured: bool,
    /// The id the server gave `base:allocation`, when selected.
    allocation_context: Option<u32>,
    block_sizes: Option<(u32, u32, u32)>,
    description: Option<String>,
    next_handle: u64,
    broken: bool,
}

fn read_array<const N: usize, R: Read>(r: &mut R) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// A reply header of `N` bytes whose `magic` (its first 4) was read
/// already: the magic and the rest, read from `r`.
fn after_magic<const N: usize, R: Read>(r: &mut R, magic: u32) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    b[..4].copy_from_slice(&magic.to_be_bytes());
    r.read_exact(&mut b[4..])?;
    Ok(b)
}

/// A `what` (reply or chunk) for `got` where the one for `handle` was
/// expected is an error.
fn expect_handle(what: &str, got: u64, handle: u64) -> Result<(), ClientError> {
    if got != handle {
        return Err(ClientError::Unexpected(format!(
            "{what} for handle {got:#x}, expected {handle:#x}"
        )));
    }
    Ok(())
}

fn read_vec<R: Read>(r: &mut R, len: u32, limit: u32) -> Result<Vec<u8>, ClientError> {
    if len > limit {
        return Err(ClientError::Unexpected(format!(
            "payload of {len} bytes exceeds {limit}"
        )));
    }
    let mut v = vec![0u8; len as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

impl Client {
    /// Connects to the export named by an NBD URI.
    pub fn connect(uri: &str) -> Result<Client, ClientError> {
        let uri = parse_nbd_uri(uri)?;
        let opts = ConnectOptions::export(uri.export_name.clone());
        Client::connect_addr(&uri.addr, &opts)
    }

    /// Connects to `addr` with `opts`.
    pub fn connect_addr(addr: &NbdAddr, opts: &ConnectOptions) -> Result<Client, ClientError> {
        match addr {
            NbdAddr::Tcp { host, port } => Client::connect_tcp((host.as_str(), *port), opts),
            NbdAddr::Unix { socket } => Client::connect_unix(socket, opts),
        }
    }

    /// Connects over TCP.
    pub fn connect_tcp<A: ToSocketAddrs>(addr: A, opts: &ConnectOptions) -> Result<Client, ClientError> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Client::handshake(Stream::Tcp(s), opts)
    }

    /// Connects over a Unix socket.
    pub fn connect_unix(path: &Path, opts: &ConnectOptions) -> Result<Client, ClientError> {
        Client::handshake(Stream::Unix(UnixStream::connect(path)?), opts)
    }

    fn handshake(mut s: Stream, opts: &ConnectOptions) -> Result<Client, ClientError> {
        s.set_read_timeout(opts.timeout)?;
        s.set_write_timeout(opts.timeout)?;
        let hflags = parse_greeting(&read_array::<GREETING_LEN, _>(&mut s)?)?;
        if hflags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
            return Err(ClientError::NotFixedNewstyle);
        }
        let no_zeroes = hflags & NBD_FLAG_NO_ZEROES != 0;
        let mut cflags = NBD_FLAG_C_FIXED_NEWSTYLE;
        if no_zeroes {
            cflags |= NBD_FLAG_C_NO_ZEROES;
        }
        s.write_all(&cflags.to_be_bytes())?;

        let mut structured = false;
        if opts.structured_replies {
            s.write_all(&encode_option(NBD_OPT_STRUCTURED_REPLY, &[]))?;
            let (h, _) = read_option_reply(&mut s, NBD_OPT_STRUCTURED_REPLY)?;
            structured = h.reply_type == NBD_REP_ACK;
        }
        let mut allocation_context = None;
        if opts.allocation && structured {
            let set = MetaContextRequest {
                export: opts.export_name.clone(),
                queries: vec![BASE_ALLOCATION.to_string()],
            };
            s.write_all(&encode_option(NBD_OPT_SET_META_CONTEXT, &set.encode()))?;
            loop {
                let (h, data) = read_option_reply(&mut s, NBD_OPT_SET_META_CONTEXT)?;
                match h.reply_type {
                    NBD_REP_META_CONTEXT if data.len() > 4 && &data[4..] == BASE_ALLOCATION.as_bytes() => {
                        allocation_context = Some(u32::from_be_bytes([data[0], data[1], data[2], data[3]]));
                    }
                    NBD_REP_META_CONTEXT => {}
                    // ACK, or an error: a server without the context.
                    _ => break,
                }
            }
        }

        let go = InfoRequest {
            name: opts.export_name.clone(),
            requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_DESCRIPTION],
        };
        s.write_all(&encode_option(NBD_OPT_GO, &go.encode()))?;
        let mut export = None;
        let mut block_sizes = None;
        let mut description = None;
        loop {
            let (h, data) = read_option_reply(&mut s, NBD_OPT_GO)?;
            match h.reply_type {
                NBD_REP_INFO => match Info::parse(&data)? {
                    Info::Export { size, flags } => export = Some((size, flags)),
                    Info::BlockSize {
                        minimum,
                        preferred,
                        maximum,
                    } => block_sizes = Some((minimum, preferred, maximum)),
                    Info::Description(d) => description = Some(d),
                    _ => {}
                },
                NBD_REP_ACK => break,
                NBD_REP_ERR_UNSUP => {
                    // An old server: EXPORT_NAME cannot report errors, the
                    // server just hangs up if the export does not exist.
                    s.write_all(&encode_option(NBD_OPT_EXPORT_NAME, opts.export_name.as_bytes()))?;
                    let b = read_array::<10, _>(&mut s)?;
                    if !no_zeroes {
                        read_array::<EXPORT_NAME_ZEROES, _>(&mut s)?;
                    }
                    let size = u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
                    let flags = u16::from_be_bytes([b[8], b[9]]);
                    export = Some((size, flags));
                    // Structured replies were negotiated by option, still valid.
                    break;
                }
                NBD_REP_ERR_UNKNOWN => return Err(ClientError::UnknownExport(opts.export_name.clone())),
                other => {
                    return Err(ClientError::OptionRejected {
                        option: NBD_OPT_GO,
                        reply: other,
                        message: String::from_utf8_lossy(&data).into_owned(),
                    })
                }
            }
        }
        let (size, flags) =
            export.ok_or_else(|| ClientError::Unexpected("GO succeeded without NBD_INFO_EXPORT".into()))?;
        Ok(Client {
            stream: s,
            size,
            flags,
            structured,
            allocation_context,
            block_sizes,
            description,
            next_handle: 1,
            broken: false,
        })
    }

    /// Size of the export in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The transmission flags the server sent.
    pub fn transmission_flags(&self) -> u16 {
        self.flags
    }

    /// Whether structured replies are in use.
    pub fn structured(&self) -> bool {
        self.structured
    }

    /// Whether the server selected `base:allocation` (see
    /// [`ConnectOptions::allocation`]).
    pub fn has_allocation(&self) -> bool {
        self.allocation_context.is_some()
    }

    /// The `base:allocation` extents of `length` bytes at `offset`, as the
    /// server describes them (from `offset`, possibly fewer bytes than
    /// asked).
    pub fn block_status(&mut self, offset: u64, length: u32) -> Result<Vec<Extent>, ClientError> {
        if self.allocation_context.is_none() {
            return Err(ClientError::Unsupported("block status (base:allocation)"));
        }
        self.check_range(offset, u64::from(length))?;
        let handle = self.take_handle()?;
        let req = Request {
            handle,
            command: Command::BlockStatus,
            flags: CmdFlags(0),
            offset,
            length,
        };
        let mut extents = Vec::new();
        let r = (|| {
            self.stream.write_all(&req.encode())?;
            self.stream.flush()?;
            self.receive_into(handle, offset, None, Some(&mut extents))
        })();
        if let Err(e) = &r {
            if !matches!(e, ClientError::Server { .. }) {
                self.broken = true;
            }
        }
        r.map(|()| extents)
    }

    /// The server's (minimum, preferred, maximum) block sizes, if it sent them.
    pub fn block_sizes(&self) -> Option<(u32, u32, u32)> {
        self.block_sizes
    }

    /// The export's description, if the server sent one.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// Largest READ/WRITE this client sends in one request.
    fn max_request(&self) -> u32 {
        let max = self.block_sizes.map_or(DEFAULT_MAX_PAYLOAD, |b| b.2);
        max.clamp(1, DEFAULT_MAX_PAYLOAD)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ClientError::OutOfRange),
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ClientError> {
        self.check_range(offset, buf.len() as u64)?;
        let max = self.max_request() as usize;
        for (i, piece) in buf.chunks_mut(max).enumerate() {
            let at = offset + (i * max) as u64;
            self.request(Command::Read, 0, at, piece.len() as u32, None, Some(piece))?;
        }
        Ok(())
    }

    /// Writes `data` at `offset`, with FUA if asked.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), ClientError> {
        self.check_range(offset, data.len() as u64)?;
        if self.flags & NBD_FLAG_READ_ONLY != 0 {
            return Err(ClientError::Unsupported("writes (read-only export)"));
        }
        let flags = self.fua_flag(fua)?;
        let max = self.max_request() as usize;
        for (i, piece) in data.chunks(max).enumerate() {
            let at = offset + (i * max) as u64;
            self.request(Command::Write, flags, at, piece.len() as u32, Some(piece), None)?;
        }
        Ok(())
    }

    fn fua_flag(&self, fua: bool) -> Result<u16, ClientError> {
        if !fua {
            return Ok(0);
        }
        if self.flags & NBD_FLAG_SEND_FUA == 0 {
            return Err(ClientError::Unsupported("FUA"));
        }
        Ok(NBD_CMD_FLAG_FUA)
    }

    /// Persists every completed write.
    pub fn flush(&mut self) -> Result<(), ClientError> {
        if self.flags & NBD_FLAG_SEND_FLUSH == 0 {
            return Err(ClientError::Unsupported("flush"));
        }
        self.request(Command::Flush, 0, 0, 0, None, None)
    }

    /// Trims `length` bytes at `offset` (split into 2 GiB pieces).
    pub fn trim(&mut self, offset: u64, length: u64) -> Result<(), ClientError> {
        if self.flags & NBD_FLAG_SEND_TRIM == 0 {
            return Err(ClientError::Unsupported("trim"));
        }
        self.ranged_no_payload(Command::Trim, 0, offset, length)
    }

    /// Writes zeroes over `length` bytes at `offset`.
    pub fn write_zeroes(
        &mut self,
        offset: u64,
        length: u64,
        fua: bool,
        no_hole: bool,
    ) -> Result<(), ClientError> {
        if self.flags & NBD_FLAG_SEND_WRITE_ZEROES == 0 {
            return Err(ClientError::Unsupported("write zeroes"));
        }
        let mut flags = self.fua_flag(fua)?;
        if no_hole {
            flags |= NBD_CMD_FLAG_NO_HOLE;
        }
        self.ranged_no_payload(Command::WriteZeroes, flags, offset, length)
    }

    fn ranged_no_payload(
        &mut self,
        cmd: Command,
        flags: u16,
        offset: u64,
        length: u64,
    ) -> Result<(), ClientError> {
        self.check_range(offset, length)?;
        // Pieces stay multiples of any minimum block size (at most 64 KiB).
        let piece = self.max_request().max(1 << 16) as u64 & !0xffff;
        let mut done = 0;
        while done < length {
            let n = (length - done).min(piece);
            self.request(cmd, flags, offset + done, n as u32, None, None)?;
            done += n;
        }
        Ok(())
    }

    /// Sends NBD_CMD_DISC and closes the connection.
    pub fn disconnect(mut self) -> Result<(), ClientError> {
        let req = Request {
            handle: self.next_handle,
            command: Command::Disc,
            flags: CmdFlags(0),
            offset: 0,
            length: 0,
        };
        self.stream.write_all(&req.encode())?;
        self.stream.flush()?;
        let _ = self.stream.shutdown(Shutdown::Write);
        // Wait for the server to close, so its in-flight work is done.
        let mut sink = [0u8; 64];
        while matches!(self.stream.read(&mut sink), Ok(n) if n > 0) {}
        Ok(())
    }

    /// Sends a raw request (any command and flags, unchecked) and waits for
    /// its reply; for tests of a server's validation. `payload` is sent after
    /// the header; `read_into` receives read data.
    pub fn raw_request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
    ) -> Result<(), ClientError> {
        let handle = self.take_handle()?;
        let header = RequestHeader {
            flags,
            command,
            handle,
            offset,
            length,
        };
        self.send_and_receive(handle, header.encode(), Some(payload), offset, read_into)
    }

    fn take_handle(&mut self) -> Result<u64, ClientError> {
        if self.broken {
            return Err(ClientError::Broken);
        }
        let h = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1);
        Ok(h)
    }

    fn request(
        &mut self,
        cmd: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: Option<&[u8]>,
        read_into: Option<&mut [u8]>,
    ) -> Result<(), ClientError> {
        let handle = self.take_handle()?;
        let req = Request {
            handle,
            command: cmd,
            flags: CmdFlags(flags),
            offset,
            length,
        };
        self.send_and_receive(handle, req.encode(), payload, offset, read_into)
    }

    fn send_and_receive(
        &mut self,
        handle: u64,
        header: [u8; REQUEST_HEADER_LEN],
        payload: Option<&[u8]>,
        offset: u64,
        read_into: Option<&mut [u8]>,
    ) -> Result<(), ClientError> {
        let r = (|| {
            self.stream.write_all(&header)?;
            if let Some(p) = payload {
                self.stream.write_all(p)?;
            }
            self.stream.flush()?;
            self.receive_into(handle, offset, read_into, None)
        })();
        if let Err(e) = &r {
            // Server errors leave the stream in frame; anything else may not.
            if !matches!(e, ClientError::Server { .. }) {
                self.broken = true;
            }
        }
        r
    }

    /// Reads the reply to `handle`: a simple reply, or structured chunks up
    /// to the one flagged DONE (block status extents into `extents`).
    fn receive_into(
        &mut self,
        handle: u64,
        offset: u64,
        mut read_into: Option<&mut [u8]>,
        mut extents: Option<&mut Vec<Extent>>,
    ) -> Result<(), ClientError> {
        let want = read_into.as_ref().map_or(0, |b| b.len()) as u64;
        let mut covered = 0u64;
        let mut error: Option<ClientError> = None;
        loop {
            let magic = u32::from_be_bytes(read_array::<4, _>(&mut self.stream)?);
            if magic == NBD_SIMPLE_REPLY_MAGIC {
                let r = SimpleReply::parse(&after_magic(&mut self.stream, magic)?)?;
                expect_handle("reply", r.handle, handle)?;
                if r.errno != 0 {
                    return Err(ClientError::Server {
                        errno: r.errno,
                        message: String::new(),
                    });
                }
                if let Some(buf) = read_into.as_deref_mut() {
                    self.stream.read_exact(buf)?;
                }
                return Ok(());
            }
            if magic != NBD_STRUCTURED_REPLY_MAGIC || !self.structured {
                return Err(ProtoError::BadReplyMagic(magic).into());
            }
            let h = StructuredHeader::parse(&after_magic(&mut self.stream, magic)?)?;
            expect_handle("chunk", h.handle, handle)?;
            match h.chunk_type {
                NBD_REPLY_TYPE_NONE => {
                    if h.length != 0 || !h.done() {
                        return Err(ClientError::Unexpected("bad NONE chunk".into()));
                    }
                }
                NBD_REPLY_TYPE_OFFSET_DATA => {
                    let Some(buf) = read_into.as_deref_mut() else {
                        return Err(ClientError::Unexpected("data chunk for a non-read".into()));
                    };
                    if h.length < 9 {
                        return Err(ClientError::Unexpected("short data chunk".into()));
                    }
                    let at = u64::from_be_bytes(read_array::<8, _>(&mut self.stream)?);
                    let n = u64::from(h.length - 8);
                    let start = at
                        .checked_sub(offset)
                        .filter(|s| s + n <= want)
                        .ok_or_else(|| ClientError::Unexpected("data chunk outside the request".into()))?;
                    self.stream
                        .read_exact(&mut buf[start as usize..(start + n) as usize])?;
                    covered += n;
                }
                NBD_REPLY_TYPE_OFFSET_HOLE => {
                    let Some(buf) = read_into.as_deref_mut() else {
                        return Err(ClientError::Unexpected("hole chunk for a non-read".into()));
                    };
                    if h.length != 12 {
                        return Err(ClientError::Unexpected("bad hole chunk".into()));
                    }
                    let p = read_array::<12, _>(&mut self.stream)?;
                    let at = u64::from_be_bytes(p[..8].try_into().unwrap_or_default());
                    let n = u64::from(u32::from_be_bytes([p[8], p[9], p[10], p[11]]));
                    let start = at
                        .checked_sub(offset)
                        .filter(|s| s + n <= want)
                        .ok_or_else(|| ClientError::Unexpected("hole chunk outside the request".into()))?;
                    buf[start as usize..(start + n) as usize].fill(0);
                    covered += n;
                }
                NBD_REPLY_TYPE_BLOCK_STATUS => {
                    // Up to a million extents (8 MiB): a fragmented export
                    // answers a large range with many.
                    let payload = read_vec(&mut self.stream, h.length, 8 << 20)?;
                    let Some(out) = extents.as_deref_mut() else {
                        return Err(ClientError::Unexpected(
                            "block status chunk for another request".into(),
                        ));
                    };
                    if payload.len() < 12 || (payload.len() - 4) % 8 != 0 {
                        return Err(ClientError::Unexpected("bad block status chunk".into()));
                    }
                    let word = |at: usize| {
                        u32::from_be_bytes([payload[at], payload[at + 1], payload[at + 2], payload[at + 3]])
                    };
                    if Some(word(0)) == self.allocation_context {
                        out.extend((4..payload.len()).step_by(8).map(|at| Extent {
                            length: word(at),
                            flags: word(at + 4),
                        }));
                    }
                }
                t if t & NBD_REPLY_TYPE_FLAG_ERROR != 0 => {
                    let payload = read_vec(&mut self.stream, h.length, MAX_REPLY_DATA)?;
                    let e = parse_error_chunk(t, &payload)?;
                    error.get_or_insert(ClientError::Server {
                        errno: if e.errno == 0 { NBD_EINVAL } else { e.errno },
                        message: e.message,
                    });
                }
                t => {
                    return Err(ClientError::Unexpected(format!("unknown chunk type {t}")));
                }
            }
            if h.done() {
                break;
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        if covered != want {
            return Err(ClientError::Unexpected(format!(
                "read reply covered {covered} of {want} bytes"
            )));
        }
        Ok(())
    }
}

/// Reads one option reply for `option`, bounding its data.
fn read_option_reply<R: Read>(r: &mut R, option: u32) -> Result<(OptionReplyHeader, Vec<u8>), ClientError> {
    let h = OptionReplyHeader::parse(&read_array::<OPTION_REPLY_HEADER_LEN, _>(r)?)?;
    if h.option != option {
        return Err(ClientError::Unexpected(format!(
            "reply to {} while waiting for {}",
            option_name(h.option),
            option_name(option)
        )));
    }
    let data = read_vec(r, h.length, MAX_REPLY_DATA)?;
    Ok((h, data))
}

/// Lists the exports of the server at `addr` (NBD_OPT_LIST), as names and
/// descriptions, then aborts the negotiation.
pub fn list_exports(addr: &NbdAddr) -> Result<Vec<(String, String)>, ClientError> {
    let mut s = match addr {
        NbdAddr::Tcp { host, port } => Stream::Tcp(TcpStream::connect((host.as_str(), *port))?),
        NbdAddr::Unix { socket } => Stream::Unix(UnixStream::connect(socket)?),
    };
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let hflags = parse_greeting(&read_array::<GREETING_LEN, _>(&mut s)?)?;
    if hflags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        return Err(ClientError::NotFixedNewstyle);
    }
    s.write_all(&NBD_FLAG_C_FIXED_NEWSTYLE.to_be_bytes())?;
    s.write_all(&encode_option(NBD_OPT_LIST, &[]))?;
    let mut out = Vec::new();
    loop {
        let (h, data) = read_option_reply(&mut s, NBD_OPT_LIST)?;
        match h.reply_type {
            NBD_REP_SERVER => out.push(parse_rep_server(&data)?),
            NBD_REP_ACK => break,
            other => {
                return Err(ClientError::OptionRejected {
                    option: NBD_OPT_LIST,
                    reply: other,
                    message: String::from_utf8_lossy(&data).into_owned(),
                })
            }
        }
    }
    s.write_all(&encode_option(NBD_OPT_ABORT, &[]))?;
    let _ = read_option_reply(&mut s, NBD_OPT_ABORT);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, name: &str) -> NbdUri {
        NbdUri {
            addr: NbdAddr::Tcp {
                host: host.into(),
                port,
            },
            export_name: name.into(),
        }
    }

    #[test]
    fn tcp_uris() {
        let cases = [
            ("nbd://example.com/disk", "example.com", 10809, "disk"),
            ("nbd://example.com", "example.com", 10809, ""),
            ("nbd://example.com/", "example.com", 10809, ""),
            ("nbd://example.com//disk", "example.com", 10809, "/disk"),
            (
                "nbd://example.com/hello%20world",
                "example.com",
                10809,
                "hello world",
            ),
            ("nbd://127.0.0.1:1234/x", "127.0.0.1", 1234, "x"),
            ("nbd://[::1]:99/", "::1", 99, ""),
            ("nbd://[::1]", "::1", 10809, ""),
            ("NBD://user@h:5/e#frag", "h", 5, "e"),
            ("nbd://h/e?x-foo=1", "h", 10809, "e"),
        ];
        for (uri, host, port, name) in cases {
            assert_eq!(parse_nbd_uri(uri).unwrap(), tcp(host, port, name), "{uri}");
        }
    }

    #[test]
    fn unix_uris() {
        let u = parse_nbd_uri("nbd+unix:///disk?socket=/tmp/s.sock").unwrap();
        assert_eq!(
            u,
            NbdUri {
                addr: NbdAddr::Unix {
                    socket: "/tmp/s.sock".into()
                },
                export_name: "disk".into()
            }
        );
        let u = parse_nbd_uri("nbd+unix:///?socket=/tmp/a%20b").unwrap();
        assert_eq!(u.export_name, "");
        assert_eq!(
            u.addr,
            NbdAddr::Unix {
                socket: "/tmp/a b".into()
            }
        );
        let u = parse_nbd_uri("nbd+unix://?socket=rel.sock").unwrap();
        assert_eq!(
            u.addr,
            NbdAddr::Unix {
                socket: "rel.sock".into()
            }
        );
    }

    #[test]
    fn bad_uris() {
        let any = String::new;
        let cases = [
            ("http://x/", UriError::Scheme(any())),
            ("nbd:x", UriError::Scheme(any())),
            ("nbds://x/", UriError::Tls(any())),
            ("nbds+unix:///?socket=s", UriError::Tls(any())),
            ("nbd://x/?tls-type=anon", UriError::Tls(any())),
            ("nbd+unix:///e", UriError::MissingSocket),
            ("nbd+unix://host/e?socket=s", UriError::Authority(any())),
            ("nbd://h:http/", UriError::Port(any())),
            ("nbd://h:99999/", UriError::Port(any())),
            ("nbd:///e", UriError::Authority(any())),
            ("nbd://[::1/", UriError::Authority(any())),
            ("nbd://h/%zz", UriError::Encoding(any())),
            ("nbd://h/%ff", UriError::Encoding(any())),
            ("nbd://h/?foo=1", UriError::UnknownParameter(any())),
            ("nbd://h/?socket=s", UriError::UnknownParameter(any())),
        ];
        for (uri, kind) in cases {
            // Only the kind of error is asserted, not the text it carries.
            match parse_nbd_uri(uri) {
                Err(e) => assert_eq!(
                    std::mem::discriminant(&e),
                    std::mem::discriminant(&kind),
                    "{uri}: {e:?}, not {kind:?}"
                ),
                Ok(u) => panic!("{uri}: parsed as {u:?}, not {kind:?}"),
            }
        }
    }

    #[test]
    fn error_messages_name_the_errno() {
        let e = ClientError::Server {
            errno: NBD_ENOSPC,
            message: "full".into(),
        };
        assert_eq!(e.to_string(), "server error ENOSPC (28): full");
        assert_eq!(e.errno(), Some(NBD_ENOSPC));
        let e = ClientError::OptionRejected {
            option: NBD_OPT_GO,
            reply: NBD_REP_ERR_POLICY,
            message: String::new(),
        };
        assert!(e.to_string().contains("NBD_OPT_GO"));
    }
}
