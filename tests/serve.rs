//! `iocache serve` end to end with real NBD clients: pattern writes and
//! verifying reads with qemu-io at many offsets and sizes, fio with crc32c
//! verification under every write policy, nbdinfo and qemu-img; a SIGTERM
//! writes dirty lines back so the data is still there after a restart.
//! Each client is skipped (with a message) when it is not installed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Served {
    child: Child,
    dir: PathBuf,
}

impl Served {
    fn start(dir: &Path, extra: &[&str]) -> Served {
        std::fs::create_dir_all(dir).unwrap();
        let mut args = vec![
            "serve",
            "--backend-size",
            "64MiB",
            "--cache-size",
            "2MiB",
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_iocache"))
            .args(&args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let socket = dir.join("iocache-data/iocache.sock");
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        Served {
            child,
            dir: dir.to_path_buf(),
        }
    }

    fn uri(&self) -> String {
        format!(
            "nbd+unix:///iocache?socket={}",
            self.dir.join("iocache-data/iocache.sock").display()
        )
    }

    /// SIGTERM, then the exit status and stderr.
    fn stop(mut self) -> (bool, String) {
        send_sigterm(self.child.id());
        self.child.wait_with_output_timeout()
    }
}

trait WaitTimeout {
    fn wait_with_output_timeout(&mut self) -> (bool, String);
}

impl WaitTimeout for Child {
    fn wait_with_output_timeout(&mut self) -> (bool, String) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = self.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                return (status.success(), err);
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = self.kill();
                panic!("server did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn send_sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn qemu_io(uri: &str, commands: &[String]) -> String {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.arg(uri).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert!(!text.contains("error"), "{text}");
    text
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iocache-serve-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Offsets and sizes that cross lines, shards and the cache's capacity.
fn pattern_commands(verb: &str) -> Vec<String> {
    let cases: [(u64, u64); 8] = [
        (0, 512),
        (4096, 4096),
        (8192 + 7 * 512, 9 * 512),
        (1 << 20, 64 << 10),
        ((256 << 10) - 512, 8 << 10),
        (5 << 20, 3 << 20),
        ((64 << 20) - 4096, 4096),
        (10 << 20, 1 << 20),
    ];
    cases
        .iter()
        .enumerate()
        .map(|(i, (offset, len))| format!("{verb} -P {} {offset} {len}", 0x10 + i))
        .collect()
}

#[test]
fn qemu_io_patterns_survive_a_restart() {
    if !have("qemu-io") {
        eprintln!("skipped: qemu-io is not installed");
        return;
    }
    let dir = temp_dir("restart");
    let served = Served::start(&dir, &[]);
    let uri = served.uri();
    qemu_io(&uri, &pattern_commands("write"));
    // Read back twice: misses fill the cache, then hits.
    qemu_io(&uri, &pattern_commands("read"));
    qemu_io(&uri, &pattern_commands("read"));
    let (ok, err) = served.stop();
    assert!(ok, "serve did not exit 0: {err}");
    assert!(err.contains("writing back"), "{err}");
    // A fresh cache over the same backend still reads every pattern.
    let served = Served::start(&dir, &["--write-policy", "wt"]);
    qemu_io(&served.uri(), &pattern_commands("read"));
    let (ok, err) = served.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fio_verifies_under_every_write_policy() {
    if !have("fio") {
        eprintln!("skipped: fio is not installed");
        return;
    }
    for wp in ["wb", "wt", "wi", "wa", "wo", "pt"] {
        let dir = temp_dir(&format!("fio-{wp}"));
        let served = Served::start(
            &dir,
            &[
                "--write-policy",
                wp,
                "--flush",
                "aggressive:interval=5ms:batch=16",
            ],
        );
        let out = Command::new("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={}", served.uri()),
                "--rw=randrw",
                "--rwmixread=50",
                "--bs=4k",
                "--size=16M",
                "--iodepth=16",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--do_verify=1",
                "--number_ios=4000",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "fio under {wp}: {text}");
        assert!(!text.contains("verify: bad"), "{wp}: {text}");
        let (ok, err) = served.stop();
        assert!(ok, "{wp}: {err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn nbdinfo_and_qemu_img_see_the_export() {
    let dir = temp_dir("info");
    let served = Served::start(&dir, &["--lookup", "coarse"]);
    if have("nbdinfo") {
        let out = Command::new("nbdinfo")
            .args(["--size", &served.uri()])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            (64u64 << 20).to_string()
        );
    } else {
        eprintln!("skipped: nbdinfo is not installed");
    }
    if have("qemu-img") {
        let src = dir.join("src.img");
        let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, &data).unwrap();
        let status = Command::new("qemu-img")
            .args([
                "convert",
                "-n",
                "-f",
                "raw",
                "-O",
                "raw",
                src.to_str().unwrap(),
                &served.uri(),
            ])
            .status()
            .unwrap();
        assert!(status.success());
        let back = dir.join("back.img");
        let status = Command::new("qemu-img")
            .args([
                "convert",
                "-f",
                "raw",
                "-O",
                "raw",
                &served.uri(),
                back.to_str().unwrap(),
            ])
            .status()
            .unwrap();
        assert!(status.success());
        let copied = std::fs::read(&back).unwrap();
        assert_eq!(&copied[..data.len()], &data[..], "qemu-img round trip");
    } else {
        eprintln!("skipped: qemu-img is not installed");
    }
    let (ok, err) = served.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_are_named() {
    let dir = temp_dir("bad");
    std::fs::create_dir_all(&dir).unwrap();
    for (args, needle) in [
        (vec!["serve", "--write-policy", "wz"], "wz"),
        (vec!["serve", "--lookup", "medium"], "medium"),
        (vec!["serve", "--line-size", "3000"], "power of two"),
        (vec!["serve", "--listen", "nowhere"], "nowhere"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_iocache"))
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
