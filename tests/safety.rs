//! Never silently wrong, as regression tests of the binary: one owner per
//! device, and no start that can lose an earlier cache's writes or serve
//! one backend's lines as another's. Each test is an operator mistake
//! that once lost data: a second `iocache serve` on the same files (by the
//! same path, a hard link or a symbolic link), a second start that failed
//! on a busy port after rewriting the first's superblock, socket paths
//! that took a live server's socket or deleted a regular file, a cache
//! device deleted, blank, zeroed or swapped, and attach paths that leave
//! their directory.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use iocache_nbd::{Client, ConnectOptions};

mod common;
use common::{nbdkit_file, set_file_len, sparse_file, temp_dir, temp_dir_in, temp_dir_with, Process};

/// The arguments of a server on the files of `dir` with its own sockets
/// (`tag` tells two servers' sockets apart).
fn args(dir: &Path, tag: &str, backend: &str, cache: &str) -> Vec<String> {
    let p = |name: &str| dir.join(name).display().to_string();
    vec![
        "serve".into(),
        "--backend".into(),
        p(backend),
        "--backend-size".into(),
        "16MiB".into(),
        "--cache".into(),
        p(cache),
        "--cache-size".into(),
        "1MiB".into(),
        "--socket".into(),
        p(&format!("nbd-{tag}.sock")),
        "--admin-socket".into(),
        p(&format!("admin-{tag}.sock")),
        "--listen".into(),
        "127.0.0.1:0".into(),
    ]
}

/// The arguments of server "a" on DIR/backend.img and DIR/cache.img,
/// then `extra`.
fn args_a(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = args(dir, "a", "backend.img", "cache.img");
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

/// Sets the value that follows `flag` in `args`.
fn set_flag(args: &mut [String], flag: &str, value: impl Into<String>) {
    let at = args.iter().position(|x| x == flag).expect(flag);
    args[at + 1] = value.into();
}

/// Runs `args`, a start that must be refused, and checks that its error
/// says each of `said`; returns the error.
fn refused_saying(args: &[String], said: &[&str]) -> String {
    let err = refused(args);
    for s in said {
        assert!(err.contains(s), "the error does not say {s:?}: {err}");
    }
    err
}

/// Server "a" with `flag value` must refuse to start saying `flag: value
/// why`.
fn refused_value(dir: &Path, flag: &str, value: &str, why: &str) {
    refused_saying(&args_a(dir, &[flag, value]), &[&format!("{flag}: {value} {why}")]);
}

fn iocache() -> Command {
    Command::new(env!("CARGO_BIN_EXE_iocache"))
}

/// Runs a server that must refuse to start (within 20 s) and returns its stderr.
fn refused(args: &[String]) -> String {
    let mut child = iocache()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            assert!(!status.success(), "the start must be refused: {err}");
            return err;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the server started instead of refusing: {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server on its own sockets (`tag`), logging to DIR/server-TAG.log.
struct Server {
    process: Process,
    socket: PathBuf,
}

impl Server {
    /// Ready once a client completes the handshake.
    fn start(dir: &Path, tag: &str, args: &[String]) -> Server {
        let log = dir.join(format!("server-{tag}.log"));
        let _ = std::fs::remove_file(&log);
        let mut process = Process::spawn(iocache().args(args), &log);
        let socket = dir.join(format!("nbd-{tag}.sock"));
        process.wait_until(&format!("server {tag} answers"), || {
            Client::connect_unix(&socket, &ConnectOptions::default()).is_ok()
        });
        Server { process, socket }
    }

    fn connect_once(&self) -> Option<Client> {
        Client::connect_unix(&self.socket, &ConnectOptions::default()).ok()
    }

    fn client(&self) -> Client {
        self.connect_once().expect("the server answers")
    }

    /// SIGTERM, then the exit status.
    fn stop(self) -> ExitStatus {
        self.process.stop()
    }

    /// SIGKILL: a crash.
    fn kill(self) {
        self.process.kill()
    }

    fn id(&self) -> u32 {
        self.process.id()
    }
}

/// Dirty line data carries a checksum verified at recovery.
/// Old failure: one flipped byte in a flushed dirty line's data on the
/// cache device was served (and written back) as the client's data after a
/// crash. Now: the start is refused naming the line; accepted, the line is
/// dropped and the backend's older data is served instead of the damage.
#[test]
fn damaged_dirty_data_refuses_the_start_until_accepted() {
    let dir = temp_dir("damaged-data");
    let base = args_a(&dir, &["--write-policy", "wb"]);
    write_and_crash(&dir, &base, 32, 21);

    let mut cache = std::fs::read(dir.join("cache.img")).unwrap();
    let superblock = superblock_of(&cache);
    let layout = superblock.layout;
    let region = layout.copy_region_bytes as usize;
    let at = |copy: u8| layout.copy_region_offset(copy) as usize;
    let load = iocache_format::load_metadata(
        &cache[at(0)..at(0) + region],
        &cache[at(1)..at(1) + region],
        &layout,
        superblock.format_version,
    )
    .unwrap();
    // A line the cleaner has not written back yet.
    let (slot, line) = load
        .lines
        .iter()
        .find_map(|(slot, r)| r.line.as_ref().filter(|l| l.dirty).map(|l| (*slot, l)))
        .expect("a dirty record");
    assert!(line.data_hash.is_some(), "its record carries a checksum");
    let damaged_line = line.line_index;
    cache[(layout.line_offset(slot) + 1234) as usize] ^= 0x08;
    std::fs::write(dir.join("cache.img"), &cache).unwrap();

    let err = refused_saying(
        &base,
        &[
            "does not match the checksum",
            &format!("probably dirty line {damaged_line} "),
        ],
    );
    assert!(err.contains("--accept-damaged-metadata"), "{err}");

    let mut accept = base.clone();
    accept.push("--accept-damaged-metadata".into());
    let server = Server::start(&dir, "a", &accept);
    let mut client = server.client();
    let mut buf = vec![0u8; 4096];
    for i in 0..32u64 {
        client.read(i * 4096, &mut buf).unwrap();
        if i == damaged_line {
            assert!(
                buf.iter().all(|&b| b == 0),
                "line {i} serves the backend's data, not the damaged bytes"
            );
        } else {
            assert!(buf.iter().all(|&b| b == 21u8.wrapping_add(i as u8)), "line {i}");
        }
    }
    drop(client);
    assert!(server.stop().success());
}

/// The current superblock of a cache device's image.
fn superblock_of(image: &[u8]) -> iocache_format::Superblock {
    match iocache_format::pick_superblock(&image[..4096], &image[4096..8192]).unwrap() {
        iocache_format::SuperblockFound::Found { superblock, .. } => superblock,
        other => panic!("no superblock: {other:?}"),
    }
}

/// Asserts that `data` holds `lines` lines of the pattern from `seed`.
fn assert_holds_pattern(data: &[u8], lines: usize, seed: u8) {
    for i in 0..lines {
        assert!(
            data[i * 4096..(i + 1) * 4096]
                .iter()
                .all(|&b| b == seed.wrapping_add(i as u8)),
            "line {i} does not hold the pattern from {seed}"
        );
    }
}

/// The TCP port a server's banner in `log` names.
fn tcp_port(log: &str) -> String {
    log.split("nbd://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("the banner names the TCP port")
        .to_string()
}

/// Runs `iocache ctl --admin-socket DIR/admin-TAG.sock ARGS`: whether it
/// succeeded, and its output.
fn ctl(dir: &Path, tag: &str, args: &[&str]) -> (bool, String) {
    let out = iocache()
        .args(["ctl", "--admin-socket"])
        .arg(dir.join(format!("admin-{tag}.sock")))
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Starts server "a" with `args`, writes `lines` lines from `seed` (flushed)
/// and crashes it.
fn write_and_crash(dir: &Path, args: &[String], lines: u64, seed: u8) {
    let server = Server::start(dir, "a", args);
    write_pattern(&mut server.client(), lines, seed);
    server.kill();
}

fn superblocks(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()[..8192].to_vec()
}

fn write_pattern(client: &mut Client, lines: u64, seed: u8) {
    for i in 0..lines {
        client
            .write(i * 4096, &[seed.wrapping_add(i as u8); 4096], false)
            .unwrap();
    }
    client.flush().unwrap();
}

fn check_pattern(client: &mut Client, lines: u64, seed: u8) {
    let mut buf = vec![0u8; 4096];
    for i in 0..lines {
        client.read(i * 4096, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&b| b == seed.wrapping_add(i as u8)),
            "line {i} does not hold what was written"
        );
    }
}

/// Old failure: the second server "recovered" the first's live cache,
/// overwrote its lines and unlinked its sockets; even a start that failed
/// on a busy port had rewritten the first's superblock.
#[test]
fn a_second_server_on_the_same_files_is_refused_under_any_name() {
    let dir = temp_dir("second");
    let first = Server::start(&dir, "a", &args_a(&dir, &[]));
    let mut client = first.client();
    write_pattern(&mut client, 64, 1);
    let before = superblocks(&dir.join("cache.img"));
    std::fs::hard_link(dir.join("backend.img"), dir.join("backend-link.img")).unwrap();
    std::os::unix::fs::symlink(dir.join("cache.img"), dir.join("cache-link.img")).unwrap();

    // The same files, under the same names and under other names.
    for (backend, cache, what) in [
        ("backend.img", "cache.img", "backend.img"),
        ("other-backend.img", "cache.img", "cache.img"),
        ("backend.img", "other-cache.img", "backend.img"),
        ("backend-link.img", "cache-link.img", "backend-link.img"),
        ("other-backend.img", "cache-link.img", "cache-link.img"),
    ] {
        let err = refused_saying(
            &args(&dir, "b", backend, cache),
            &[&format!("{what} is in use by pid {}", first.id())],
        );
        assert!(err.contains("(iocache)"), "the holder is named: {err}");
        // Refused before its own sockets were left behind.
        assert!(!dir.join("nbd-b.sock").exists() && !dir.join("admin-b.sock").exists());
    }
    assert_eq!(
        superblocks(&dir.join("cache.img")),
        before,
        "the refused starts wrote the cache"
    );

    // A start on the first's TCP port fails before it opens any device:
    // its new cache file is not even created.
    let log = std::fs::read_to_string(dir.join("server-a.log")).unwrap();
    let port = tcp_port(&log);
    let mut busy_port = args(&dir, "c", "backend.img", "cache-new.img");
    set_flag(&mut busy_port, "--listen", format!("127.0.0.1:{port}"));
    refused_saying(&busy_port, &["--listen", "Address already in use"]);
    assert!(
        !dir.join("cache-new.img").exists(),
        "a device was opened before the listener"
    );

    // Nothing of the first was disturbed.
    assert!(dir.join("nbd-a.sock").exists() && dir.join("admin-a.sock").exists());
    check_pattern(&mut first.client(), 64, 1);
    assert_eq!(superblocks(&dir.join("cache.img")), before);
    drop(client);
    let out = first.stop();
    assert!(out.success());
}

/// Old failure: a second server's --socket or --admin-socket on the first's
/// path unlinked the first's live socket; a path naming a regular file was
/// deleted.
#[test]
fn socket_paths_never_take_a_live_socket_nor_delete_a_file() {
    let dir = temp_dir("sockets");
    let first = Server::start(&dir, "a", &args_a(&dir, &[]));
    let other = |socket: &str, admin: &str| {
        let mut a = args(&dir, "b", "backend-b.img", "cache-b.img");
        set_flag(&mut a, "--socket", dir.join(socket).display().to_string());
        set_flag(&mut a, "--admin-socket", dir.join(admin).display().to_string());
        a
    };
    refused_saying(
        &other("nbd-a.sock", "admin-b.sock"),
        &["--socket", "a server is already listening"],
    );
    refused_saying(
        &other("nbd-b.sock", "admin-a.sock"),
        &["--admin-socket", "a server is already listening"],
    );
    std::fs::write(dir.join("precious.txt"), b"keep me").unwrap();
    refused_saying(
        &other("nbd-b.sock", "precious.txt"),
        &["is not a socket (a regular file); not removing it"],
    );
    assert_eq!(std::fs::read(dir.join("precious.txt")).unwrap(), b"keep me");
    refused_saying(&other("precious.txt", "admin-b.sock"), &["not removing it"]);
    assert_eq!(std::fs::read(dir.join("precious.txt")).unwrap(), b"keep me");
    // None of them opened a device.
    assert!(!dir.join("cache-b.img").exists() && !dir.join("backend-b.img").exists());
    // The first still answers on both sockets, which are its owner's only.
    let mut client = first.client();
    write_pattern(&mut client, 4, 7);
    let stats = iocache()
        .args(["stats", "--admin-socket"])
        .arg(dir.join("admin-a.sock"))
        .output()
        .unwrap();
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    for s in ["nbd-a.sock", "admin-a.sock"] {
        let mode = std::fs::metadata(dir.join(s)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{s}");
    }
    drop(client);
    assert!(first.stop().success());
    // A server's exit removes its own sockets (a stale one is replaced on the next start).
    assert!(!dir.join("nbd-a.sock").exists() && !dir.join("admin-a.sock").exists());
}

/// `ctl attach` of a file another process serves is refused before the
/// file is read or written, naming the holder.
/// A socket path deep in directories that do not exist is a mistake: it
/// is refused, naming them, and nothing is created.
#[test]
fn a_socket_path_in_missing_directories_is_refused_and_creates_nothing() {
    let dir = temp_dir("socket-dirs");
    for (flag, named) in [("--socket", "--socket"), ("--admin-socket", "--admin-socket")] {
        let mut a = args_a(&dir, &[]);
        set_flag(
            &mut a,
            flag,
            dir.join("missing/deeper/s.sock").display().to_string(),
        );
        let err = refused(&a);
        assert!(
            err.contains(named) && err.contains("does not exist, nor") && err.contains("missing"),
            "{err}"
        );
        assert!(!dir.join("missing").exists(), "{flag}: a directory was created");
    }
    // One missing level (a data directory to be) is created.
    let mut a = args_a(&dir, &[]);
    set_flag(&mut a, "--socket", dir.join("new/s.sock").display().to_string());
    let socket = dir.join("new/s.sock");
    let mut server = Process::spawn(iocache().args(&a), &dir.join("server-new.log"));
    server.wait_until("the socket in a new directory answers", || {
        Client::connect_unix(&socket, &ConnectOptions::default()).is_ok()
    });
    drop(server);
}

/// Flags that cannot do what they say are not passed over in silence: a
/// size for a backend that exists, a cache larger than what it serves.
#[test]
fn a_size_that_changes_nothing_is_said() {
    let dir = temp_dir("said");
    sparse_file(&dir.join("backend.img"), 8 << 20);
    let mut a = args_a(&dir, &[]);
    set_flag(&mut a, "--cache-size", "12MiB");
    a.push("--init".into());
    let server = Server::start(&dir, "a", &a);
    drop(server);
    let log = std::fs::read_to_string(dir.join("server-a.log")).unwrap();
    assert!(
        log.contains("exists and holds 8MiB; --backend-size 16MiB sizes only a file it creates"),
        "{log}"
    );
    assert!(
        log.contains("the cache (12MiB) is larger than the volumes it serves together (8MiB)"),
        "{log}"
    );
}

/// Mistakes that used to get a bare system error say what is wrong.
#[test]
fn mistakes_are_named() {
    let dir = temp_dir("named");
    // `stats` pointed at the NBD socket.
    let server = Server::start(&dir, "a", &args_a(&dir, &[]));
    let out = iocache()
        .args(["stats", "--admin-socket"])
        .arg(&server.socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is an NBD socket") && err.contains("--admin-socket PATH"),
        "{err}"
    );
    drop(server);
    // A block device that is not there is not offered a size.
    let mut a = args(&dir, "b", "backend-b.img", "cache-b.img");
    set_flag(&mut a, "--backend", "/dev/iocache-no-such-device");
    let err = refused(&a);
    assert!(
        err.contains("/dev/iocache-no-such-device does not exist: a device is not created")
            && !err.contains("--backend-size"),
        "{err}"
    );
    // A host name where an address was expected is resolved.
    let mut a = args(&dir, "c", "backend-c.img", "cache-c.img");
    set_flag(&mut a, "--listen", "localhost:0");
    let server = Server::start(&dir, "c", &a);
    drop(server);
}

#[test]
fn attach_refuses_a_file_another_server_holds() {
    let dir = temp_dir("attach");
    let mut a_args = args(&dir, "a", "backend-a.img", "cache-a.img");
    a_args.extend(["--attach-dir".into(), dir.display().to_string()]);
    let a = Server::start(&dir, "a", &a_args);
    let b = Server::start(&dir, "b", &args(&dir, "b", "backend-b.img", "cache-b.img"));
    let mut client = b.client();
    write_pattern(&mut client, 8, 3);
    let before = std::fs::read(dir.join("cache-b.img")).unwrap();
    for file in ["backend-b.img", "cache-b.img"] {
        let (ok, text) = ctl(
            &dir,
            "a",
            &["attach", "stolen", &dir.join(file).display().to_string()],
        );
        assert!(!ok, "{text}");
        assert!(text.contains(&format!("in use by pid {}", b.id())), "{text}");
    }
    assert_eq!(std::fs::read(dir.join("cache-b.img")).unwrap(), before);
    check_pattern(&mut client, 8, 3);
    drop(client);
    assert!(a.stop().success());
    assert!(b.stop().success());
}

/// Old failure: the cache file deleted while the server ran, then a kill
/// -9: the restart formatted a new cache and the flushed writes it held
/// were gone, silently. A blank or missing cache device under a backend
/// that existed before is formatted only with --init.
#[test]
fn a_missing_or_blank_cache_over_an_existing_backend_needs_init() {
    let dir = temp_dir("blank");
    let base = args_a(&dir, &[]);
    // First start: both files new, nothing to lose.
    let server = Server::start(&dir, "a", &base);
    write_pattern(&mut server.client(), 16, 9);
    assert!(server.stop().success());

    std::fs::remove_file(dir.join("cache.img")).unwrap();
    refused_saying(&base, &["cache.img does not exist", "--init"]);
    assert!(
        !dir.join("cache.img").exists(),
        "the refused start created the cache file"
    );

    std::fs::write(dir.join("cache.img"), vec![0u8; 2 << 20]).unwrap();
    refused_saying(&base, &["holds no cache (blank)", "backend.img existed before"]);

    let mut init = base.clone();
    init.push("--init".into());
    let server = Server::start(&dir, "a", &init);
    check_pattern(&mut server.client(), 16, 9);
    assert!(server.stop().success());
    // And the cache it formatted loads without --init from now on.
    let server = Server::start(&dir, "a", &base);
    check_pattern(&mut server.client(), 16, 9);
    assert!(server.stop().success());
}

/// Old failure: SIGTERM after the Unix socket file was removed hung
/// forever (the accept thread was woken by connecting to the path).
#[test]
fn sigterm_stops_the_server_after_its_socket_file_was_removed() {
    let dir = temp_dir("unlinked");
    let server = Server::start(&dir, "a", &args_a(&dir, &[]));
    write_pattern(&mut server.client(), 4, 5);
    std::fs::remove_file(dir.join("nbd-a.sock")).unwrap();
    std::fs::remove_file(dir.join("admin-a.sock")).unwrap();
    let started = Instant::now();
    let out = server.stop();
    assert!(out.success());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

/// Old failure: one flipped byte in a dirty line's record, after a crash,
/// and the server started, logged one line and served the backend's old
/// data for a write that was flushed. Now the start is refused, naming the
/// slot and the line, until the operator accepts the loss.
#[test]
fn a_damaged_dirty_record_refuses_the_start_until_accepted() {
    let dir = temp_dir("damaged");
    let base = args_a(&dir, &["--write-policy", "wb", "--persistence", "dirty"]);
    // Crash: the records of the 32 dirty lines are durable (FLUSH).
    write_and_crash(&dir, &base, 32, 11);

    // Flip one byte (the line index) of the first dirty record found.
    let mut cache = std::fs::read(dir.join("cache.img")).unwrap();
    let at = (8192..cache.len() - 64)
        .step_by(64)
        .find(|&at| &cache[at..at + 4] == b"IOCR" && cache[at + 4] == 2 && cache[at + 5] & 1 == 1)
        .expect("a dirty line record");
    cache[at + 24] ^= 0x40;
    std::fs::write(dir.join("cache.img"), &cache).unwrap();

    let err = refused_saying(&base, &["metadata is damaged"]);
    assert!(
        err.contains(&format!("{at}")),
        "the device offset is named: {err}"
    );
    assert!(err.contains("probably dirty line"), "the line is named: {err}");
    assert!(
        err.contains("--accept-damaged-metadata"),
        "the way out is named: {err}"
    );
    assert_eq!(
        std::fs::read(dir.join("cache.img")).unwrap(),
        cache,
        "a refused start wrote the cache"
    );

    let mut accept = base.clone();
    accept.push("--accept-damaged-metadata".into());
    let server = Server::start(&dir, "a", &accept);
    let log = std::fs::read_to_string(dir.join("server-a.log")).unwrap();
    assert!(log.contains("started over damaged metadata"), "{log}");
    // Every other line is intact.
    let mut client = server.client();
    let mut buf = vec![0u8; 4096];
    let mut intact = 0;
    for i in 0..32u64 {
        client.read(i * 4096, &mut buf).unwrap();
        intact += usize::from(buf.iter().all(|&b| b == 11u8.wrapping_add(i as u8)));
    }
    assert_eq!(intact, 31, "only the line of the damaged record is lost");
    drop(client);
    assert!(server.stop().success());
    // The damage was cleared: a plain start works.
    let server = Server::start(&dir, "a", &base);
    assert!(server.stop().success());
}

/// Old failure: SIGTERM with the NBD backend gone spun at 100 % CPU
/// writing back and never exited. Now the shutdown gives up after its
/// patience, says how many dirty lines stay on the cache device, exits
/// non-zero, and the next start (backend back) writes them back.
#[test]
fn shutdown_with_the_backend_gone_is_bounded_and_keeps_the_dirty_lines() {
    let Some(dir) = temp_dir_with(&["nbdkit"], "gone") else {
        return;
    };
    let image = dir.join("backend.img");
    sparse_file(&image, 16 << 20);
    let (kit, backend_uri) = nbdkit_file(&dir, &image, &[], &[]);
    let mut base = args(&dir, "a", "unused", "cache.img");
    set_flag(&mut base, "--backend", backend_uri);
    base.retain(|a| a != "--backend-size" && a != "16MiB");
    base.extend(["--write-policy".into(), "wb".into()]);
    let mut first = base.clone();
    first.push("--init".into());
    let server = Server::start(&dir, "a", &first);
    write_pattern(&mut server.client(), 32, 21);
    kit.kill();

    let started = Instant::now();
    let out = server.stop();
    let took = started.elapsed();
    let log = std::fs::read_to_string(dir.join("server-a.log")).unwrap();
    assert!(!out.success(), "the exit status says dirty lines remain: {log}");
    assert!(took < Duration::from_secs(40), "the shutdown took {took:?}");
    assert!(log.contains("32 dirty lines could not be written back"), "{log}");
    assert!(log.contains("stay on the cache device"), "{log}");
    assert!(std::fs::read(&image).unwrap()[..4096].iter().all(|&b| b == 0));

    // The backend is back: the lines are served from the cache and written
    // back at the next shutdown.
    let _ = std::fs::remove_file(dir.join("backend.sock"));
    let (kit, _) = nbdkit_file(&dir, &image, &[], &[]);
    let server = Server::start(&dir, "a", &base);
    check_pattern(&mut server.client(), 32, 21);
    assert!(server.stop().success());
    assert_holds_pattern(&std::fs::read(&image).unwrap(), 32, 21);
    kit.kill();
}

/// Old failure: a volume whose backend is the server's own export
/// deadlocked every FLUSH and SIGTERM. Refused at attach.
#[test]
fn a_volume_cannot_be_its_own_backend() {
    let dir = temp_dir("self");
    let server = Server::start(&dir, "a", &args_a(&dir, &[]));
    let socket = dir.join("nbd-a.sock");
    let log = std::fs::read_to_string(dir.join("server-a.log")).unwrap();
    let port = tcp_port(&log);
    for uri in [
        format!("nbd+unix:///?socket={}", socket.display()),
        format!("nbd://127.0.0.1:{port}/iocache"),
        format!("nbd://localhost:{port}/"),
    ] {
        let (ok, text) = ctl(&dir, "a", &["attach", "loop", &uri]);
        assert!(!ok && text.contains("this server's own export"), "{uri}: {text}");
    }
    let started = Instant::now();
    assert!(server.stop().success());
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Old exposure: `serve` always opened TCP on 127.0.0.1:10809 beside the
/// Unix socket (any local user could read and write the volume over TCP
/// whatever the socket's mode), files and sockets took the umask, and
/// clients were told the backend's path. Now the defaults expose nothing
/// beyond the owner.
#[test]
fn the_defaults_expose_nothing_beyond_the_owner() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("defaults");
    let data = dir.join("iocache-data");
    let socket = data.join("iocache.sock");
    let mut process = Process::spawn(
        iocache()
            .args(["serve", "--backend-size", "16MiB", "--cache-size", "1MiB"])
            .current_dir(&dir),
        &dir.join("server.log"),
    );
    process.wait_until("the server answers", || {
        Client::connect_unix(&socket, &ConnectOptions::default()).is_ok()
    });
    let server = Server { process, socket };
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "the data directory");
    for f in ["backend.img", "cache.img", "iocache.sock", "admin.sock"] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
    let client = server.client();
    let description = client.description().unwrap_or_default().to_string();
    assert!(
        !description.contains("iocache-data") && !description.contains(".img"),
        "{description}"
    );
    // No TCP socket of the process listens (state 0A in /proc/net/tcp*).
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", server.id()))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
        .collect();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert!(
                !(fields[3] == "0A" && inodes.iter().any(|i| i == fields[9])),
                "the server listens on TCP by default: {line}"
            );
        }
    }
    drop(client);
    let out = server.stop();
    assert!(out.success());
    let text = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(!text.contains("nbd://"), "the banner offers TCP: {text}");

    // Beyond loopback only with a warning.
    let server = Server::start(&dir, "w", &{
        let mut a = args(&dir, "w", "backend-w.img", "cache-w.img");
        set_flag(&mut a, "--listen", "0.0.0.0:0");
        a
    });
    assert!(server.stop().success());
    let text = std::fs::read_to_string(dir.join("server-w.log")).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(" WARN ") && l.contains("listening on 0.0.0.0")),
        "{text}"
    );
}

/// Old failure: a symbolic link planted in a shared working directory made
/// the default `serve` format its target. The default data directory must
/// be the user's alone, and links in it are not followed.
#[test]
fn a_planted_link_or_a_shared_data_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("planted");
    let data = dir.join("iocache-data");
    std::fs::create_dir(&data).unwrap();
    let victim = dir.join("victim.img");
    std::fs::write(&victim, vec![0x77u8; 4 << 20]).unwrap();
    std::os::unix::fs::symlink(&victim, data.join("cache.img")).unwrap();
    let serve = |extra: &[&str]| {
        let out = iocache()
            .args([
                "serve",
                "--backend-size",
                "16MiB",
                "--cache-size",
                "1MiB",
                "--init",
                "--force",
            ])
            .args(extra)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = serve(&[]);
    assert!(err.contains("is a symbolic link in the data directory"), "{err}");
    assert!(
        std::fs::read(&victim).unwrap().iter().all(|&b| b == 0x77),
        "the target was written"
    );

    std::fs::remove_file(data.join("cache.img")).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = serve(&[]);
    assert!(err.contains("is writable by others"), "{err}");
    std::fs::remove_dir_all(&data).unwrap();
    std::os::unix::fs::symlink(&victim, &data).unwrap();
    let err = serve(&[]);
    assert!(
        err.contains("data directory") && err.contains("is a symbolic link"),
        "{err}"
    );
    assert!(
        std::fs::read(&victim).unwrap().iter().all(|&b| b == 0x77),
        "the target was written"
    );
}

/// A block device is claimed with O_EXCL: a second server on the same
/// loop device is refused, naming the holder. Needs root and losetup
/// (skipped otherwise).
#[test]
fn a_block_device_is_claimed_exclusively() {
    let dir = temp_dir("loop");
    sparse_file(&dir.join("c.img"), 32 << 20);
    let attached = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(dir.join("c.img"))
        .output();
    let Some(out) = attached.ok().filter(|o| o.status.success()) else {
        eprintln!("SKIPPED: no loop device (needs root and losetup)");
        return;
    };
    let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let with_cache = |tag: &str| {
        let mut a = args(&dir, tag, &format!("backend-{tag}.img"), "unused");
        set_flag(&mut a, "--cache", device.clone());
        a.push("--init".into());
        a
    };
    let first = Server::start(&dir, "a", &with_cache("a"));
    refused_saying(
        &with_cache("b"),
        &[&format!("{device} is in use by pid {}", first.id())],
    );
    write_pattern(&mut first.client(), 8, 4);
    assert!(first.stop().success());
    let _ = Command::new("losetup").args(["-d", &device]).status();
}

/// Starts server "a" with `args`, writes `lines` lines from `seed` and
/// reads them back over one client, and stops it cleanly.
fn assert_serves(dir: &Path, args: &[String], lines: u64, seed: u8) {
    let server = Server::start(dir, "a", args);
    let mut client = server.client();
    write_pattern(&mut client, lines, seed);
    check_pattern(&mut client, lines, seed);
    drop(client);
    assert!(server.stop().success());
}

/// `--threads-per-connection` reaches the server: out of range is refused
/// naming the flag; one thread (leader and only follower) serves.
#[test]
fn threads_per_connection_is_a_flag() {
    let dir = temp_dir("threads");
    refused_value(&dir, "--threads-per-connection", "0", "is not between 1 and 64");
    assert_serves(&dir, &args_a(&dir, &["--threads-per-connection", "1"]), 8, 3);
}

#[test]
fn poll_before_sleep_is_a_flag() {
    let dir = temp_dir("poll");
    refused_value(&dir, "--poll-before-sleep-us", "5000", "is above 1000");
    // Never polling, and polling: both serve.
    for us in ["0", "50"] {
        assert_serves(&dir, &args_a(&dir, &["--poll-before-sleep-us", us]), 8, 4);
    }
}

/// `--max-connections-per-peer` reaches the server: with 2, a third
/// connection of the same user is closed while two are served, and one
/// more is served once one of them hangs up; out of range, the start is
/// refused naming the flag.
#[test]
fn the_connection_limit_per_peer_is_a_flag() {
    let dir = temp_dir("perpeer");
    refused_value(&dir, "--max-connections-per-peer", "0", "is not between 1 and 64");
    let a = args_a(&dir, &["--max-connections-per-peer", "2"]);
    let server = Server::start(&dir, "a", &a);
    // The readiness probe's connection is gone before counting.
    std::thread::sleep(Duration::from_millis(300));
    let mut first = server.client();
    let second = server.client();
    // Marked as in transmission just after the client has its reply.
    std::thread::sleep(Duration::from_millis(100));
    let mut buf = vec![0u8; 4096];
    let third = server.connect_once().map(|mut c| c.read(0, &mut buf).is_ok());
    assert_ne!(
        third,
        Some(true),
        "a third connection of the same user is refused"
    );
    first.read(0, &mut buf).unwrap();
    drop(second);
    std::thread::sleep(Duration::from_millis(300));
    server.client().read(0, &mut buf).unwrap();
    drop(first);
    assert!(server.stop().success());
}

/// The NBD socket is shared with a group only when asked (`--socket-group`):
/// then 0660 and that group's; an unknown group is refused by name.
#[test]
fn a_socket_group_shares_the_socket_with_that_group_only() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = temp_dir("group");
    refused_saying(
        &args_a(&dir, &["--socket-group", "no-such-group-here"]),
        &["--socket-group", "no group named `no-such-group-here`"],
    );
    // A numeric group id needs no entry in /etc/group (root may give a
    // file to any group; another user only to its own groups).
    // SAFETY: getegid has no preconditions.
    let gid = if unsafe { libc::geteuid() } == 0 {
        12345
    } else {
        unsafe { libc::getegid() }
    };
    let a = args_a(&dir, &["--socket-group", &gid.to_string()]);
    let server = Server::start(&dir, "a", &a);
    let meta = std::fs::metadata(dir.join("nbd-a.sock")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), gid);
    // The admin socket stays its owner's.
    assert_eq!(
        std::fs::metadata(dir.join("admin-a.sock"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(server.stop().success());
}

/// An operator truncates the cache file of a running server (on tmpfs,
/// where it is mapped: a page that is gone raises SIGBUS). Old failure
/// (before the mapping's guard): the server died on its next cache hit.
/// Now: the server lives, every read either fails or returns what was
/// written (never the zeros of the missing pages), and it stops on SIGTERM.
#[test]
fn a_cache_file_truncated_under_the_server_is_an_error_not_a_crash() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    // Mapped (the default on tmpfs), then read and written with pread and
    // pwrite (`--no-map-cache`), where a truncated file reads short.
    for mapped in [true, false] {
        let dir = temp_dir_in(shm, &format!("truncated-{mapped}"));
        let mut a = args_a(&dir, &[]);
        if !mapped {
            a.push("--no-map-cache".into());
        }
        let server = Server::start(&dir, "a", &a);
        let log = std::fs::read_to_string(dir.join("server-a.log")).unwrap();
        if mapped && !log.contains("is in memory: mapped") {
            eprintln!("skipped: /dev/shm is not tmpfs here, the cache is not mapped: {log}");
            let _ = server.stop();
            return;
        }
        assert_eq!(log.contains("mapped"), mapped, "{log}");
        let mut client = server.client();
        write_pattern(&mut client, 64, 7);
        set_file_len(&dir.join("cache.img"), 0);
        let mut buf = vec![0u8; 4096];
        let mut failed = 0;
        for i in 0..64u64 {
            match client.read(i * 4096, &mut buf) {
                Ok(()) => assert!(
                    buf.iter().all(|&b| b == 7u8.wrapping_add(i as u8)),
                    "line {i} read as done but does not hold what was written (mapped: {mapped})"
                ),
                Err(_) => failed += 1,
            }
        }
        assert!(
            failed > 0,
            "the lines written were in the cache file that is gone"
        );
        // New writes: whatever is acknowledged reads back as written, or fails.
        for i in 100..116u64 {
            let written = client.write(i * 4096, &[0x5a; 4096], false).is_ok();
            if written && client.read(i * 4096, &mut buf).is_ok() {
                assert!(buf.iter().all(|&b| b == 0x5a), "line {i}");
            }
        }
        let mut server = server;
        assert!(
            server.process.is_running(),
            "the server died: {}",
            std::fs::read_to_string(dir.join("server-a.log")).unwrap()
        );
        drop(client);
        assert!(server.connect_once().is_some(), "a new client is still served");
        let _ = server.stop();
        let log = std::fs::read_to_string(dir.join("server-a.log")).unwrap();
        assert!(!log.contains("panicked"), "{log}");
        // The shrink is seen by a read (SIGBUS in the mapping, a short
        // read) or, first, by the cleaner's check of the file's size.
        assert!(
            log.contains("SIGBUS") || log.contains("truncated"),
            "the error names the cause: {log}"
        );
    }
}

/// Kills `server` (SIGKILL) and waits for it.
fn crash(server: Server) {
    server.kill();
}

/// Old failure: only the export name and the size were compared, so a
/// dirty cache restarted in front of another backend of the same size
/// served that backend as the first one's data and, at SIGTERM, wrote the
/// first backend's flushed writes into it. Now the start is refused naming
/// both, nothing is written to the other backend, the right backend gets
/// its data, and a copy of it is taken only with the acknowledgement.
#[test]
fn a_dirty_cache_is_refused_in_front_of_another_backend() {
    let dir = temp_dir("identity");
    let wb = |backend: &str| {
        let mut a = args(&dir, "a", backend, "cache.img");
        a.extend(["--write-policy".into(), "wb".into()]);
        a
    };
    write_and_crash(&dir, &wb("backend.img"), 32, 21);

    // Another file of the same size, never served.
    std::fs::write(dir.join("other.img"), vec![0u8; 16 << 20]).unwrap();
    refused_saying(&wb("other.img"), &["other.img", "dirty", "--rebind-backend"]);
    assert!(
        std::fs::read(dir.join("other.img"))
            .unwrap()
            .iter()
            .all(|&b| b == 0),
        "nothing was written to the other backend"
    );

    // A copy of the right backend is another file too: refused, then
    // taken with the acknowledgement, and given the dirty data.
    std::fs::copy(dir.join("backend.img"), dir.join("copy.img")).unwrap();
    refused_saying(&wb("copy.img"), &["copy.img"]);
    let mut rebind = wb("copy.img");
    rebind.push("--rebind-backend".into());
    let server = Server::start(&dir, "a", &rebind);
    check_pattern(&mut server.client(), 32, 21);
    assert!(server.stop().success());
    // Written back to the rebound copy.
    assert_holds_pattern(&std::fs::read(dir.join("copy.img")).unwrap(), 32, 21);
    // The cache is now the copy's: the original is refused while the
    // cache holds dirty lines of the copy.
    let server = Server::start(&dir, "a", &wb("copy.img"));
    check_pattern(&mut server.client(), 32, 21);
    write_pattern(&mut server.client(), 32, 77);
    crash(server);
    refused_saying(&wb("backend.img"), &["backend.img"]);
    // With clean lines only (after a clean stop), another backend is
    // bound at once and served its own data, not the clean lines.
    let server = Server::start(&dir, "a", &wb("copy.img"));
    check_pattern(&mut server.client(), 32, 77);
    assert!(server.stop().success());
    let server = Server::start(&dir, "a", &wb("other.img"));
    let mut buf = vec![0u8; 4096];
    server.client().read(0, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0),
        "the other backend's own data, not a clean line"
    );
    assert!(server.stop().success());
}

/// Old failure: a record copy of all zeroes counted as "never written", so
/// zeroing the record regions of a crashed cache lost every dirty line
/// with exit 0, zeroing one sector lost the lines of its records (or made
/// an older record current), and zeroed superblocks let `--init` format
/// without `--force`. Now every slot's records are written at format time
/// and a zeroed one is damage.
#[test]
fn zeroed_metadata_refuses_the_start() {
    let dir = temp_dir("zeroed");
    let base = args_a(&dir, &["--write-policy", "wb"]);
    write_and_crash(&dir, &base, 32, 21);
    let crashed = std::fs::read(dir.join("cache.img")).unwrap();
    let superblock = superblock_of(&crashed);
    assert_eq!(superblock.format_version, iocache_format::FORMAT_VERSION);
    let layout = superblock.layout;
    let region = layout.copy_region_bytes as usize;
    let metadata = layout.metadata_offset as usize;
    let zeroed = |range: std::ops::Range<usize>| {
        let mut image = crashed.clone();
        image[range].fill(0);
        std::fs::write(dir.join("cache.img"), image).unwrap();
    };
    // Both record regions.
    zeroed(metadata..metadata + 2 * region);
    refused_saying(&base, &["damaged", "all zero"]);
    // One sector of records, in each region.
    for copy in 0..2 {
        let at = metadata + copy * region;
        zeroed(at..at + 512);
        let err = refused(&base);
        assert!(err.contains("damaged"), "copy {copy}: {err}");
    }
    // Both superblock copies: refused, and --init alone does not format.
    zeroed(0..8192);
    let err = refused(&base);
    assert!(err.contains("superblock") || err.contains("blank"), "{err}");
    let mut init = base.clone();
    init.push("--init".into());
    refused_saying(&init, &["superblocks were zeroed", "--force"]);
    // The untouched image still recovers every line.
    std::fs::write(dir.join("cache.img"), &crashed).unwrap();
    let server = Server::start(&dir, "a", &base);
    check_pattern(&mut server.client(), 32, 21);
    assert!(server.stop().success());
}

/// Runs `iocache ctl attach EXPORT BACKEND [--backend-size SIZE]` against
/// the server of `dir`'s admin socket `tag`; returns success and its output.
fn ctl_attach(dir: &Path, tag: &str, export: &str, backend: &Path, size: Option<&str>) -> (bool, String) {
    let backend = backend.display().to_string();
    let mut args = vec!["attach", export, &backend];
    if let Some(size) = size {
        args.extend(["--backend-size", size]);
    }
    ctl(dir, tag, &args)
}

/// Old failure: attach checked the resolved path, then opened the name
/// again following links with O_CREAT: a dangling link planted in the
/// attach directory created and served a file outside it, and a name
/// swapped between check and open attached an outside file. Now the file
/// is opened beneath the directory in one step, following no link, and
/// created only with O_EXCL.
#[test]
fn attach_never_leaves_its_directory() {
    let dir = temp_dir("attach-beneath");
    let allowed = dir.join("allowed");
    let outside = dir.join("outside");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.img"), vec![5u8; 1 << 20]).unwrap();
    let server_args = args_a(&dir, &["--attach-dir", &allowed.display().to_string()]);
    let server = Server::start(&dir, "a", &server_args);

    // A dangling link with a size to create: nothing created outside.
    std::os::unix::fs::symlink(outside.join("created.img"), allowed.join("dangling.img")).unwrap();
    let (ok, text) = ctl_attach(&dir, "a", "d", &allowed.join("dangling.img"), Some("4MiB"));
    assert!(!ok, "{text}");
    assert!(!outside.join("created.img").exists(), "{text}");
    // Links to an outside file, absolute and relative, and through a linked directory.
    std::os::unix::fs::symlink(outside.join("secret.img"), allowed.join("abs.img")).unwrap();
    std::os::unix::fs::symlink("../outside/secret.img", allowed.join("rel.img")).unwrap();
    std::os::unix::fs::symlink(&outside, allowed.join("sub")).unwrap();
    for (name, path) in [
        ("abs", allowed.join("abs.img")),
        ("rel", allowed.join("rel.img")),
        ("sub", allowed.join("sub/secret.img")),
        ("dotdot", allowed.join("../outside/secret.img")),
    ] {
        let (ok, text) = ctl_attach(&dir, "a", name, &path, None);
        assert!(!ok, "{name}: {text}");
    }
    // A name swapped for a link while attach runs: every attach either
    // refuses or serves the file in the directory, never the outside one.
    let mine = allowed.join("mine.img");
    std::fs::write(&mine, vec![9u8; 1 << 20]).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, allowed, outside) = (stop.clone(), allowed.clone(), outside.clone());
        std::thread::spawn(move || {
            let link = allowed.join("swap-link");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(outside.join("secret.img"), &link).unwrap();
            let (real, name) = (allowed.join("swap-real"), allowed.join("swap.img"));
            std::fs::hard_link(allowed.join("mine.img"), &real).unwrap();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                std::fs::rename(&real, &name).unwrap();
                std::fs::hard_link(&name, &real).unwrap();
                std::fs::rename(&link, &name).unwrap();
                std::os::unix::fs::symlink(outside.join("secret.img"), &link).unwrap();
            }
        })
    };
    let mut attached = 0;
    for i in 0..20 {
        let export = format!("swap{i}");
        let (ok, text) = ctl_attach(&dir, "a", &export, &allowed.join("swap.img"), None);
        if ok {
            attached += 1;
            let mut client =
                Client::connect_unix(&server.socket, &ConnectOptions::export(export.clone())).unwrap();
            let mut buf = vec![0u8; 4096];
            client.read(0, &mut buf).unwrap();
            assert!(
                buf.iter().all(|&b| b == 9),
                "attach {i} served another file: {text}"
            );
            drop(client);
            let (ok, text) = ctl(&dir, "a", &["detach", &export]);
            assert!(ok, "{text}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    swapper.join().unwrap();
    eprintln!("swapped name: {attached} of 20 attaches served the file in the directory, the rest refused");
    assert_eq!(
        std::fs::read(outside.join("secret.img")).unwrap(),
        vec![5u8; 1 << 20]
    );
    // A file in the directory attaches, and a new one is created there.
    let (ok, text) = ctl_attach(&dir, "a", "fresh", &allowed.join("fresh.img"), Some("4MiB"));
    assert!(ok, "{text}");
    assert_eq!(
        std::fs::metadata(allowed.join("fresh.img")).unwrap().len(),
        4 << 20
    );
    assert!(server.stop().success());
}

/// Old failure: `truncate -s 1M cache.img` under a running server made the
/// first reads fail, the probe re-admitted the device 2 s later (it read
/// only the superblock), new writes re-extended the sparse file, and reads
/// of its holes returned zeroes as cached data. Now the shrunk device is
/// failed for good: clean data comes from the backend, dirty data is an
/// error, never zeroes; the restart refuses the device without advising to
/// grow it.
#[test]
fn a_cache_file_truncated_while_serving_never_serves_zeroes() {
    let shm = Path::new("/dev/shm");
    for (place, write_policy, map) in [
        ("disk", "wt", false),
        ("disk", "wb", false),
        ("shm", "wt", true),
        ("shm", "wb", false),
    ] {
        if place == "shm" && !shm.is_dir() {
            continue;
        }
        let name = format!("truncated-{write_policy}");
        let dir = match place {
            "disk" => temp_dir(&name),
            _ => temp_dir_in(shm, &name),
        };
        let mut a = args_a(&dir, &["--write-policy", write_policy]);
        if !map {
            a.push("--no-map-cache".into());
        }
        let server = Server::start(&dir, "a", &a);
        let mut client = server.client();
        // 200 lines of 4 KiB; cutting the file to 256 KiB loses most of
        // them (the metadata takes the first part of the file).
        write_pattern(&mut client, 200, 7);
        set_file_len(&dir.join("cache.img"), 256 << 10);
        let mut buf = vec![0u8; 4096];
        let mut failed = 0;
        let mut check = |client: &mut Client, round: &str| {
            for i in 0..200u64 {
                match client.read(i * 4096, &mut buf) {
                    Ok(()) => assert!(
                        buf.iter().all(|&b| b == 7u8.wrapping_add(i as u8)),
                        "{place} {write_policy} {round}: line {i} read as done but holds {:#04x}",
                        buf[0]
                    ),
                    Err(_) => failed += 1,
                }
            }
        };
        check(&mut client, "after the truncation");
        // Past the probe's first interval; new writes re-extend the file.
        std::thread::sleep(Duration::from_millis(2500));
        for i in 300..340u64 {
            let _ = client.write(i * 4096, &[0x5a; 4096], false);
        }
        let _ = client.flush();
        check(&mut client, "after new writes");
        if write_policy == "wt" {
            assert_eq!(failed, 0, "{place}: clean lines are read from the backend");
        }
        drop(client);
        let log = std::fs::read_to_string(dir.join("server-a.log")).unwrap();
        assert!(log.contains("truncated"), "{place} {write_policy}: {log}");
        server.kill();
        // The restart refuses the device and does not advise growing it.
        let err = refused(&a);
        assert!(
            err.contains("truncated") && !err.contains("truncate -s"),
            "{place} {write_policy}: {err}"
        );
    }
}

/// An identity the operator gives (`--backend-id`) is the one recorded and
/// compared: another file under the same id is taken, the same file
/// under another id is refused while the cache holds its dirty lines.
#[test]
fn a_given_backend_id_is_the_identity_compared() {
    let dir = temp_dir("given-id");
    let with = |backend: &str, id: &str| {
        let mut a = args(&dir, "a", backend, "cache.img");
        a.extend([
            "--write-policy".into(),
            "wb".into(),
            "--backend-id".into(),
            id.into(),
        ]);
        a
    };
    write_and_crash(&dir, &with("backend.img", "disk-7f3a"), 16, 40);
    refused_saying(&with("backend.img", "disk-0000"), &["operator-given identity"]);
    std::fs::copy(dir.join("backend.img"), dir.join("moved.img")).unwrap();
    let server = Server::start(&dir, "a", &with("moved.img", "disk-7f3a"));
    check_pattern(&mut server.client(), 16, 40);
    assert!(server.stop().success());
}
