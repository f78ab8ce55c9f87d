//! The server against real NBD clients, and our client against a real NBD
//! server: qemu-io (patterns, AIO, zeroes, discard, FUA, flush), qemu-img
//! convert/compare, nbdinfo, nbdcopy and fio's nbd engine drive a
//! `MemExport` over both socket families; nbdkit's memory plugin serves our
//! client. A missing tool makes its test pass with a printed "skipped"
//! message (Debian packages: qemu-utils, libnbd-bin, nbdkit, fio).

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use iocache_nbd::proto::*;
use iocache_nbd::{Client, ConnectOptions, MemExport, RunningServer};

const SIZE: usize = 16 << 20;

/// Whether `tool` is on the PATH; prints why the test is skipped if not.
fn have(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    if !found {
        eprintln!("skipped: {tool} is not installed");
    }
    found
}

/// Runs a command, killing it after `timeout`.
fn run(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} timed out\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command and checks it succeeded; returns stdout.
fn ok(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    let out = run(cmd, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    stdout
}

/// A server of a SIZE memory export for a test of `tool`, or `None` when
/// `tool` is not installed.
fn serve_for(tool: &str) -> Option<(Arc<MemExport>, RunningServer)> {
    if !have(tool) {
        return None;
    }
    let export = Arc::new(MemExport::new(SIZE));
    let server = start(tool, export.clone());
    Some((export, server))
}

fn uris(server: &RunningServer, name: &str) -> Vec<String> {
    vec![
        format!(
            "nbd+unix:///{name}?socket={}",
            server.unix_path().unwrap().display()
        ),
        format!("nbd://127.0.0.1:{}/{name}", server.tcp_addr().unwrap().port()),
    ]
}

trait ZeroAll {
    fn write_zeroes_all(&self);
}

impl ZeroAll for MemExport {
    fn write_zeroes_all(&self) {
        use iocache_nbd::Export;
        self.write_zeroes(0, self.size_bytes(), false, false).unwrap();
    }
}

fn temp_file(tag: &str) -> std::path::PathBuf {
    temp_socket(tag).with_extension("img")
}

/// A file of `SIZE` pattern bytes (from `seed`) but for a run of zeroes,
/// for a client to copy into an export; with its contents.
fn source_file(tag: &str, seed: u64, zeroes: std::ops::Range<usize>) -> (std::path::PathBuf, Vec<u8>) {
    let src = temp_file(tag);
    let mut data = pattern(SIZE, seed);
    data[zeroes].fill(0);
    std::fs::write(&src, &data).unwrap();
    (src, data)
}

#[test]
fn qemu_io_writes_patterns_and_verifies_them() {
    let Some((export, server)) = serve_for("qemu-io") else {
        return;
    };
    for (i, uri) in uris(&server, "disk").into_iter().enumerate() {
        let base = i as u64 * (8 << 20);
        // (offset, length, pattern): aligned, large, and unaligned (qemu does
        // read-modify-write at our 512-byte minimum block size).
        let cases = [
            (0u64, 512u64, 0x11u8),
            (4096, 65536, 0x22),
            (1 << 20, 3 << 20, 0x33),
            (70100, 1000, 0x44),
            ((5 << 20) + 7, 70000, 0x55),
        ];
        let mut cmd = Command::new("qemu-io");
        cmd.args(["-f", "raw"]);
        for (off, len, p) in cases {
            cmd.arg("-c").arg(format!("write -P {p:#x} {} {len}", base + off));
        }
        for (off, len, p) in cases {
            cmd.arg("-c").arg(format!("read -P {p:#x} {} {len}", base + off));
        }
        // FUA write, zeroes (with and without unmap), discard, flush, AIO.
        let b = base + (6 << 20);
        for c in [
            format!("write -f -P 0x66 {b} 64k"),
            format!("read -P 0x66 {b} 64k"),
            format!("write -z {b} 32k"),
            format!("read -P 0 {b} 32k"),
            format!("write -z -u {} 32k", b + 32768),
            format!("read -P 0 {b} 64k"),
            format!("discard {} 64k", b + 65536),
            "flush".to_string(),
            format!("aio_write -P 0x77 {} 64k", b + 131072),
            format!("aio_write -P 0x78 {} 64k", b + 196608),
            format!("aio_write -P 0x79 {} 64k", b + 262144),
            "aio_flush".to_string(),
            format!("read -P 0x77 {} 64k", b + 131072),
            format!("read -P 0x78 {} 64k", b + 196608),
            format!("read -P 0x79 {} 64k", b + 262144),
        ] {
            cmd.arg("-c").arg(c);
        }
        cmd.arg(&uri);
        let out = ok(&mut cmd);
        for bad in ["failed", "error", "Pattern verification"] {
            assert!(!out.contains(bad), "{uri}: qemu-io reported {bad:?}:\n{out}");
        }
        // The export holds what qemu wrote.
        let snap = export.snapshot();
        for (off, len, p) in cases {
            let r = (base + off) as usize..(base + off + len) as usize;
            assert!(snap[r].iter().all(|&x| x == p), "{uri}: {off}+{len}");
        }
        eprintln!("qemu-io over {uri}: ok");
    }
}

#[test]
fn qemu_img_convert_and_compare() {
    let Some((export, server)) = serve_for("qemu-img") else {
        return;
    };
    // A zero run to exercise write-zeroes.
    let (src, data) = source_file("qemu-img-src", 42, SIZE / 2..SIZE / 2 + (1 << 20));
    for uri in uris(&server, "") {
        export.write_zeroes_all();
        ok(Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&uri));
        assert!(export.snapshot() == data, "{uri}: converted contents differ");
        ok(Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(&uri));
        let info = ok(Command::new("qemu-img").args(["info", "-f", "raw"]).arg(&uri));
        assert!(info.contains(&format!("{SIZE} bytes")), "{info}");
        eprintln!("qemu-img convert/compare/info over {uri}: ok");
    }
    let _ = std::fs::remove_file(&src);
}

#[test]
fn nbdinfo_reports_size_flags_and_exports() {
    if !have("nbdinfo") {
        return;
    }
    let a = Arc::new(MemExport::new(SIZE).with_description("the disk"));
    let b = Arc::new(MemExport::new(1 << 20).with_read_only(true));
    let server = start_with(config("nbdinfo"), vec![("disk", a as _), ("small", b as _)]);
    for uri in uris(&server, "disk") {
        let size = ok(Command::new("nbdinfo").arg("--size").arg(&uri));
        assert_eq!(size.trim(), SIZE.to_string(), "{uri}");
        let json = ok(Command::new("nbdinfo").arg("--json").arg(&uri));
        let compact: String = json.split_whitespace().collect();
        for want in [
            "\"can_flush\":true",
            "\"can_fua\":true",
            "\"can_trim\":true",
            "\"can_zero\":true",
            "\"can_multi_conn\":true",
            "\"is_read_only\":false",
            "\"block_size_minimum\":512",
            "\"block_size_preferred\":4096",
            "\"block_size_maximum\":33554432",
            "\"description\":\"thedisk\"",
            "\"protocol\":\"newstyle-fixed\"",
            "\"structured\":true",
        ] {
            assert!(
                compact.contains(want),
                "{uri}: nbdinfo --json lacks {want}:\n{json}"
            );
        }
        eprintln!("nbdinfo over {uri}: ok");
    }
    let small = &uris(&server, "small")[0];
    let json = ok(Command::new("nbdinfo").arg("--json").arg(small));
    assert!(
        json.split_whitespace()
            .collect::<String>()
            .contains("\"is_read_only\":true"),
        "{json}"
    );
    let list = ok(Command::new("nbdinfo").arg("--list").arg(&uris(&server, "")[0]));
    assert!(
        list.contains("export=\"disk\"") && list.contains("export=\"small\""),
        "{list}"
    );
    eprintln!("nbdinfo --list: ok");
}

#[test]
fn nbdcopy_both_ways() {
    let Some((export, server)) = serve_for("nbdcopy") else {
        return;
    };
    let (src, data) = source_file("nbdcopy-src", 7, 1 << 20..3 << 20);
    let dst = temp_file("nbdcopy-dst");
    for uri in uris(&server, "disk") {
        export.write_zeroes_all();
        // nbdcopy pipelines many requests and, seeing CAN_MULTI_CONN, opens
        // several connections.
        ok(Command::new("nbdcopy")
            .args(["--flush", "--requests=32", "--connections=4"])
            .arg(&src)
            .arg(&uri));
        assert!(export.snapshot() == data, "{uri}: copy in differs");
        let _ = std::fs::remove_file(&dst);
        std::fs::write(&dst, []).unwrap();
        ok(Command::new("nbdcopy").arg(&uri).arg(&dst));
        assert!(std::fs::read(&dst).unwrap() == data, "{uri}: copy out differs");
        eprintln!("nbdcopy in and out over {uri}: ok");
    }
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&dst);
}

#[test]
fn fio_nbd_engine_verifies_random_writes() {
    if !have("fio") {
        return;
    }
    let out = run(Command::new("fio").arg("--enghelp"), Duration::from_secs(10));
    if !String::from_utf8_lossy(&out.stdout).contains("nbd") {
        eprintln!("skipped: this fio has no nbd engine");
        return;
    }
    let export = Arc::new(MemExport::new(SIZE));
    let server = start("fio", export);
    for uri in uris(&server, "disk") {
        let out = ok(Command::new("fio").args([
            "--name=nbd",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--size=8M",
            "--iodepth=32",
            "--verify=crc32c",
            "--verify_state_save=0",
            "--do_verify=1",
            "--verify_fatal=1",
        ]));
        assert!(out.contains("nbd:") || out.contains("nbd"), "{out}");
        eprintln!("fio nbd engine over {uri}: ok");
    }
}

/// Starts `nbdkit memory` on a Unix socket and waits for the socket.
struct Nbdkit {
    child: std::process::Child,
    socket: std::path::PathBuf,
}

impl Nbdkit {
    fn start(size: &str) -> Nbdkit {
        let socket = temp_socket("nbdkit");
        let child = Command::new("nbdkit")
            .args(["-f", "-e", "mem", "-U"])
            .arg(&socket)
            .args(["memory", size])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !Path::new(&socket).exists() {
            assert!(t0.elapsed() < Duration::from_secs(10), "nbdkit did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nbdkit { child, socket }
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[test]
fn our_client_against_nbdkit() {
    if !have("nbdkit") {
        return;
    }
    let kit = Nbdkit::start("16M");
    for structured in [true, false] {
        let opts = ConnectOptions {
            structured_replies: structured,
            ..ConnectOptions::export("mem")
        };
        let mut c = Client::connect_unix(&kit.socket, &opts).unwrap();
        assert_eq!(c.size(), 16 << 20);
        assert_eq!(c.structured(), structured);
        let data = pattern(3 << 20, structured as u64);
        c.write(4096, &data, true).unwrap();
        let mut back = vec![0u8; data.len()];
        c.read(4096, &mut back).unwrap();
        assert!(back == data);
        c.flush().unwrap();
        c.write_zeroes(8192, 65536, false, true).unwrap();
        let mut z = vec![1u8; 65536];
        c.read(8192, &mut z).unwrap();
        assert!(z.iter().all(|&b| b == 0));
        c.trim(1 << 20, 1 << 20).unwrap();
        // nbdkit's memory plugin answers reads of trimmed space with holes
        // when structured replies are on: they must read as zeroes.
        let mut t = vec![1u8; 1 << 20];
        c.read(1 << 20, &mut t).unwrap();
        assert!(t.iter().all(|&b| b == 0));
        let e = c
            .raw_request(NBD_CMD_READ, 0, 16 << 20, 512, &[], Some(&mut [0u8; 512]))
            .unwrap_err();
        assert_eq!(e.errno(), Some(NBD_EINVAL), "{e}");
        c.disconnect().unwrap();
    }
    let uri = format!("nbd+unix:///mem?socket={}", kit.socket.display());
    let c = Client::connect(&uri).unwrap();
    assert_eq!(c.size(), 16 << 20);
    eprintln!("our client against nbdkit: ok");
}
