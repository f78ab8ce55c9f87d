//! The server driven by our own client and by hand-made byte streams:
//! round trips of every command over both socket families and both reply
//! styles, range and validation errors, pipelining with out-of-order
//! replies, DISC and shutdown finishing in-flight work, and clients that
//! send garbage or vanish mid-request.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use iocache_nbd::fuzzing::request;
use iocache_nbd::proto::*;
use iocache_nbd::{list_exports, Client, ConnectOptions, Export, MemExport, NbdAddr, ServerConfig};

fn clients(server: &iocache_nbd::RunningServer, name: &str) -> Vec<(String, Client)> {
    let mut v = Vec::new();
    for structured in [true, false] {
        let opts = ConnectOptions {
            structured_replies: structured,
            ..ConnectOptions::export(name)
        };
        let u = Client::connect_unix(server.unix_path().unwrap(), &opts).unwrap();
        assert_eq!(u.structured(), structured);
        v.push((format!("unix structured={structured}"), u));
        let t = Client::connect_tcp(server.tcp_addr().unwrap(), &opts).unwrap();
        v.push((format!("tcp structured={structured}"), t));
    }
    v
}

#[test]
fn round_trips_over_unix_and_tcp_with_both_reply_styles() {
    let export = mem(8 << 20);
    let server = start("rt", export.clone());
    for (i, (what, mut c)) in clients(&server, "disk").into_iter().enumerate() {
        assert_eq!(c.size(), 8 << 20, "{what}");
        assert_eq!(c.block_sizes(), Some((512, 4096, 32 << 20)));
        let f = c.transmission_flags();
        for bit in [
            NBD_FLAG_HAS_FLAGS,
            NBD_FLAG_SEND_FLUSH,
            NBD_FLAG_SEND_FUA,
            NBD_FLAG_SEND_TRIM,
            NBD_FLAG_SEND_WRITE_ZEROES,
            NBD_FLAG_CAN_MULTI_CONN,
        ] {
            assert_ne!(f & bit, 0, "{what}: flag {bit:#x}");
        }
        let base = i as u64 * (1 << 20);
        for (off, len) in [(0u64, 512usize), (4096, 65536), (512 * 7, 512 * 9), (0, 1 << 20)] {
            let data = pattern(len, base + off);
            c.write(base + off, &data, off == 4096).unwrap();
            let mut back = vec![0u8; len];
            c.read(base + off, &mut back).unwrap();
            assert_eq!(back, data, "{what} at {off}+{len}");
        }
        c.flush().unwrap();
        c.write_zeroes(base + 4096, 8192, false, true).unwrap();
        let mut back = vec![1u8; 8192];
        c.read(base + 4096, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "{what}");
        c.trim(base, 4096).unwrap();
        let mut empty = [];
        c.read(base, &mut empty).unwrap();
        c.disconnect().unwrap();
    }
    // Everything went to the one shared export.
    let snap = export.snapshot();
    let base = 3 << 20;
    assert!(snap[base + 65536..base + (1 << 20)] == pattern(1 << 20, base as u64)[65536..]);
    let stats = server.shutdown();
    assert!(stats.requests > 0);
    assert_eq!(stats.transmissions, 4);
}

#[test]
fn large_requests_are_split_by_the_client_and_capped_by_the_server() {
    let mut config = config("large");
    config.limits.max_payload = 1 << 20;
    let server = start_with(config, vec![("disk", mem(4 << 20) as _)]);
    let mut c = Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).unwrap();
    assert_eq!(c.block_sizes(), Some((512, 4096, 1 << 20)));
    let data = pattern(3 << 20, 9);
    c.write(512, &data, false).unwrap();
    let mut back = vec![0u8; 3 << 20];
    c.read(512, &mut back).unwrap();
    assert_eq!(back, data);
    // A raw read above the maximum is served in pieces.
    let mut big = vec![0u8; 2 << 20];
    c.raw_request(NBD_CMD_READ, 0, 512, 2 << 20, &[], Some(&mut big))
        .unwrap();
    assert!(big[..] == data[..2 << 20]);
    // write_zeroes and trim of more than the maximum are fine.
    c.write_zeroes(0, 4 << 20, false, false).unwrap();
    c.trim(0, 4 << 20).unwrap();
}

#[test]
fn default_write_zeroes_writes_in_chunks() {
    use iocache_nbd::export::WRITE_ZEROES_CHUNK;
    let size = 2 * WRITE_ZEROES_CHUNK + 4096;
    let m = DefaultsOnly(MemExport::from_vec(vec![0xff; size]));
    m.write_zeroes(512, (size - 1024) as u64, true, true).unwrap();
    let s = m.0.snapshot();
    assert!(s[..512].iter().all(|&b| b == 0xff));
    assert!(s[512..size - 512].iter().all(|&b| b == 0));
    assert!(s[size - 512..].iter().all(|&b| b == 0xff));
    m.write_zeroes(0, 0, false, false).unwrap();
    assert!(m.trim(0, 512).is_ok());
    assert!(!m.can_multi_conn() && !m.read_only());
    assert_eq!(m.block_sizes(), (512, 4096, 32 << 20));
    assert_eq!(m.description(), None);
}

#[test]
fn fast_zero_is_refused_at_once_where_zeroing_is_slow() {
    // Its zeroes are written as zero buffers.
    let server = start("slowzero", Arc::new(DefaultsOnly(MemExport::new(1 << 20))));
    for (what, mut c) in clients(&server, "") {
        assert_ne!(c.transmission_flags() & NBD_FLAG_SEND_FAST_ZERO, 0, "{what}");
        c.write(0, &pattern(4096, 5), false).unwrap();
        let e = c
            .raw_request(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FAST_ZERO, 0, 4096, &[], None)
            .unwrap_err();
        assert_eq!(e.errno(), Some(NBD_ENOTSUP), "{what}");
        let mut buf = vec![0u8; 4096];
        c.read(0, &mut buf).unwrap();
        assert_eq!(buf, pattern(4096, 5), "{what}: nothing changed");
        // Without FAST_ZERO the zero buffers are written.
        c.write_zeroes(0, 4096, false, false).unwrap();
        c.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "{what}");
    }
}

#[test]
fn out_of_range_unaligned_and_invalid_requests() {
    let server = start("range", mem(1 << 20));
    for (what, mut c) in clients(&server, "") {
        let size = c.size();
        let mut buf = vec![0u8; 1024];
        let raw_read = |c: &mut Client, off: u64, len: u32| {
            let mut b = vec![0u8; len as usize];
            c.raw_request(NBD_CMD_READ, 0, off, len, &[], Some(&mut b))
        };
        assert_eq!(
            raw_read(&mut c, size - 512, 1024).unwrap_err().errno(),
            Some(NBD_EINVAL),
            "{what}"
        );
        assert_eq!(
            raw_read(&mut c, 100, 512).unwrap_err().errno(),
            Some(NBD_EINVAL),
            "{what}"
        );
        assert_eq!(
            raw_read(&mut c, u64::MAX - 511, 512).unwrap_err().errno(),
            Some(NBD_EINVAL)
        );
        let e = c
            .raw_request(NBD_CMD_WRITE, 0, size - 512, 1024, &buf, None)
            .unwrap_err();
        assert_eq!(e.errno(), Some(NBD_ENOSPC), "{what}: write past the end");
        let e = c
            .raw_request(NBD_CMD_WRITE_ZEROES, 0, size, 512, &[], None)
            .unwrap_err();
        assert_eq!(e.errno(), Some(NBD_ENOSPC), "{what}: write zeroes past the end");
        let e = c.raw_request(NBD_CMD_TRIM, 0, size, 512, &[], None).unwrap_err();
        assert_eq!(e.errno(), Some(NBD_EINVAL), "{what}: trim past the end");
        // Unknown command, unknown flag on a write (payload skipped), block
        // status without negotiation, FAST_ZERO on a command other than
        // WRITE_ZEROES.
        for (cmd, flags, payload) in [
            (99u16, 0u16, &[][..]),
            (NBD_CMD_WRITE, 1 << 9, &buf[..512]),
            (NBD_CMD_BLOCK_STATUS, 0, &[][..]),
            (NBD_CMD_TRIM, NBD_CMD_FLAG_FAST_ZERO, &[][..]),
            (NBD_CMD_CACHE, 0, &[][..]),
        ] {
            let e = c
                .raw_request(cmd, flags, 0, payload.len() as u32, payload, None)
                .unwrap_err();
            assert_eq!(e.errno(), Some(NBD_EINVAL), "{what}: cmd {cmd} flags {flags:#x}");
        }
        // FAST_ZERO: a memory export zeroes quickly.
        c.write(0, &pattern(1024, 3), false).unwrap();
        c.raw_request(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FAST_ZERO, 0, 1024, &[], None)
            .unwrap();
        c.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "{what}: FAST_ZERO zeroed");
        // DF only with structured replies.
        let r = c.raw_request(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512, &[], Some(&mut buf[..512]));
        assert_eq!(r.is_ok(), c.structured(), "{what}");
        // Still in frame after all that.
        c.write(0, &pattern(1024, 1), false).unwrap();
        c.read(0, &mut buf).unwrap();
        assert_eq!(buf, pattern(1024, 1));
        // The client refuses out-of-range requests itself.
        assert!(c.read(size, &mut buf).is_err());
    }
}

#[test]
fn read_only_exports_refuse_writes_with_eperm() {
    let ro = Arc::new(MemExport::from_vec(pattern(1 << 16, 3)).with_read_only(true));
    let server = start("ro", ro);
    let mut c = Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).unwrap();
    assert_ne!(c.transmission_flags() & NBD_FLAG_READ_ONLY, 0);
    let buf = vec![0u8; 512];
    for (cmd, payload) in [
        (NBD_CMD_WRITE, &buf[..]),
        (NBD_CMD_TRIM, &[][..]),
        (NBD_CMD_WRITE_ZEROES, &[][..]),
    ] {
        let e = c.raw_request(cmd, 0, 0, 512, payload, None).unwrap_err();
        assert_eq!(e.errno(), Some(NBD_EPERM), "cmd {cmd}");
    }
    let mut back = vec![0u8; 1 << 16];
    c.read(0, &mut back).unwrap();
    assert_eq!(back, pattern(1 << 16, 3));
}

#[test]
fn named_exports_default_listing_and_unknown_names() {
    let a = Arc::new(MemExport::new(1 << 20).with_description("first"));
    let b = Arc::new(MemExport::new(2 << 20));
    let server = start_with(config("names"), vec![("a", a as _), ("b", b as _)]);
    let path = server.unix_path().unwrap().to_path_buf();
    let c = Client::connect(&format!("nbd+unix:///b?socket={}", path.display())).unwrap();
    assert_eq!(c.size(), 2 << 20);
    let c = Client::connect(&format!("nbd+unix:///?socket={}", path.display())).unwrap();
    assert_eq!(c.size(), 1 << 20, "the first export is the default");
    assert_eq!(c.description(), Some("first"));
    let port = server.tcp_addr().unwrap().port();
    let c = Client::connect(&format!("nbd://127.0.0.1:{port}/a")).unwrap();
    assert_eq!(c.size(), 1 << 20);
    let e = Client::connect(&format!("nbd://127.0.0.1:{port}/zz")).unwrap_err();
    assert!(matches!(e, iocache_nbd::ClientError::UnknownExport(_)), "{e}");
    let list = list_exports(&NbdAddr::Unix { socket: path }).unwrap();
    assert_eq!(
        list,
        vec![
            ("a".to_string(), "first".to_string()),
            ("b".to_string(), String::new())
        ]
    );
}

#[test]
fn fua_flush_trim_and_write_zeroes_reach_the_export() {
    let e = Arc::new(Instrumented::new(1 << 20));
    let server = start("fua", e.clone());
    let mut c = Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).unwrap();
    assert_eq!(
        c.transmission_flags() & NBD_FLAG_CAN_MULTI_CONN,
        0,
        "not multi-conn unless the export says so"
    );
    c.write(0, &[1; 512], true).unwrap();
    c.write(512, &[1; 512], false).unwrap();
    assert_eq!(e.fua_writes.load(Ordering::SeqCst), 1);
    c.flush().unwrap();
    assert_eq!(e.flushes.load(Ordering::SeqCst), 1);
    c.trim(4096, 8192).unwrap();
    assert_eq!(*e.trims.lock().unwrap(), vec![(4096, 8192)]);
    c.raw_request(NBD_CMD_TRIM, NBD_CMD_FLAG_FUA, 0, 512, &[], None)
        .unwrap();
    assert_eq!(e.flushes.load(Ordering::SeqCst), 2, "FUA trim flushes");
    c.write_zeroes(0, 1024, true, true).unwrap();
    c.write_zeroes(1024, 1024, false, false).unwrap();
    assert_eq!(
        *e.zeroes.lock().unwrap(),
        vec![(0, 1024, true, true), (1024, 1024, false, false)]
    );
}

#[test]
fn pipelined_requests_are_answered_out_of_order() {
    let e = Arc::new(Instrumented::new(1 << 20));
    e.slow_at(0, Duration::from_millis(300));
    let server = start("pipe", e.clone());
    for structured in [true, false] {
        let mut raw = Raw::connect(&server, structured);
        // A slow read first, then 32 writes and reads elsewhere.
        raw.send(1000, NBD_CMD_READ, 0, 0, 4096, &[]);
        for i in 0..16u64 {
            let data = pattern(4096, i);
            raw.send(i, NBD_CMD_WRITE, 0, 4096 * (i + 1), 4096, &data);
        }
        let mut replies = Vec::new();
        for _ in 0..17 {
            replies.push(raw.recv(|h| if h == 1000 { 4096 } else { 0 }));
        }
        assert!(replies.iter().all(|r| r.1 == 0));
        assert_eq!(replies.last().unwrap().0, 1000, "the slow read is answered last");
        for i in 0..16u64 {
            raw.send(100 + i, NBD_CMD_READ, 0, 4096 * (i + 1), 4096, &[]);
        }
        for _ in 0..16 {
            let (h, errno, data) = raw.recv(|_| 4096);
            assert_eq!(errno, 0);
            assert_eq!(data, pattern(4096, h - 100));
        }
    }
}

/// Requests sent in one write, so the server finds them buffered: quick
/// reads are served by the thread that read them and their replies sent
/// together; writes, errors and a read the export wrongly called quick are
/// mixed in. Every request gets exactly one correct reply.
#[test]
fn buffered_quick_reads_are_served_inline_and_answered_once_each() {
    let e = Arc::new(Instrumented {
        claims_quick: true,
        ..Instrumented::new(1 << 20)
    });
    e.slow_at(4096 * 200, Duration::from_millis(200));
    for i in 0..64u64 {
        e.inner.write(4096 * i, &pattern(4096, i), false).unwrap();
    }
    let server = start("inline", e.clone());
    for structured in [true, false] {
        let mut raw = Raw::connect(&server, structured);
        let before = server.stats().served_inline;
        let mut bytes = Vec::new();
        let mut expect = std::collections::HashMap::new();
        let mut push = |handle: u64, command: u16, offset: u64, length: u32, payload: &[u8]| {
            bytes.extend(request(command, 0, handle, offset, length, payload));
        };
        for round in 0..4u64 {
            for i in 0..64u64 {
                let handle = round * 1000 + i;
                match i % 16 {
                    // A write elsewhere, answered without data.
                    5 => {
                        push(
                            handle,
                            NBD_CMD_WRITE,
                            4096 * (100 + i),
                            4096,
                            &pattern(4096, handle),
                        );
                        expect.insert(handle, (0, Vec::new()));
                    }
                    // Out of range: an error, no data.
                    9 => {
                        push(handle, NBD_CMD_READ, 1 << 20, 4096, &[]);
                        expect.insert(handle, (NBD_EINVAL, Vec::new()));
                    }
                    _ => {
                        push(handle, NBD_CMD_READ, 4096 * i, 4096, &[]);
                        expect.insert(handle, (0, pattern(4096, i)));
                    }
                }
            }
        }
        // A read the export calls quick but that takes 200 ms, among them.
        push(7777, NBD_CMD_READ, 4096 * 200, 4096, &[]);
        expect.insert(7777, (0, vec![0; 4096]));
        for i in 0..8u64 {
            push(8000 + i, NBD_CMD_READ, 4096 * i, 4096, &[]);
            expect.insert(8000 + i, (0, pattern(4096, i)));
        }
        raw.s.write_all(&bytes).unwrap();
        // Simple replies do not say their length: reads that succeed carry 4096.
        let data_len = |h: u64| match expect.get(&h) {
            Some((0, data)) => data.len(),
            _ => 0,
        };
        let mut seen = std::collections::HashSet::new();
        for _ in 0..expect.len() {
            let (h, errno, data) = raw.recv(data_len);
            assert!(seen.insert(h), "handle {h} answered twice");
            let (want_errno, want) = &expect[&h];
            assert_eq!(errno, *want_errno, "handle {h}");
            assert_eq!(&data, want, "handle {h}");
        }
        let inline = server.stats().served_inline - before;
        assert!(inline > 0, "no read was served inline");
    }
    // A request cut in two: the replies of those before it must not wait
    // for its second half (the client may wait for them before sending it).
    let mut raw = Raw::connect(&server, true);
    let mut bytes = Vec::new();
    for i in 0..20u64 {
        bytes.extend(request(NBD_CMD_READ, 0, i, 4096 * i, 4096, &[]));
    }
    raw.s.write_all(&bytes[..20 * REQUEST_HEADER_LEN - 10]).unwrap();
    for _ in 0..19 {
        let (h, errno, data) = raw.recv(|_| 4096);
        assert_eq!((errno, data), (0, pattern(4096, h)), "handle {h}");
    }
    raw.s.write_all(&bytes[20 * REQUEST_HEADER_LEN - 10..]).unwrap();
    let (h, errno, data) = raw.recv(|_| 4096);
    assert_eq!((h, errno, data), (19, 0, pattern(4096, 19)));
    // Each written block holds one of the four rounds' data (writes to the
    // same block in flight together may run in any order).
    let snapshot = e.inner.snapshot();
    for i in [5u64, 21, 37, 53] {
        let block = &snapshot[(4096 * (100 + i)) as usize..][..4096];
        assert!(
            (0..4u64).any(|round| block == &pattern(4096, round * 1000 + i)[..]),
            "block {}",
            100 + i
        );
    }
}

/// A quick read with nothing buffered after it (a client at queue depth
/// one) is served by the thread that read it, and its reply leaves at
/// once: the client waits for it before sending the next request.
#[test]
fn a_lone_quick_read_is_served_inline_and_answered_at_once() {
    let e = Arc::new(Instrumented {
        claims_quick: true,
        ..Instrumented::new(1 << 20)
    });
    for i in 0..8u64 {
        e.inner.write(4096 * i, &pattern(4096, i), false).unwrap();
    }
    let server = start("lone-inline", e.clone());
    let mut raw = Raw::connect(&server, true);
    let before = server.stats().served_inline;
    for i in 0..8u64 {
        raw.send(i, NBD_CMD_READ, 0, 4096 * i, 4096, &[]);
        let (h, errno, data) = raw.recv(|_| 4096);
        assert_eq!((h, errno, data), (i, 0, pattern(4096, i)));
    }
    assert_eq!(
        server.stats().served_inline - before,
        8,
        "every lone hit served inline"
    );
}

#[test]
fn disc_finishes_in_flight_requests_then_closes() {
    let e = Arc::new(Instrumented::new(1 << 20));
    e.slow_at(8192, Duration::from_millis(300));
    let server = start("disc", e.clone());
    let mut raw = Raw::connect(&server, false);
    raw.send(1, NBD_CMD_WRITE, 0, 8192, 512, &[7; 512]);
    raw.send(2, NBD_CMD_DISC, 0, 0, 0, &[]);
    let (h, errno, _) = raw.recv(|_| 0);
    assert_eq!((h, errno), (1, 0), "the write is answered before the close");
    let mut rest = Vec::new();
    raw.s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "no reply to DISC, then EOF");
    assert_eq!(e.inner.snapshot()[8192..8704], [7; 512]);
}

#[test]
fn shutdown_finishes_in_flight_requests_and_stops_accepting() {
    let e = Arc::new(Instrumented::new(1 << 20));
    e.slow_at(0, Duration::from_secs(2));
    let server = start("shutdown", e.clone());
    let path = server.unix_path().unwrap().to_path_buf();
    let tcp = server.tcp_addr().unwrap();
    let mut raw = Raw::connect(&server, true);
    let mut idle = Client::connect_unix(&path, &ConnectOptions::default()).unwrap();
    raw.send(5, NBD_CMD_WRITE, 0, 0, 512, &[9; 512]);
    // Shut down while the write is in the export (it takes 2 s there).
    let deadline = Instant::now() + Duration::from_secs(10);
    while e.writes_started.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the write never reached the export");
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    let stats = server.shutdown();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(stats.active_connections, 0);
    let (h, errno, _) = raw.recv(|_| 0);
    assert_eq!((h, errno), (5, 0), "the in-flight write was answered");
    assert_eq!(e.inner.snapshot()[..512], [9; 512]);
    let mut buf = [0u8; 512];
    assert!(idle.read(0, &mut buf).is_err(), "idle connections are closed");
    assert!(UnixStream::connect(&path).is_err(), "the socket is gone");
    assert!(
        std::net::TcpStream::connect(tcp).is_err(),
        "no longer listening on TCP"
    );
}

/// Sends `bytes` on a fresh connection, then checks the server closes it
/// within the timeout and still serves a normal client afterwards.
fn garbage_then_healthy(
    server: &iocache_nbd::RunningServer,
    bytes: &[u8],
    after_handshake: bool,
    close_early: bool,
) {
    let mut s = if after_handshake {
        Raw::connect(server, true).s
    } else {
        let s = UnixStream::connect(server.unix_path().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let _ = s.write_all(bytes);
    if close_early {
        drop(s);
    } else {
        // The server must end the conversation: EOF (or reset), not a hang.
        let t0 = Instant::now();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        assert!(t0.elapsed() < Duration::from_secs(8), "server hung on garbage");
    }
    let mut c = Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).unwrap();
    let mut buf = [0u8; 512];
    c.read(0, &mut buf).unwrap();
}

#[test]
fn garbage_and_vanishing_clients_do_not_hurt_the_server() {
    let mut cfg = config("garbage");
    cfg.handshake_timeout = Some(Duration::from_millis(500));
    let server = start_with(cfg, vec![("disk", mem(1 << 20) as _)]);
    let junk = pattern(4096, 77);
    // Before or during the handshake.
    garbage_then_healthy(&server, &junk, false, false);
    garbage_then_healthy(&server, &[0, 0, 0, 1], false, false); // flags, then silence: timeout
    garbage_then_healthy(&server, &[0, 0, 0, 0], false, false); // not fixed newstyle
    let mut opt = 1u32.to_be_bytes().to_vec();
    opt.extend(encode_option(NBD_OPT_GO, &[0xff; 3]));
    opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
    opt.extend_from_slice(&[0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff]); // 4 GiB option
    garbage_then_healthy(&server, &opt, false, false);
    // In transmission: bad magic, a header cut short, a write without its
    // payload, an oversized write whose payload never comes (closed at the
    // reply timeout).
    garbage_then_healthy(&server, &junk, true, false);
    let hdr = request(NBD_CMD_READ, 0, 1, 0, 512, &[]);
    garbage_then_healthy(&server, &hdr[..10], true, true);
    let partial = request(NBD_CMD_WRITE, 0, 1, 0, 65536, &[1; 1000]);
    garbage_then_healthy(&server, &partial, true, true);
    let huge = request(NBD_CMD_WRITE, 0, 1, 0, u32::MAX, &[]);
    garbage_then_healthy(&server, &huge, true, false);
    // Many requests, then vanish without reading replies.
    let mut burst = Vec::new();
    for i in 0..200u64 {
        burst.extend(request(NBD_CMD_READ, 0, i, 0, 65536, &[]));
    }
    garbage_then_healthy(&server, &burst, true, true);
    let stats = server.shutdown();
    assert_eq!(stats.active_connections, 0);
}

#[test]
fn connection_limit_and_config_errors() {
    let mut cfg = config("limit");
    cfg.max_connections = 1;
    let server = start_with(cfg, vec![("disk", mem(1 << 16) as _)]);
    let _first = Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).unwrap();
    // The client has its GO reply a moment before the server counts it as
    // out of the handshake (until then a new connection may evict it as the
    // oldest handshake): wait for that.
    let started = std::time::Instant::now();
    while server.stats().transmissions < 1 {
        assert!(started.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).is_err());
    drop(server);

    let s = iocache_nbd::Server::new(ServerConfig::default());
    assert!(matches!(s.start(), Err(iocache_nbd::ServerError::NoListener)));
    let s = iocache_nbd::Server::new(config("noexp"));
    assert!(matches!(s.start(), Err(iocache_nbd::ServerError::NoExports)));
    let mut s = iocache_nbd::Server::new(config("bad"));
    let bad = Arc::new(MemExport::new(4096).with_block_sizes(3, 4096, 4096));
    assert!(s.add_export("x", bad).is_err());
    assert!(s.set_default_export("nope").is_err());
    let mut cfg = config("payload");
    cfg.limits.max_payload = 1000;
    let mut s = iocache_nbd::Server::new(cfg);
    s.add_export("x", mem(4096)).unwrap();
    assert!(matches!(s.start(), Err(iocache_nbd::ServerError::Config(_))));
    // Polling is bounded for library callers too, and the error names it.
    for (poll, accepted) in [
        (iocache_nbd::POLL_BEFORE_SLEEP_MAX, true),
        (
            iocache_nbd::POLL_BEFORE_SLEEP_MAX + Duration::from_nanos(1),
            false,
        ),
    ] {
        let mut cfg = config("poll");
        cfg.poll_before_sleep = poll;
        let mut s = iocache_nbd::Server::new(cfg);
        s.add_export("x", mem(4096)).unwrap();
        match s.start() {
            Ok(running) => {
                assert!(accepted, "a poll of {poll:?} was accepted");
                running.shutdown();
            }
            Err(iocache_nbd::ServerError::Config(message)) => {
                assert!(!accepted, "a poll of {poll:?} was refused: {message}");
                assert!(message.contains("poll_before_sleep"), "{message}");
            }
            Err(e) => panic!("unexpected error for a poll of {poll:?}: {e}"),
        }
    }
}

mod random_streams {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use std::net::Shutdown;

    /// Pieces a client might send: valid requests of every command with
    /// random fields (writes with their payload, or a shorter one), and
    /// raw garbage.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            (
                0u16..9,
                any::<u16>(),
                any::<u64>(),
                0u64..(2 << 20),
                0u32..(1 << 17),
                0usize..4096
            )
                .prop_map(|(command, flags, handle, offset, length, payload)| {
                    let flags = flags & 0x1f;
                    let mut v = request(command, flags, handle, offset, length, &[]);
                    if command == NBD_CMD_WRITE {
                        v.resize(v.len() + payload.min(length as usize), 0xab);
                    }
                    v
                }),
            proptest::collection::vec(any::<u8>(), 0..64),
        ]
    }

    /// Whatever a client sends after the handshake, then closes its sending
    /// side: the server answers or hangs up, finishes, closes the connection
    /// promptly and keeps serving others. One server for all cases.
    #[test]
    fn transmission_survives_arbitrary_input() {
        let mut cfg = config("random");
        cfg.limits.max_payload = 1 << 16;
        let server = start_with(cfg, vec![("disk", mem(1 << 20) as _)]);
        let mut runner = TestRunner::new(Config {
            cases: 48,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&proptest::collection::vec(piece(), 0..12), |pieces| {
                let mut raw = Raw::connect(&server, pieces.len() % 2 == 0);
                for p in &pieces {
                    let _ = raw.s.write_all(p);
                }
                let _ = raw.s.shutdown(Shutdown::Write);
                let t0 = Instant::now();
                let mut sink = Vec::new();
                let _ = raw.s.read_to_end(&mut sink);
                prop_assert!(t0.elapsed() < Duration::from_secs(8), "server did not close");
                let mut c =
                    Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).unwrap();
                let mut buf = [0u8; 512];
                c.read(0, &mut buf).unwrap();
                Ok(())
            })
            .unwrap();
        let stats = server.shutdown();
        assert_eq!(stats.active_connections, 0);
    }
}

/// An export that fails every call with ESHUTDOWN once `closed` is set, as
/// a detached cache volume does.
struct Closable {
    inner: MemExport,
    closed: std::sync::atomic::AtomicBool,
}

impl iocache_nbd::Export for Closable {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), iocache_nbd::ExportError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(iocache_nbd::ExportError::Shutdown);
        }
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), iocache_nbd::ExportError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(iocache_nbd::ExportError::Shutdown);
        }
        self.inner.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), iocache_nbd::ExportError> {
        Ok(())
    }
}

#[test]
fn exports_join_and_leave_a_running_server() {
    let a = Arc::new(MemExport::new(1 << 20));
    let server = start_with(config("live"), vec![("a", a as _)]);
    let path = server.unix_path().unwrap().to_path_buf();
    let uri = |name: &str| format!("nbd+unix:///{name}?socket={}", path.display());
    let handle = server.exports();
    let e = Client::connect(&uri("b")).unwrap_err();
    assert!(matches!(e, iocache_nbd::ClientError::UnknownExport(_)), "{e}");

    // Added at run time: reachable, listed, refused twice.
    let b = Arc::new(Closable {
        inner: MemExport::new(2 << 20),
        closed: Default::default(),
    });
    handle.add_export("b", b.clone()).unwrap();
    assert!(
        handle.add_export("b", mem(4096)).is_err(),
        "a served name cannot be added again"
    );
    assert_eq!(handle.names(), vec!["a".to_string(), "b".to_string()]);
    let mut c = Client::connect(&uri("b")).unwrap();
    assert_eq!(c.size(), 2 << 20);
    c.write(0, &[9u8; 4096], false).unwrap();
    let listed = list_exports(&NbdAddr::Unix { socket: path.clone() }).unwrap();
    assert_eq!(listed.len(), 2);
    // A second connection sits in the transmission phase on `b`.
    let mut idle = Client::connect(&uri("b")).unwrap();
    let started = Instant::now();
    // The server registers a connection just after answering NBD_OPT_GO.
    while handle.connections_to("b") < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "connections not registered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(handle.connections_to("b"), 2);

    // Removed: new handshakes get NBD_REP_ERR_UNKNOWN, connections on it are
    // closed after what they sent is answered, the other export is untouched.
    b.closed.store(true, Ordering::SeqCst);
    assert!(handle.remove_export("b").is_some());
    assert!(handle.remove_export("b").is_none());
    let e = Client::connect(&uri("b")).unwrap_err();
    assert!(matches!(e, iocache_nbd::ClientError::UnknownExport(_)), "{e}");
    let mut back = [0u8; 512];
    let e = c.read(0, &mut back).unwrap_err();
    assert!(
        e.errno() == Some(NBD_ESHUTDOWN)
            || matches!(
                e,
                iocache_nbd::ClientError::Io(_) | iocache_nbd::ClientError::Broken
            ),
        "{e}"
    );
    assert!(idle.read(0, &mut back).is_err());
    let started = Instant::now();
    while handle.connections_to("b") > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "connections to a removed export stay open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut a_client = Client::connect(&uri("")).unwrap();
    assert_eq!(a_client.size(), 1 << 20, "the default export still serves");
    a_client.write(0, &[1u8; 512], true).unwrap();

    // The name can serve again (here a new export), and is the default export again
    // if it was before.
    handle.add_export("b", mem(3 << 20)).unwrap();
    assert_eq!(Client::connect(&uri("b")).unwrap().size(), 3 << 20);
    assert!(handle.remove_export("a").is_some());
    let e = Client::connect(&uri("")).unwrap_err();
    assert!(matches!(e, iocache_nbd::ClientError::UnknownExport(_)), "{e}");
    handle.add_export("a", mem(5 << 20)).unwrap();
    assert_eq!(Client::connect(&uri("")).unwrap().size(), 5 << 20);
    server.shutdown();
}

/// Old failure: a client that stopped reading its replies delayed a
/// shutdown by about two minutes (each blocked reply waited out its own
/// timeout). Now a shutdown waits `shutdown_grace`, then closes it.
#[test]
fn a_client_that_stops_reading_replies_cannot_hold_a_shutdown() {
    let config = ServerConfig {
        reply_timeout: Some(Duration::from_secs(60)),
        shutdown_grace: Duration::from_millis(500),
        ..config("unread")
    };
    let server = start_with(config, vec![("disk", mem(64 << 20) as _)]);
    let mut raw = Raw::connect(&server, true);
    // 32 MiB of replies the client never reads: more than the socket buffers hold.
    for handle in 0..16u64 {
        raw.send(handle, NBD_CMD_READ, 0, handle * (2 << 20), 2 << 20, &[]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    server.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
}

#[test]
fn block_status_answers_base_allocation_once_selected() {
    let server = start("status", mem(1 << 20));
    let socket = server.unix_path().unwrap();
    // Not selected: the client says so, the server refuses the command.
    let mut plain = Client::connect_unix(socket, &ConnectOptions::export("")).unwrap();
    assert!(!plain.has_allocation());
    assert!(plain.block_status(0, 4096).is_err());
    let e = plain
        .raw_request(NBD_CMD_BLOCK_STATUS, 0, 0, 4096, &[], None)
        .unwrap_err();
    assert_eq!(e.errno(), Some(NBD_EINVAL));
    // Selected: one data extent (memory is all allocated).
    let opts = ConnectOptions {
        allocation: true,
        ..ConnectOptions::export("")
    };
    let mut c = Client::connect_unix(socket, &opts).unwrap();
    assert!(c.has_allocation());
    let extents = c.block_status(4096, 65536).unwrap();
    assert_eq!(
        extents,
        vec![iocache_nbd::proto::Extent {
            length: 65536,
            flags: 0
        }]
    );
    // Without structured replies there is no context.
    let opts = ConnectOptions {
        allocation: true,
        structured_replies: false,
        ..ConnectOptions::export("")
    };
    assert!(!Client::connect_unix(socket, &opts).unwrap().has_allocation());
    // Still in frame.
    let mut buf = vec![0u8; 512];
    c.read(0, &mut buf).unwrap();
}

/// A client that sends a long pipeline (reads whose replies overflow the
/// socket buffers, and writes whose payloads follow them) before reading
/// any reply is served without a stall: the server goes on reading while
/// the replies wait, within the connection's budget. Old failure: reading
/// stopped as soon as a reply write blocked, and both ends waited until a
/// timeout (a 60 s reply timeout here; the client gives up after 10 s).
#[test]
fn a_long_pipeline_sent_before_any_reply_is_read_does_not_stall() {
    // Four threads a connection (three may wait for the client while one
    // reads), and one (every reply the socket does not take is queued).
    for workers in [4, 1] {
        late_reader_pipeline(workers);
    }
}

fn late_reader_pipeline(workers: usize) {
    let config = ServerConfig {
        reply_timeout: Some(Duration::from_secs(60)),
        workers_per_connection: workers,
        ..config("pipeline")
    };
    let size = 64usize << 20;
    let export = mem(size);
    let piece = 1usize << 20;
    let pairs = 24u64;
    // The first half holds data the reads check (sent from where it lies
    // when the socket takes it, else from a copy in the queue).
    for i in 0..pairs {
        export
            .write(i * piece as u64, &pattern(piece, 100 + i), false)
            .unwrap();
    }
    let server = start_with(config, vec![("disk", export as _)]);
    for structured in [true, false] {
        let mut raw = Raw::connect(&server, structured);
        raw.s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let started = Instant::now();
        for i in 0..pairs {
            // Reads of the first half, writes to the second.
            raw.send(2 * i, NBD_CMD_READ, 0, i * piece as u64, piece as u32, &[]);
            let data = pattern(piece, i);
            let at = (size / 2 + i as usize * piece) as u64;
            raw.send(2 * i + 1, NBD_CMD_WRITE, 0, at, piece as u32, &data);
        }
        // And a read above the 32 MiB maximum, written in pieces while
        // the replies before it wait in the queue.
        let huge = 40usize << 20;
        raw.send(999, NBD_CMD_READ, 0, 0, huge as u32, &[]);
        let sent = started.elapsed();
        let length = |h: u64| match h {
            999 => huge,
            h if h % 2 == 0 => piece,
            _ => 0,
        };
        let mut answered = std::collections::HashSet::new();
        for _ in 0..2 * pairs + 1 {
            let (handle, errno, data) = raw.recv(length);
            assert_eq!(errno, 0, "request {handle}");
            assert_eq!(data.len(), length(handle), "read {handle}");
            if handle % 2 == 0 && handle < 2 * pairs {
                assert!(data == pattern(piece, 100 + handle / 2), "read {handle}'s data");
            }
            assert!(answered.insert(handle), "request {handle} answered twice");
        }
        assert!(
            sent < Duration::from_secs(5),
            "structured={structured}: sending the pipeline took {sent:?}"
        );
        // The writes landed.
        for i in 0..pairs {
            let at = (size / 2 + i as usize * piece) as u64;
            raw.send(1000 + i, NBD_CMD_READ, 0, at, piece as u32, &[]);
            let (_, errno, data) = raw.recv(|_| piece);
            assert_eq!(errno, 0);
            assert!(data == pattern(piece, i), "write {i} read back");
        }
    }
    assert!(
        server.stats().replies_queued > 0,
        "the replies waited in the queue"
    );
    server.shutdown();
}

/// READs and WRITEs above the advertised maximum block size (32 MiB) are
/// served in pieces, up to `max_request_bytes`, holding one piece of
/// budget; above it both are refused with EINVAL and the connection stays
/// usable. Old failure: a READ over 32 MiB got EINVAL and a WRITE over
/// 32 MiB closed the connection (nbd-tester-client's integrityhuge test
/// reads 42,380,288 bytes at once).
#[test]
fn requests_above_the_block_size_maximum_are_served_in_pieces() {
    let size = 300usize << 20;
    let config = ServerConfig {
        reply_timeout: Some(Duration::from_secs(60)),
        max_request_bytes: 256 << 20,
        ..config("huge")
    };
    let server = start_with(config, vec![("disk", mem(size) as _)]);
    for structured in [true, false] {
        let mut raw = Raw::connect(&server, structured);
        raw.s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        for (handle, length) in [(1u64, 256usize << 20), (2, 42_380_288)] {
            let offset = 4096 * handle;
            let data = pattern(length, handle + structured as u64);
            raw.send(
                handle,
                NBD_CMD_WRITE,
                NBD_CMD_FLAG_FUA,
                offset,
                length as u32,
                &data,
            );
            let (h, errno, _) = raw.recv(|_| 0);
            assert_eq!((h, errno), (handle, 0), "write of {length}");
            raw.send(handle + 10, NBD_CMD_READ, 0, offset, length as u32, &[]);
            let (h, errno, read) = raw.recv(|_| length);
            assert_eq!((h, errno), (handle + 10, 0), "read of {length}");
            assert!(
                read == data,
                "structured={structured}: {length} bytes read back differ"
            );
        }
        // Above the largest request: EINVAL for both, the connection kept.
        let over = (256u32 << 20) + 4096;
        raw.send(20, NBD_CMD_READ, 0, 0, over, &[]);
        assert_eq!(raw.recv(|_| 0).1, NBD_EINVAL);
        raw.send(21, NBD_CMD_WRITE, 0, 0, over, &vec![0xee; over as usize]);
        assert_eq!(raw.recv(|_| 0).1, NBD_EINVAL);
        // A piece past the end: the whole WRITE refused, nothing written.
        let tail = 64usize << 20;
        raw.send(
            22,
            NBD_CMD_WRITE,
            0,
            (size - tail / 2) as u64,
            tail as u32,
            &vec![0xdd; tail],
        );
        assert_eq!(raw.recv(|_| 0).1, NBD_ENOSPC);
        raw.send(23, NBD_CMD_READ, 0, (size - 4096) as u64, 4096, &[]);
        let (h, errno, last) = raw.recv(|_| 4096);
        assert_eq!((h, errno), (23, 0));
        assert!(last.iter().all(|&b| b != 0xdd), "the refused write left nothing");
    }
    // One piece of budget at a time, never a whole request's.
    let peak = server.stats().peak_inflight_bytes;
    assert!(peak <= 64 << 20, "peak payload held: {peak}");
    server.shutdown();
}
