//! The server's TLS (NBD_OPT_STARTTLS, tls.rs) tested
//! in-process, with no external tool: an OpenSSL client with a pre-shared
//! key runs option haggling and a transmission phase through the relay
//! pump (megabytes each way, so backpressure is exercised), and the
//! handshake's guarantees are checked byte by byte: the handshake deadline
//! covers the TLS handshake, a client that sends plaintext after STARTTLS
//! gets nothing, and wrong keys or unknown identities are refused.
//! tests/tls.rs at the top of the repository tests real clients (nbdinfo,
//! qemu-io) against `iocache serve`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use iocache_nbd::proto::{
    encode_option, GREETING_LEN, NBD_FLAG_C_FIXED_NEWSTYLE, NBD_OPT_GO, NBD_OPT_STARTTLS, NBD_REP_ACK,
};
use iocache_nbd::{RunningServer, ServerConfig, TlsCredentials, TlsMode, TlsServer};
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

/// A PSK file (mode 0600) holding `alice` with [`KEY`].
fn psk_file(tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("iocache-nbd-tls-{tag}-{}.psk", std::process::id()));
    let hex: String = KEY.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, format!("alice:{hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn tls_server(tag: &str, timeout: Duration) -> (RunningServer, PathBuf) {
    let psk = psk_file(tag);
    let tls = TlsServer::new(
        TlsMode::Require,
        &TlsCredentials {
            psk: Some(psk.clone()),
            ..TlsCredentials::default()
        },
    )
    .unwrap();
    let config = ServerConfig {
        tls: Some(tls),
        handshake_timeout: Some(timeout),
        ..config(tag)
    };
    (start_with(config, vec![("disk", mem(8 << 20) as _)]), psk)
}

/// Reads the greeting, sends the client flags and STARTTLS, and reads the
/// server's acknowledgement.
fn start_tls(s: &mut TcpStream) {
    let mut greeting = [0u8; GREETING_LEN];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&NBD_FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
    s.write_all(&encode_option(NBD_OPT_STARTTLS, &[])).unwrap();
    let (opt, ty, data) = read_option_reply(s);
    assert_eq!((opt, ty, data.len()), (NBD_OPT_STARTTLS, NBD_REP_ACK, 0));
}

/// One option reply: (option, reply type, data).
fn read_option_reply<S: Read>(s: &mut S) -> (u32, u32, Vec<u8>) {
    let mut head = [0u8; 20];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head[..8], &0x0003_e889_0455_65a9u64.to_be_bytes());
    let opt = u32::from_be_bytes(head[8..12].try_into().unwrap());
    let ty = u32::from_be_bytes(head[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
    let mut data = vec![0u8; len];
    s.read_exact(&mut data).unwrap();
    (opt, ty, data)
}

/// An OpenSSL client offering `identity` with `key`.
fn psk_client(
    identity: &'static str,
    key: &'static [u8],
    s: TcpStream,
) -> Result<SslStream<TcpStream>, String> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256").unwrap();
    b.set_psk_client_callback(move |_, _, id, psk| {
        id[..identity.len()].copy_from_slice(identity.as_bytes());
        id[identity.len()] = 0;
        psk[..key.len()].copy_from_slice(key);
        Ok(key.len())
    });
    let mut conf = b.build().configure().unwrap();
    conf.set_verify_hostname(false);
    conf.set_use_server_name_indication(false);
    let mut tls = conf.connect("localhost", s).map_err(|e| e.to_string())?;
    // TLS 1.3: a refused key shows at the first read at the latest.
    tls.write_all(&encode_option(NBD_OPT_GO, &go_data("disk")))
        .map_err(|e| e.to_string())?;
    Ok(tls)
}

fn go_data(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}

fn request(ty: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut r = 0x2560_9513u32.to_be_bytes().to_vec();
    r.extend_from_slice(&0u16.to_be_bytes());
    r.extend_from_slice(&ty.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    r
}

/// A simple reply's error and cookie.
fn read_simple_reply<S: Read>(s: &mut S) -> (u32, u64) {
    let mut head = [0u8; 16];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head[..4], &0x6744_6698u32.to_be_bytes());
    (
        u32::from_be_bytes(head[4..8].try_into().unwrap()),
        u64::from_be_bytes(head[8..16].try_into().unwrap()),
    )
}

#[test]
fn a_psk_client_is_served_through_the_relay() {
    let (server, psk) = tls_server("psk-ok", Duration::from_secs(5));
    let mut s = TcpStream::connect(server.tcp_addr().unwrap()).unwrap();
    start_tls(&mut s);
    let mut tls = psk_client("alice", KEY, s).unwrap();
    loop {
        let (opt, ty, _) = read_option_reply(&mut tls);
        assert_eq!(opt, NBD_OPT_GO);
        if ty == NBD_REP_ACK {
            break;
        }
        assert!(ty < 1 << 31, "GO refused: {ty:#x}");
    }
    // 4 MiB written, then read back, in 1 MiB requests, the writes sent
    // all at once before any reply is read (so both directions fill up).
    let data = pattern(4 << 20, 7);
    let mut out = Vec::new();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        out.extend(request(1, i as u64, (i << 20) as u64, 1 << 20));
        out.extend_from_slice(chunk);
    }
    tls.write_all(&out).unwrap();
    // Pipelined requests are answered in any order.
    let mut cookies: Vec<u64> = (0..4)
        .map(|_| read_simple_reply(&mut tls))
        .map(|(e, c)| {
            assert_eq!(e, 0);
            c
        })
        .collect();
    cookies.sort_unstable();
    assert_eq!(cookies, [0, 1, 2, 3]);
    for i in 0..4u64 {
        tls.write_all(&request(0, 10 + i, i << 20, 1 << 20)).unwrap();
    }
    let mut back = vec![0u8; 4 << 20];
    for _ in 0..4 {
        let (error, cookie) = read_simple_reply(&mut tls);
        assert_eq!(error, 0);
        let i = (cookie - 10) as usize;
        assert!(i < 4, "cookie {cookie}");
        tls.read_exact(&mut back[i << 20..(i + 1) << 20]).unwrap();
    }
    assert!(back == data, "read back other bytes");
    tls.write_all(&request(2, 99, 0, 0)).unwrap(); // NBD_CMD_DISC
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest);
    assert!(rest.is_empty());
    assert_eq!(server.stats().tls_failures, 0);
    server.shutdown();
    let _ = std::fs::remove_file(psk);
}

/// Waits (5 s at most) for `server` to count `failures` failed TLS
/// handshakes, checks that it counted exactly those, and stops it.
fn assert_tls_failures_then_stop(server: RunningServer, psk: PathBuf, failures: u64) {
    let started = Instant::now();
    while server.stats().tls_failures < failures && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.stats().tls_failures, failures);
    server.shutdown();
    let _ = std::fs::remove_file(psk);
}

#[test]
fn wrong_keys_and_unknown_identities_are_refused() {
    let (server, psk) = tls_server("psk-wrong", Duration::from_secs(5));
    for (identity, key) in [("alice", &b"not the key"[..]), ("mallory", KEY)] {
        let mut s = TcpStream::connect(server.tcp_addr().unwrap()).unwrap();
        start_tls(&mut s);
        let r = psk_client(identity, key, s).and_then(|mut t| {
            let mut b = [0u8; 20];
            t.read_exact(&mut b).map_err(|e| e.to_string())
        });
        assert!(r.is_err(), "{identity} was served");
    }
    assert_tls_failures_then_stop(server, psk, 2);
}

#[test]
fn the_handshake_deadline_covers_the_tls_handshake_and_plaintext_gets_nothing() {
    let (server, psk) = tls_server("psk-slow", Duration::from_secs(1));
    // A client that acknowledges STARTTLS and then says nothing is closed
    // when the handshake's deadline passes.
    let mut s = TcpStream::connect(server.tcp_addr().unwrap()).unwrap();
    let started = Instant::now();
    start_tls(&mut s);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the server said something to a silent client");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2500), "closed after {took:?}");

    // A client that goes on in plaintext after STARTTLS gets no answer
    // in plaintext: at most a TLS alert, then the end.
    let mut s = TcpStream::connect(server.tcp_addr().unwrap()).unwrap();
    start_tls(&mut s);
    s.write_all(&encode_option(NBD_OPT_GO, &go_data("disk"))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        got.is_empty() || got[0] == 0x15,
        "plaintext after STARTTLS was answered with {got:02x?}"
    );
    assert_tls_failures_then_stop(server, psk, 2);
}
