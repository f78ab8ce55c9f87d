//! The NBD wire protocol as constants and pure encode/parse functions.
//!
//! Everything that touches the layout of bytes on the wire is here, so the
//! server, the handshake and the client share one definition and the
//! layouts can be tested exhaustively without sockets. Nothing in this module
//! does I/O; parsers take fixed-size arrays or slices and never panic.
//! All integers are big-endian (network byte order), as the protocol
//! requires. The reference is the NBD project's `doc/proto.md`.

use thiserror::Error;

// ---------------------------------------------------------------------------
// Handshake magics and flags
// ---------------------------------------------------------------------------

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic the server sends, and the magic that starts
/// every option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Oldstyle negotiation's second magic (`cliserv_magic`); never sent by us,
/// recognised by the client so it can refuse oldstyle servers.
pub const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;
/// Magic of every option reply in fixed newstyle negotiation.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

/// Handshake flag: the server supports fixed newstyle.
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can omit the 124 zero bytes after EXPORT_NAME.
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;

/// Client flag: the client speaks fixed newstyle.
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: the server must not send the 124 zero bytes.
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;
/// Every client flag this implementation knows.
pub const KNOWN_CLIENT_FLAGS: u32 = NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES;

/// Bytes of the server's greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Zero bytes that follow the EXPORT_NAME reply unless NO_ZEROES was agreed.
pub const EXPORT_NAME_ZEROES: usize = 124;

// ---------------------------------------------------------------------------
// Transmission flags
// ---------------------------------------------------------------------------

/// Transmission flag bit 0: always set.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
/// The export is read-only.
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
/// NBD_CMD_FLUSH is supported.
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
/// NBD_CMD_FLAG_FUA is supported.
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
/// The export behaves like a rotational medium.
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
/// NBD_CMD_TRIM is supported.
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
/// NBD_CMD_WRITE_ZEROES is supported.
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// NBD_CMD_FLAG_DF is supported on reads (structured replies only).
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
/// Flush and FUA are visible across all connections to the export.
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// NBD_CMD_CACHE is supported.
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
/// NBD_CMD_FLAG_FAST_ZERO is supported.
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---------------------------------------------------------------------------
// Options and option replies
// ---------------------------------------------------------------------------

/// Choose an export and enter transmission (cannot return errors).
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
/// End negotiation; the server acknowledges and the client disconnects.
pub const NBD_OPT_ABORT: u32 = 2;
/// List the exports.
pub const NBD_OPT_LIST: u32 = 3;
/// Withdrawn; never valid.
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
/// Upgrade to TLS (not supported here).
pub const NBD_OPT_STARTTLS: u32 = 5;
/// Describe an export without entering transmission.
pub const NBD_OPT_INFO: u32 = 6;
/// Describe an export and enter transmission.
pub const NBD_OPT_GO: u32 = 7;
/// Use structured replies during transmission.
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
/// List metadata contexts (not supported here).
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
/// Select metadata contexts (not supported here).
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
/// Use 64-bit extended headers (not supported here).
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

/// The option succeeded (or a list is complete).
pub const NBD_REP_ACK: u32 = 1;
/// One export of an NBD_OPT_LIST.
pub const NBD_REP_SERVER: u32 = 2;
/// One information item of an NBD_OPT_INFO / NBD_OPT_GO.
pub const NBD_REP_INFO: u32 = 3;
/// One metadata context.
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks every error reply.
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
/// The option is unknown to the server.
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
/// The option is forbidden by policy.
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
/// The option is syntactically or semantically invalid.
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
/// The option is not supported on this platform.
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
/// TLS is required first.
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
/// The requested export does not exist.
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
/// The server is shutting down.
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
/// The client must request NBD_INFO_BLOCK_SIZE.
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
/// The request or reply is too large.
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;

/// Information type: size and transmission flags (mandatory before ACK).
pub const NBD_INFO_EXPORT: u16 = 0;
/// Information type: canonical export name.
pub const NBD_INFO_NAME: u16 = 1;
/// Information type: human-readable description.
pub const NBD_INFO_DESCRIPTION: u16 = 2;
/// Information type: minimum, preferred and maximum block sizes.
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

/// Bytes of an option header as the client sends it: magic, option, length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Bytes of an option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// The protocol's upper bound on a string (export name, message).
pub const MAX_STRING_LEN: usize = 4096;

// ---------------------------------------------------------------------------
// Transmission: requests and replies
// ---------------------------------------------------------------------------

/// Magic of every request.
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Bytes of a request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const STRUCTURED_HEADER_LEN: usize = 20;

/// Command types.
pub const NBD_CMD_READ: u16 = 0;
/// Write `length` bytes that follow the header.
pub const NBD_CMD_WRITE: u16 = 1;
/// Disconnect after finishing outstanding requests; no reply.
pub const NBD_CMD_DISC: u16 = 2;
/// Persist every completed write.
pub const NBD_CMD_FLUSH: u16 = 3;
/// Discard a range (advisory).
pub const NBD_CMD_TRIM: u16 = 4;
/// Prefetch hint (not supported here).
pub const NBD_CMD_CACHE: u16 = 5;
/// Write zeroes without a payload.
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
/// Query block status (not supported here).
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;

/// Command flag: force unit access (persist before replying).
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag (WRITE_ZEROES): do not create a hole.
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag (READ): send at most one content chunk.
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag (BLOCK_STATUS): one extent only.
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag (WRITE_ZEROES): fail fast unless zeroing is fast.
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flag: this is the last chunk of the reply.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
/// Structured chunk: no payload, only ends a reply.
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
/// Structured chunk: an offset and data.
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Structured chunk: an offset and a length of zeroes.
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Structured chunk: block status descriptors.
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// The one metadata context served: allocation status (holes, zeroes).
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id `base:allocation` gets in NBD_REP_META_CONTEXT.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` flag: the extent is not allocated (a hole).
pub const NBD_STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` flag: the extent reads as zeroes.
pub const NBD_STATE_ZERO: u32 = 1 << 1;
/// Bit 15 marks every error chunk.
pub const NBD_REPLY_TYPE_FLAG_ERROR: u16 = 1 << 15;
/// Structured chunk: an error for the whole request.
pub const NBD_REPLY_TYPE_ERROR: u16 = NBD_REPLY_TYPE_FLAG_ERROR | 1;
/// Structured chunk: an error at an offset.
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = NBD_REPLY_TYPE_FLAG_ERROR | 2;

/// Error numbers of the protocol (not the host's errno values).
pub const NBD_EPERM: u32 = 1;
/// Input/output error.
pub const NBD_EIO: u32 = 5;
/// Cannot allocate memory.
pub const NBD_ENOMEM: u32 = 12;
/// Invalid argument.
pub const NBD_EINVAL: u32 = 22;
/// No space left on device.
pub const NBD_ENOSPC: u32 = 28;
/// Value too large.
pub const NBD_EOVERFLOW: u32 = 75;
/// Operation not supported.
pub const NBD_ENOTSUP: u32 = 95;
/// Server is shutting down.
pub const NBD_ESHUTDOWN: u32 = 108;

/// The default maximum payload of one READ or WRITE (32 MiB), the size the
/// protocol says no one should consider a denial of service.
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

/// The name of an NBD error number, for messages.
pub fn errno_name(errno: u32) -> &'static str {
    match errno {
        0 => "OK",
        NBD_EPERM => "EPERM",
        NBD_EIO => "EIO",
        NBD_ENOMEM => "ENOMEM",
        NBD_EINVAL => "EINVAL",
        NBD_ENOSPC => "ENOSPC",
        NBD_EOVERFLOW => "EOVERFLOW",
        NBD_ENOTSUP => "ENOTSUP",
        NBD_ESHUTDOWN => "ESHUTDOWN",
        _ => "unknown error",
    }
}

/// The name of an option, for messages.
pub fn option_name(option: u32) -> &'static str {
    match option {
        NBD_OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        NBD_OPT_ABORT => "NBD_OPT_ABORT",
        NBD_OPT_LIST => "NBD_OPT_LIST",
        NBD_OPT_PEEK_EXPORT => "NBD_OPT_PEEK_EXPORT",
        NBD_OPT_STARTTLS => "NBD_OPT_STARTTLS",
        NBD_OPT_INFO => "NBD_OPT_INFO",
        NBD_OPT_GO => "NBD_OPT_GO",
        NBD_OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        NBD_OPT_LIST_META_CONTEXT => "NBD_OPT_LIST_META_CONTEXT",
        NBD_OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        NBD_OPT_EXTENDED_HEADERS => "NBD_OPT_EXTENDED_HEADERS",
        _ => "unknown option",
    }
}

/// The name of an option reply type, for messages.
pub fn reply_type_name(reply: u32) -> &'static str {
    match reply {
        NBD_REP_ACK => "NBD_REP_ACK",
        NBD_REP_SERVER => "NBD_REP_SERVER",
        NBD_REP_INFO => "NBD_REP_INFO",
        NBD_REP_META_CONTEXT => "NBD_REP_META_CONTEXT",
        NBD_REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP",
        NBD_REP_ERR_POLICY => "NBD_REP_ERR_POLICY",
        NBD_REP_ERR_INVALID => "NBD_REP_ERR_INVALID",
        NBD_REP_ERR_PLATFORM => "NBD_REP_ERR_PLATFORM",
        NBD_REP_ERR_TLS_REQD => "NBD_REP_ERR_TLS_REQD",
        NBD_REP_ERR_UNKNOWN => "NBD_REP_ERR_UNKNOWN",
        NBD_REP_ERR_SHUTDOWN => "NBD_REP_ERR_SHUTDOWN",
        NBD_REP_ERR_BLOCK_SIZE_REQD => "NBD_REP_ERR_BLOCK_SIZE_REQD",
        NBD_REP_ERR_TOO_BIG => "NBD_REP_ERR_TOO_BIG",
        _ => "unknown reply type",
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// A message on the wire that this implementation cannot accept.
///
/// Request errors carry the request's handle: unless [`ProtoError::is_fatal`]
/// says otherwise, the server answers them with [`ProtoError::errno`] and
/// keeps the connection, after discarding
/// [`ProtoError::payload_to_discard`] bytes of write payload.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    #[error("bad request magic {0:#010x}")]
    BadRequestMagic(u32),
    #[error("unknown command {command} (handle {handle:#x})")]
    UnknownCommand { handle: u64, command: u16 },
    #[error("command flags {flags:#06x} not valid for {command:?} (handle {handle:#x})")]
    InvalidFlags {
        handle: u64,
        command: Command,
        flags: u16,
        /// Payload bytes that follow the header (writes only).
        payload: u32,
    },
    #[error("offset {offset} + length {length} overflows (handle {handle:#x})")]
    RangeOverflow {
        handle: u64,
        command: Command,
        offset: u64,
        length: u32,
        payload: u32,
    },
    #[error("{command:?} of {length} bytes exceeds the maximum of {max} (handle {handle:#x})")]
    TooLong {
        handle: u64,
        command: Command,
        length: u32,
        max: u32,
    },
    #[error("bad option magic {0:#018x}")]
    BadOptionMagic(u64),
    #[error("bad option reply magic {0:#018x}")]
    BadOptionReplyMagic(u64),
    #[error("bad reply magic {0:#010x}")]
    BadReplyMagic(u32),
    #[error("bad server greeting")]
    BadGreeting,
    #[error("malformed {what}")]
    Malformed { what: &'static str },
    #[error("string is not valid UTF-8 or contains NUL")]
    BadString,
}

impl ProtoError {
    /// Whether the connection cannot continue: the stream can no longer be
    /// framed (bad magic) or the payload is too large to read.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            ProtoError::TooLong { .. }
                | ProtoError::UnknownCommand { .. }
                | ProtoError::InvalidFlags { .. }
                | ProtoError::RangeOverflow { .. }
        )
    }

    /// The handle of the request this error is about, if any.
    pub fn handle(&self) -> Option<u64> {
        match self {
            ProtoError::UnknownCommand { handle, .. }
            | ProtoError::InvalidFlags { handle, .. }
            | ProtoError::RangeOverflow { handle, .. }
            | ProtoError::TooLong { handle, .. } => Some(*handle),
            _ => None,
        }
    }

    /// The NBD error number to answer a non-fatal request error with.
    pub fn errno(&self) -> u32 {
        match self {
            ProtoError::RangeOverflow {
                command: Command::Write | Command::WriteZeroes,
                ..
            } => NBD_ENOSPC,
            _ => NBD_EINVAL,
        }
    }

    /// Bytes of write payload that follow a rejected header and must be
    /// read and dropped to stay in frame.
    pub fn payload_to_discard(&self) -> u32 {
        match self {
            ProtoError::InvalidFlags { payload, .. } | ProtoError::RangeOverflow { payload, .. } => *payload,
            ProtoError::TooLong {
                command: Command::Write,
                length,
                ..
            } => *length,
            _ => 0,
        }
    }

    /// Whether the rejected request was a read (which, with structured
    /// replies, must be answered with a structured reply).
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            ProtoError::InvalidFlags {
                command: Command::Read,
                ..
            } | ProtoError::RangeOverflow {
                command: Command::Read,
                ..
            } | ProtoError::TooLong {
                command: Command::Read,
                ..
            }
        )
    }
}

// ---------------------------------------------------------------------------
// Small big-endian helpers (panic-free on the sizes used)
// ---------------------------------------------------------------------------

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Checks that `bytes` is a protocol string (UTF-8, no NUL, at most 4096
/// bytes) and returns it.
pub fn parse_string(bytes: &[u8]) -> Result<String, ProtoError> {
    if bytes.len() > MAX_STRING_LEN || bytes.contains(&0) {
        return Err(ProtoError::BadString);
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError::BadString)
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// The commands this implementation serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    WriteZeroes,
    /// NBD_CMD_CACHE: bring a range into the export's cache, no data back.
    Cache,
    /// NBD_CMD_BLOCK_STATUS: which parts of a range are allocated.
    BlockStatus,
}

impl Command {
    /// The command's type number on the wire.
    pub fn code(self) -> u16 {
        match self {
            Command::Read => NBD_CMD_READ,
            Command::Write => NBD_CMD_WRITE,
            Command::Disc => NBD_CMD_DISC,
            Command::Flush => NBD_CMD_FLUSH,
            Command::Trim => NBD_CMD_TRIM,
            Command::WriteZeroes => NBD_CMD_WRITE_ZEROES,
            Command::Cache => NBD_CMD_CACHE,
            Command::BlockStatus => NBD_CMD_BLOCK_STATUS,
        }
    }

    /// The command for a type number, if it is one we serve.
    pub fn from_code(code: u16) -> Option<Command> {
        Some(match code {
            NBD_CMD_READ => Command::Read,
            NBD_CMD_WRITE => Command::Write,
            NBD_CMD_DISC => Command::Disc,
            NBD_CMD_FLUSH => Command::Flush,
            NBD_CMD_TRIM => Command::Trim,
            NBD_CMD_WRITE_ZEROES => Command::WriteZeroes,
            NBD_CMD_CACHE => Command::Cache,
            NBD_CMD_BLOCK_STATUS => Command::BlockStatus,
            _ => return None,
        })
    }

    /// Command flags valid on this command. FUA is accepted on every command
    /// (the spec says servers must accept it even where it means nothing).
    pub fn allowed_flags(self) -> u16 {
        match self {
            Command::Read => NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_DF,
            Command::WriteZeroes => NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO,
            Command::BlockStatus => NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_REQ_ONE,
            _ => NBD_CMD_FLAG_FUA,
        }
    }

    /// Whether `offset + length` describes a range of the export that must
    /// lie within it.
    pub fn has_range(self) -> bool {
        matches!(
            self,
            Command::Read
                | Command::Write
                | Command::Trim
                | Command::WriteZeroes
                | Command::Cache
                | Command::BlockStatus
        )
    }
}

/// Command flags of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmdFlags(pub u16);

impl CmdFlags {
    /// Force unit access.
    pub fn fua(self) -> bool {
        self.0 & NBD_CMD_FLAG_FUA != 0
    }
    /// Do not punch a hole (WRITE_ZEROES).
    pub fn no_hole(self) -> bool {
        self.0 & NBD_CMD_FLAG_NO_HOLE != 0
    }
    /// Fail at once unless the zeroing is quick (WRITE_ZEROES).
    pub fn fast_zero(self) -> bool {
        self.0 & NBD_CMD_FLAG_FAST_ZERO != 0
    }
    /// One extent is enough (BLOCK_STATUS).
    pub fn req_one(self) -> bool {
        self.0 & NBD_CMD_FLAG_REQ_ONE != 0
    }
    /// Do not fragment the read reply.
    pub fn df(self) -> bool {
        self.0 & NBD_CMD_FLAG_DF != 0
    }
}

/// A validated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub handle: u64,
    pub command: Command,
    pub flags: CmdFlags,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// The request's header on the wire (the payload of a write follows it).
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        RequestHeader {
            flags: self.flags.0,
            command: self.command.code(),
            handle: self.handle,
            offset: self.offset,
            length: self.length,
        }
        .encode()
    }

    /// Bytes of payload that follow the header.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
            self.length
        } else {
            0
        }
    }
}

/// A request header as it is on the wire, before validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
    /// Splits 28 bytes into fields; only the magic is checked.
    pub fn decode(buf: &[u8; REQUEST_HEADER_LEN]) -> Result<RequestHeader, ProtoError> {
        let magic = be32(buf, 0);
        if magic != NBD_REQUEST_MAGIC {
            return Err(ProtoError::BadRequestMagic(magic));
        }
        Ok(RequestHeader {
            flags: be16(buf, 4),
            command: be16(buf, 6),
            handle: be64(buf, 8),
            offset: be64(buf, 16),
            length: be32(buf, 24),
        })
    }

    /// The header's 28 bytes.
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decodes and validates a request header: magic, command, flags valid
    /// for the command, `offset + length` without overflow, and a READ or
    /// WRITE length at most `max_payload`. Export bounds and alignment are
    /// the server's business (the parser does not know the export).
    ///
    /// The length of TRIM and WRITE_ZEROES is not limited: it carries no
    /// payload, and the export handles it in pieces.
    pub fn parse(buf: &[u8; REQUEST_HEADER_LEN], max_payload: u32) -> Result<Request, ProtoError> {
        let h = RequestHeader::decode(buf)?;
        let command = Command::from_code(h.command).ok_or(ProtoError::UnknownCommand {
            handle: h.handle,
            command: h.command,
        })?;
        // A write's payload follows the header whatever else is wrong with
        // it, so a rejection must say how much to skip.
        let payload = if command == Command::Write { h.length } else { 0 };
        if matches!(command, Command::Read | Command::Write) && h.length > max_payload {
            return Err(ProtoError::TooLong {
                handle: h.handle,
                command,
                length: h.length,
                max: max_payload,
            });
        }
        if h.flags & !command.allowed_flags() != 0 {
            return Err(ProtoError::InvalidFlags {
                handle: h.handle,
                command,
                flags: h.flags,
                payload,
            });
        }
        if command.has_range() && h.offset.checked_add(u64::from(h.length)).is_none() {
            return Err(ProtoError::RangeOverflow {
                handle: h.handle,
                command,
                offset: h.offset,
                length: h.length,
                payload,
            });
        }
        Ok(Request {
            handle: h.handle,
            command,
            flags: CmdFlags(h.flags),
            offset: h.offset,
            length: h.length,
        })
    }
}

// ---------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------

/// A simple reply header (the data of a successful read follows it).
pub fn encode_simple_reply(handle: u64, errno: u32) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&errno.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// A structured reply chunk header for a payload of `length` bytes.
pub fn encode_structured_header(
    handle: u64,
    flags: u16,
    chunk_type: u16,
    length: u32,
) -> [u8; STRUCTURED_HEADER_LEN] {
    let mut b = [0u8; STRUCTURED_HEADER_LEN];
    b[0..4].copy_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// The final `NBD_REPLY_TYPE_NONE` chunk.
pub fn encode_chunk_none(handle: u64) -> [u8; STRUCTURED_HEADER_LEN] {
    encode_structured_header(handle, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0)
}

/// Header and offset of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk carrying
/// `data_len` bytes (which the caller sends right after). `data_len` must be
/// at least 1 and at most `u32::MAX - 8`; `None` otherwise.
pub fn encode_chunk_offset_data_header(
    handle: u64,
    offset: u64,
    data_len: u32,
    done: bool,
) -> Option<[u8; STRUCTURED_HEADER_LEN + 8]> {
    if data_len == 0 {
        return None;
    }
    let length = data_len.checked_add(8)?;
    let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
    let mut b = [0u8; STRUCTURED_HEADER_LEN + 8];
    b[..STRUCTURED_HEADER_LEN].copy_from_slice(&encode_structured_header(
        handle,
        flags,
        NBD_REPLY_TYPE_OFFSET_DATA,
        length,
    ));
    b[STRUCTURED_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
    Some(b)
}

/// Truncates `message` to the protocol's string limit at a character
/// boundary.
fn clip_message(message: &str) -> &str {
    if message.len() <= MAX_STRING_LEN {
        return message;
    }
    let mut end = MAX_STRING_LEN;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// A complete `NBD_REPLY_TYPE_ERROR` chunk with a message for humans.
/// `errno` 0 is not a valid error and is sent as EIO.
pub fn encode_chunk_error(handle: u64, errno: u32, message: &str, done: bool) -> Vec<u8> {
    encode_error_chunk(handle, errno, message, None, done)
}

/// A complete `NBD_REPLY_TYPE_ERROR_OFFSET` chunk.
pub fn encode_chunk_error_offset(handle: u64, errno: u32, message: &str, offset: u64, done: bool) -> Vec<u8> {
    encode_error_chunk(handle, errno, message, Some(offset), done)
}

fn encode_error_chunk(handle: u64, errno: u32, message: &str, offset: Option<u64>, done: bool) -> Vec<u8> {
    let errno = if errno == 0 { NBD_EIO } else { errno };
    let message = clip_message(message).as_bytes();
    let extra = if offset.is_some() { 8 } else { 0 };
    let length = 6 + message.len() + extra;
    let chunk_type = if offset.is_some() {
        NBD_REPLY_TYPE_ERROR_OFFSET
    } else {
        NBD_REPLY_TYPE_ERROR
    };
    let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
    let mut b = Vec::with_capacity(STRUCTURED_HEADER_LEN + length);
    // Lengths are bounded by MAX_STRING_LEN + 14, far below u32/u16 limits.
    b.extend_from_slice(&encode_structured_header(
        handle,
        flags,
        chunk_type,
        length as u32,
    ));
    b.extend_from_slice(&errno.to_be_bytes());
    b.extend_from_slice(&(message.len() as u16).to_be_bytes());
    b.extend_from_slice(message);
    if let Some(offset) = offset {
        b.extend_from_slice(&offset.to_be_bytes());
    }
    b
}

/// A parsed simple reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub errno: u32,
    pub handle: u64,
}

impl SimpleReply {
    /// Parses 16 bytes of a simple reply.
    pub fn parse(buf: &[u8; SIMPLE_REPLY_LEN]) -> Result<SimpleReply, ProtoError> {
        let magic = be32(buf, 0);
        if magic != NBD_SIMPLE_REPLY_MAGIC {
            return Err(ProtoError::BadReplyMagic(magic));
        }
        Ok(SimpleReply {
            errno: be32(buf, 4),
            handle: be64(buf, 8),
        })
    }
}

/// A parsed structured reply chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructuredHeader {
    pub flags: u16,
    pub chunk_type: u16,
    pub handle: u64,
    pub length: u32,
}

impl StructuredHeader {
    /// Parses 20 bytes of a structured reply chunk header.
    pub fn parse(buf: &[u8; STRUCTURED_HEADER_LEN]) -> Result<StructuredHeader, ProtoError> {
        let magic = be32(buf, 0);
        if magic != NBD_STRUCTURED_REPLY_MAGIC {
            return Err(ProtoError::BadReplyMagic(magic));
        }
        Ok(StructuredHeader {
            flags: be16(buf, 4),
            chunk_type: be16(buf, 6),
            handle: be64(buf, 8),
            length: be32(buf, 16),
        })
    }

    /// Whether this is the last chunk of its reply.
    pub fn done(&self) -> bool {
        self.flags & NBD_REPLY_FLAG_DONE != 0
    }
}

/// The payload of an error chunk: error number, message and (for
/// ERROR_OFFSET) the offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorChunk {
    pub errno: u32,
    pub message: String,
    pub offset: Option<u64>,
}

/// Parses the payload of an error chunk of type `chunk_type`.
pub fn parse_error_chunk(chunk_type: u16, payload: &[u8]) -> Result<ErrorChunk, ProtoError> {
    let bad = ProtoError::Malformed { what: "error chunk" };
    if payload.len() < 6 {
        return Err(bad);
    }
    let errno = be32(payload, 0);
    let mlen = usize::from(be16(payload, 4));
    let rest = &payload[6..];
    if mlen > rest.len() {
        return Err(bad);
    }
    let message = String::from_utf8_lossy(&rest[..mlen]).into_owned();
    let tail = &rest[mlen..];
    let offset = if chunk_type == NBD_REPLY_TYPE_ERROR_OFFSET {
        if tail.len() != 8 {
            return Err(bad);
        }
        Some(be64(tail, 0))
    } else {
        None
    };
    Ok(ErrorChunk {
        errno,
        message,
        offset,
    })
}

// ---------------------------------------------------------------------------
// Handshake and options
// ---------------------------------------------------------------------------

/// The server's greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    b
}

/// Parses the server's greeting and returns its handshake flags. An
/// oldstyle greeting (whose second magic is `cliserv_magic`) is refused.
pub fn parse_greeting(buf: &[u8; GREETING_LEN]) -> Result<u16, ProtoError> {
    if be64(buf, 0) != NBD_MAGIC || be64(buf, 8) != IHAVEOPT {
        return Err(ProtoError::BadGreeting);
    }
    Ok(be16(buf, 16))
}

/// An option header sent by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

impl OptionHeader {
    /// Parses 16 bytes of an option header.
    pub fn parse(buf: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, ProtoError> {
        let magic = be64(buf, 0);
        if magic != IHAVEOPT {
            return Err(ProtoError::BadOptionMagic(magic));
        }
        Ok(OptionHeader {
            option: be32(buf, 8),
            length: be32(buf, 12),
        })
    }
}

/// An option as the client sends it: header and data.
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(OPTION_HEADER_LEN + data.len());
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// An option reply: header and data.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(OPTION_REPLY_HEADER_LEN + data.len());
    b.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&reply_type.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// A parsed option reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

impl OptionReplyHeader {
    /// Parses 20 bytes of an option reply header.
    pub fn parse(buf: &[u8; OPTION_REPLY_HEADER_LEN]) -> Result<OptionReplyHeader, ProtoError> {
        let magic = be64(buf, 0);
        if magic != OPTION_REPLY_MAGIC {
            return Err(ProtoError::BadOptionReplyMagic(magic));
        }
        Ok(OptionReplyHeader {
            option: be32(buf, 8),
            reply_type: be32(buf, 12),
            length: be32(buf, 16),
        })
    }

    /// Whether the reply is an error (bit 31).
    pub fn is_error(&self) -> bool {
        self.reply_type & NBD_REP_FLAG_ERROR != 0
    }
}

/// The data of an NBD_OPT_INFO or NBD_OPT_GO: export name and the
/// information types the client asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// The data of NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT: an
/// export name and the queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    /// Parses the option data; every length must agree exactly with the
    /// option's length.
    pub fn parse(data: &[u8]) -> Result<MetaContextRequest, ProtoError> {
        let bad = ProtoError::Malformed {
            what: "NBD_OPT_*_META_CONTEXT data",
        };
        let string = |at: usize| -> Result<(String, usize), ProtoError> {
            let len = be32(data.get(at..at + 4).ok_or(bad.clone())?, 0) as usize;
            let end = (at + 4)
                .checked_add(len)
                .filter(|&e| e <= data.len())
                .ok_or(bad.clone())?;
            Ok((parse_string(&data[at + 4..end])?, end))
        };
        let (export, mut at) = string(0)?;
        let count = be32(data.get(at..at + 4).ok_or(bad.clone())?, 0);
        at += 4;
        let mut queries = Vec::new();
        for _ in 0..count {
            let (query, end) = string(at)?;
            queries.push(query);
            at = end;
        }
        if at != data.len() {
            return Err(bad);
        }
        Ok(MetaContextRequest { export, queries })
    }

    /// The option data for this request.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(self.export.len() as u32).to_be_bytes());
        b.extend_from_slice(self.export.as_bytes());
        b.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q.as_bytes());
        }
        b
    }
}

/// An NBD_REP_META_CONTEXT reply's data: the context's id and name.
pub fn encode_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

/// One extent of a block status reply: `length` bytes with `flags`
/// (`NBD_STATE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u32,
    pub flags: u32,
}

/// A whole `NBD_REPLY_TYPE_BLOCK_STATUS` chunk (the last of its reply).
pub fn encode_block_status_reply(handle: u64, context: u32, extents: &[Extent]) -> Vec<u8> {
    let payload = 4 + 8 * extents.len() as u32;
    let mut b =
        encode_structured_header(handle, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS, payload).to_vec();
    b.extend_from_slice(&context.to_be_bytes());
    for e in extents {
        b.extend_from_slice(&e.length.to_be_bytes());
        b.extend_from_slice(&e.flags.to_be_bytes());
    }
    b
}

impl InfoRequest {
    /// Parses the option data; every length must agree exactly with the
    /// option's length.
    pub fn parse(data: &[u8]) -> Result<InfoRequest, ProtoError> {
        let bad = ProtoError::Malformed {
            what: "NBD_OPT_INFO/GO data",
        };
        if data.len() < 6 {
            return Err(bad);
        }
        let name_len = be32(data, 0) as usize;
        if name_len > data.len() - 6 {
            return Err(bad);
        }
        let name = parse_string(&data[4..4 + name_len])?;
        let rest = &data[4 + name_len..];
        let count = usize::from(be16(rest, 0));
        let list = &rest[2..];
        if list.len() != count * 2 {
            return Err(bad);
        }
        let requests = list.chunks_exact(2).map(|c| be16(c, 0)).collect();
        Ok(InfoRequest { name, requests })
    }

    /// The option data for this request.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(6 + self.name.len() + 2 * self.requests.len());
        b.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        b.extend_from_slice(self.name.as_bytes());
        b.extend_from_slice(&(self.requests.len() as u16).to_be_bytes());
        for r in &self.requests {
            b.extend_from_slice(&r.to_be_bytes());
        }
        b
    }
}

/// One NBD_REP_INFO payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    Export {
        size: u64,
        flags: u16,
    },
    Name(String),
    Description(String),
    BlockSize {
        minimum: u32,
        preferred: u32,
        maximum: u32,
    },
    /// An information type this implementation does not know (ignored).
    Unknown(u16),
}

impl Info {
    /// The NBD_REP_INFO data for this item.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Info::Export { size, flags } => {
                b.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
                b.extend_from_slice(&size.to_be_bytes());
                b.extend_from_slice(&flags.to_be_bytes());
            }
            Info::Name(s) => {
                b.extend_from_slice(&NBD_INFO_NAME.to_be_bytes());
                b.extend_from_slice(clip_message(s).as_bytes());
            }
            Info::Description(s) => {
                b.extend_from_slice(&NBD_INFO_DESCRIPTION.to_be_bytes());
                b.extend_from_slice(clip_message(s).as_bytes());
            }
            Info::BlockSize {
                minimum,
                preferred,
                maximum,
            } => {
                b.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
                b.extend_from_slice(&minimum.to_be_bytes());
                b.extend_from_slice(&preferred.to_be_bytes());
                b.extend_from_slice(&maximum.to_be_bytes());
            }
            Info::Unknown(t) => b.extend_from_slice(&t.to_be_bytes()),
        }
        b
    }

    /// Parses NBD_REP_INFO data.
    pub fn parse(data: &[u8]) -> Result<Info, ProtoError> {
        let bad = ProtoError::Malformed {
            what: "NBD_REP_INFO data",
        };
        if data.len() < 2 {
            return Err(bad);
        }
        let rest = &data[2..];
        Ok(match be16(data, 0) {
            NBD_INFO_EXPORT => {
                if rest.len() != 10 {
                    return Err(bad);
                }
                Info::Export {
                    size: be64(rest, 0),
                    flags: be16(rest, 8),
                }
            }
            NBD_INFO_NAME => Info::Name(parse_string(rest)?),
            NBD_INFO_DESCRIPTION => Info::Description(parse_string(rest)?),
            NBD_INFO_BLOCK_SIZE => {
                if rest.len() != 12 {
                    return Err(bad);
                }
                Info::BlockSize {
                    minimum: be32(rest, 0),
                    preferred: be32(rest, 4),
                    maximum: be32(rest, 8),
                }
            }
            other => Info::Unknown(other),
        })
    }
}

/// The NBD_REP_SERVER data for one export of a list.
pub fn encode_rep_server(name: &str, description: Option<&str>) -> Vec<u8> {
    let name = clip_message(name);
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    if let Some(d) = description {
        b.extend_from_slice(clip_message(d).as_bytes());
    }
    b
}

/// Parses NBD_REP_SERVER data into the export name and the optional
/// details that follow it.
pub fn parse_rep_server(data: &[u8]) -> Result<(String, String), ProtoError> {
    let bad = ProtoError::Malformed {
        what: "NBD_REP_SERVER data",
    };
    if data.len() < 4 {
        return Err(bad);
    }
    let len = be32(data, 0) as usize;
    if len > data.len() - 4 {
        return Err(bad);
    }
    let name = parse_string(&data[4..4 + len])?;
    let details = String::from_utf8_lossy(&data[4 + len..]).into_owned();
    Ok((name, details))
}

/// The reply to NBD_OPT_EXPORT_NAME: size, transmission flags and, unless
/// `no_zeroes`, 124 zero bytes.
pub fn encode_export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(10 + EXPORT_NAME_ZEROES);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        b.resize(10 + EXPORT_NAME_ZEROES, 0);
    }
    b
}

#[cfg(test)]
mod tests;
