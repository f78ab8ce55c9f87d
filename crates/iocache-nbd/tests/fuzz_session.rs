//! The fuzz targets' bodies (`iocache_nbd::fuzzing`, run by libFuzzer from
//! `fuzz/`) under proptest, so they run in CI: random bytes and
//! structure-aware client streams (valid magics with random fields,
//! truncated streams, huge lengths, bad flags, out-of-range offsets,
//! duplicate handles). The properties: the server does not panic, the
//! session ends within a time limit, and every reply is well formed and
//! right by the client-side model (see the module's documentation).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

use iocache_nbd::fuzzing::{self, request, SessionReport, Violation, EXPORTS, MAX_OPTION_LEN, MAX_PAYLOAD};
use iocache_nbd::proto::*;
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Longest a session may take; a bounded input must mean bounded work.
const SESSION_TIME_LIMIT: Duration = Duration::from_secs(20);

/// Runs `f` on its own thread and fails if it panics or outlives the limit.
fn within_limit(
    what: &str,
    f: impl FnOnce() -> Result<SessionReport, Violation> + Send + 'static,
) -> Result<SessionReport, Violation> {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(SESSION_TIME_LIMIT) {
        Ok(r) => {
            let _ = t.join();
            r
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: the session did not end within {SESSION_TIME_LIMIT:?}")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{what}: the session panicked: {:?}", t.join().err())
        }
    }
}

fn run_transmission(input: Vec<u8>) -> Result<SessionReport, Violation> {
    within_limit("transmission", move || fuzzing::transmission(&input))
}

fn run_session(input: Vec<u8>) -> Result<SessionReport, Violation> {
    within_limit("session", move || fuzzing::session(&input))
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

fn command() -> impl Strategy<Value = u16> {
    prop_oneof![
        8 => prop_oneof![
            Just(NBD_CMD_READ),
            Just(NBD_CMD_WRITE),
            Just(NBD_CMD_FLUSH),
            Just(NBD_CMD_TRIM),
            Just(NBD_CMD_WRITE_ZEROES),
        ],
        1 => Just(NBD_CMD_DISC),
        1 => prop_oneof![Just(NBD_CMD_CACHE), Just(NBD_CMD_BLOCK_STATUS), any::<u16>()],
    ]
}

fn cmd_flags() -> impl Strategy<Value = u16> {
    prop_oneof![
        8 => Just(0u16),
        3 => 0u16..32,
        1 => any::<u16>(),
    ]
}

fn handle() -> impl Strategy<Value = u64> {
    // Few distinct handles, so replies to requests with the same handle
    // must be told apart by order and content.
    prop_oneof![4 => 0u64..4, 1 => any::<u64>()]
}

fn offset() -> impl Strategy<Value = u64> {
    let sizes: Vec<u64> = EXPORTS.iter().map(|e| e.size as u64).collect();
    prop_oneof![
        // In range and aligned on every export but the tiny one.
        6 => (0u64..16).prop_map(|i| i * 4096),
        3 => (0u64..256).prop_map(|i| i * 512),
        // In range of the tiny export too.
        2 => 0u64..2000,
        2 => (prop::sample::select(sizes), -1024i64..1024).prop_map(|(s, d)| s.saturating_add_signed(d)),
        1 => 0u64..4096,
        1 => prop_oneof![any::<u64>(), (0u64..(1 << 20)).prop_map(|d| u64::MAX - d)],
    ]
}

fn length() -> impl Strategy<Value = u32> {
    prop_oneof![
        1 => Just(0u32),
        4 => (1u32..=4).prop_map(|i| i * 4096),
        4 => (1u32..=32).prop_map(|i| i * 512),
        2 => 1u32..1000,
        1 => 1000u32..2048,
        1 => MAX_PAYLOAD - 2..=MAX_PAYLOAD + 2,
        1 => prop_oneof![any::<u32>(), Just(u32::MAX)],
    ]
}

/// How much of a write's payload follows its header.
#[derive(Debug, Clone, Copy)]
enum Payload {
    Full,
    Short(usize),
    None,
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        8 => Just(Payload::Full),
        1 => (0usize..600).prop_map(Payload::Short),
        1 => Just(Payload::None),
    ]
}

/// One piece of a transmission-phase stream.
fn request_piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        12 => (command(), cmd_flags(), handle(), offset(), length(), payload(), any::<u8>()).prop_map(
            |(command, flags, handle, offset, length, payload, fill)| {
                let n = match payload {
                    // Whole payloads only where the server may read them.
                    Payload::Full if length <= MAX_PAYLOAD => length as usize,
                    Payload::Full => 0,
                    Payload::Short(n) => n.min(length as usize),
                    Payload::None => 0,
                };
                let n = if command == NBD_CMD_WRITE { n } else { 0 };
                let bytes: Vec<u8> = (0..n).map(|i| fill ^ (i as u8)).collect();
                request(command, flags, handle, offset, length, &bytes)
            }
        ),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

/// Pieces joined, then cut anywhere (or not at all).
fn stream_of(pieces: impl Strategy<Value = Vec<Vec<u8>>>) -> impl Strategy<Value = Vec<u8>> {
    (pieces, prop::option::weighted(0.2, any::<prop::sample::Index>())).prop_map(|(pieces, cut)| {
        let mut v = pieces.concat();
        if let Some(cut) = cut {
            if !v.is_empty() {
                v.truncate(cut.index(v.len()));
            }
        }
        v
    })
}

fn export_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec!["", "disk", "ro", "tiny"]).prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::sample::select(vec!["nope", "dis", "disk\0", "DISK"]).prop_map(|s| s.as_bytes().to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn info_data() -> impl Strategy<Value = Vec<u8>> {
    (
        export_name(),
        proptest::collection::vec(prop_oneof![0u16..5, any::<u16>()], 0..5),
        prop_oneof![8 => Just(None), 1 => any::<u32>().prop_map(Some), 1 => any::<u16>().prop_map(|c| Some(u32::from(c)))],
    )
        .prop_map(|(name, requests, lie)| {
            let mut d = (name.len() as u32).to_be_bytes().to_vec();
            d.extend(&name);
            d.extend((requests.len() as u16).to_be_bytes());
            for r in requests {
                d.extend(r.to_be_bytes());
            }
            // A lying name length or count.
            if let Some(lie) = lie {
                if lie & 1 == 0 {
                    d[..4].copy_from_slice(&lie.to_be_bytes());
                } else {
                    let at = 4 + name.len();
                    d[at..at + 2].copy_from_slice(&(lie as u16).to_be_bytes());
                }
            }
            d
        })
}

/// One piece of a handshake-phase stream.
fn option_piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Every option code, with random data.
        3 => (0u32..13, proptest::collection::vec(any::<u8>(), 0..24)).prop_map(|(o, d)| encode_option(o, &d)),
        // Options without data.
        3 => prop::sample::select(vec![
            NBD_OPT_LIST,
            NBD_OPT_STRUCTURED_REPLY,
            NBD_OPT_STARTTLS,
            NBD_OPT_EXTENDED_HEADERS,
            NBD_OPT_ABORT,
        ])
        .prop_map(|o| encode_option(o, &[])),
        // GO and INFO, well formed or lying.
        4 => (prop::bool::ANY, info_data())
            .prop_map(|(go, d)| encode_option(if go { NBD_OPT_GO } else { NBD_OPT_INFO }, &d)),
        1 => export_name().prop_map(|n| encode_option(NBD_OPT_EXPORT_NAME, &n)),
        // Longer than the server reads: skipped, all of it or cut.
        1 => (prop::bool::ANY, MAX_OPTION_LEN + 1..MAX_OPTION_LEN + 64, 0usize..400).prop_map(|(name, len, have)| {
            let mut v = IHAVEOPT.to_be_bytes().to_vec();
            v.extend((if name { NBD_OPT_EXPORT_NAME } else { NBD_OPT_LIST }).to_be_bytes());
            v.extend(len.to_be_bytes());
            v.resize(v.len() + have.min(len as usize), 0x5a);
            v
        }),
        // Huge lengths, random option codes, bad magic.
        1 => (any::<u32>(), any::<u32>()).prop_map(|(o, len)| {
            let mut v = IHAVEOPT.to_be_bytes().to_vec();
            v.extend(o.to_be_bytes());
            v.extend(len.to_be_bytes());
            v
        }),
        1 => proptest::collection::vec(any::<u8>(), 0..32),
    ]
}

fn client_flags() -> impl Strategy<Value = u32> {
    prop_oneof![
        8 => Just(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES),
        4 => Just(NBD_FLAG_C_FIXED_NEWSTYLE),
        1 => any::<u32>(),
    ]
}

/// A whole client stream in pieces: flags, options (usually ending with a
/// GO), then requests.
fn client_stream() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let go = (0u8..0x20).prop_map(|setup| fuzzing::handshake_prefix(setup)[4..].to_vec());
    (
        client_flags(),
        proptest::collection::vec(option_piece(), 0..6),
        prop::option::weighted(0.7, go),
        proptest::collection::vec(request_piece(), 0..8),
    )
        .prop_map(|(flags, options, go, requests)| {
            let mut v = vec![flags.to_be_bytes().to_vec()];
            v.extend(options);
            v.extend(go);
            v.extend(requests);
            v
        })
}

fn header() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => (command(), cmd_flags(), handle(), offset(), length())
            .prop_map(|(c, f, h, o, l)| request(c, f, h, o, l, &[])),
        1 => proptest::collection::vec(any::<u8>(), REQUEST_HEADER_LEN..=REQUEST_HEADER_LEN),
    ]
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(Config { cases: 256, failure_persistence: None, ..Config::default() })]

    /// The `nbd_request` target: a valid handshake, then structured request
    /// streams.
    #[test]
    fn transmission_answers_every_request_correctly(
        setup in any::<u8>(),
        requests in stream_of(proptest::collection::vec(request_piece(), 0..16)),
    ) {
        let mut input = vec![setup];
        input.extend(requests);
        let r = run_transmission(input);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    /// The `nbd_handshake` target: option haggling, then requests.
    #[test]
    fn sessions_are_answered_correctly(input in stream_of(client_stream())) {
        let r = run_session(input);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    /// Both targets and the header check on raw bytes.
    #[test]
    fn random_bytes_are_survived(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        let r = run_session(input.clone());
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        let r = run_transmission(input.clone());
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        let r = fuzzing::request_headers(&input);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

proptest! {
    #![proptest_config(Config { cases: 4096, failure_persistence: None, ..Config::default() })]

    /// The request parser agrees with the model on valid magics with
    /// random fields.
    #[test]
    fn request_parser_agrees_with_the_model(headers in proptest::collection::vec(header(), 1..8)) {
        let r = fuzzing::request_headers(&headers.concat());
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

// ---------------------------------------------------------------------------
// Fixed cases
// ---------------------------------------------------------------------------

#[test]
fn seeds_pass_and_reach_what_they_are_for() {
    let mut replies = 0;
    for seed in fuzzing::seeds() {
        let r = match seed.target {
            "nbd_request" => run_transmission(seed.input.clone()),
            "nbd_handshake" => run_session(seed.input.clone()),
            other => panic!("unknown target {other}"),
        };
        let r = r.unwrap_or_else(|v| panic!("{}: {v}", seed.name));
        replies += r.replies;
    }
    assert!(replies > 40, "the seeds answered only {replies} requests");
}

/// Inputs libFuzzer found that once failed. Each is run by the target's
/// body, as `cargo fuzz run TARGET FILE` would.
#[test]
fn fuzzer_findings_stay_fixed() {
    // nbd_request, crash-bb8793ab: a FLUSH whose offset + length overflows
    // (legal: FLUSH has no range) made the model's own arithmetic overflow
    // (a panic with overflow checks, as cargo fuzz builds). The server was
    // right.
    let flush_overflow =
        b"\x01\x25\x60\x95\x13\x00\x00\x00\x03\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\
        \xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\
        \x0b\x00\x00\x00\x00";
    assert_eq!(
        flush_overflow[1..29],
        request(NBD_CMD_FLUSH, 0, 0x00ff_ffff_ffff_ffff, u64::MAX, u32::MAX, &[])[..]
    );
    // The FLUSH is answered; the rest is a bad magic, which ends the session.
    let r = run_transmission(flush_overflow.to_vec()).unwrap();
    assert_eq!((r.replies, r.errors), (1, 0));
}

/// Many maximal reads from 28-byte requests: the output is bounded by the
/// requests times the payload limit, and the session still ends.
#[test]
fn a_flood_of_maximal_reads_ends() {
    let mut input = vec![0x01];
    for h in 0..200u64 {
        input.extend(request(NBD_CMD_READ, 0, h, 0, MAX_PAYLOAD, &[]));
    }
    let r = run_transmission(input).unwrap();
    assert_eq!(r.replies, 200);
    assert_eq!(r.errors, 0);
}

/// `Server::serve_stream` over a real socket pair, with the same checks.
#[test]
fn serve_stream_over_a_socket_pair() {
    for seed in fuzzing::seeds() {
        let input = match seed.target {
            "nbd_request" => [fuzzing::handshake_prefix(seed.input[0]), seed.input[1..].to_vec()].concat(),
            _ => seed.input.clone(),
        };
        let (mut client, server_end) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || fuzzing::server().unwrap().serve_stream(server_end).unwrap());
        let reader = {
            let mut c = client.try_clone().unwrap();
            std::thread::spawn(move || {
                // Until end of file, or a reset (a Unix socket closed with
                // unread input resets its peer after its data is read).
                let mut out = Vec::new();
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => out.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                out
            })
        };
        // The server may hang up before reading everything.
        let _ = client.write_all(&input);
        let _ = client.shutdown(Shutdown::Write);
        let stats = t.join().unwrap();
        let output = reader.join().unwrap();
        fuzzing::check_session(&input, &output, stats).unwrap_or_else(|v| panic!("{}: {v}", seed.name));
    }
}
