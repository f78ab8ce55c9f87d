//! `iocache serve --adapt reca` with a real client: fio's
//! phases (sequential writes, random writes, verifying reads, random
//! reads) move
//! the running cache from one ReCA category to the next, `ctl get` and
//! `stats` show it, every change is logged once, a table with a mistake is
//! refused by `ctl reca-reload` naming the file, line and field, and every
//! block fio wrote reads back intact (crc32c), also after a restart.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use iocache_nbd::{Client, ConnectOptions};

mod common;
use common::{ctl, installed, nbd_uri, nbdkit_failing, temp_dir, temp_dir_with, Process, SHARED_CACHE};

type Server = Process;

/// `iocache serve ARGS` in `dir`, its output appended to `server.log`;
/// returns once a client connects with `options`.
fn spawn_server(dir: &Path, args: &[&str], options: ConnectOptions) -> Server {
    Process::serve(dir, args, options)
}

/// SIGTERM: the server writes every dirty line back and exits 0.
fn stop(server: Server) {
    assert!(server.stop().success());
}

fn start(dir: &Path, extra: &[&str]) -> Server {
    start_with_window(dir, "1000", extra)
}

fn start_with_window(dir: &Path, window: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--adapt", "reca", "--reca-window", window];
    args.extend_from_slice(extra);
    start_serving(dir, &args)
}

/// `iocache serve` of a 64 MiB backend through an 8 MiB cache, with `extra`.
fn start_serving(dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--backend-size", "64MiB", "--cache-size", "8MiB"];
    args.extend_from_slice(extra);
    spawn_server(dir, &args, ConnectOptions::default())
}

/// Waits (30 s at most) until the server's log has `needle`.
fn wait_for_log(dir: &Path, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(dir.join("server.log"))
        .unwrap()
        .contains(needle)
    {
        assert!(Instant::now() < deadline, "no `{needle}`: {:#}", stats(dir));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts that the server's log has every one of `needles`; returns it.
fn assert_logged(dir: &Path, needles: &[&str]) -> String {
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    for needle in needles {
        assert!(log.contains(needle), "no `{needle}` in:\n{log}");
    }
    log
}

/// A loopback address nothing listens on (yet).
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// `GET /metrics`.
fn scrape(address: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {address}\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

/// ReCA's part of `ctl get --json`.
fn reca(dir: &Path) -> serde_json::Value {
    let (ok, text) = ctl(dir, &["get", "--json"]);
    assert!(ok, "{text}");
    let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
    reply["reca"].clone()
}

fn wait_for(dir: &Path, category: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = reca(dir);
        if r["category"] == category {
            return r;
        }
        assert!(Instant::now() < deadline, "not {category}: {r:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a fio job does.
#[derive(Clone, Copy, PartialEq)]
enum Job {
    /// Writes every 4 KiB block once, with a crc32c of it inside.
    Write,
    /// Reads back what the same `Write` job wrote, checking every block.
    Verify,
    /// Reads every block once, not checked (for the workload only).
    Read,
}

/// One fio job over 16 MiB at `offset` in 4 KiB blocks; `rw` is its
/// order (the `Write` job's for `Verify`, which reads in offset order).
fn fio(dir: &Path, job: Job, rw: &str, offset: &str) -> Output {
    let uri = nbd_uri(dir);
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=reca",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        &format!("--rw={rw}"),
        &format!("--offset={offset}"),
        "--size=16M",
        "--bs=4k",
        "--iodepth=4",
        "--randseed=15",
        "--random_generator=lfsr",
    ]);
    match job {
        Job::Write => cmd.args(["--verify=crc32c", "--do_verify=0"]),
        Job::Verify => cmd.args([
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--verify_only",
            "--do_verify=1",
        ]),
        Job::Read => cmd.args(["--verify=0"]),
    };
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !text.contains("verify: bad") && text.contains("err= 0"),
        "fio {rw} at {offset}: {text}"
    );
    // Every block was written, or read back (4096 of 4 KiB).
    let issued = match job {
        Job::Write => "issued rwts: total=0,4096,",
        Job::Verify | Job::Read => "issued rwts: total=4096,",
    };
    assert!(text.contains(issued), "fio {rw} at {offset}: {text}");
    out
}

#[test]
fn serve_adapt_reca_switches_category_under_fio_and_keeps_every_block() {
    let Some(dir) = temp_dir_with(&["fio"], "fio") else {
        return;
    };
    let metrics = free_address();
    let server = start(&dir, &["--metrics", &metrics, "--reca-line-size", "next_start"]);
    // Before any window: ReCA runs, no category yet.
    let r = reca(&dir);
    assert_eq!(r["table"], "built-in");
    assert!(r["category"].is_null(), "{r:#}");

    // Sequential writes: large file generators, who want 128 KiB lines
    // (pending: the cache keeps its 4 KiB lines until a restart).
    fio(&dir, Job::Write, "write", "0");
    let r = wait_for(&dir, "large_file_generators");
    assert_eq!(r["write_policy"], "wb");
    assert_eq!(r["line_bytes"], 4096);
    assert_eq!(r["pending_line_bytes"], 128 << 10);
    let (ok, text) = ctl(&dir, &["get"]);
    assert!(
        ok && text.contains("category large_file_generators") && text.contains("PENDING"),
        "{text}"
    );

    // Random writes: random producer/consumers.
    fio(&dir, Job::Write, "randwrite", "32M");
    let r = wait_for(&dir, "random_producer_consumers");
    assert!(r["pending_line_bytes"].is_null(), "{r:#}");
    assert!(
        r["policy"].as_str().unwrap().starts_with("reca:evict=priority"),
        "{r:#}"
    );

    // Reading it all back, each block checked: fio reads in offset order,
    // so mostly sequential reads: archival consumers, a read-only cache
    // (wa) while the dirty lines from before are still served (and
    // drained).
    fio(&dir, Job::Verify, "randwrite", "32M");
    let r = wait_for(&dir, "archival_consumers");
    assert_eq!(r["write_policy"], "wa");
    let (ok, text) = ctl(&dir, &["get"]);
    assert!(ok && text.contains("wa write policy (controller)"), "{text}");

    // Random reads: random consumers.
    fio(&dir, Job::Read, "randread", "32M");
    wait_for(&dir, "random_consumers");
    let (ok, text) = ctl(&dir, &["stats"]);
    assert!(
        ok && text.contains("reca       category random_consumers"),
        "{text}"
    );
    let scraped = scrape(&metrics);
    for needle in [
        "iocache_cache_reca_category{cache=\"iocache-data/cache.img\",category=\"random_consumers\"} 1",
        "iocache_cache_reca_line_bytes{cache=\"iocache-data/cache.img\",state=\"in_force\"} 4096",
        "iocache_cache_reca_requests_total{cache=\"iocache-data/cache.img\",outcome=\"characterized\"}",
    ] {
        assert!(scraped.contains(needle), "no `{needle}` in:\n{scraped}");
    }

    // A table with a mistake is refused, naming the file, line and field;
    // the table in force stays.
    let bad = dir.join("bad.toml");
    let builtin = include_str!("../crates/iocache-core/data/reca-categories.toml");
    std::fs::write(
        &bad,
        builtin.replacen("line_size = \"4KiB\"", "line_size = \"3KiB\"", 1),
    )
    .unwrap();
    let (ok, text) = ctl(&dir, &["reca-reload", "--table", bad.to_str().unwrap()]);
    assert!(!ok, "{text}");
    let line = builtin.lines().position(|l| l == "line_size = \"4KiB\"").unwrap() + 1;
    assert!(text.contains(&format!("bad.toml:{line}: line_size")), "{text}");
    assert_eq!(reca(&dir)["table"], "built-in");
    // A good one is taken; the category stays.
    let good = dir.join("good.toml");
    std::fs::write(&good, builtin).unwrap();
    let (ok, text) = ctl(&dir, &["reca-reload", "--table", good.to_str().unwrap()]);
    assert!(ok && text.contains("good.toml"), "{text}");
    let r = reca(&dir);
    assert_eq!(r["category"], "random_consumers");

    // Everything written reads back, then again after a restart.
    fio(&dir, Job::Verify, "write", "0");
    stop(server);
    let server = start(&dir, &["--reca-line-size", "next_start"]);
    fio(&dir, Job::Verify, "write", "0");
    fio(&dir, Job::Verify, "randwrite", "32M");
    stop(server);

    // Each change was logged once, with its vector and distances.
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    for change in [
        "-> large_file_generators",
        "-> random_producer_consumers",
        "-> archival_consumers",
        "-> random_consumers",
    ] {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(change)).collect();
        assert!(!lines.is_empty(), "no `{change}` in:\n{log}");
        assert!(
            lines
                .iter()
                .all(|l| l.contains("distances:") && l.contains("sw=")),
            "{lines:?}"
        );
    }
    assert!(log.contains("line size: 4KiB -> 128KiB pending"), "{log}");
}

const NEXT_START: [&str; 2] = ["--reca-line-size", "next_start"];

/// ReCA's line size, recorded on the cache device, is taken at the next
/// start while the configuration says what it said; a changed `--line-size`
/// wins. Every block survives both reformats.
#[test]
fn the_line_size_reca_chose_is_taken_at_the_next_start() {
    let Some(dir) = temp_dir_with(&["fio"], "line") else {
        return;
    };
    let server = start(&dir, &NEXT_START);
    fio(&dir, Job::Write, "write", "0");
    let r = wait_for(&dir, "large_file_generators");
    assert_eq!(r["pending_line_bytes"], 128 << 10);
    stop(server);

    let server = start(&dir, &NEXT_START);
    let r = reca(&dir);
    assert_eq!(
        (r["line_bytes"].as_u64(), r["configured_line_bytes"].as_u64()),
        (Some(128 << 10), Some(4096))
    );
    let (ok, text) = ctl(&dir, &["get"]);
    assert!(
        ok && text.contains("line size 128KiB (ReCA's; configured 4KiB)"),
        "{text}"
    );
    fio(&dir, Job::Verify, "write", "0");
    // Sequential reads: archival consumers, who want 128 KiB too.
    let r = wait_for(&dir, "archival_consumers");
    assert!(r["pending_line_bytes"].is_null(), "{r:#}");
    stop(server);

    // Still recorded: the next start keeps 128 KiB without a reformat.
    let server = start(&dir, &NEXT_START);
    assert_eq!(reca(&dir)["line_bytes"], 128 << 10);
    stop(server);

    // The configuration changed since: it wins.
    let server = start(&dir, &["--line-size", "8KiB", "--reca-line-size", "next_start"]);
    let r = reca(&dir);
    assert_eq!(
        (r["line_bytes"].as_u64(), r["configured_line_bytes"].as_u64()),
        (Some(8192), Some(8192))
    );
    fio(&dir, Job::Verify, "write", "0");
    stop(server);

    assert_logged(
        &dir,
        &[
            "starting with ReCA's line size 128KiB (configured 4KiB; the cache holds 4KiB lines)",
            "keeping ReCA's line size 128KiB (configured 4KiB)",
            "ReCA's line size 128KiB of the last run was chosen over a configured 4KiB; the configuration says 8KiB now",
        ],
    );
}

/// `stats` as JSON: the first volume's entry.
fn stats(dir: &Path) -> serde_json::Value {
    let (ok, text) = ctl(dir, &["stats", "--json"]);
    assert!(ok, "{text}");
    let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
    reply["volumes"][0].clone()
}

fn wait_for_line_bytes(dir: &Path, line_bytes: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = stats(dir);
        if s["line_bytes"] == line_bytes && s["reca"]["line_bytes"] == line_bytes {
            return s;
        }
        assert!(Instant::now() < deadline, "not {line_bytes}-byte lines: {s:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With `reca_line_size = live` (the default) a category's line size is
/// put in force while serving: 4 KiB -> 128 KiB under sequential writes,
/// back to 4 KiB under random writes and reads; every
/// block reads back intact after each change and after a restart, and the
/// restart keeps the line size in force without formatting again.
#[test]
fn reca_changes_the_line_size_while_serving_and_keeps_every_block() {
    let Some(dir) = temp_dir_with(&["fio"], "live-line") else {
        return;
    };
    let server = start(&dir, &[]);
    // Sequential writes: large file generators, 128 KiB lines (the change
    // starts once a second window wanted them too).
    fio(&dir, Job::Write, "write", "0");
    wait_for(&dir, "large_file_generators");
    let s = wait_for_line_bytes(&dir, 128 << 10);
    assert!(s["reca"]["pending_line_bytes"].is_null(), "{s:#}");
    let changes = s["line_size_changes"].as_array().unwrap().clone();
    assert_eq!(changes.len(), 1, "{s:#}");
    assert_eq!(
        (
            changes[0]["old_line_bytes"].as_u64(),
            changes[0]["new_line_bytes"].as_u64()
        ),
        (Some(4096), Some(128 << 10))
    );
    // The old cache's data was copied across (all of it: it is far below
    // the bound), not read from the backend again.
    let (kept, warm) = (
        changes[0]["kept_bytes"].as_u64().unwrap(),
        changes[0]["warm_bytes"].as_u64().unwrap(),
    );
    assert!(kept > 0 && kept == warm, "{s:#}");
    // The category carried over to the new engine (and stays in force).
    assert_eq!(s["reca"]["category"], "large_file_generators");
    fio(&dir, Job::Verify, "write", "0");

    // Random writes then random reads elsewhere: random producer/consumers
    // and random consumers, both with 4 KiB lines.
    fio(&dir, Job::Write, "randwrite", "32M");
    fio(&dir, Job::Read, "randread", "32M");
    let s = wait_for_line_bytes(&dir, 4096);
    assert_eq!(s["line_size_changes"].as_array().unwrap().len(), 2, "{s:#}");
    fio(&dir, Job::Verify, "randwrite", "32M");
    fio(&dir, Job::Verify, "write", "0");
    stop(server);

    // Back at the configured 4 KiB: the restart loads the cache as it is
    // (no second format).
    let server = start(&dir, &[]);
    fio(&dir, Job::Verify, "write", "0");
    fio(&dir, Job::Verify, "randwrite", "32M");
    stop(server);

    let log = assert_logged(
        &dir,
        &[
            "line size 4KiB -> 128KiB while serving",
            "line size 128KiB -> 4KiB while serving",
            "warm-up done",
            "(0B of it from the backend)",
            "loaded the cache on iocache-data/cache.img (shut down cleanly)",
        ],
    );
    assert_eq!(log.matches("formatted a new cache").count(), 1, "{log}");
    // The fills came from the copies: the wrapper counted its answers.
    let served: Vec<u64> = log
        .lines()
        .filter_map(|l| {
            l.split(" fills of the warm-up were answered from the old cache's copies")
                .next()
                .filter(|_| l.contains("fills of the warm-up"))
        })
        .filter_map(|head| head.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(!served.is_empty() && served.iter().all(|&n| n > 0), "{log}");
    assert!(!log.contains("WARN"), "{log}");
}

/// What block `block` holds after its `generation`-th write (0: never
/// written, zeroes).
fn block_bytes(block: u64, generation: u32) -> Vec<u8> {
    if generation == 0 {
        return vec![0; 4096];
    }
    let mut out = Vec::with_capacity(4096);
    while out.len() < 4096 {
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&u64::from(generation).to_le_bytes());
    }
    out
}

/// A client that never stops writing and reading back while ReCA changes
/// the line size twice (4 KiB -> 128 KiB under sequential writes, back to
/// 4 KiB under random writes and reads): every request is answered without
/// error, every read returns what the last write put there (a model of the
/// 16 MiB region), and so does the whole region after a restart.
#[test]
fn line_size_changes_under_a_client_that_never_stops_lose_nothing() {
    const BLOCKS: u64 = 4096;
    let dir = temp_dir("under-load");
    let server = start(&dir, &[]);
    let socket = dir.join("iocache-data/iocache.sock");
    let mut client = Client::connect_unix(&socket, &ConnectOptions::default()).unwrap();
    let mut model = vec![0u32; BLOCKS as usize];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut buf = vec![0u8; 4096];
    let mut requests = 0u64;
    let mut cursor = 0u64;
    for (sequential, want) in [(true, 128u64 << 10), (false, 4096)] {
        let deadline = Instant::now() + Duration::from_secs(60);
        // Requests after the change was seen, to run on the new engine too.
        let mut after = None;
        while after.is_none_or(|n| n > 0) {
            assert!(
                Instant::now() < deadline,
                "no change to {want}: {:#}",
                stats(&dir)
            );
            let block = if sequential {
                cursor = (cursor + 1) % BLOCKS;
                cursor
            } else {
                next() % BLOCKS
            };
            let generation = model[block as usize] + 1;
            client
                .write(block * 4096, &block_bytes(block, generation), false)
                .unwrap_or_else(|e| panic!("write of block {block} (request {requests}): {e}"));
            model[block as usize] = generation;
            requests += 1;
            // One read in four, of a random block, checked.
            if requests.is_multiple_of(4) {
                let block = next() % BLOCKS;
                client
                    .read(block * 4096, &mut buf)
                    .unwrap_or_else(|e| panic!("read of block {block} (request {requests}): {e}"));
                assert!(
                    buf == block_bytes(block, model[block as usize]),
                    "block {block} (request {requests}) is not its write {}",
                    model[block as usize]
                );
                requests += 1;
            }
            if let Some(n) = after.as_mut() {
                *n -= 1;
            } else if block.is_multiple_of(256) && stats(&dir)["line_bytes"] == want {
                after = Some(2000);
            }
        }
    }
    let s = stats(&dir);
    let changes = s["line_size_changes"].as_array().unwrap();
    assert_eq!(changes.len(), 2, "{s:#}");
    let check_all = |client: &mut Client| {
        let mut buf = vec![0u8; 4096];
        for block in 0..BLOCKS {
            client.read(block * 4096, &mut buf).unwrap();
            assert!(
                buf == block_bytes(block, model[block as usize]),
                "block {block} is not its write {}",
                model[block as usize]
            );
        }
    };
    check_all(&mut client);
    client.disconnect().unwrap();
    stop(server);
    let server = start(&dir, &[]);
    let mut client = Client::connect_unix(&socket, &ConnectOptions::default()).unwrap();
    check_all(&mut client);
    client.disconnect().unwrap();
    stop(server);
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(!log.contains("WARN"), "{log}");
}

/// The server is killed (SIGKILL) at a different moment of each round while
/// a client writes with FUA and ReCA changes the line size: 0, 20 and 40 ms
/// after ReCA chose a category with another line size (the change starts a
/// window later), then 0, 6, 12, ... ms after a change started (the cache
/// device is slowed down to 200 µs per I/O, so its write-back, format and
/// warm-up take long enough to be hit).
/// After every restart, every acknowledged write reads back (the one in
/// flight may read either way).
#[test]
fn a_kill_during_a_line_size_change_loses_no_acknowledged_write() {
    const BLOCKS: u64 = 4096;
    const PENDING: &str = "pending: the cache of";
    const STARTED: &str = "changing the line size";
    const DONE: &str = "while serving:";
    let dir = temp_dir("kill");
    let socket = dir.join("iocache-data/iocache.sock");
    let log_path = dir.join("server.log");
    let mut model = vec![0u32; BLOCKS as usize];
    // Kills before a change started, during one, after one.
    let mut killed = [0; 3];
    // Twelve rounds, and on (at most 24 in all) until one kill has fallen
    // during a change: how long a change lasts depends on the machine.
    let mut round = 0u64;
    while round < 12 || (killed[1] == 0 && round < 24) {
        let before = std::fs::read_to_string(&log_path).unwrap_or_default();
        let count = |log: &str| {
            (
                log.matches(PENDING).count(),
                log.matches(STARTED).count(),
                log.matches(DONE).count(),
            )
        };
        let (pending_before, started_before, done_before) = count(&before);
        let server = start_with_window(&dir, "100", &["--slow-cache", "200us"]);
        // Sequential writes want 128 KiB lines (the cache starts each
        // round with 4 KiB ones: the check below runs without ReCA).
        let client_model = model.clone();
        let client_socket = socket.clone();
        let writer = std::thread::spawn(move || {
            let mut model = client_model;
            let mut in_flight = None;
            let Ok(mut client) = Client::connect_unix(&client_socket, &ConnectOptions::default()) else {
                return (model, in_flight);
            };
            for i in 0u64.. {
                let block = i % BLOCKS;
                let generation = model[block as usize] + 1;
                in_flight = Some(block);
                if client
                    .write(block * 4096, &block_bytes(block, generation), true)
                    .is_err()
                {
                    break;
                }
                model[block as usize] = generation;
                in_flight = None;
            }
            (model, in_flight)
        });
        // Rounds 0-2: 0, 20, 40 ms after ReCA chose the category; rounds
        // 3-11: 0, 6, 12, ... ms after the change started; any later ones
        // at once after it started.
        let (marker, before_marker, delay_ms) = match round {
            0..3 => (PENDING, pending_before, 20 * round),
            3..12 => (STARTED, started_before, 6 * (round - 3)),
            _ => (STARTED, started_before, 0),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .matches(marker)
            .count()
            == before_marker
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        server.kill();
        let (acknowledged, in_flight) = writer.join().unwrap();
        let (_, started, done) = count(&std::fs::read_to_string(&log_path).unwrap());
        match (started > started_before, done > done_before) {
            (false, _) => killed[0] += 1,
            (true, false) => killed[1] += 1,
            (true, true) => killed[2] += 1,
        }

        // Checked without ReCA: the cache goes back to 4 KiB lines.
        let server = start_serving(&dir, &[]);
        let mut client = Client::connect_unix(&socket, &ConnectOptions::default()).unwrap();
        let mut buf = vec![0u8; 4096];
        model = acknowledged;
        for block in 0..BLOCKS {
            client.read(block * 4096, &mut buf).unwrap();
            let acked = model[block as usize];
            if in_flight == Some(block) && buf == block_bytes(block, acked + 1) {
                // The write in flight reached the disk: it counts from now.
                model[block as usize] = acked + 1;
                continue;
            }
            assert!(
                buf == block_bytes(block, acked),
                "round {round}: block {block} is not its acknowledged write {acked}"
            );
        }
        client.disconnect().unwrap();
        stop(server);
        round += 1;
    }
    eprintln!("rounds killed before a change started, during one, after one: {killed:?}");
    assert!(killed[1] > 0, "no kill fell during a change: {killed:?}");
}

/// Two volumes on one cache device, and a third attached while serving: a
/// line size change keeps serving all three (the successor opens every
/// attached volume), each keeps its data, and the third can be detached
/// after and its data read back after a restart.
#[test]
fn a_line_size_change_serves_every_volume_of_the_cache_on() {
    let dir = temp_dir("volumes");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    // The kit's two volumes, on the Unix socket only, the first adapting.
    let config = SHARED_CACHE.replace("listen = \"127.0.0.1:0\"\n", "").replace(
        "persistence = \"dirty\"\n",
        "persistence = \"dirty\"\nadapt = \"reca\"\nreca_window = 1000\n",
    );
    std::fs::write(dir.join("iocache.toml"), config).unwrap();
    let server = start_serving_config(&dir);
    let socket = dir.join("iocache-data/iocache.sock");
    let connect = |export: &str| Client::connect_unix(&socket, &ConnectOptions::export(export)).unwrap();
    let (ok, text) = ctl(
        &dir,
        &["attach", "three", "data/three.img", "--backend-size", "8MiB"],
    );
    assert!(ok, "{text}");
    let mut model: Vec<(String, u64, u32)> = Vec::new();
    let mut write_all = |export: &str, blocks: u64, sequential: bool, generation: u32| {
        let mut client = connect(export);
        let mut rng = 0x1234_5678u64 ^ u64::from(generation);
        for i in 0..blocks {
            let block = if sequential {
                i
            } else {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % blocks
            };
            client
                .write(block * 4096, &block_bytes(block, generation), false)
                .unwrap();
            model.retain(|(e, b, _)| !(e == export && *b == block));
            model.push((export.to_string(), block, generation));
        }
        client.flush().unwrap();
        client.disconnect().unwrap();
    };
    // Sequential writes on all three: 128 KiB lines.
    write_all("one", 4096, true, 1);
    write_all("two", 2048, true, 2);
    write_all("three", 2048, true, 3);
    write_all("one", 4096, true, 4);
    let s = wait_for_line_bytes(&dir, 128 << 10);
    assert_eq!(s["line_size_changes"].as_array().unwrap().len(), 1, "{s:#}");
    // Random writes: 4 KiB lines again.
    write_all("three", 2048, false, 5);
    write_all("two", 2048, false, 6);
    write_all("one", 4096, false, 7);
    write_all("three", 2048, false, 8);
    wait_for_line_bytes(&dir, 4096);
    let check = |model: &[(String, u64, u32)]| {
        let mut buf = vec![0u8; 4096];
        for export in ["one", "two", "three"] {
            let mut client = connect(export);
            for (_, block, generation) in model.iter().filter(|(e, _, _)| e == export) {
                client.read(block * 4096, &mut buf).unwrap();
                assert!(
                    buf == block_bytes(*block, *generation),
                    "{export}: block {block} is not its write {generation}"
                );
            }
            client.disconnect().unwrap();
        }
    };
    check(&model);
    let (ok, text) = ctl(&dir, &["detach", "three"]);
    assert!(ok, "{text}");
    stop(server);
    let server = start_serving_config(&dir);
    let (ok, text) = ctl(&dir, &["attach", "three", "data/three.img"]);
    assert!(ok, "{text}");
    check(&model);
    stop(server);
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    // Two changes at least (the checks' reads in offset order may make
    // ReCA want 128 KiB lines once more).
    assert!(log.matches("while serving:").count() >= 2, "{log}");
    assert!(!log.contains("WARN"), "{log}");
}

/// `iocache serve --config iocache.toml` in `dir`.
fn start_serving_config(dir: &Path) -> Server {
    spawn_server(dir, &["--config", "iocache.toml"], ConnectOptions::export("one"))
}

/// A line size change whose write-back the backend refuses (nbdkit's error
/// filter fails every write while a file exists) is given up: the cache
/// serves on with its line size and every byte written to it, and says
/// so; once the backend heals, the shutdown writes every line back.
#[test]
fn a_line_size_change_the_backend_refuses_leaves_the_cache_serving() {
    if !installed(&["nbdkit"]) {
        return;
    }
    const BLOCKS: u64 = 1024;
    let dir = temp_dir("refused");
    let (nbdkit, backend_uri, backend_img, inject) = nbdkit_failing(&dir, 64 << 20, "pwrite-");
    let server = spawn_server(
        &dir,
        &[
            "--backend",
            &backend_uri,
            "--cache-size",
            "8MiB",
            "--write-policy",
            "wb",
            "--persistence",
            "dirty",
            "--adapt",
            "reca",
            "--reca-window",
            "250",
            "--init",
        ],
        ConnectOptions::default(),
    );
    std::fs::write(&inject, b"").unwrap();
    let socket = dir.join("iocache-data/iocache.sock");
    let mut client = Client::connect_unix(&socket, &ConnectOptions::default()).unwrap();
    // Sequential writes (they fit in the cache as dirty lines): ReCA wants
    // 128 KiB lines, and the change cannot write them back.
    for block in 0..BLOCKS {
        client.write(block * 4096, &block_bytes(block, 1), false).unwrap();
    }
    wait_for_log(&dir, "the line size was not changed to 128KiB");
    let s = stats(&dir);
    assert_eq!(s["line_bytes"], 4096, "{s:#}");
    assert!(s["line_size_changes"].as_array().unwrap().is_empty(), "{s:#}");
    let mut buf = vec![0u8; 4096];
    for block in 0..BLOCKS {
        client.read(block * 4096, &mut buf).unwrap();
        assert!(
            buf == block_bytes(block, 1),
            "block {block} while the backend fails"
        );
    }
    client.disconnect().unwrap();
    // Healed: the shutdown writes everything back.
    std::fs::remove_file(&inject).unwrap();
    stop(server);
    let image = std::fs::read(&backend_img).unwrap();
    for block in 0..BLOCKS {
        let at = (block * 4096) as usize;
        assert!(
            image[at..at + 4096] == block_bytes(block, 1)[..],
            "block {block} on the backend"
        );
    }
    nbdkit.kill();
}

/// A line size whose lines and metadata would not fit the cache device
/// (`cache_size` set, 4 KiB lines need more records than the 128 KiB lines
/// the device was made for) is not put in force, neither live nor at the
/// next start: the cache serves on with its line size, says why once, and
/// starts again.
#[test]
fn a_line_size_that_does_not_fit_the_device_is_refused_live_and_at_start() {
    let Some(dir) = temp_dir_with(&["fio"], "no-fit") else {
        return;
    };
    let server = start(&dir, &["--line-size", "128KiB"]);
    // Random writes then random reads: 4 KiB lines wanted.
    fio(&dir, Job::Write, "randwrite", "32M");
    fio(&dir, Job::Read, "randread", "32M");
    wait_for_log(&dir, "ReCA's line size 4KiB is not put in force");
    let s = stats(&dir);
    assert_eq!(s["line_bytes"], 128 << 10, "{s:#}");
    // Stopped while 4 KiB is still wanted (recorded for the next start).
    stop(server);
    let server = start(&dir, &["--line-size", "128KiB"]);
    assert_eq!(stats(&dir)["line_bytes"], 128 << 10);
    fio(&dir, Job::Verify, "randwrite", "32M");
    stop(server);
    let log = assert_logged(
        &dir,
        &[
            "with lines of 4KiB: 8MiB of lines and their metadata need",
            "ReCA's line size 4KiB of the last run is not taken",
        ],
    );
    assert_eq!(
        log.matches("ReCA's line size 4KiB is not put in force").count(),
        1,
        "said once: {log}"
    );
}
