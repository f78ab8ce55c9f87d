//! The admin socket of a running server (its clients use
//! [`crate::admin_client`]).
//!
//! The protocol is one request line and one reply line per connection. The
//! line `stats` (or an empty line) asks for the statistics of every volume;
//! any other request is a JSON object with a `command`:
//!
//! - `{"command":"stats","export":NAME?}`: statistics, of one volume if named;
//! - `{"command":"attach","export":NAME,"backend":PATH|URI,"backend_size":SIZE?,"cache":PATH?}`:
//!   adds a volume to a cache device (the only one, or the one named) and
//!   serves it as a new export; `backend_size` creates a missing file;
//! - `{"command":"flush","export":NAME}`: writes back the volume's dirty lines;
//! - `{"command":"replace-member","old":PATH,"new":PATH,"cache":PATH?}`:
//!   puts a new device in place of a cache-array member, while serving;
//! - `{"command":"warm","export":NAME,"offset":BYTES?,"length":BYTES?}`:
//!   reads a range (the whole volume by default) through the cache in the
//!   background, as NBD_CMD_CACHE does; progress in the stats;
//! - `{"command":"detach","export":NAME}`: stops serving the volume, after
//!   writing back its dirty lines and dropping its lines from the cache.
//! - `{"command":"get","export":NAME?}`: the knobs of the cache the volume
//!   uses (or the only one), configured and current, and the write policy
//!   in force with its cause;
//! - `{"command":"set","export":NAME?,"settings":["KEY=VALUE",...]}`:
//!   changes knobs while the cache serves (`iocache_core::Setting`), and
//!   answers as `get`.
//!
//! The reply is a JSON object: the statistics (`{"volumes":[...]}`), what
//! was done, or `{"error": MESSAGE}`.
//!
//! What a client can make the server hold is bounded:
//! a request line is read up to [`MAX_REQUEST_BYTES`] (a longer one is
//! answered with an error naming the limit, after reading at most one byte
//! more, and is never echoed); the whole line must arrive within
//! [`REQUEST_DEADLINE`] (a client trickling bytes gets an error when it
//! passes); at most [`MAX_CONNECTIONS`] connections are served at once
//! (more are answered with a one-line error and closed by the accept thread
//! itself); and a thread that cannot be created refuses that one
//! connection (a line on stderr at most every ten seconds), never panics
//! the accept thread.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::{refused, Result, Within};

use crate::running::{AttachRequest, Running};

/// The statistics as JSON: one entry per volume (of `export` only, if given).
fn stats_json(state: &Running, export: Option<&str>) -> Result<Value> {
    Ok(serde_json::to_value(crate::stats::Snapshot::take(
        state, export,
    )?)?)
}

/// Runs one admin request.
fn dispatch(state: &Running, line: &str) -> Result<Value> {
    match line {
        "stats" | "" => return stats_json(state, None),
        text if !text.starts_with('{') => {
            return Err(refused!(
                "unknown command `{}`; expected `stats` or a JSON request",
                shortened(text)
            ))
        }
        _ => {}
    }
    let request: Value = serde_json::from_str(line).within(|| "the request is not JSON".to_string())?;
    let field = |name: &str| request.get(name).and_then(Value::as_str);
    let needed = |name: &str| field(name).ok_or_else(|| refused!("the request needs `{name}`"));
    match field("command") {
        Some("stats") => stats_json(state, field("export")),
        Some("attach") => state.attach(&AttachRequest {
            export: needed("export")?,
            backend: needed("backend")?,
            backend_size: field("backend_size"),
            cache: field("cache"),
        }),
        Some("detach") => state.detach(needed("export")?),
        Some("flush") => state.flush(needed("export")?),
        Some("replace-member") => state.replace_member(field("cache"), needed("old")?, needed("new")?),
        Some("warm") => {
            let number = |name: &str| match request.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| refused!("`{name}` must be a number of bytes")),
            };
            state.warm(needed("export")?, number("offset")?, number("length")?)
        }
        Some("get") => state.get_settings(field("export")),
        Some("set") => {
            let changes: Vec<String> = request
                .get("settings")
                .and_then(Value::as_array)
                .ok_or_else(|| refused!("the request needs `settings`: a list of \"KEY=VALUE\""))?
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| refused!("`settings` must be a list of strings"))?;
            state.set_settings(field("export"), &changes)
        }
        Some("reca-reload") => state.reca_reload(field("export"), field("table")),
        Some(other) => Err(refused!(
            "unknown command `{}`; expected stats, attach, detach, flush, replace-member, warm, get, set or \
             reca-reload",
            shortened(other)
        )),
        None => Err(refused!("the request needs a `command`")),
    }
}

/// Longest request line read (64 KiB, far above any real request: an
/// attach with two 4 KiB paths is about 8.3 KiB).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Admin connections served at once. A connection holds a thread and at
/// most `MAX_REQUEST_BYTES` of request for at most `REQUEST_DEADLINE`
/// (then the time its request takes to run).
pub const MAX_CONNECTIONS: usize = 16;
/// Time a client has to send its whole request line, counted from the
/// moment its connection is taken up (every real client writes the line in
/// one go right after connecting).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Time the reply may take to be written (a client that does not read it
/// cannot keep its thread).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Characters of an unknown command echoed in the error.
const ECHO_CHARS: usize = 64;

/// The start of `text`, for an error message.
fn shortened(text: &str) -> String {
    match text.char_indices().nth(ECHO_CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// Why no request could be read.
#[derive(Debug)]
enum BadRequest {
    TooLong,
    Deadline,
    NotUtf8,
    Io(std::io::Error),
}

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadRequest::TooLong => write!(
                f,
                "the request line is longer than {MAX_REQUEST_BYTES} bytes (the limit); it was not read"
            ),
            BadRequest::Deadline => write!(
                f,
                "no complete request line within {} s",
                REQUEST_DEADLINE.as_secs_f64()
            ),
            BadRequest::NotUtf8 => write!(f, "the request is not UTF-8"),
            BadRequest::Io(e) => write!(f, "cannot read the request: {e}"),
        }
    }
}

/// Whether a read failed because its timeout passed.
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Reads one request line (up to a newline or the end of the stream),
/// reading at most `MAX_REQUEST_BYTES + 1` bytes and giving up at
/// `deadline`. Bytes after the newline are ignored.
fn read_request(stream: &UnixStream, deadline: Instant) -> Result<String, BadRequest> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BadRequest::Deadline);
        }
        stream.set_read_timeout(Some(left)).map_err(BadRequest::Io)?;
        let want = (MAX_REQUEST_BYTES + 1 - line.len()).min(chunk.len());
        let n = match (&*stream).read(&mut chunk[..want]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if is_timeout(&e) => return Err(BadRequest::Deadline),
            Err(e) => return Err(BadRequest::Io(e)),
        };
        if n == 0 {
            break;
        }
        if let Some(end) = chunk[..n].iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&chunk[..end]);
            if line.len() > MAX_REQUEST_BYTES {
                return Err(BadRequest::TooLong);
            }
            break;
        }
        line.extend_from_slice(&chunk[..n]);
        if line.len() > MAX_REQUEST_BYTES {
            return Err(BadRequest::TooLong);
        }
    }
    String::from_utf8(line).map_err(|_| BadRequest::NotUtf8)
}

/// Answers one admin connection.
fn answer(mut stream: UnixStream, state: &Running) {
    let reply = match read_request(&stream, Instant::now() + REQUEST_DEADLINE) {
        Ok(line) => match dispatch(state, line.trim()) {
            Ok(value) => value,
            Err(e) => json!({ "error": crate::error_chain_text(&e) }),
        },
        Err(e) => json!({ "error": e.to_string() }),
    };
    let _ = stream.set_write_timeout(Some(REPLY_TIMEOUT));
    let _ = writeln!(stream, "{reply}");
}

/// Tells a client there is no room for it, without ever blocking the
/// accept thread, and closes the connection.
fn refuse(stream: UnixStream, why: &str) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = writeln!(&stream, "{}", json!({ "error": why }));
    }
}

/// One of the `MAX_CONNECTIONS` places, given back when dropped (also
/// when the thread it was moved into could not be created).
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Writes `message` on stderr unless a line went out less than ten
/// seconds ago.
fn log_rate_limited(last: &Mutex<Option<Instant>>, message: &str) {
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
        *last = Some(Instant::now());
        log::warn!("admin socket: {message}");
    }
}

/// Answers the admin socket until the server stops: one thread per
/// connection, so a long detach does not hold up `iocache stats`; at most
/// `MAX_CONNECTIONS` at once.
pub fn serve_admin(listener: UnixListener, state: Arc<Running>) {
    let active = Arc::new(AtomicUsize::new(0));
    let last_log = Mutex::new(None);
    loop {
        let accepted = listener.accept();
        if state.stopping() {
            return;
        }
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                // EMFILE and friends: do not spin.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            refuse(
                stream,
                &format!("too many admin connections (at most {MAX_CONNECTIONS} at once); try again"),
            );
            continue;
        }
        let place = Place(Arc::clone(&active));
        let state = Arc::clone(&state);
        let spawned = std::thread::Builder::new().name("admin".into()).spawn(move || {
            let _place = place;
            answer(stream, &state);
        });
        if let Err(e) = spawned {
            // The closure, with the stream and the place, was dropped: the
            // connection is closed and its place free.
            log_rate_limited(
                &last_log,
                &format!("cannot start a thread ({e}); connection refused"),
            );
        }
    }
}
