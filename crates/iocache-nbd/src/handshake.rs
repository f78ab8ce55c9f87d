//! The server side of the NBD handshake: fixed newstyle option haggling up to
//! the transmission phase.
//!
//! It is a function over any `Read + Write` stream rather than a socket so
//! the whole negotiation can be driven by tests (and by a property test that
//! feeds it random bytes) without a network. Every allocation it makes is
//! bounded by [`NegotiationLimits`], and every option it reads consumes at
//! least 16 bytes of input, so a finite input always ends the negotiation.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::export::{Export, ExportLookup};
use crate::proto::*;
use crate::tls::TlsMode;

/// Limits on what a client can make the server do during negotiation.
#[derive(Debug, Clone)]
pub struct NegotiationLimits {
    /// Largest option data the server reads into memory; longer options are
    /// skipped and answered with NBD_REP_ERR_TOO_BIG.
    pub max_option_len: u32,
    /// Options per connection before the server hangs up.
    pub max_options: u32,
    /// Largest READ/WRITE payload the server accepts; the advertised maximum
    /// block size is capped by it.
    pub max_payload: u32,
}

impl Default for NegotiationLimits {
    fn default() -> Self {
        NegotiationLimits {
            max_option_len: 16 * 1024,
            max_options: 1024,
            max_payload: DEFAULT_MAX_PAYLOAD,
        }
    }
}

/// The outcome of a successful negotiation: what transmission will serve.
#[derive(Clone)]
pub struct Negotiated {
    /// The export's canonical name.
    pub name: String,
    pub export: Arc<dyn Export>,
    /// Whether structured replies were negotiated.
    pub structured: bool,
    /// The transmission flags sent to the client.
    pub flags: u16,
    /// Effective (minimum, preferred, maximum) block sizes, the maximum
    /// capped by [`NegotiationLimits::max_payload`].
    pub block_sizes: (u32, u32, u32),
    /// `base:allocation` was selected (NBD_OPT_SET_META_CONTEXT) for this
    /// export: NBD_CMD_BLOCK_STATUS is served.
    pub block_status: bool,
}

impl std::fmt::Debug for Negotiated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Negotiated")
            .field("name", &self.name)
            .field("structured", &self.structured)
            .field("flags", &format_args!("{:#06x}", self.flags))
            .field("block_sizes", &self.block_sizes)
            .finish()
    }
}

/// Why a negotiation ended without entering transmission.
#[derive(Debug, Error)]
pub enum HandshakeError {
    #[error("I/O error during handshake: {0}")]
    Io(#[from] io::Error),
    #[error("protocol error during handshake: {0}")]
    Proto(#[from] ProtoError),
    #[error("client flags {0:#x} include unknown bits")]
    UnknownClientFlags(u32),
    #[error("client does not speak fixed newstyle negotiation")]
    NotFixedNewstyle,
    #[error("NBD_OPT_EXPORT_NAME for unknown export {0:?}")]
    UnknownExport(String),
    #[error("too many options (limit {0})")]
    TooManyOptions(u32),
    #[error("client aborted the negotiation")]
    Aborted,
    #[error("the connection was closed during the handshake")]
    Closed,
    #[error("NBD_OPT_EXPORT_NAME before TLS on a server that requires TLS")]
    TlsRequired,
}

/// Where option haggling stands: kept across a TLS upgrade, which ends one
/// call of [`negotiate_tls`] and starts the next on the upgraded stream.
#[derive(Clone, Debug, Default)]
pub struct Haggle {
    greeted: bool,
    no_zeroes: bool,
    structured: bool,
    options: u32,
    tls_active: bool,
    /// The export `base:allocation` was last selected for, if any.
    meta_context: Option<String>,
}

impl Haggle {
    /// Whether the session runs inside TLS.
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// Transmission on `export` (`name` is its canonical name) with what
    /// the options so far negotiated.
    fn done(
        &self,
        name: String,
        export: Arc<dyn Export>,
        flags: u16,
        block_sizes: (u32, u32, u32),
    ) -> Negotiation {
        let block_status = self.structured && self.meta_context.as_deref() == Some(name.as_str());
        Negotiation::Done(Negotiated {
            name,
            export,
            structured: self.structured,
            flags,
            block_sizes,
            block_status,
        })
    }
}

/// How a call of [`negotiate_tls`] ended.
pub enum Negotiation {
    /// The client chose an export: transmission starts.
    Done(Negotiated),
    /// The client asked for TLS and was told yes: the caller must run the
    /// TLS handshake on the stream and go on with [`negotiate_tls`] over
    /// the upgraded stream (or drop the connection).
    StartTls,
}

/// The transmission flags for `export`.
pub fn transmission_flags(export: &dyn Export, structured: bool) -> u16 {
    let mut flags = NBD_FLAG_HAS_FLAGS
        | NBD_FLAG_SEND_FLUSH
        | NBD_FLAG_SEND_FUA
        | NBD_FLAG_SEND_TRIM
        | NBD_FLAG_SEND_WRITE_ZEROES
        // Answered at once with ENOTSUP where the export cannot zero
        // quickly (`Export::zeroes_fast`), as the protocol allows.
        | NBD_FLAG_SEND_FAST_ZERO;
    if export.read_only() {
        flags |= NBD_FLAG_READ_ONLY;
    }
    if export.can_multi_conn() {
        flags |= NBD_FLAG_CAN_MULTI_CONN;
    }
    if export.can_cache() {
        flags |= NBD_FLAG_SEND_CACHE;
    }
    if structured {
        // Every read is answered with one content chunk, so DF costs nothing.
        flags |= NBD_FLAG_SEND_DF;
    }
    flags
}

/// The block sizes to advertise for `export` under `max_payload`.
pub fn effective_block_sizes(export: &dyn Export, max_payload: u32) -> (u32, u32, u32) {
    let (min, pref, max) = export.block_sizes();
    let min = min.max(1);
    let capped = max.min(max_payload);
    let capped = (capped / min * min).max(min);
    // The preferred size may not exceed the maximum: shrink it to the
    // largest power of two that fits (still at least 512 when the maximum
    // is, which the server's payload limit guarantees).
    let pref = if pref > capped {
        1 << (31 - capped.leading_zeros())
    } else {
        pref
    };
    (min, pref.max(min), capped)
}

fn read_exact_array<const N: usize, S: Read>(s: &mut S) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Reads and drops `n` bytes without buffering them.
pub(crate) fn discard<S: Read>(s: &mut S, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut s.take(n), &mut io::sink())?;
    if copied < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn reply<S: Write>(s: &mut S, option: u32, reply_type: u32, data: &[u8]) -> io::Result<()> {
    s.write_all(&encode_option_reply(option, reply_type, data))
}

fn reply_error<S: Write>(s: &mut S, option: u32, reply_type: u32, message: &str) -> io::Result<()> {
    reply(s, option, reply_type, message.as_bytes())
}

/// An export's canonical name and the export, as
/// [`ExportLookup::find_export`] finds them.
type FoundExport = (String, Arc<dyn Export>);

/// The request of option `opt` that names an export (`name` picks the
/// name), and that export; `None` when the data did not parse or names no
/// export, after answering the option with the error.
fn find_requested<S: Write, R>(
    stream: &mut S,
    opt: u32,
    exports: &dyn ExportLookup,
    parsed: Result<R, ProtoError>,
    name: fn(&R) -> &str,
) -> io::Result<Option<(R, FoundExport)>> {
    let req = match parsed {
        Ok(r) => r,
        Err(e) => {
            reply_error(stream, opt, NBD_REP_ERR_INVALID, &e.to_string())?;
            return Ok(None);
        }
    };
    let Some(found) = exports.find_export(name(&req)) else {
        reply_error(stream, opt, NBD_REP_ERR_UNKNOWN, "no such export")?;
        return Ok(None);
    };
    Ok(Some((req, found)))
}

/// Runs the server side of the handshake on `stream`.
///
/// Sends the greeting (fixed newstyle, no-zeroes), requires the client to
/// answer with fixed newstyle, then answers options until the client enters
/// transmission with NBD_OPT_GO or NBD_OPT_EXPORT_NAME. Supported options:
/// EXPORT_NAME, ABORT, LIST, INFO, GO (with NBD_INFO_EXPORT, NAME,
/// DESCRIPTION, BLOCK_SIZE), STRUCTURED_REPLY and the metadata context
/// `base:allocation` (LIST_ and SET_META_CONTEXT); STARTTLS (without TLS:
/// see [`negotiate_tls`]), extended headers and unknown options get
/// NBD_REP_ERR_UNSUP.
/// While `shutting_down` is set, options other than ABORT get
/// NBD_REP_ERR_SHUTDOWN.
pub fn negotiate<S: Read + Write>(
    stream: &mut S,
    exports: &dyn ExportLookup,
    limits: &NegotiationLimits,
    shutting_down: &AtomicBool,
) -> Result<Negotiated, HandshakeError> {
    match negotiate_tls(
        stream,
        exports,
        limits,
        shutting_down,
        TlsMode::Off,
        &mut Haggle::default(),
    )? {
        Negotiation::Done(n) => Ok(n),
        // TlsMode::Off answers STARTTLS with NBD_REP_ERR_UNSUP.
        Negotiation::StartTls => unreachable!("STARTTLS accepted with TLS off"),
    }
}

/// [`negotiate`] with TLS: `tls` says whether NBD_OPT_STARTTLS is refused
/// (off), accepted (on), or required before any other option (require:
/// NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME ends the session). On
/// STARTTLS the call returns [`Negotiation::StartTls`] after acknowledging;
/// option haggling then goes on, inside TLS, with a second call on the
/// upgraded stream and the same `haggle` (what was negotiated before TLS,
/// such as structured replies, is forgotten: only options sent inside TLS
/// count).
pub fn negotiate_tls<S: Read + Write>(
    stream: &mut S,
    exports: &dyn ExportLookup,
    limits: &NegotiationLimits,
    shutting_down: &AtomicBool,
    tls: TlsMode,
    haggle: &mut Haggle,
) -> Result<Negotiation, HandshakeError> {
    if !haggle.greeted {
        stream.write_all(&encode_greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES))?;
        stream.flush()?;
        let client_flags = u32::from_be_bytes(read_exact_array::<4, _>(stream)?);
        if client_flags & !KNOWN_CLIENT_FLAGS != 0 {
            return Err(HandshakeError::UnknownClientFlags(client_flags));
        }
        if client_flags & NBD_FLAG_C_FIXED_NEWSTYLE == 0 {
            return Err(HandshakeError::NotFixedNewstyle);
        }
        haggle.greeted = true;
        haggle.no_zeroes = client_flags & NBD_FLAG_C_NO_ZEROES != 0;
    }
    let no_zeroes = haggle.no_zeroes;
    loop {
        haggle.options += 1;
        if haggle.options > limits.max_options {
            return Err(HandshakeError::TooManyOptions(limits.max_options));
        }
        stream.flush()?;
        let header = OptionHeader::parse(&read_exact_array::<OPTION_HEADER_LEN, _>(stream)?)?;
        let opt = header.option;
        if header.length > limits.max_option_len {
            discard(stream, u64::from(header.length))?;
            if opt == NBD_OPT_EXPORT_NAME {
                // EXPORT_NAME cannot be answered with an error.
                return Err(HandshakeError::UnknownExport("<too long>".into()));
            }
            reply_error(stream, opt, NBD_REP_ERR_TOO_BIG, "option data too long")?;
            continue;
        }
        let mut data = vec![0u8; header.length as usize];
        stream.read_exact(&mut data)?;

        if shutting_down.load(Ordering::Relaxed) && opt != NBD_OPT_ABORT {
            if opt == NBD_OPT_EXPORT_NAME {
                return Err(HandshakeError::Aborted);
            }
            reply_error(stream, opt, NBD_REP_ERR_SHUTDOWN, "server is shutting down")?;
            continue;
        }

        if tls == TlsMode::Require && !haggle.tls_active && opt != NBD_OPT_STARTTLS && opt != NBD_OPT_ABORT {
            if opt == NBD_OPT_EXPORT_NAME {
                // It cannot be answered with an error.
                return Err(HandshakeError::TlsRequired);
            }
            reply_error(
                stream,
                opt,
                NBD_REP_ERR_TLS_REQD,
                "this server requires TLS: send NBD_OPT_STARTTLS first",
            )?;
            continue;
        }

        match opt {
            NBD_OPT_STARTTLS if tls != TlsMode::Off => {
                if haggle.tls_active {
                    reply_error(stream, opt, NBD_REP_ERR_INVALID, "TLS is already negotiated")?;
                } else if !data.is_empty() {
                    reply_error(stream, opt, NBD_REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data")?;
                } else {
                    reply(stream, opt, NBD_REP_ACK, &[])?;
                    stream.flush()?;
                    haggle.tls_active = true;
                    haggle.structured = false;
                    haggle.meta_context = None;
                    return Ok(Negotiation::StartTls);
                }
            }
            NBD_OPT_EXPORT_NAME => {
                let name = parse_string(&data)?;
                let Some((canonical, export)) = exports.find_export(&name) else {
                    return Err(HandshakeError::UnknownExport(name));
                };
                let flags = transmission_flags(export.as_ref(), haggle.structured);
                if !exports.entering_transmission(&canonical) {
                    return Err(HandshakeError::Closed);
                }
                stream.write_all(&encode_export_name_reply(export.size_bytes(), flags, no_zeroes))?;
                stream.flush()?;
                let block_sizes = effective_block_sizes(export.as_ref(), limits.max_payload);
                return Ok(haggle.done(canonical, export, flags, block_sizes));
            }
            NBD_OPT_ABORT => {
                // Best effort: the client may already have hung up.
                let _ = reply(stream, opt, NBD_REP_ACK, &[]).and_then(|_| stream.flush());
                return Err(HandshakeError::Aborted);
            }
            NBD_OPT_LIST => {
                if !data.is_empty() {
                    reply_error(stream, opt, NBD_REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                    continue;
                }
                for (name, description) in exports.list_exports() {
                    let d = encode_rep_server(&name, description.as_deref());
                    reply(stream, opt, NBD_REP_SERVER, &d)?;
                }
                reply(stream, opt, NBD_REP_ACK, &[])?;
            }
            NBD_OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    reply_error(stream, opt, NBD_REP_ERR_INVALID, "option takes no data")?;
                } else if haggle.structured {
                    reply_error(stream, opt, NBD_REP_ERR_INVALID, "already negotiated")?;
                } else {
                    haggle.structured = true;
                    reply(stream, opt, NBD_REP_ACK, &[])?;
                }
            }
            NBD_OPT_INFO | NBD_OPT_GO => {
                let parsed = InfoRequest::parse(&data);
                let Some((req, (canonical, export))) =
                    find_requested(stream, opt, exports, parsed, |r| r.name.as_str())?
                else {
                    continue;
                };
                let flags = transmission_flags(export.as_ref(), haggle.structured);
                let block_sizes = effective_block_sizes(export.as_ref(), limits.max_payload);
                let mut infos = vec![Info::Export {
                    size: export.size_bytes(),
                    flags,
                }];
                if req.requests.contains(&NBD_INFO_NAME) {
                    infos.push(Info::Name(canonical.clone()));
                }
                if req.requests.contains(&NBD_INFO_DESCRIPTION) {
                    if let Some(d) = export.description() {
                        infos.push(Info::Description(d));
                    }
                }
                // Sent whether asked for or not: the server enforces them.
                infos.push(Info::BlockSize {
                    minimum: block_sizes.0,
                    preferred: block_sizes.1,
                    maximum: block_sizes.2,
                });
                if opt == NBD_OPT_GO && !exports.entering_transmission(&canonical) {
                    return Err(HandshakeError::Closed);
                }
                for info in &infos {
                    reply(stream, opt, NBD_REP_INFO, &info.encode())?;
                }
                reply(stream, opt, NBD_REP_ACK, &[])?;
                if opt == NBD_OPT_GO {
                    stream.flush()?;
                    return Ok(haggle.done(canonical, export, flags, block_sizes));
                }
            }
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
                let set = opt == NBD_OPT_SET_META_CONTEXT;
                if set && !haggle.structured {
                    reply_error(
                        stream,
                        opt,
                        NBD_REP_ERR_INVALID,
                        "metadata contexts need structured replies",
                    )?;
                    continue;
                }
                let parsed = MetaContextRequest::parse(&data);
                let Some((req, (canonical, _))) =
                    find_requested(stream, opt, exports, parsed, |r| r.export.as_str())?
                else {
                    continue;
                };
                // `base:allocation` is the one context; a listing with no
                // query, or the query `base:`, names it too.
                let chosen = req.queries.iter().any(|q| q == BASE_ALLOCATION)
                    || (!set && (req.queries.is_empty() || req.queries.iter().any(|q| q == "base:")));
                if set {
                    haggle.meta_context = chosen.then_some(canonical);
                }
                if chosen {
                    let id = if set { BASE_ALLOCATION_ID } else { 0 };
                    reply(
                        stream,
                        opt,
                        NBD_REP_META_CONTEXT,
                        &encode_meta_context(id, BASE_ALLOCATION),
                    )?;
                }
                reply(stream, opt, NBD_REP_ACK, &[])?;
            }
            _ => {
                reply_error(stream, opt, NBD_REP_ERR_UNSUP, "option not supported")?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{Exports, MemExport};
    use crate::fuzzing::MemStream;

    fn exports() -> Exports {
        let mut x = Exports::new();
        x.insert(
            "disk",
            Arc::new(MemExport::new(1 << 20).with_description("a disk")),
        );
        x.insert("other", Arc::new(MemExport::new(4096)));
        x
    }

    fn run(input: Vec<u8>) -> (Result<Negotiated, HandshakeError>, Vec<u8>) {
        run_with(input, &NegotiationLimits::default(), false)
    }

    fn run_with(
        input: Vec<u8>,
        limits: &NegotiationLimits,
        shutting: bool,
    ) -> (Result<Negotiated, HandshakeError>, Vec<u8>) {
        let mut d = MemStream::new(input);
        let r = negotiate(&mut d, &exports(), limits, &AtomicBool::new(shutting));
        (r, d.output())
    }

    /// Splits server output after the greeting into option replies.
    fn replies(out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        let mut rest = &out[GREETING_LEN..];
        while rest.len() >= OPTION_REPLY_HEADER_LEN {
            let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
            h.copy_from_slice(&rest[..OPTION_REPLY_HEADER_LEN]);
            let Ok(h) = OptionReplyHeader::parse(&h) else {
                break;
            };
            let end = OPTION_REPLY_HEADER_LEN + h.length as usize;
            v.push((
                h.option,
                h.reply_type,
                rest[OPTION_REPLY_HEADER_LEN..end].to_vec(),
            ));
            rest = &rest[end..];
        }
        v
    }

    fn client_flags(f: u32) -> Vec<u8> {
        f.to_be_bytes().to_vec()
    }

    fn go(name: &str, requests: &[u16]) -> Vec<u8> {
        encode_option(
            NBD_OPT_GO,
            &InfoRequest {
                name: name.into(),
                requests: requests.to_vec(),
            }
            .encode(),
        )
    }

    /// Runs `input` through [`negotiate_tls`] in `mode` (one call).
    fn run_tls(
        input: Vec<u8>,
        mode: TlsMode,
        haggle: &mut Haggle,
    ) -> (Result<Negotiation, HandshakeError>, Vec<u8>) {
        let mut d = MemStream::new(input);
        let r = negotiate_tls(
            &mut d,
            &exports(),
            &NegotiationLimits::default(),
            &AtomicBool::new(false),
            mode,
            haggle,
        );
        (r, d.output())
    }

    #[test]
    fn required_tls_refuses_every_option_but_starttls_and_abort() {
        let mut input = client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
        input.extend(encode_option(NBD_OPT_LIST, &[]));
        input.extend(go("disk", &[]));
        input.extend(encode_option(NBD_OPT_STRUCTURED_REPLY, &[]));
        input.extend(encode_option(NBD_OPT_STARTTLS, &[1]));
        input.extend(encode_option(NBD_OPT_STARTTLS, &[]));
        let mut haggle = Haggle::default();
        let (r, out) = run_tls(input, TlsMode::Require, &mut haggle);
        assert!(matches!(r, Ok(Negotiation::StartTls)));
        assert!(haggle.tls_active());
        let got: Vec<(u32, u32)> = replies(&out).iter().map(|(o, t, _)| (*o, *t)).collect();
        assert_eq!(
            got,
            vec![
                (NBD_OPT_LIST, NBD_REP_ERR_TLS_REQD),
                (NBD_OPT_GO, NBD_REP_ERR_TLS_REQD),
                (NBD_OPT_STRUCTURED_REPLY, NBD_REP_ERR_TLS_REQD),
                (NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID),
                (NBD_OPT_STARTTLS, NBD_REP_ACK),
            ]
        );
        // Inside TLS (the same haggle, no new greeting): a second STARTTLS
        // is invalid, and the export is served.
        let mut input = encode_option(NBD_OPT_STARTTLS, &[]);
        input.extend(go("disk", &[]));
        let (r, out) = run_tls(input, TlsMode::Require, &mut haggle);
        let Ok(Negotiation::Done(n)) = r else {
            panic!("GO inside TLS failed")
        };
        assert_eq!(n.name, "disk");
        assert!(!out.starts_with(&NBD_MAGIC.to_be_bytes()), "no second greeting");
        // NBD_OPT_EXPORT_NAME before TLS cannot be answered: the session ends.
        let mut input = client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
        input.extend(encode_option(NBD_OPT_EXPORT_NAME, b"disk"));
        let (r, _) = run_tls(input, TlsMode::Require, &mut Haggle::default());
        assert!(matches!(r, Err(HandshakeError::TlsRequired)));
    }

    #[test]
    fn structured_replies_negotiated_before_tls_are_forgotten() {
        let mut input = client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
        input.extend(encode_option(NBD_OPT_STRUCTURED_REPLY, &[]));
        input.extend(encode_option(NBD_OPT_STARTTLS, &[]));
        let mut haggle = Haggle::default();
        let (r, _) = run_tls(input, TlsMode::On, &mut haggle);
        assert!(matches!(r, Ok(Negotiation::StartTls)));
        let (r, _) = run_tls(go("disk", &[]), TlsMode::On, &mut haggle);
        let Ok(Negotiation::Done(n)) = r else {
            panic!("GO failed")
        };
        assert!(!n.structured);
        // With TLS off, STARTTLS is unsupported and nothing else changes.
        let mut input = client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
        input.extend(encode_option(NBD_OPT_STARTTLS, &[]));
        input.extend(go("disk", &[]));
        let (r, out) = run_tls(input, TlsMode::Off, &mut Haggle::default());
        assert!(matches!(r, Ok(Negotiation::Done(_))));
        assert_eq!(replies(&out)[0].1, NBD_REP_ERR_UNSUP);
    }

    #[test]
    fn greeting_is_fixed_newstyle_with_no_zeroes() {
        let (r, out) = run(vec![]);
        assert!(matches!(r, Err(HandshakeError::Io(_))));
        assert_eq!(parse_greeting(out[..18].try_into().unwrap()).unwrap(), 3);
    }

    #[test]
    fn rejects_non_fixed_and_unknown_client_flags() {
        assert!(matches!(
            run(client_flags(0)).0,
            Err(HandshakeError::NotFixedNewstyle)
        ));
        assert!(matches!(
            run(client_flags(1 << 5 | 1)).0,
            Err(HandshakeError::UnknownClientFlags(_))
        ));
    }

    #[test]
    fn go_with_structured_replies() {
        let mut input = client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
        input.extend(encode_option(NBD_OPT_STRUCTURED_REPLY, &[]));
        input.extend(go(
            "disk",
            &[NBD_INFO_NAME, NBD_INFO_DESCRIPTION, NBD_INFO_BLOCK_SIZE],
        ));
        let (r, out) = run(input);
        let n = r.unwrap();
        assert!(n.structured);
        assert_eq!(n.name, "disk");
        assert_eq!(n.block_sizes, (512, 4096, 32 << 20));
        assert_ne!(n.flags & NBD_FLAG_CAN_MULTI_CONN, 0);
        assert_ne!(n.flags & NBD_FLAG_SEND_DF, 0);
        let reps = replies(&out);
        assert_eq!(reps[0], (NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, vec![]));
        let infos: Vec<Info> = reps[1..reps.len() - 1]
            .iter()
            .map(|(o, t, d)| {
                assert_eq!((*o, *t), (NBD_OPT_GO, NBD_REP_INFO));
                Info::parse(d).unwrap()
            })
            .collect();
        assert_eq!(
            infos,
            vec![
                Info::Export {
                    size: 1 << 20,
                    flags: n.flags
                },
                Info::Name("disk".into()),
                Info::Description("a disk".into()),
                Info::BlockSize {
                    minimum: 512,
                    preferred: 4096,
                    maximum: 32 << 20
                },
            ]
        );
        assert_eq!(reps.last().unwrap(), &(NBD_OPT_GO, NBD_REP_ACK, vec![]));
    }

    #[test]
    fn empty_name_is_the_default_export_and_unknown_names_err() {
        let mut input = client_flags(1);
        input.extend(go("nope", &[]));
        input.extend(encode_option(
            NBD_OPT_INFO,
            &InfoRequest {
                name: String::new(),
                requests: vec![],
            }
            .encode(),
        ));
        input.extend(go("", &[]));
        let (r, out) = run(input);
        let n = r.unwrap();
        assert_eq!(n.name, "disk");
        assert!(!n.structured);
        assert_eq!(n.flags & NBD_FLAG_SEND_DF, 0);
        let reps = replies(&out);
        assert_eq!(reps[0].1, NBD_REP_ERR_UNKNOWN);
        assert_eq!(reps[1].0, NBD_OPT_INFO);
        assert!(reps.iter().filter(|r| r.1 == NBD_REP_ACK).count() == 2);
    }

    #[test]
    fn export_name_with_and_without_zeroes() {
        for (flags, tail) in [(1u32, 134usize), (3, 10)] {
            let mut input = client_flags(flags);
            input.extend(encode_option(NBD_OPT_EXPORT_NAME, b"other"));
            let (r, out) = run(input);
            let n = r.unwrap();
            assert_eq!(n.export.size_bytes(), 4096);
            assert_eq!(out.len(), GREETING_LEN + tail);
            assert_eq!(&out[18..26], &4096u64.to_be_bytes());
        }
        let mut input = client_flags(1);
        input.extend(encode_option(NBD_OPT_EXPORT_NAME, b"missing"));
        assert!(matches!(run(input).0, Err(HandshakeError::UnknownExport(_))));
    }

    #[test]
    fn base_allocation_is_listed_and_selected_for_one_export() {
        let meta = |export: &str, queries: &[&str]| {
            MetaContextRequest {
                export: export.into(),
                queries: queries.iter().map(|q| q.to_string()).collect(),
            }
            .encode()
        };
        let mut input = client_flags(1);
        input.extend(encode_option(NBD_OPT_LIST_META_CONTEXT, &meta("disk", &[])));
        input.extend(encode_option(
            NBD_OPT_LIST_META_CONTEXT,
            &meta("disk", &["qemu:dirty-bitmap:x"]),
        ));
        input.extend(encode_option(NBD_OPT_STRUCTURED_REPLY, &[]));
        input.extend(encode_option(
            NBD_OPT_SET_META_CONTEXT,
            &meta("nosuch", &["base:allocation"]),
        ));
        input.extend(encode_option(
            NBD_OPT_SET_META_CONTEXT,
            &meta("disk", &["x:y", "base:allocation"]),
        ));
        input.extend(encode_option(
            NBD_OPT_GO,
            &InfoRequest {
                name: "disk".into(),
                requests: vec![],
            }
            .encode(),
        ));
        let (r, out) = run(input);
        let n = r.unwrap();
        assert!(n.block_status, "selected for the export entered");
        let reps = replies(&out);
        let types: Vec<u32> = reps.iter().map(|r| r.1).collect();
        assert_eq!(
            &types[..7],
            &[
                NBD_REP_META_CONTEXT,
                NBD_REP_ACK,
                NBD_REP_ACK,
                NBD_REP_ACK,
                NBD_REP_ERR_UNKNOWN,
                NBD_REP_META_CONTEXT,
                NBD_REP_ACK
            ]
        );
        assert_eq!(reps[0].2, encode_meta_context(0, BASE_ALLOCATION));
        assert_eq!(
            reps[5].2,
            encode_meta_context(BASE_ALLOCATION_ID, BASE_ALLOCATION)
        );
    }

    #[test]
    fn list_abort_unsupported_and_invalid() {
        let mut input = client_flags(1);
        input.extend(encode_option(NBD_OPT_LIST, &[]));
        input.extend(encode_option(NBD_OPT_LIST, b"x"));
        input.extend(encode_option(NBD_OPT_STARTTLS, &[]));
        input.extend(encode_option(NBD_OPT_SET_META_CONTEXT, &[0; 8]));
        input.extend(encode_option(0xdead, b"junk"));
        input.extend(encode_option(NBD_OPT_STRUCTURED_REPLY, b"x"));
        input.extend(encode_option(NBD_OPT_GO, b"\0\0"));
        input.extend(encode_option(NBD_OPT_ABORT, &[]));
        let (r, out) = run(input);
        assert!(matches!(r, Err(HandshakeError::Aborted)));
        let reps = replies(&out);
        let types: Vec<u32> = reps.iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            vec![
                NBD_REP_SERVER,
                NBD_REP_SERVER,
                NBD_REP_ACK,
                NBD_REP_ERR_INVALID,
                NBD_REP_ERR_UNSUP,
                // SET_META_CONTEXT before structured replies.
                NBD_REP_ERR_INVALID,
                NBD_REP_ERR_UNSUP,
                NBD_REP_ERR_INVALID,
                NBD_REP_ERR_INVALID,
                NBD_REP_ACK
            ]
        );
        assert_eq!(
            parse_rep_server(&reps[0].2).unwrap(),
            ("disk".into(), "a disk".into())
        );
        assert_eq!(reps[9].0, NBD_OPT_ABORT);
    }

    #[test]
    fn limits_are_enforced() {
        let limits = NegotiationLimits {
            max_option_len: 16,
            max_options: 3,
            max_payload: 1 << 20,
        };
        let mut input = client_flags(1);
        input.extend(encode_option(NBD_OPT_LIST, &[0; 100]));
        input.extend(encode_option(NBD_OPT_LIST, &[]));
        input.extend(encode_option(NBD_OPT_LIST, &[]));
        input.extend(encode_option(NBD_OPT_LIST, &[]));
        let (r, out) = run_with(input, &limits, false);
        assert!(matches!(r, Err(HandshakeError::TooManyOptions(3))));
        assert_eq!(replies(&out)[0].1, NBD_REP_ERR_TOO_BIG);

        // The advertised maximum is capped by max_payload.
        let mut input = client_flags(1);
        input.extend(go("disk", &[]));
        let (r, _) = run_with(input, &limits, false);
        assert_eq!(r.unwrap().block_sizes, (512, 4096, 1 << 20));
    }

    #[test]
    fn effective_block_sizes_stay_consistent() {
        let e = MemExport::new(1 << 20).with_block_sizes(4096, 1 << 20, 8 << 20);
        assert_eq!(effective_block_sizes(&e, 32 << 20), (4096, 1 << 20, 8 << 20));
        assert_eq!(effective_block_sizes(&e, 100_000), (4096, 65536, 98304));
        let e = MemExport::new(1 << 20).with_block_sizes(512, 4096, u32::MAX);
        assert_eq!(effective_block_sizes(&e, 1 << 20), (512, 4096, 1 << 20));
    }

    #[test]
    fn shutdown_refuses_options() {
        let mut input = client_flags(1);
        input.extend(go("disk", &[]));
        input.extend(encode_option(NBD_OPT_ABORT, &[]));
        let (r, out) = run_with(input, &NegotiationLimits::default(), true);
        assert!(matches!(r, Err(HandshakeError::Aborted)));
        let reps = replies(&out);
        assert_eq!(reps[0].1, NBD_REP_ERR_SHUTDOWN);
        assert_eq!(reps[1].1, NBD_REP_ACK);
    }

    #[test]
    fn bad_option_magic_ends_negotiation() {
        let mut input = client_flags(1);
        input.extend([0u8; 16]);
        assert!(matches!(
            run(input).0,
            Err(HandshakeError::Proto(ProtoError::BadOptionMagic(0)))
        ));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn option_strategy() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                // Well-formed options with random codes and data.
                (0u32..16, proptest::collection::vec(any::<u8>(), 0..40))
                    .prop_map(|(o, d)| encode_option(o, &d)),
                // GO/INFO with random names and requests.
                (
                    prop::bool::ANY,
                    "[a-z]{0,6}",
                    proptest::collection::vec(0u16..6, 0..4)
                )
                    .prop_map(|(info, name, requests)| encode_option(
                        if info { NBD_OPT_INFO } else { NBD_OPT_GO },
                        &InfoRequest { name, requests }.encode()
                    )),
                // Raw garbage, including lying lengths.
                proptest::collection::vec(any::<u8>(), 0..40),
            ]
        }

        proptest! {
            #[test]
            fn negotiation_never_panics_on_random_bytes(
                flags in prop_oneof![Just(1u32), Just(3u32), any::<u32>()],
                options in proptest::collection::vec(option_strategy(), 0..8),
                raw in proptest::collection::vec(any::<u8>(), 0..200),
                use_raw in prop::bool::ANY,
            ) {
                let mut input = flags.to_be_bytes().to_vec();
                if use_raw {
                    input.extend(raw);
                } else {
                    for o in options {
                        input.extend(o);
                    }
                }
                let len = input.len();
                let limits = NegotiationLimits { max_option_len: 64, max_options: 16, max_payload: 1 << 20 };
                let mut d = MemStream::new(input);
                let r = negotiate(&mut d, &exports(), &limits, &AtomicBool::new(false));
                // Either transmission was entered or the negotiation ended
                // with an error (EOF included); it consumed no more than given.
                prop_assert!(d.consumed() <= len);
                if let Ok(n) = r {
                    prop_assert!(n.flags & NBD_FLAG_HAS_FLAGS != 0);
                }
            }
        }
    }
}
