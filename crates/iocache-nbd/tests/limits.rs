//! connections that do nothing, or too little, cannot
//! keep other clients out. Each test is an attack that once locked every
//! other client out: idle handshakes filling the connection limit (on
//! both listeners), a handshake trickled a byte at a time (the timeout was
//! per read), a TCP flood taking the Unix socket's places too (one limit
//! for both), and idle transmission connections filling a listener.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use iocache_nbd::{Client, ConnectOptions, RunningServer, ServerConfig};

fn unix_client(server: &RunningServer) -> Result<Client, iocache_nbd::ClientError> {
    Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default())
}

fn tcp_client(server: &RunningServer) -> Result<Client, iocache_nbd::ClientError> {
    Client::connect_tcp(server.tcp_addr().unwrap(), &ConnectOptions::default())
}

/// A client that reads (one round trip) and hangs up.
fn served(client: Result<Client, iocache_nbd::ClientError>) -> bool {
    let Ok(mut c) = client else { return false };
    let mut buf = [0u8; 512];
    c.read(0, &mut buf).is_ok()
}

/// Reads until the server closes the stream; returns how long that took
/// (`None`: still open after `limit`).
fn closed_within<S: Read>(s: &mut S, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if started.elapsed() >= limit {
                    return None;
                }
            }
            Err(_) => return Some(started.elapsed()),
        }
    }
}

/// Old failure: the 64 connections of `max_connections` were shared by
/// both listeners and counted from accept, so 64 clients that connected
/// and said nothing (or read the greeting and stopped) closed every later
/// connection, on TCP and on the Unix socket, for 30 s each. Now
/// handshaking connections have their own smaller budget per listener and
/// a new one evicts the oldest.
#[test]
fn idle_handshakes_do_not_lock_out_new_clients_on_either_listener() {
    // The default limits (64 connections, 16 handshakes per listener).
    let server = start("hsidle", mem(1 << 20));
    let mut idle_unix = Vec::new();
    let mut idle_tcp = Vec::new();
    for _ in 0..64 {
        idle_unix.push(UnixStream::connect(server.unix_path().unwrap()).unwrap());
        idle_tcp.push(TcpStream::connect(server.tcp_addr().unwrap()).unwrap());
    }
    // Let the accept threads take them all up.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    assert!(served(unix_client(&server)), "a new Unix client is served");
    assert!(served(tcp_client(&server)), "a new TCP client is served");
    assert!(started.elapsed() < Duration::from_secs(3));
    // The oldest idle handshakes were the ones closed.
    idle_unix[0]
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    // (Evicted so early that it may not even have had the greeting.)
    assert!(
        closed_within(&mut idle_unix[0], Duration::from_secs(2)).is_some(),
        "the oldest handshake was evicted"
    );
    let stats = server.stats();
    assert!(
        stats.evicted_connections >= 2 * (64 - 16),
        "evicted {}",
        stats.evicted_connections
    );
    drop(idle_unix);
    drop(idle_tcp);
    server.shutdown();
}

/// Sends `bytes` one every `every` on `w` until it fails or all are sent.
fn trickle<W: Write + Send + 'static>(
    mut w: W,
    bytes: Vec<u8>,
    every: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for b in bytes {
            std::thread::sleep(every);
            if w.write_all(&[b]).is_err() {
                return;
            }
        }
    })
}

/// Old failure: `handshake_timeout` applied to each read, so a client
/// sending one byte every 250 ms (less than the timeout apart) kept its
/// handshake, its thread and its connection place forever. Now the whole
/// handshake must finish within `handshake_timeout`.
#[test]
fn a_trickled_handshake_is_closed_at_the_total_deadline() {
    let config = ServerConfig {
        handshake_timeout: Some(Duration::from_secs(1)),
        ..config("slowloris")
    };
    let server = start_with(config, vec![("disk", mem(1 << 20) as _)]);
    // Client flags, then an option header, a byte at a time: 5 s of input.
    let mut input = 3u32.to_be_bytes().to_vec();
    input.extend_from_slice(&iocache_nbd::proto::encode_option(
        iocache_nbd::proto::NBD_OPT_LIST,
        &[],
    ));
    let mut u = UnixStream::connect(server.unix_path().unwrap()).unwrap();
    let mut t = TcpStream::connect(server.tcp_addr().unwrap()).unwrap();
    u.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    t.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let tu = trickle(u.try_clone().unwrap(), input.clone(), Duration::from_millis(250));
    let tt = trickle(t.try_clone().unwrap(), input, Duration::from_millis(250));
    let took_u = closed_within(&mut u, Duration::from_secs(3));
    let took_t = closed_within(&mut t, Duration::from_secs(3));
    assert!(
        took_u.is_some_and(|d| d < Duration::from_millis(2000)),
        "Unix handshake closed after {took_u:?}"
    );
    assert!(took_t.is_some(), "TCP handshake closed ({took_t:?})");
    let _ = tu.join();
    let _ = tt.join();
    assert_eq!(server.stats().handshake_timeouts, 2);
    assert!(served(unix_client(&server)));
    server.shutdown();
}

/// Old failure: one `max_connections` for both listeners, so TCP clients
/// filling it locked out the local Unix socket too. Now each listener has
/// its own budget.
#[test]
fn a_full_tcp_listener_does_not_lock_out_the_unix_socket() {
    let config = ServerConfig {
        max_connections: 4,
        idle_eviction: None,
        ..config("families")
    };
    let server = start_with(config, vec![("disk", mem(1 << 20) as _)]);
    let tcp: Vec<Client> = (0..4).map(|_| tcp_client(&server).unwrap()).collect();
    assert!(!served(tcp_client(&server)), "TCP is full");
    let unix: Vec<Client> = (0..4).map(|_| unix_client(&server).unwrap()).collect();
    assert!(!served(unix_client(&server)), "the Unix socket is full");
    // One client address and user: the peer's limit (at most the
    // listener's) is what refused them (tests/peer_limits.rs).
    let stats = server.stats();
    assert_eq!(stats.refused_connections + stats.refused_per_peer, 2, "{stats:?}");
    drop(tcp);
    drop(unix);
    server.shutdown();
}

/// Old failure: transmission connections with nothing in flight kept their
/// places for ever, so a full listener refused every new client. Now, when
/// the listener is full, the one idle longest (at least `idle_eviction`)
/// makes room; busy ones and recently active ones are kept.
#[test]
fn idle_transmission_connections_make_room_only_when_the_listener_is_full() {
    let config = ServerConfig {
        max_connections: 2,
        // A second, so that a stalled test machine does not make the
        // client idle long enough before the first check.
        idle_eviction: Some(Duration::from_secs(1)),
        ..config("idle")
    };
    let server = start_with(config, vec![("disk", mem(1 << 20) as _)]);
    let mut idle = unix_client(&server).unwrap();
    let mut busy = unix_client(&server).unwrap();
    assert!(!served(unix_client(&server)), "nobody idle long enough yet");
    let mut buf = [0u8; 512];
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1300) {
        busy.read(0, &mut buf).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(served(unix_client(&server)), "the idle one made room");
    assert!(idle.read(0, &mut buf).is_err(), "the idle one was closed");
    busy.read(0, &mut buf).unwrap();
    assert_eq!(server.stats().evicted_connections, 1);
    server.shutdown();
}

/// Old failure (the DoS soak): connections that pipelined reads and never
/// read the replies took every place of their listener, and being busy they
/// were never evicted as idle, so fresh clients were refused. Now a full
/// listener closes the connection that has made no progress for longest,
/// once that is at least `stall_timeout`.
#[test]
fn connections_that_stopped_reading_make_room_on_a_full_listener() {
    use iocache_nbd::proto::NBD_CMD_READ;
    let config = ServerConfig {
        max_connections: 4,
        max_inflight_bytes: 8 << 20,
        reply_timeout: Some(Duration::from_secs(60)),
        stall_timeout: Duration::from_secs(1),
        ..config("stuck")
    };
    let server = start_with(config, vec![("disk", mem(16 << 20) as _)]);
    let mut stuck: Vec<Raw> = (0..4).map(|_| Raw::connect(&server, true)).collect();
    for raw in &mut stuck {
        // 8 MiB of replies: more than the socket buffers take.
        for handle in 0..4u64 {
            raw.send(handle, NBD_CMD_READ, 0, handle << 21, 2 << 20, &[]);
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !served(unix_client(&server)),
        "the listener is full and nobody is stuck long enough yet"
    );
    std::thread::sleep(Duration::from_millis(1200));
    assert!(served(unix_client(&server)), "a stuck connection made room");
    assert!(server.stats().evicted_connections >= 1);
    drop(stuck);
    server.shutdown();
}
