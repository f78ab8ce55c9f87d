//! The test kit shared by the binary's integration tests: fresh
//! directories, tool detection and runs of the binary. Each test file includes it with
//! `mod common;` and uses what it needs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The test binary's name without cargo's hash (`serve`, `tls`, ...), so
/// that directories of different test files never meet.
fn test_binary() -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let stem = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("test");
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
        _ => stem.to_string(),
    }
}

/// `base/iocache-BINARY-NAME-PID`, removed if it exists, not created.
pub fn temp_path_in(base: &Path, name: &str) -> PathBuf {
    let dir = base.join(format!("iocache-{}-{name}-{}", test_binary(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A test's directory: removed when the test passes, kept to look into
/// when it fails (dropped while panicking).
pub struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A fresh empty directory under the system's temporary directory, for
/// one test.
pub fn temp_dir(name: &str) -> TestDir {
    temp_dir_in(&std::env::temp_dir(), name)
}

/// A fresh empty directory under `base` (see [`temp_path_in`]), for one
/// test.
pub fn temp_dir_in(base: &Path, name: &str) -> TestDir {
    let dir = temp_path_in(base, name);
    std::fs::create_dir_all(&dir).unwrap();
    TestDir(dir)
}

/// A fresh empty directory in memory (`/dev/shm`), or under the system's
/// temporary directory where there is none.
pub fn temp_dir_in_memory(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = temp_path_in(&base, name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `iocache ARGS` run in the repository's root, to its end.
pub fn iocache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iocache"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("iocache runs")
}

/// What a command printed on stdout.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What a command printed on stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `iocache args` (see [`iocache`]), which must succeed.
pub fn run_ok(args: &[&str]) -> Output {
    let o = iocache(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    o
}

/// A configuration of two volumes on one cache device (the keys of the
/// cache written once), listening on TCP too.
pub const SHARED_CACHE: &str = r#"
[server]
socket = "iocache-data/iocache.sock"
listen = "127.0.0.1:0"
admin_socket = "iocache-data/admin.sock"
attach_dirs = ["data"]

[[volume]]
export = "one"
backend = "data/one.img"
backend_size = "32MiB"
cache = "data/cache.img"
cache_size = "8MiB"
persistence = "dirty"

[[volume]]
export = "two"
backend = "data/two.img"
backend_size = "16MiB"
cache = "data/cache.img"
"#;

/// Whether `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Says a test is SKIPPED for want of `what` and lets it pass, except
/// under CI (`CI` set), where scripts/test.sh installs everything: there
/// the test fails.
pub fn skip_unless_ci(what: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "needs {what} (installed by scripts/test.sh), missing under CI"
    );
    eprintln!("SKIPPED: needs {what}");
}

/// The tools of `tools` that are not on the PATH.
pub fn missing<'a>(tools: &[&'a str]) -> Vec<&'a str> {
    tools.iter().copied().filter(|t| !have(t)).collect()
}

/// Whether every tool in `tools` is on the PATH; if not, says the test is
/// skipped and what it needs.
pub fn installed(tools: &[&str]) -> bool {
    let missing = missing(tools);
    if !missing.is_empty() {
        eprintln!("SKIPPED: needs {}", missing.join(", "));
    }
    missing.is_empty()
}

/// A fresh directory (see [`temp_dir`]) for a test that needs every tool
/// in `tools`; None, after saying the test is skipped, when one is missing.
pub fn temp_dir_with(tools: &[&str], name: &str) -> Option<TestDir> {
    installed(tools).then(|| temp_dir(name))
}

/// Whether the tests run as root (for loop devices and mounts) and every
/// tool in `tools` is on the PATH; if not, says the test is skipped and why.
pub fn root_and_installed(tools: &[&str]) -> bool {
    let id = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&id.stdout).trim() != "0" {
        eprintln!("SKIPPED: needs root");
        return false;
    }
    installed(tools)
}

/// A process a test runs (`iocache serve`, nbdkit): its stdout and stderr
/// appended to a log file; killed when dropped still running, its log then
/// printed if the test is failing.
pub struct Process {
    child: Option<std::process::Child>,
    log: PathBuf,
}

impl Process {
    /// Runs `command` with its output appended to `log`.
    pub fn spawn(command: &mut Command, log: &Path) -> Process {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?}: {e}"));
        Process {
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    /// `iocache serve ARGS` in `dir`, logging to DIR/server.log, ready once
    /// a client connects to DIR/iocache-data/iocache.sock with `options`
    /// (20 s at most).
    pub fn serve(dir: &Path, args: &[&str], options: iocache_nbd::ConnectOptions) -> Process {
        let mut server = Process::spawn(
            Command::new(env!("CARGO_BIN_EXE_iocache"))
                .arg("serve")
                .args(args)
                .current_dir(dir),
            &dir.join("server.log"),
        );
        let socket = dir.join("iocache-data/iocache.sock");
        server.wait_until("the server accepts a client", || {
            iocache_nbd::Client::connect_unix(&socket, &options).is_ok()
        });
        server
    }

    /// `iocache serve` in `dir` of DIR/backend.img through a 128 MiB
    /// write-back cache in DIR/cache.img, with `extra` arguments, ready as
    /// [`Process::serve`] has it for the default export.
    pub fn serve_write_back(dir: &Path, extra: &[&str]) -> Process {
        let mut args = vec![
            "--backend",
            "backend.img",
            "--cache",
            "cache.img",
            "--cache-size",
            "128MiB",
            "--write-policy",
            "wb",
        ];
        args.extend_from_slice(extra);
        Process::serve(dir, &args, iocache_nbd::ConnectOptions::export(String::new()))
    }

    /// `iocache serve ARGS` in `dir` listening on TCP (`--listen
    /// 127.0.0.1:0` among `args`), logging to DIR/server.log; ready once
    /// its banner names the port, which it returns.
    pub fn serve_tcp(dir: &Path, args: &[&str]) -> (Process, u16) {
        let log = dir.join("server.log");
        let _ = std::fs::remove_file(&log);
        let mut process = Process::spawn(
            Command::new(env!("CARGO_BIN_EXE_iocache"))
                .arg("serve")
                .args(args)
                .current_dir(dir),
            &log,
        );
        let port = || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .split("://127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split('/').next())
                .and_then(|p| p.parse::<u16>().ok())
        };
        process.wait_until("the banner names the port", || port().is_some());
        (process, port().expect("the banner names the port"))
    }

    /// Waits (20 s at most) until `ready` says so; panics with the log if
    /// the process exits first or time runs out.
    pub fn wait_until(&mut self, what: &str, mut ready: impl FnMut() -> bool) {
        let started = std::time::Instant::now();
        while !ready() {
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "waiting until {what}: the process exited ({status}):\n{}",
                    self.log()
                );
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "waiting until {what}: not within 20 s:\n{}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM, then its exit status (30 s at most).
    pub fn stop(self) -> std::process::ExitStatus {
        assert!(Command::new("kill")
            .args(["-TERM", &self.id().to_string()])
            .status()
            .unwrap()
            .success());
        self.wait()
    }

    /// SIGTERM; it must exit 0. Returns what it logged.
    pub fn stop_logged(self) -> String {
        let log = self.log.clone();
        let status = self.stop();
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(status.success(), "{status}:\n{text}");
        text
    }

    /// Its exit status once it exits on its own (30 s at most).
    pub fn wait(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                let _ = child.kill();
                panic!("still running after 30 s:\n{}", self.log());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// SIGKILL (a crash), and waits for it.
    pub fn kill(mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if std::thread::panicking() {
                eprintln!("--- {} ---\n{}", self.log.display(), self.log());
            }
        }
    }
}

/// `len` bytes of a fixed scramble (each index through Knuth's
/// multiplicative hash, shifted right by `shift`), written to `path` and
/// returned, for copies to compare.
pub fn scrambled_file(path: &Path, len: u32, shift: u32) -> Vec<u8> {
    let data: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> shift) as u8)
        .collect();
    std::fs::write(path, &data).unwrap();
    data
}

/// A sparse file of `len` bytes at `path`.
pub fn sparse_file(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

/// Cuts or grows the existing file at `path` to `len` bytes, keeping what
/// it holds below that.
pub fn set_file_len(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// nbdkit exporting the file `image` through `filters` (`--filter=error`)
/// with the plugin parameters `params`, on DIR/backend.sock and logging to
/// DIR/nbdkit.log: ready when returned, with the NBD URI of its export.
pub fn nbdkit_file(dir: &Path, image: &Path, filters: &[&str], params: &[&str]) -> (Process, String) {
    let socket = dir.join("backend.sock");
    let mut nbdkit = Process::spawn(
        Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&socket)
            .args(filters)
            .arg("file")
            .arg(image)
            .args(params),
        &dir.join("nbdkit.log"),
    );
    nbdkit.wait_until("nbdkit listens", || socket.exists());
    (nbdkit, format!("nbd+unix:///?socket={}", socket.display()))
}

/// A backend that fails on demand: nbdkit (see [`nbdkit_file`]) exporting
/// DIR/backend.img, a new sparse file of `len` bytes, through its `error`
/// filter, which fails every `requests` (`""` for all, `"pwrite-"` for
/// writes) while DIR/inject exists. Returns nbdkit, its URI, the image and
/// the trigger file.
pub fn nbdkit_failing(dir: &Path, len: u64, requests: &str) -> (Process, String, PathBuf, PathBuf) {
    let (image, inject) = (dir.join("backend.img"), dir.join("inject"));
    sparse_file(&image, len);
    let rate = format!("error-{requests}rate=100%");
    let trigger = format!("error-{requests}file={}", inject.display());
    let (nbdkit, uri) = nbdkit_file(dir, &image, &["--filter=error"], &[&rate, &trigger]);
    (nbdkit, uri, image, inject)
}

/// `iocache ctl ARGS` against the admin socket of a server run in `dir`
/// (DIR/iocache-data/admin.sock): whether it succeeded, and its output.
pub fn ctl(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .current_dir(dir)
        .args(["ctl", "--admin-socket", "iocache-data/admin.sock"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// `iocache stats --json` of a server run in `dir`.
pub fn stats_json(dir: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .current_dir(dir)
        .args(["stats", "--json", "--admin-socket", "iocache-data/admin.sock"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The strings of a JSON array of strings (a verdict's figures, a change's
/// list), panicking on anything else.
pub fn json_strings(array: &serde_json::Value) -> Vec<&str> {
    array
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// `iocache ctl set` of each of `changes` (KEY=VALUE lists) in turn, one
/// every `pause`, on the server run in `dir` until `stop`; each must
/// succeed. Returns how many were made.
pub fn set_until(
    dir: &Path,
    stop: &std::sync::atomic::AtomicBool,
    changes: &[&[&str]],
    pause: std::time::Duration,
) -> usize {
    let mut made = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut args = vec!["set"];
        args.extend_from_slice(changes[made % changes.len()]);
        let (ok, text) = ctl(dir, &args);
        assert!(ok, "ctl {args:?}: {text}");
        made += 1;
        std::thread::sleep(pause);
    }
    made
}

/// The NBD URI of the default export of a server run in `dir` (its
/// socket at DIR/iocache-data/iocache.sock).
pub fn nbd_uri(dir: &Path) -> String {
    format!(
        "nbd+unix:///?socket={}",
        dir.join("iocache-data/iocache.sock").display()
    )
}

/// [`fio_verify`] over `size` on the server run in `dir` while
/// [`set_until`] makes `changes` in turn, one every `pause`: whether fio
/// passed, what it printed, and how many changes were made while it ran.
pub fn fio_verify_while_setting(
    dir: &Path,
    size: &str,
    changes: &[&[&str]],
    pause: std::time::Duration,
) -> (bool, String, usize) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let setter = s.spawn(|| set_until(dir, &stop, changes, pause));
        let (passed, text) = fio_verify(dir, size);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (passed, text, setter.join().unwrap())
    })
}

/// [`write_flushing`] to the first `blocks` blocks for `time` while
/// [`set_until`] makes `changes` in turn, one every `pause`, then `server`
/// killed (SIGKILL) with the changes still going: what was written, and
/// when the kill came.
pub fn write_flushing_then_kill(
    dir: &Path,
    server: Process,
    blocks: u64,
    time: std::time::Duration,
    changes: &[&[&str]],
    pause: std::time::Duration,
) -> (Written, std::time::Instant) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let setter = s.spawn(|| set_until(dir, &stop, changes, pause));
        let written = write_flushing(dir, blocks, time);
        let killed_at = std::time::Instant::now();
        server.kill();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = setter.join();
        (written, killed_at)
    })
}

/// fio over NBD on the default export of a server run in `dir`: random
/// 4 KiB reads and writes (half each) over `size`, QD 16, 30,000 I/Os,
/// every block verified (crc32c). Returns whether it passed, and what it
/// printed.
pub fn fio_verify(dir: &Path, size: &str) -> (bool, String) {
    let uri = nbd_uri(dir);
    let out = Command::new("fio")
        .args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randrw",
            "--rwmixread=50",
            "--bs=4k",
            &format!("--size={size}"),
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--number_ios=30000",
            "--verify_state_save=0",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && !text.contains("verify: bad"), text)
}

/// One 4 KiB block's content: its index and the write's number.
pub fn block(index: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for chunk in b.chunks_mut(16) {
        chunk[..8].copy_from_slice(&index.to_le_bytes());
        chunk[8..].copy_from_slice(&seq.to_le_bytes());
    }
    b
}

/// What [`write_flushing`] wrote.
pub struct Written {
    /// Per block, the number of its last write a FLUSH covered (0: none).
    pub flushed: Vec<u64>,
    /// Every write: block, number, when it was acknowledged.
    pub log: Vec<(u64, u64, std::time::Instant)>,
}

impl Written {
    /// Per block, the number of its last write acknowledged before
    /// `cutoff` (0: none).
    pub fn acknowledged_before(&self, cutoff: std::time::Instant) -> Vec<u64> {
        let mut last = vec![0u64; self.flushed.len()];
        for &(index, seq, _) in self.log.iter().filter(|(_, _, at)| *at < cutoff) {
            last[index as usize] = seq;
        }
        last
    }
}

/// Writes blocks among the first `blocks` of the default export of a
/// server run in `dir` for `time`, a FLUSH every 16 writes.
pub fn write_flushing(dir: &Path, blocks: u64, time: std::time::Duration) -> Written {
    let mut written = Written {
        flushed: vec![0u64; blocks as usize],
        log: Vec::new(),
    };
    let mut c = client(dir);
    let mut pending = Vec::new();
    let started = std::time::Instant::now();
    let mut seq = 0u64;
    while started.elapsed() < time {
        seq += 1;
        let index = (seq * 7919) % blocks;
        c.write(index * 4096, &block(index, seq), false).unwrap();
        written.log.push((index, seq, std::time::Instant::now()));
        pending.push((index, seq));
        if seq.is_multiple_of(16) {
            c.flush().unwrap();
            for (i, s) in pending.drain(..) {
                written.flushed[i as usize] = s;
            }
        }
    }
    written
}

/// Reads back each block `durable` names (a write's number per block, 0
/// for none; see [`Written`]) from the server run in `dir`: it must hold
/// its own index and that write or a later one.
pub fn check_flushed(dir: &Path, durable: &[u64]) {
    let mut c = client(dir);
    let mut buf = vec![0u8; 4096];
    for (index, &seq) in durable.iter().enumerate() {
        if seq == 0 {
            continue;
        }
        c.read(index as u64 * 4096, &mut buf).unwrap();
        let got_index = u64::from_le_bytes(buf[..8].try_into().unwrap());
        let got_seq = u64::from_le_bytes(buf[8..16].try_into().unwrap());
        assert_eq!(
            got_index, index as u64,
            "block {index} holds another block's data"
        );
        assert!(
            got_seq >= seq,
            "block {index}: flushed write {seq} lost (found {got_seq})"
        );
    }
}

/// A client of the default export of a server run in `dir` (its NBD socket
/// at DIR/iocache-data/iocache.sock).
pub fn client(dir: &Path) -> iocache_nbd::Client {
    iocache_nbd::Client::connect_unix(
        &dir.join("iocache-data/iocache.sock"),
        &iocache_nbd::ConnectOptions::export(String::new()),
    )
    .unwrap()
}

/// The default export of a server run in `dir`, mounted with nbdfuse as
/// the file DIR/fuse/disk (for a loop device and a file system on it);
/// unmounted when dropped.
pub struct FuseDisk {
    pub disk: PathBuf,
    dir: PathBuf,
    nbdfuse: std::process::Child,
}

impl FuseDisk {
    pub fn mount(dir: &Path) -> FuseDisk {
        let fuse = dir.join("fuse");
        std::fs::create_dir_all(&fuse).unwrap();
        let socket = dir.join("iocache-data/iocache.sock");
        let nbdfuse = Command::new("nbdfuse")
            .arg(fuse.join("disk"))
            .args(["--unix", socket.to_str().unwrap()])
            .spawn()
            .unwrap();
        let disk = fuse.join("disk");
        let started = std::time::Instant::now();
        while !disk.exists() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "nbdfuse did not mount"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        FuseDisk {
            disk,
            dir: fuse,
            nbdfuse,
        }
    }
}

impl Drop for FuseDisk {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.dir).status();
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = self.nbdfuse.wait();
    }
}
