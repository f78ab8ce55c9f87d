//! Bodies of the fuzz targets in `fuzz/` and of the property tests in
//! `tests/fuzz_session.rs`: whole NBD sessions over an in-memory stream,
//! checked by an independent client-side model.
//!
//! The same functions run under libFuzzer (`scripts/fuzz.sh`) and under
//! proptest in CI, so an input libFuzzer finds can be replayed as a fixed
//! case of the tests (`tests/fuzz_session.rs`).
//!
//! - [`session`]: the input is everything a client sends, from the first
//!   byte of the handshake on. The server ([`Server::serve_stream`]) serves
//!   it against three small [`MemExport`]s ([`EXPORTS`]); then the server's
//!   output is replayed against a model of the protocol that walks the
//!   client's input: every option reply, the export reply, and every
//!   transmission reply must be well formed, carry the right handle, error
//!   number and data, and nothing may follow where the server must have
//!   hung up.
//! - [`transmission`]: the first input byte picks a valid handshake
//!   ([`handshake_prefix`]: reply style, export, GO or EXPORT_NAME); the
//!   rest is the request stream. This reaches the request parser and the
//!   transmission phase without the fuzzer having to find the handshake.
//! - [`request_headers`]: [`RequestHeader::parse`] alone on every 28-byte
//!   chunk, compared with the model's classification.
//!
//! A violation is returned as a [`Violation`] (the fuzz targets panic with
//! it); a panic or a hang of the server is a failure by itself.
//!
//! The model knows only what a client can know from the protocol and from
//! the exports' configuration: it has its own request classification and
//! its own copy of each export's contents. Sessions use one worker per
//! connection, so the replies of the requests that reach the export come in
//! request order; the replies to requests rejected by the parser are sent
//! by the reading thread and may come before them. The model accepts any
//! interleaving of the two ordered sequences.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use thiserror::Error;

use crate::export::MemExport;
use crate::handshake::NegotiationLimits;
use crate::proto::*;
use crate::server::{ConnectionStream, Server, ServerConfig, ServerStats, MIN_MAX_PAYLOAD};

/// The READ/WRITE payload limit of fuzzed sessions (the smallest the server
/// accepts, so large requests are cheap to reach).
pub const MAX_PAYLOAD: u32 = MIN_MAX_PAYLOAD;
/// The largest READ/WRITE of fuzzed sessions: those above an export's
/// maximum block size are served in pieces.
pub const MAX_REQUEST: u32 = 4 * MAX_PAYLOAD;
/// Largest option data read into memory in fuzzed sessions.
pub const MAX_OPTION_LEN: u32 = 256;
/// Options per fuzzed session before the server hangs up.
pub const MAX_OPTIONS: u32 = 24;

/// One export every fuzzed session offers.
#[derive(Debug, Clone, Copy)]
pub struct ExportSpec {
    pub name: &'static str,
    pub size: usize,
    pub read_only: bool,
    /// What the export declares.
    pub block_sizes: (u32, u32, u32),
    /// What the server must advertise and enforce under [`MAX_PAYLOAD`].
    pub effective: (u32, u32, u32),
    pub description: Option<&'static str>,
}

/// The exports of a fuzzed session; the first is the default.
pub const EXPORTS: [ExportSpec; 3] = [
    ExportSpec {
        name: "disk",
        size: 128 * 1024,
        read_only: false,
        block_sizes: (512, 4096, 32 << 20),
        effective: (512, 4096, MAX_PAYLOAD),
        description: Some("fuzz disk"),
    },
    ExportSpec {
        name: "ro",
        size: 64 * 1024,
        read_only: true,
        block_sizes: (4096, 4096, 16384),
        effective: (4096, 4096, 16384),
        description: None,
    },
    ExportSpec {
        name: "tiny",
        size: 3000,
        read_only: false,
        block_sizes: (1, 512, 1000),
        effective: (1, 512, 1000),
        description: None,
    },
];

/// The initial contents of an export: a pattern, so reads have something to
/// check.
pub fn initial_contents(spec: &ExportSpec) -> Vec<u8> {
    (0..spec.size)
        .map(|i| (i as u8) ^ ((i >> 8) as u8).wrapping_mul(37) ^ spec.name.len() as u8)
        .collect()
}

/// Something the server did that the protocol (or this server's documented
/// behaviour) does not allow.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Violation {
    #[error("cannot set up the server: {0}")]
    Setup(String),
    #[error("handshake, output byte {at}: {what}")]
    Handshake { at: usize, what: String },
    #[error("transmission: {0}")]
    Transmission(String),
    #[error("request parser on {header:02x?} (max payload {max_payload}): {what}")]
    Parser {
        header: Vec<u8>,
        max_payload: u32,
        what: String,
    },
    #[error("counters: {0}")]
    Stats(String),
}

/// What a checked session did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionReport {
    /// Whether the handshake reached transmission.
    pub transmission: bool,
    /// Whether structured replies were negotiated.
    pub structured: bool,
    /// Requests answered.
    pub replies: usize,
    /// Of which errors.
    pub errors: usize,
    /// Bytes the server sent.
    pub output_bytes: usize,
    /// The server's counters.
    pub stats: ServerStats,
}

// ---------------------------------------------------------------------------
// The in-memory stream
// ---------------------------------------------------------------------------

/// A connection whose client side is a fixed input: reads return the input
/// (in pieces of varying size, then end of file), writes are recorded.
/// Clones share the same connection, as socket clones do.
#[derive(Clone, Debug)]
pub struct MemStream(Arc<Mutex<MemState>>);

#[derive(Debug)]
struct MemState {
    input: Vec<u8>,
    pos: usize,
    read_closed: bool,
    output: Vec<u8>,
    write_closed: bool,
    /// Drives the sizes of reads.
    rng: u64,
}

impl MemStream {
    /// A connection on which the client sends `input` and then closes its
    /// sending side.
    pub fn new(input: Vec<u8>) -> MemStream {
        let rng = 0x9e37_79b9_7f4a_7c15 ^ input.len() as u64;
        MemStream(Arc::new(Mutex::new(MemState {
            input,
            pos: 0,
            read_closed: false,
            output: Vec::new(),
            write_closed: false,
            rng,
        })))
    }

    fn state(&self) -> MutexGuard<'_, MemState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything the server wrote.
    pub fn output(&self) -> Vec<u8> {
        self.state().output.clone()
    }

    /// Input bytes the server has read.
    pub fn consumed(&self) -> usize {
        self.state().pos
    }
}

impl Read for MemStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.state();
        if s.read_closed || buf.is_empty() {
            return Ok(0);
        }
        // Short reads of 1 to 4096 bytes, as a socket may return, so the
        // server's read loops see requests split anywhere.
        s.rng ^= s.rng << 13;
        s.rng ^= s.rng >> 7;
        s.rng ^= s.rng << 17;
        let piece = 1 + (s.rng % 4096) as usize;
        let n = buf.len().min(s.input.len() - s.pos).min(piece);
        let start = s.pos;
        buf[..n].copy_from_slice(&s.input[start..start + n]);
        s.pos += n;
        Ok(n)
    }
}

impl Write for MemStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut s = self.state();
        if s.write_closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        s.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ConnectionStream for MemStream {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(self.clone())
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let mut s = self.state();
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            s.read_closed = true;
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            s.write_closed = true;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------

/// The server of a fuzzed session: [`EXPORTS`] with their initial contents,
/// one worker, small limits.
pub fn server() -> Result<Server, Violation> {
    let config = ServerConfig {
        workers_per_connection: 1,
        max_inflight_bytes: 2 * MAX_PAYLOAD as usize,
        max_request_bytes: MAX_REQUEST,
        handshake_timeout: Some(Duration::from_secs(5)),
        reply_timeout: Some(Duration::from_secs(5)),
        limits: NegotiationLimits {
            max_option_len: MAX_OPTION_LEN,
            max_options: MAX_OPTIONS,
            max_payload: MAX_PAYLOAD,
        },
        ..ServerConfig::default()
    };
    let mut server = Server::new(config);
    for spec in &EXPORTS {
        let (min, pref, max) = spec.block_sizes;
        let mut e = MemExport::from_vec(initial_contents(spec))
            .with_read_only(spec.read_only)
            .with_block_sizes(min, pref, max);
        if let Some(d) = spec.description {
            e = e.with_description(d);
        }
        server
            .add_export(spec.name, Arc::new(e))
            .map_err(|e| Violation::Setup(e.to_string()))?;
    }
    Ok(server)
}

/// Serves `input` as everything a client sends (handshake and
/// transmission) and checks every byte the server sent back.
pub fn session(input: &[u8]) -> Result<SessionReport, Violation> {
    let server = server()?;
    let stream = MemStream::new(input.to_vec());
    let stats = server
        .serve_stream(stream.clone())
        .map_err(|e| Violation::Setup(e.to_string()))?;
    check_session(input, &stream.output(), stats)
}

/// A valid handshake chosen by `setup`: bit 0 asks for structured replies,
/// bits 1-2 pick the export (the default, `disk`, `ro`, `tiny`), bit 3
/// enters with NBD_OPT_EXPORT_NAME instead of NBD_OPT_GO, bit 4 sets the
/// client's NO_ZEROES flag.
pub fn handshake_prefix(setup: u8) -> Vec<u8> {
    let mut flags = NBD_FLAG_C_FIXED_NEWSTYLE;
    if setup & 0x10 != 0 {
        flags |= NBD_FLAG_C_NO_ZEROES;
    }
    let mut v = flags.to_be_bytes().to_vec();
    if setup & 1 != 0 {
        v.extend(encode_option(NBD_OPT_STRUCTURED_REPLY, &[]));
    }
    let name = match (setup >> 1) & 3 {
        0 => "",
        i => EXPORTS[usize::from(i) - 1].name,
    };
    if setup & 0x08 != 0 {
        v.extend(encode_option(NBD_OPT_EXPORT_NAME, name.as_bytes()));
    } else {
        let go = InfoRequest {
            name: name.to_string(),
            requests: vec![NBD_INFO_BLOCK_SIZE],
        };
        v.extend(encode_option(NBD_OPT_GO, &go.encode()));
    }
    v
}

/// The first byte picks a handshake ([`handshake_prefix`]); the rest is the
/// request stream. Checked as [`session`], and the handshake must succeed.
pub fn transmission(input: &[u8]) -> Result<SessionReport, Violation> {
    let Some((&setup, requests)) = input.split_first() else {
        return Ok(SessionReport::default());
    };
    let mut full = handshake_prefix(setup);
    full.extend_from_slice(requests);
    let report = session(&full)?;
    if !report.transmission {
        return Err(Violation::Transmission(format!(
            "the valid handshake {setup:#04x} did not reach transmission"
        )));
    }
    Ok(report)
}

/// Runs [`RequestHeader::parse`] on every 28-byte chunk of `input`, with
/// this session's payload limit and with the largest one, and compares each
/// result with the model.
pub fn request_headers(input: &[u8]) -> Result<(), Violation> {
    for chunk in input.chunks_exact(REQUEST_HEADER_LEN) {
        let mut h = [0u8; REQUEST_HEADER_LEN];
        h.copy_from_slice(chunk);
        for max_payload in [MAX_PAYLOAD, u32::MAX, 0] {
            check_header(&h, max_payload).map_err(|what| Violation::Parser {
                header: chunk.to_vec(),
                max_payload,
                what,
            })?;
        }
    }
    Ok(())
}

mod seeds;
pub use seeds::{request, seeds, Seed};

// ---------------------------------------------------------------------------
// The model: request classification
// ---------------------------------------------------------------------------

/// What the protocol makes of a request header, by the model.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Class {
    /// The stream cannot be followed any further: bad magic, or a write
    /// whose payload the server will not read.
    Fatal,
    /// Answered by the parser with `errno`, after skipping `discard` bytes.
    Rejected {
        handle: u64,
        errno: u32,
        discard: u32,
        is_read: bool,
    },
    /// A well-formed request (DISC included).
    Accepted(Header),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    flags: u16,
    command: u16,
    handle: u64,
    offset: u64,
    length: u32,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

const SERVED_COMMANDS: [u16; 8] = [
    NBD_CMD_READ,
    NBD_CMD_WRITE,
    NBD_CMD_DISC,
    NBD_CMD_FLUSH,
    NBD_CMD_TRIM,
    NBD_CMD_WRITE_ZEROES,
    NBD_CMD_CACHE,
    NBD_CMD_BLOCK_STATUS,
];

fn allowed_flags(command: u16) -> u16 {
    match command {
        NBD_CMD_READ => NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_DF,
        NBD_CMD_WRITE_ZEROES => NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO,
        NBD_CMD_BLOCK_STATUS => NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_REQ_ONE,
        _ => NBD_CMD_FLAG_FUA,
    }
}

fn has_range(command: u16) -> bool {
    matches!(
        command,
        NBD_CMD_READ
            | NBD_CMD_WRITE
            | NBD_CMD_TRIM
            | NBD_CMD_WRITE_ZEROES
            | NBD_CMD_CACHE
            | NBD_CMD_BLOCK_STATUS
    )
}

fn classify(b: &[u8; REQUEST_HEADER_LEN], max_payload: u32) -> Class {
    if be32(b, 0) != NBD_REQUEST_MAGIC {
        return Class::Fatal;
    }
    let h = Header {
        flags: be16(b, 4),
        command: be16(b, 6),
        handle: be64(b, 8),
        offset: be64(b, 16),
        length: be32(b, 24),
    };
    let reject = |errno, discard, is_read| Class::Rejected {
        handle: h.handle,
        errno,
        discard,
        is_read,
    };
    if !SERVED_COMMANDS.contains(&h.command) {
        // Unknown commands are assumed to carry no payload.
        return reject(NBD_EINVAL, 0, false);
    }
    let is_read = h.command == NBD_CMD_READ;
    let payload = if h.command == NBD_CMD_WRITE { h.length } else { 0 };
    if matches!(h.command, NBD_CMD_READ | NBD_CMD_WRITE) && h.length > max_payload {
        // Refused; a write's payload is read and dropped.
        return reject(NBD_EINVAL, payload, is_read);
    }
    if h.flags & !allowed_flags(h.command) != 0 {
        return reject(NBD_EINVAL, payload, is_read);
    }
    if has_range(h.command) && h.offset.checked_add(u64::from(h.length)).is_none() {
        let errno = if matches!(h.command, NBD_CMD_WRITE | NBD_CMD_WRITE_ZEROES) {
            NBD_ENOSPC
        } else {
            NBD_EINVAL
        };
        return reject(errno, payload, is_read);
    }
    Class::Accepted(h)
}

/// Compares [`RequestHeader::parse`] with the model on one header.
fn check_header(b: &[u8; REQUEST_HEADER_LEN], max_payload: u32) -> Result<(), String> {
    let model = classify(b, max_payload);
    let parsed = RequestHeader::parse(b, max_payload);
    match (&parsed, &model) {
        (Ok(req), Class::Accepted(h)) => {
            let same = req.handle == h.handle
                && req.command.code() == h.command
                && req.flags.0 == h.flags
                && req.offset == h.offset
                && req.length == h.length;
            if !same {
                return Err(format!("parsed {req:?}, the model reads {h:?}"));
            }
            if req.encode() != *b {
                return Err(format!("{req:?} does not encode back to its header"));
            }
            if req.payload_len() != if h.command == NBD_CMD_WRITE { h.length } else { 0 } {
                return Err(format!("{req:?}: wrong payload length"));
            }
            Ok(())
        }
        (Err(e), Class::Fatal) if e.is_fatal() => {
            let _ = e.to_string();
            Ok(())
        }
        (
            Err(e),
            Class::Rejected {
                handle,
                errno,
                discard,
                is_read,
            },
        ) if !e.is_fatal() => {
            let _ = e.to_string();
            let got = (e.handle(), e.errno(), e.payload_to_discard(), e.is_read());
            let want = (Some(*handle), *errno, *discard, *is_read);
            if got != want {
                return Err(format!(
                    "{e:?}: (handle, errno, discard, is_read) {got:?}, the model says {want:?}"
                ));
            }
            Ok(())
        }
        _ => Err(format!("parsed {parsed:?}, the model says {model:?}")),
    }
}

// ---------------------------------------------------------------------------
// The model: the session
// ---------------------------------------------------------------------------

/// A cursor over bytes.
struct Cur<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cur<'a> {
    fn new(b: &'a [u8]) -> Cur<'a> {
        Cur { b, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.remaining() < n {
            return None;
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| be32(b, 0))
    }
}

/// What the handshake ended in, by the model.
struct Entered {
    export: usize,
    structured: bool,
    /// `base:allocation` was selected for this export.
    block_status: bool,
}

impl Entered {
    /// Transmission on `export`; `meta` is the export `base:allocation`
    /// was last selected for.
    fn new(export: usize, structured: bool, meta: Option<usize>) -> Entered {
        Entered {
            export,
            structured,
            block_status: structured && meta == Some(export),
        }
    }
}

fn find_export(name: &[u8]) -> Option<usize> {
    if name.is_empty() {
        return Some(0);
    }
    EXPORTS.iter().position(|e| e.name.as_bytes() == name)
}

/// A protocol string: UTF-8 without NUL, at most 4096 bytes.
fn is_string(b: &[u8]) -> bool {
    b.len() <= MAX_STRING_LEN && !b.contains(&0) && std::str::from_utf8(b).is_ok()
}

/// Option data of NBD_OPT_LIST_META_CONTEXT or _SET_ (for the seeds).
fn meta_context(export: &str, queries: &[&str]) -> Vec<u8> {
    MetaContextRequest {
        export: export.into(),
        queries: queries.iter().map(|q| q.to_string()).collect(),
    }
    .encode()
}

/// The data of NBD_OPT_LIST_META_CONTEXT and _SET_: the export name and
/// the queries, when well formed.
fn meta_request(data: &[u8]) -> Option<(&[u8], Vec<&[u8]>)> {
    let string = |at: usize| -> Option<(&[u8], usize)> {
        let len = usize::try_from(be32(data.get(at..at.checked_add(4)?)?, 0)).ok()?;
        let end = at.checked_add(4)?.checked_add(len)?;
        let s = data.get(at + 4..end)?;
        is_string(s).then_some((s, end))
    };
    let (name, mut at) = string(0)?;
    let count = be32(data.get(at..at + 4)?, 0);
    at += 4;
    let mut queries = Vec::new();
    for _ in 0..count {
        let (q, end) = string(at)?;
        queries.push(q);
        at = end;
    }
    (at == data.len()).then_some((name, queries))
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO: the name and the requested
/// information types, when well formed.
fn info_request(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let name_len = usize::try_from(be32(data.get(..4)?, 0)).ok()?;
    let name = data.get(4..4usize.checked_add(name_len)?)?;
    let rest = &data[4 + name_len..];
    let count = usize::from(be16(rest.get(..2)?, 0));
    let list = &rest[2..];
    if list.len() != 2 * count || !is_string(name) {
        return None;
    }
    Some((name, list.chunks_exact(2).map(|c| be16(c, 0)).collect()))
}

fn expected_flags(spec: &ExportSpec, structured: bool) -> u16 {
    let mut f = NBD_FLAG_HAS_FLAGS
        | NBD_FLAG_SEND_FLUSH
        | NBD_FLAG_SEND_FUA
        | NBD_FLAG_SEND_TRIM
        | NBD_FLAG_SEND_WRITE_ZEROES
        | NBD_FLAG_SEND_FAST_ZERO
        | NBD_FLAG_CAN_MULTI_CONN;
    if spec.read_only {
        f |= NBD_FLAG_READ_ONLY;
    }
    if structured {
        f |= NBD_FLAG_SEND_DF;
    }
    f
}

/// Reads the server's side of the handshake.
struct HandshakeChecker<'a> {
    out: Cur<'a>,
}

impl<'a> HandshakeChecker<'a> {
    fn fail(&self, what: impl Into<String>) -> Violation {
        Violation::Handshake {
            at: self.out.pos,
            what: what.into(),
        }
    }

    /// One option reply for `option`: its type and data.
    fn reply(&mut self, option: u32) -> Result<(u32, &'a [u8]), Violation> {
        let at = self.out.pos;
        let h = self
            .out
            .take(OPTION_REPLY_HEADER_LEN)
            .ok_or_else(|| self.fail(format!("missing reply to option {option}")))?;
        if be64(h, 0) != OPTION_REPLY_MAGIC {
            return Err(self.fail(format!("bad option reply magic at {at}")));
        }
        let (o, t, len) = (be32(h, 8), be32(h, 12), be32(h, 16) as usize);
        if o != option {
            return Err(self.fail(format!("reply for option {o}, expected {option}")));
        }
        let data = self
            .out
            .take(len)
            .ok_or_else(|| self.fail(format!("reply data cut short ({len} bytes announced)")))?;
        Ok((t, data))
    }

    /// The final reply to `option` must be the error `error`.
    fn error(&mut self, option: u32, error: u32) -> Result<(), Violation> {
        let (t, data) = self.reply(option)?;
        if t != error {
            return Err(self.fail(format!(
                "option {option}: reply {}, expected {}",
                reply_type_name(t),
                reply_type_name(error)
            )));
        }
        if !is_string(data) {
            return Err(self.fail("error message is not a protocol string"));
        }
        Ok(())
    }

    /// The export a request names (`parsed`: the name and the rest, or
    /// `None` when malformed), and the rest; `None` when the request is
    /// malformed or names no export, after the error reply that must
    /// follow.
    fn requested<R>(
        &mut self,
        option: u32,
        parsed: Option<(&[u8], R)>,
    ) -> Result<Option<(usize, R)>, Violation> {
        let Some((name, rest)) = parsed else {
            self.error(option, NBD_REP_ERR_INVALID)?;
            return Ok(None);
        };
        let Some(export) = find_export(name) else {
            self.error(option, NBD_REP_ERR_UNKNOWN)?;
            return Ok(None);
        };
        Ok(Some((export, rest)))
    }

    /// The final reply to `option` must be an ACK without data.
    fn ack(&mut self, option: u32) -> Result<(), Violation> {
        let (t, data) = self.reply(option)?;
        if t != NBD_REP_ACK || !data.is_empty() {
            return Err(self.fail(format!(
                "option {option}: reply {} with {} bytes, expected an empty ACK",
                reply_type_name(t),
                data.len()
            )));
        }
        Ok(())
    }

    /// The replies to a valid INFO/GO for `export`: INFO items then ACK.
    fn info(
        &mut self,
        option: u32,
        export: usize,
        requests: &[u16],
        structured: bool,
    ) -> Result<(), Violation> {
        let spec = &EXPORTS[export];
        let (mut saw_export, mut saw_block) = (false, false);
        loop {
            let (t, data) = self.reply(option)?;
            if t == NBD_REP_ACK {
                if !data.is_empty() {
                    return Err(self.fail("ACK with data"));
                }
                break;
            }
            if t != NBD_REP_INFO || data.len() < 2 {
                return Err(self.fail(format!("unexpected reply {} to INFO/GO", reply_type_name(t))));
            }
            let rest = &data[2..];
            match be16(data, 0) {
                NBD_INFO_EXPORT => {
                    let want_flags = expected_flags(spec, structured);
                    if rest.len() != 10 || be64(rest, 0) != spec.size as u64 || be16(rest, 8) != want_flags {
                        return Err(self.fail(format!("bad NBD_INFO_EXPORT {rest:02x?}")));
                    }
                    saw_export = true;
                }
                NBD_INFO_NAME => {
                    if rest != spec.name.as_bytes() {
                        return Err(self.fail("NBD_INFO_NAME is not the canonical name"));
                    }
                }
                NBD_INFO_DESCRIPTION => {
                    if Some(rest) != spec.description.map(str::as_bytes)
                        || !requests.contains(&NBD_INFO_DESCRIPTION)
                    {
                        return Err(self.fail("bad or unrequested NBD_INFO_DESCRIPTION"));
                    }
                }
                NBD_INFO_BLOCK_SIZE => {
                    let (min, pref, max) = spec.effective;
                    if rest.len() != 12 || (be32(rest, 0), be32(rest, 4), be32(rest, 8)) != (min, pref, max) {
                        return Err(self.fail(format!("bad NBD_INFO_BLOCK_SIZE {rest:02x?}")));
                    }
                    saw_block = true;
                }
                other => return Err(self.fail(format!("unknown information type {other}"))),
            }
        }
        if !saw_export || !saw_block {
            return Err(self.fail("INFO/GO without NBD_INFO_EXPORT or NBD_INFO_BLOCK_SIZE"));
        }
        Ok(())
    }
}

/// Walks the handshake: returns the export and reply style when the client
/// entered transmission, `None` when the server must have hung up.
fn check_handshake(inp: &mut Cur<'_>, hs: &mut HandshakeChecker<'_>) -> Result<Option<Entered>, Violation> {
    let greeting = hs.out.take(GREETING_LEN).ok_or_else(|| hs.fail("no greeting"))?;
    if be64(greeting, 0) != NBD_MAGIC
        || be64(greeting, 8) != IHAVEOPT
        || be16(greeting, 16) != NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES
    {
        return Err(hs.fail(format!("bad greeting {greeting:02x?}")));
    }
    let Some(client_flags) = inp.u32() else {
        return Ok(None);
    };
    if client_flags & !KNOWN_CLIENT_FLAGS != 0 || client_flags & NBD_FLAG_C_FIXED_NEWSTYLE == 0 {
        return Ok(None);
    }
    let no_zeroes = client_flags & NBD_FLAG_C_NO_ZEROES != 0;
    let mut structured = false;
    // The export `base:allocation` was last selected for.
    let mut meta: Option<usize> = None;
    for _ in 0..MAX_OPTIONS {
        let Some(h) = inp.take(OPTION_HEADER_LEN) else {
            return Ok(None);
        };
        if be64(h, 0) != IHAVEOPT {
            return Ok(None);
        }
        let (option, len) = (be32(h, 8), be32(h, 12));
        let Some(data) = inp.take(len as usize) else {
            // Cut short: the server sees end of file while reading (or
            // skipping) the data.
            return Ok(None);
        };
        if len > MAX_OPTION_LEN {
            if option == NBD_OPT_EXPORT_NAME {
                return Ok(None);
            }
            hs.error(option, NBD_REP_ERR_TOO_BIG)?;
            continue;
        }
        match option {
            NBD_OPT_EXPORT_NAME => {
                let Some(export) = find_export(data).filter(|_| is_string(data)) else {
                    return Ok(None);
                };
                let spec = &EXPORTS[export];
                let want = if no_zeroes { 10 } else { 10 + EXPORT_NAME_ZEROES };
                let r = hs
                    .out
                    .take(want)
                    .ok_or_else(|| hs.fail("export name reply cut short"))?;
                if be64(r, 0) != spec.size as u64
                    || be16(r, 8) != expected_flags(spec, structured)
                    || r[10..].iter().any(|&b| b != 0)
                {
                    return Err(hs.fail(format!("bad export name reply {r:02x?}")));
                }
                return Ok(Some(Entered::new(export, structured, meta)));
            }
            NBD_OPT_ABORT => {
                hs.ack(option)?;
                return Ok(None);
            }
            NBD_OPT_LIST => {
                if !data.is_empty() {
                    hs.error(option, NBD_REP_ERR_INVALID)?;
                    continue;
                }
                let mut seen = HashSet::new();
                loop {
                    let (t, d) = hs.reply(option)?;
                    if t == NBD_REP_ACK && d.is_empty() {
                        break;
                    }
                    if t != NBD_REP_SERVER || d.len() < 4 {
                        return Err(hs.fail(format!("unexpected reply {} to LIST", reply_type_name(t))));
                    }
                    let n = be32(d, 0) as usize;
                    let name = d.get(4..4usize.saturating_add(n)).unwrap_or(&[]);
                    let spec = EXPORTS.iter().find(|e| e.name.as_bytes() == name && n > 0);
                    let Some(spec) = spec else {
                        return Err(hs.fail(format!("LIST names an unknown export {d:02x?}")));
                    };
                    if &d[4 + n..] != spec.description.unwrap_or("").as_bytes() || !seen.insert(spec.name) {
                        return Err(hs.fail(format!("bad or repeated LIST entry {d:02x?}")));
                    }
                }
                if seen.len() != EXPORTS.len() {
                    return Err(hs.fail("LIST left out an export"));
                }
            }
            NBD_OPT_STRUCTURED_REPLY => {
                if !data.is_empty() || structured {
                    hs.error(option, NBD_REP_ERR_INVALID)?;
                } else {
                    hs.ack(option)?;
                    structured = true;
                }
            }
            NBD_OPT_INFO | NBD_OPT_GO => {
                let Some((export, requests)) = hs.requested(option, info_request(data))? else {
                    continue;
                };
                hs.info(option, export, &requests, structured)?;
                if option == NBD_OPT_GO {
                    return Ok(Some(Entered::new(export, structured, meta)));
                }
            }
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
                let set = option == NBD_OPT_SET_META_CONTEXT;
                if set && !structured {
                    hs.error(option, NBD_REP_ERR_INVALID)?;
                    continue;
                }
                let Some((export, queries)) = hs.requested(option, meta_request(data))? else {
                    continue;
                };
                let chosen = queries.contains(&&b"base:allocation"[..])
                    || (!set && (queries.is_empty() || queries.contains(&&b"base:"[..])));
                if set {
                    meta = chosen.then_some(export);
                }
                if chosen {
                    let (t, d) = hs.reply(option)?;
                    let id = u32::from(set);
                    if t != NBD_REP_META_CONTEXT
                        || d.len() < 4
                        || be32(d, 0) != id
                        || &d[4..] != b"base:allocation"
                    {
                        return Err(
                            hs.fail(format!("bad META_CONTEXT reply {} {d:02x?}", reply_type_name(t)))
                        );
                    }
                }
                hs.ack(option)?;
            }
            _ => {
                let (t, d) = hs.reply(option)?;
                if t & NBD_REP_FLAG_ERROR == 0 || !is_string(d) {
                    return Err(hs.fail(format!(
                        "unsupported option {option} answered with {}",
                        reply_type_name(t)
                    )));
                }
            }
        }
    }
    // The option after the last allowed one ends the negotiation.
    Ok(None)
}

/// The reply a request must get.
#[derive(Debug)]
enum Expect {
    /// An error with one of these numbers (and no data); a read's error
    /// must be a structured chunk when structured replies are on.
    Error {
        handle: u64,
        errnos: Vec<u32>,
        is_read: bool,
    },
    /// A successful read of these bytes (`None`: any value).
    Read {
        handle: u64,
        offset: u64,
        data: Vec<Option<u8>>,
    },
    /// One `base:allocation` chunk: one data extent of `length` bytes.
    BlockStatus { handle: u64, length: u32 },
    /// Any other success.
    Done { handle: u64 },
}

/// Builds what every request must get, in the order the server handles
/// them: `rejected` by the parser (answered by the reading thread) and
/// `executed` (answered by the worker, in order).
fn expectations(inp: &mut Cur<'_>, entered: &Entered) -> (Vec<Expect>, Vec<Expect>) {
    let spec = &EXPORTS[entered.export];
    let mut disk: Vec<Option<u8>> = initial_contents(spec).into_iter().map(Some).collect();
    let (min, _, _) = spec.effective;
    let (mut rejected, mut executed) = (Vec::new(), Vec::new());
    while let Some(b) = inp.take(REQUEST_HEADER_LEN) {
        let mut hb = [0u8; REQUEST_HEADER_LEN];
        hb.copy_from_slice(b);
        let h = match classify(&hb, MAX_REQUEST) {
            Class::Fatal => break,
            Class::Rejected {
                handle,
                errno,
                discard,
                is_read,
            } => {
                // The reply is sent after the payload is skipped.
                if inp.take(discard as usize).is_none() {
                    break;
                }
                rejected.push(Expect::Error {
                    handle,
                    errnos: vec![errno],
                    is_read,
                });
                continue;
            }
            Class::Accepted(h) => h,
        };
        if h.command == NBD_CMD_DISC {
            break;
        }
        let payload = if h.command == NBD_CMD_WRITE {
            match inp.take(h.length as usize) {
                Some(p) => p,
                None => break,
            }
        } else {
            &[]
        };
        let mut errnos = Vec::new();
        // Only commands with a range are known not to overflow (a FLUSH
        // may carry any offset and length).
        let end = h.offset.saturating_add(u64::from(h.length));
        if has_range(h.command) {
            if end > spec.size as u64 {
                errnos.push(if matches!(h.command, NBD_CMD_WRITE | NBD_CMD_WRITE_ZEROES) {
                    NBD_ENOSPC
                } else {
                    NBD_EINVAL
                });
            }
            if h.offset % u64::from(min) != 0 || h.length % min != 0 {
                errnos.push(NBD_EINVAL);
            }
        }
        if spec.read_only && matches!(h.command, NBD_CMD_WRITE | NBD_CMD_TRIM | NBD_CMD_WRITE_ZEROES) {
            errnos.push(NBD_EPERM);
        }
        // The fuzzed exports (memory) do not offer CACHE.
        if h.command == NBD_CMD_CACHE {
            errnos.push(NBD_EINVAL);
        }
        if h.command == NBD_CMD_BLOCK_STATUS && (!entered.block_status || h.length == 0) {
            errnos.push(NBD_EINVAL);
        }
        if h.flags & NBD_CMD_FLAG_DF != 0 && !entered.structured {
            errnos.push(NBD_EINVAL);
        }
        if !errnos.is_empty() {
            executed.push(Expect::Error {
                handle: h.handle,
                errnos,
                is_read: h.command == NBD_CMD_READ,
            });
            continue;
        }
        let range = h.offset as usize..end as usize;
        match h.command {
            NBD_CMD_BLOCK_STATUS => {
                // A memory export: all of it allocated data.
                executed.push(Expect::BlockStatus {
                    handle: h.handle,
                    length: h.length,
                });
                continue;
            }
            NBD_CMD_READ => {
                executed.push(Expect::Read {
                    handle: h.handle,
                    offset: h.offset,
                    data: disk[range].to_vec(),
                });
                continue;
            }
            NBD_CMD_WRITE => {
                for (d, &s) in disk[range].iter_mut().zip(payload) {
                    *d = Some(s);
                }
            }
            NBD_CMD_WRITE_ZEROES => disk[range].fill(Some(0)),
            // The contents of a trimmed range are unspecified.
            NBD_CMD_TRIM => disk[range].fill(None),
            _ => {}
        }
        executed.push(Expect::Done { handle: h.handle });
    }
    (rejected, executed)
}

/// Matches the reply at `p` in `out` against `e`; returns where the next
/// reply starts.
fn match_reply(out: &[u8], p: usize, e: &Expect, structured: bool) -> Result<usize, String> {
    let rest = &out[p..];
    if rest.len() < 4 {
        return Err(format!("reply cut short at {p}"));
    }
    let (handle, is_read) = match e {
        Expect::Error { handle, is_read, .. } => (*handle, *is_read),
        Expect::Read { handle, .. } => (*handle, true),
        Expect::Done { handle } => (*handle, false),
        Expect::BlockStatus { handle, .. } => (*handle, true),
    };
    match be32(rest, 0) {
        NBD_SIMPLE_REPLY_MAGIC => {
            if rest.len() < SIMPLE_REPLY_LEN {
                return Err(format!("simple reply cut short at {p}"));
            }
            if structured && is_read {
                return Err(format!("simple reply at {p} to a read with structured replies"));
            }
            let (errno, h) = (be32(rest, 4), be64(rest, 8));
            if h != handle {
                return Err(format!("reply at {p} has handle {h:#x}, expected {handle:#x}"));
            }
            match e {
                Expect::Error { errnos, .. } => {
                    if !errnos.contains(&errno) {
                        return Err(format!("reply at {p}: error {errno}, expected one of {errnos:?}"));
                    }
                    Ok(p + SIMPLE_REPLY_LEN)
                }
                Expect::Done { .. } if errno == 0 => Ok(p + SIMPLE_REPLY_LEN),
                Expect::Read { offset, data, .. } if errno == 0 => {
                    let got = rest
                        .get(SIMPLE_REPLY_LEN..SIMPLE_REPLY_LEN + data.len())
                        .ok_or_else(|| format!("read data at {p} cut short"))?;
                    compare_data(got, data, *offset, p)?;
                    Ok(p + SIMPLE_REPLY_LEN + data.len())
                }
                _ => Err(format!(
                    "reply at {p}: error {errno} to a request that must succeed"
                )),
            }
        }
        NBD_STRUCTURED_REPLY_MAGIC => {
            if !structured {
                return Err(format!("structured reply at {p} without negotiation"));
            }
            if rest.len() < STRUCTURED_HEADER_LEN {
                return Err(format!("structured reply cut short at {p}"));
            }
            let (flags, t, h, len) = (
                be16(rest, 4),
                be16(rest, 6),
                be64(rest, 8),
                be32(rest, 16) as usize,
            );
            if h != handle {
                return Err(format!("chunk at {p} has handle {h:#x}, expected {handle:#x}"));
            }
            if flags != NBD_REPLY_FLAG_DONE {
                return Err(format!("chunk at {p}: flags {flags:#x}, expected only DONE"));
            }
            let payload = rest
                .get(STRUCTURED_HEADER_LEN..STRUCTURED_HEADER_LEN + len)
                .ok_or_else(|| format!("chunk at {p} cut short"))?;
            let next = p + STRUCTURED_HEADER_LEN + len;
            match (t, e) {
                (NBD_REPLY_TYPE_ERROR, Expect::Error { errnos, .. }) => {
                    if len < 6 {
                        return Err(format!("error chunk at {p} too short"));
                    }
                    let errno = be32(payload, 0);
                    let mlen = usize::from(be16(payload, 4));
                    if 6 + mlen != len || !is_string(&payload[6..]) {
                        return Err(format!("error chunk at {p}: bad message"));
                    }
                    if !errnos.contains(&errno) {
                        return Err(format!("chunk at {p}: error {errno}, expected one of {errnos:?}"));
                    }
                    Ok(next)
                }
                (NBD_REPLY_TYPE_NONE, Expect::Done { .. }) if len == 0 => Ok(next),
                (NBD_REPLY_TYPE_BLOCK_STATUS, Expect::BlockStatus { length, .. }) => {
                    if len != 12
                        || be32(payload, 0) != BASE_ALLOCATION_ID
                        || be32(payload, 4) != *length
                        || be32(payload, 8) != 0
                    {
                        return Err(format!(
                            "block status chunk at {p}: {payload:02x?}, expected one data extent of {length}"
                        ));
                    }
                    Ok(next)
                }
                (NBD_REPLY_TYPE_NONE, Expect::Read { data, .. }) if len == 0 && data.is_empty() => Ok(next),
                (NBD_REPLY_TYPE_OFFSET_DATA, Expect::Read { offset, data, .. }) if !data.is_empty() => {
                    if len != 8 + data.len() || be64(payload, 0) != *offset {
                        return Err(format!(
                            "data chunk at {p}: {len} bytes at {}, expected {} at {offset}",
                            be64(payload, 0),
                            8 + data.len()
                        ));
                    }
                    compare_data(&payload[8..], data, *offset, p)?;
                    Ok(next)
                }
                _ => Err(format!(
                    "chunk at {p}: type {} ({len} bytes) does not answer {e:?}",
                    reply_type_name(u32::from(t))
                )),
            }
        }
        m => Err(format!("bad reply magic {m:#010x} at {p}")),
    }
}

fn compare_data(got: &[u8], want: &[Option<u8>], offset: u64, p: usize) -> Result<(), String> {
    match got.iter().zip(want).position(|(g, w)| w.is_some_and(|w| w != *g)) {
        None => Ok(()),
        Some(i) => Err(format!(
            "read at {offset} (reply at {p}) returned {} at byte {i}, expected {:?}",
            got[i], want[i]
        )),
    }
}

/// Finds an interleaving of `a` (in order) and `b` (in order) that the
/// replies in `out` answer exactly, with nothing left over.
fn match_replies(out: &[u8], a: &[Expect], b: &[Expect], structured: bool) -> Result<(), String> {
    let mut stack = vec![(0usize, 0usize, 0usize)];
    let mut visited = HashSet::new();
    // The failure of the path that matched the most replies.
    let mut deepest: (usize, String) = (0, String::from("no replies matched"));
    fn note(depth: usize, what: String, deepest: &mut (usize, String)) {
        if depth >= deepest.0 {
            *deepest = (depth, what);
        }
    }
    while let Some((i, j, p)) = stack.pop() {
        if !visited.insert((i, j, p)) {
            continue;
        }
        if i == a.len() && j == b.len() {
            if p == out.len() {
                return Ok(());
            }
            note(
                i + j,
                format!("{} bytes after the last expected reply, at {p}", out.len() - p),
                &mut deepest,
            );
            continue;
        }
        if p == out.len() {
            let missing: Vec<&Expect> = a[i..].iter().chain(&b[j..]).collect();
            note(i + j, format!("no reply to {missing:?}"), &mut deepest);
            continue;
        }
        if i < a.len() {
            match match_reply(out, p, &a[i], structured) {
                Ok(q) => stack.push((i + 1, j, q)),
                Err(e) => note(i + j, e, &mut deepest),
            }
        }
        if j < b.len() {
            match match_reply(out, p, &b[j], structured) {
                Ok(q) => stack.push((i, j + 1, q)),
                Err(e) => note(i + j, e, &mut deepest),
            }
        }
    }
    Err(deepest.1)
}

/// Checks the server's `output` for the client's `input`.
pub fn check_session(input: &[u8], output: &[u8], stats: ServerStats) -> Result<SessionReport, Violation> {
    let mut inp = Cur::new(input);
    let mut hs = HandshakeChecker {
        out: Cur::new(output),
    };
    let entered = check_handshake(&mut inp, &mut hs)?;
    let mut report = SessionReport {
        output_bytes: output.len(),
        stats,
        ..SessionReport::default()
    };
    let Some(entered) = entered else {
        if hs.out.remaining() != 0 {
            return Err(hs.fail(format!(
                "{} bytes after the point where the server must hang up",
                hs.out.remaining()
            )));
        }
        if stats.transmissions != 0 || stats.requests != 0 {
            return Err(Violation::Stats(format!("no transmission, but {stats:?}")));
        }
        return Ok(report);
    };
    let (rejected, executed) = expectations(&mut inp, &entered);
    let start = hs.out.pos;
    match_replies(&output[start..], &rejected, &executed, entered.structured)
        .map_err(|e| Violation::Transmission(format!("(replies from output byte {start}) {e}")))?;
    let errors = rejected.len()
        + executed
            .iter()
            .filter(|e| matches!(e, Expect::Error { .. }))
            .count();
    report.transmission = true;
    report.structured = entered.structured;
    report.replies = rejected.len() + executed.len();
    report.errors = errors;
    let want = (1, report.replies as u64, errors as u64);
    let got = (stats.transmissions, stats.requests, stats.errors);
    if got != want {
        return Err(Violation::Stats(format!(
            "(transmissions, requests, errors) {got:?}, expected {want:?}"
        )));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_are_valid_and_their_effective_sizes_are_the_servers() {
        let s = server().unwrap();
        drop(s);
        for spec in &EXPORTS {
            let e = MemExport::new(spec.size).with_block_sizes(
                spec.block_sizes.0,
                spec.block_sizes.1,
                spec.block_sizes.2,
            );
            assert_eq!(
                crate::handshake::effective_block_sizes(&e, MAX_PAYLOAD),
                spec.effective,
                "{}",
                spec.name
            );
        }
    }

    #[test]
    fn every_handshake_prefix_enters_transmission() {
        for setup in 0..=0x1f {
            let r = transmission(&[setup]).unwrap();
            assert!(r.transmission);
            assert_eq!(r.structured, setup & 1 != 0);
        }
    }

    #[test]
    fn every_seed_passes() {
        for seed in seeds() {
            let r = match seed.target {
                "nbd_request" => transmission(&seed.input),
                _ => session(&seed.input),
            };
            let r = r.unwrap_or_else(|v| panic!("{}: {v}", seed.name));
            assert!(
                r.transmission != matches!(seed.name, "abort" | "unknown-export-name"),
                "{}: {r:?}",
                seed.name
            );
        }
    }

    #[test]
    fn the_checker_catches_a_wrong_reply() {
        let mut input = handshake_prefix(0);
        input.extend(request(NBD_CMD_READ, 0, 7, 512, 512, &[]));
        let server = server().unwrap();
        let stream = MemStream::new(input.clone());
        let stats = server.serve_stream(stream.clone()).unwrap();
        let mut out = stream.output();
        check_session(&input, &out, stats).unwrap();
        // A flipped data byte, a wrong handle, a missing and an extra byte.
        let n = out.len();
        out[n - 1] ^= 1;
        assert!(check_session(&input, &out, stats).is_err());
        out[n - 1] ^= 1;
        out[n - 512 - 1] ^= 1;
        assert!(check_session(&input, &out, stats).is_err());
        out[n - 512 - 1] ^= 1;
        assert!(check_session(&input, &out[..n - 1], stats).is_err());
        out.push(0);
        assert!(check_session(&input, &out, stats).is_err());
    }
}
