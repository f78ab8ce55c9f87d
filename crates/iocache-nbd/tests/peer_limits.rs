//! Limits per peer: one client that reconnects as fast
//! as the server closes it (the DoS soak with `--reconnect-delay 0`) could
//! take every place of a listener, since the limits were per listener only.
//! Each flood test runs the same attack twice: with the limits per peer
//! made as large as the listener's (the old behaviour), where the attacker
//! locks the probing client out, then with limits per peer, where every
//! probe of another peer is served.
//!
//! A peer is a user id on the Unix socket, so the Unix test runs its
//! attacker as uid 65534 in a child process (this test binary again, the
//! ignored `unix_attacker_process` test); it needs root and says it was
//! skipped otherwise. On TCP a peer is an address: attackers bind their
//! sockets to 127.0.0.2 and 127.0.0.3, probes come from 127.0.0.1.

mod common;

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use iocache_nbd::proto::*;
use iocache_nbd::{Client, ConnectOptions, RunningServer, ServerConfig};

/// The uid the Unix attacker runs as (nobody).
const ATTACKER_UID: u32 = 65534;
/// Environment of the attacker process: the socket to flood (until its
/// standard input is closed).
const ENV_SOCKET: &str = "IOCACHE_PEER_ATTACK_SOCKET";

/// Connections a flooding peer keeps in transmission (enough to fill a
/// listener of the flood tests alone), and in handshake.
const HOLDERS: usize = 12;
const FLOODERS: usize = 12;

fn probe_options() -> ConnectOptions {
    ConnectOptions {
        timeout: Some(Duration::from_secs(5)),
        ..ConnectOptions::default()
    }
}

/// A client that connects, reads one block and hangs up.
fn served(client: Result<Client, iocache_nbd::ClientError>) -> bool {
    let Ok(mut c) = client else { return false };
    let mut buf = [0u8; 4096];
    c.read(0, &mut buf).is_ok()
}

/// Fixed newstyle handshake with NBD_OPT_GO on the default export; any
/// failure (the server closed us) is an error, never a panic.
fn negotiate<S: Read + Write>(s: &mut S) -> io::Result<()> {
    let mut greeting = [0u8; GREETING_LEN];
    s.read_exact(&mut greeting)?;
    s.write_all(&(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes())?;
    let go = InfoRequest {
        name: String::new(),
        requests: Vec::new(),
    };
    s.write_all(&encode_option(NBD_OPT_GO, &go.encode()))?;
    loop {
        let mut header = [0u8; 20];
        s.read_exact(&mut header)?;
        let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(header[16..20].try_into().unwrap());
        io::copy(&mut Read::by_ref(s).take(len as u64), &mut io::sink())?;
        if reply_type == NBD_REP_ACK {
            return Ok(());
        }
        if reply_type & NBD_REP_FLAG_ERROR != 0 {
            return Err(io::Error::other("NBD_OPT_GO refused"));
        }
    }
}

/// Blocks until the server closes `s` or `stop` is set.
fn hold<S: Read>(s: &mut S, stop: &AtomicBool) {
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// A libc call's result: the OS error when it returned non-zero.
fn os_result(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A TCP connection to `to` from the local address `source` (any address
/// of 127/8 is this machine's loopback on Linux).
fn tcp_from(source: Ipv4Addr, to: SocketAddr) -> io::Result<TcpStream> {
    let SocketAddr::V4(to) = to else {
        return Err(io::Error::other("IPv4 only"));
    };
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket descriptor, owned by the TcpStream at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket nobody else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let local = sockaddr(source, 0);
    let remote = sockaddr(*to.ip(), to.port());
    // SAFETY: bind and connect read `len` bytes of live sockaddr_in values.
    os_result(unsafe {
        libc::bind(
            stream.as_raw_fd(),
            (&local as *const libc::sockaddr_in).cast(),
            len,
        )
    })?;
    // SAFETY: as above.
    os_result(unsafe {
        libc::connect(
            stream.as_raw_fd(),
            (&remote as *const libc::sockaddr_in).cast(),
            len,
        )
    })?;
    Ok(stream)
}

/// Starts one peer's flood: `HOLDERS` threads that negotiate and then sit
/// idle in transmission, `FLOODERS` that connect and say nothing; each
/// reconnects at once when the server closes it. Returns the threads and
/// a count of connections made.
fn flood<S, C>(connect: C, stop: &Arc<AtomicBool>) -> (Vec<JoinHandle<()>>, Arc<AtomicU64>)
where
    S: Read + Write,
    C: Fn() -> io::Result<S> + Send + Sync + Clone + 'static,
{
    let made = Arc::new(AtomicU64::new(0));
    let threads = (0..HOLDERS + FLOODERS)
        .map(|i| {
            let (connect, stop, made) = (connect.clone(), Arc::clone(stop), Arc::clone(&made));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = connect() else {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    made.fetch_add(1, Ordering::Relaxed);
                    if i < HOLDERS && negotiate(&mut s).is_err() {
                        continue;
                    }
                    hold(&mut s, &stop);
                }
            })
        })
        .collect();
    (threads, made)
}

/// Probes `n` times, 50 ms apart; returns how many were served.
fn probe(n: usize, mut once: impl FnMut() -> bool) -> usize {
    (0..n)
        .filter(|_| {
            let ok = once();
            std::thread::sleep(Duration::from_millis(50));
            ok
        })
        .count()
}

/// Waits (at most 10 s) until `ready` holds of the server's counters.
fn wait_for(server: &RunningServer, what: &str, ready: impl Fn(&iocache_nbd::ServerStats) -> bool) {
    let started = Instant::now();
    while !ready(&server.stats()) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: {:?}",
            server.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A listener of 12 places (4 in handshake at once); per peer 4 places and
/// 2 handshakes, or (`per_peer` false) the listener's own limits, as
/// before limits per peer existed.
fn flood_config(tag: &str, per_peer: bool) -> ServerConfig {
    let base = ServerConfig {
        max_connections: 12,
        max_handshakes: 4,
        // Never in these tests: the attackers' idle connections would be
        // closed for the probes after a minute, not in the test's seconds.
        idle_eviction: None,
        ..config(tag)
    };
    ServerConfig {
        max_connections_per_peer: if per_peer { 4 } else { base.max_connections },
        max_handshakes_per_peer: if per_peer { 2 } else { base.max_handshakes },
        ..base
    }
}

/// Waits until a flood from `attackers` peers is in place: with limits
/// per peer (`per_peer`), each at its 4 places (`at_limit` says so);
/// without, every place of the listener taken.
fn wait_for_flood(server: &RunningServer, per_peer: bool, attackers: u64, at_limit: &str) {
    if per_peer {
        wait_for(server, at_limit, |s| {
            s.refused_per_peer > 100 && s.transmissions >= 4 * attackers
        });
    } else {
        wait_for(server, "the listener full", |s| {
            s.refused_connections + s.refused_per_peer > 100 && s.transmissions >= 12
        });
    }
}

/// Old failure: two addresses that reconnect at once took all 12 places
/// of the TCP listener (the idle ones in transmission are never evicted,
/// the others churn through the handshakes), so a client from a third
/// address was refused. Now each address holds at most 4.
#[test]
fn a_reconnecting_flood_from_two_addresses_cannot_lock_out_a_third_on_tcp() {
    for per_peer in [false, true] {
        let server = start_with(
            flood_config(&format!("tcpflood-{per_peer}"), per_peer),
            vec![("disk", mem(1 << 20) as _)],
        );
        let addr = server.tcp_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut made = Vec::new();
        for source in [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)] {
            let (t, m) = flood(
                move || {
                    let s = tcp_from(source, addr)?;
                    s.set_read_timeout(Some(Duration::from_millis(200)))?;
                    Ok(s)
                },
                &stop,
            );
            threads.extend(t);
            made.push(m);
        }
        wait_for_flood(&server, per_peer, 2, "both attackers at their limit");
        let ok = probe(20, || served(Client::connect_tcp(addr, &probe_options())));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let stats = server.shutdown();
        for m in &made {
            assert!(
                m.load(Ordering::Relaxed) > 100,
                "each attacker reconnected many times"
            );
        }
        if per_peer {
            assert_eq!(ok, 20, "every probe served with limits per peer: {stats:?}");
            assert_eq!(stats.refused_connections, 0, "{stats:?}");
        } else {
            assert_eq!(
                ok, 0,
                "without limits per peer the flood locks the probes out: {stats:?}"
            );
            // The listener turned the flood away when full. (Its per-peer
            // limit is then the listener's own, 12: when one address wins
            // all 12 places, which depends on timing, its next attempts
            // count as refused for its peer; so `refused_per_peer` may be
            // above 0 here. A CI run saw 5,214.)
            assert!(stats.refused_connections > 0, "{stats:?}");
        }
    }
}

/// Not a test of its own: the attacker of
/// `a_reconnecting_flood_of_another_user_cannot_lock_out_the_unix_socket`,
/// run by it as uid 65534 in a child process (this binary, with
/// `--ignored --exact`), flooding the socket named in its environment
/// until its standard input is closed.
#[test]
#[ignore = "the Unix flood test runs it as another user"]
fn unix_attacker_process() {
    let Ok(path) = std::env::var(ENV_SOCKET) else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (threads, made) = flood(
        move || {
            let s = UnixStream::connect(&path)?;
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            Ok(s)
        },
        &stop,
    );
    let _ = io::stdin().read_to_end(&mut Vec::new());
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    println!("attacker connections: {}", made.load(Ordering::Relaxed));
}

/// Says the Unix flood test did not run, and why, on the test's standard
/// error itself: libtest captures `eprintln!` of a passing test, and
/// stable Rust cannot mark a test ignored at run time.
fn skipped(why: &str) {
    let _ = writeln!(
        io::stderr(),
        "SKIPPED a_reconnecting_flood_of_another_user_cannot_lock_out_the_unix_socket: {why}"
    );
}

/// Old failure (the DoS soak, `--reconnect-delay 0`: 2 of 15 Unix probes
/// refused): another user's connections, reconnecting at once, took every
/// place of the Unix socket. Now that user holds at most 4 of its 12.
#[test]
fn a_reconnecting_flood_of_another_user_cannot_lock_out_the_unix_socket() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skipped(&format!(
            "needs root, to run the attacker as uid {ATTACKER_UID} (a peer on the Unix socket is a user)"
        ));
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for per_peer in [false, true] {
        let config = ServerConfig {
            // Let the attacker's user connect.
            unix_socket_mode: 0o666,
            ..flood_config(&format!("unixflood-{per_peer}"), per_peer)
        };
        let server = start_with(config, vec![("disk", mem(1 << 20) as _)]);
        let attacker = std::process::Command::new(&exe)
            .args(["--ignored", "--exact", "unix_attacker_process", "--nocapture"])
            .env(ENV_SOCKET, server.unix_path().unwrap())
            .uid(ATTACKER_UID)
            .gid(ATTACKER_UID)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn();
        let mut attacker = match attacker {
            Ok(child) => child,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                skipped(&format!("uid {ATTACKER_UID} cannot run {} ({e})", exe.display()));
                return;
            }
            Err(e) => panic!("cannot start the attacker: {e}"),
        };
        wait_for_flood(&server, per_peer, 1, "the attacker at its limit");
        let path = server.unix_path().unwrap().to_path_buf();
        let ok = probe(20, || served(Client::connect_unix(&path, &probe_options())));
        // Its standard input closed: the attacker stops.
        drop(attacker.stdin.take());
        let out = attacker.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&out.stdout);
        let stats = server.shutdown();
        let made: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("attacker connections: "))
            .unwrap_or_else(|| panic!("the attacker ran: {out}"))
            .parse()
            .unwrap();
        assert!(made > 100, "the attacker reconnected many times ({made})");
        if per_peer {
            assert_eq!(ok, 20, "every probe served with limits per peer: {stats:?}");
        } else {
            assert_eq!(
                ok, 0,
                "without limits per peer the flood locks the probes out: {stats:?}"
            );
        }
    }
}

/// Reads the greeting, then tells whether the server closed the stream
/// within `within`.
fn closed_after_greeting(s: &mut TcpStream, within: Duration) -> bool {
    let mut greeting = [0u8; GREETING_LEN];
    if s.read_exact(&mut greeting).is_err() {
        return true;
    }
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 16];
    !matches!(s.read(&mut buf), Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}

/// Fairness on a full listener: the handshake closed for a newcomer is the
/// oldest of the peer holding the most places, not the oldest of all (old
/// behaviour: a peer with one place, connected first, was the one evicted
/// while another held three).
#[test]
fn a_full_listener_evicts_a_handshake_of_the_peer_holding_most_places() {
    let config = ServerConfig {
        max_connections: 4,
        max_handshakes: 4,
        max_connections_per_peer: 4,
        max_handshakes_per_peer: 4,
        idle_eviction: None,
        ..config("fair")
    };
    let server = start_with(config, vec![("disk", mem(1 << 20) as _)]);
    let addr = server.tcp_addr().unwrap();
    let mut small = tcp_from(Ipv4Addr::new(127, 0, 0, 3), addr).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut big: Vec<TcpStream> = (0..3)
        .map(|_| {
            let s = tcp_from(Ipv4Addr::new(127, 0, 0, 2), addr).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s
        })
        .collect();
    wait_for(&server, "four handshakes", |s| s.connections == 4);
    assert!(
        served(Client::connect_tcp(addr, &probe_options())),
        "the newcomer is served"
    );
    assert!(
        !closed_after_greeting(&mut small, Duration::from_millis(300)),
        "the peer with one place kept it"
    );
    assert!(
        closed_after_greeting(&mut big[0], Duration::from_secs(2)),
        "the biggest peer's oldest handshake made room"
    );
    assert!(!closed_after_greeting(&mut big[1], Duration::from_millis(300)));
    assert_eq!(server.stats().evicted_connections, 1);
    server.shutdown();
}

/// A peer at its limit with every place in transmission is refused at
/// once (counted apart from a full listener), and its handshakes beyond
/// `max_handshakes_per_peer` evict its own oldest, not another peer's.
#[test]
fn a_peer_at_its_limit_is_refused_and_churns_only_its_own_handshakes() {
    let config = ServerConfig {
        max_connections: 16,
        max_handshakes: 8,
        max_connections_per_peer: 2,
        max_handshakes_per_peer: 1,
        ..config("peerlimit")
    };
    let server = start_with(config, vec![("disk", mem(1 << 20) as _)]);
    let addr = server.tcp_addr().unwrap();
    let other = Ipv4Addr::new(127, 0, 0, 2);
    let mut other_handshake = tcp_from(other, addr).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Three handshakes from 127.0.0.1: each evicts the one before it.
    let mut mine: Vec<TcpStream> = (0..3)
        .map(|_| {
            let s = TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            s
        })
        .collect();
    assert!(closed_after_greeting(&mut mine[0], Duration::from_secs(2)));
    assert!(closed_after_greeting(&mut mine[1], Duration::from_secs(2)));
    assert!(!closed_after_greeting(&mut mine[2], Duration::from_millis(300)));
    assert!(
        !closed_after_greeting(&mut other_handshake, Duration::from_millis(300)),
        "another peer's handshake is never evicted for this one"
    );
    assert_eq!(server.stats().evicted_connections, 2);
    drop(mine);
    // Two in transmission: the peer is at its limit, nothing to evict. The
    // server marks a connection as in transmission just after its client
    // has the reply to NBD_OPT_GO: until then it is a handshake, which the
    // next connection of the peer (at one handshake) would evict.
    let held: Vec<Client> = (1..=2)
        .map(|n| {
            let c = Client::connect_tcp(addr, &probe_options()).unwrap();
            wait_for(&server, "in transmission", |s| s.transmissions == n);
            c
        })
        .collect();
    assert!(!served(Client::connect_tcp(addr, &probe_options())));
    assert_eq!(server.stats().refused_per_peer, 1);
    assert_eq!(server.stats().refused_connections, 0);
    // Another peer is served.
    let mut s = tcp_from(other, addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    negotiate(&mut s).unwrap();
    drop(held);
    server.shutdown();
}

/// With 4 handshakes per peer (the first default), `fio --ioengine=nbd
/// --numjobs=8` lost jobs: its connections' handshakes all start at once,
/// and the fifth evicted the first. With the defaults, 16 clients of one
/// user connecting at once are all served.
#[test]
fn sixteen_clients_of_one_user_connecting_at_once_are_all_served() {
    let server = start("burst", mem(1 << 20));
    let path = server.unix_path().unwrap().to_path_buf();
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (path, barrier) = (path.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let mut c = Client::connect_unix(&path, &probe_options()).ok()?;
                // Every connection stays open until all have read.
                let mut buf = [0u8; 4096];
                c.read(0, &mut buf).ok()?;
                Some(c)
            })
        })
        .collect();
    let served = clients
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(Option::is_some)
        .count();
    let stats = server.shutdown();
    assert_eq!(served, 16, "{stats:?}");
    assert_eq!(stats.evicted_connections + stats.refused_per_peer, 0, "{stats:?}");
}
