//! How the binary ends: SIGHUP stops a server cleanly as SIGTERM does, a
//! stdout nobody reads neither stops a server nor panics a command, and
//! exit statuses tell a configuration error (2) from something that may
//! pass (75).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{client, temp_dir, temp_dir_with, Process};
use iocache_nbd::{Client, ConnectOptions};

fn iocache(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_iocache"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// The arguments of `iocache serve` for a new 16 MiB volume through an
/// 8 MiB cache.
const SMALL: [&str; 5] = ["--init", "--backend-size", "16MiB", "--cache-size", "8MiB"];

#[test]
fn sighup_stops_a_server_cleanly() {
    let dir = temp_dir("sighup");
    let args = [&SMALL[..], &["--write-policy", "wb"]].concat();
    let server = Process::serve(&dir, &args, ConnectOptions::export(String::new()));
    let mut c = client(&dir);
    c.write(0, &[7u8; 65536], false).unwrap();
    drop(c);
    assert!(Command::new("kill")
        .args(["-HUP", &server.id().to_string()])
        .status()
        .unwrap()
        .success());
    let log_path = dir.join("server.log");
    let started = Instant::now();
    while !std::fs::read_to_string(&log_path)
        .unwrap_or_default()
        .contains("stopped")
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "SIGHUP did not stop the server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = server.wait();
    assert!(status.success(), "{status:?}");
    let backend = std::fs::read(dir.join("iocache-data/backend.img")).unwrap();
    assert!(
        backend[..65536].iter().all(|&b| b == 7),
        "the dirty data was written back"
    );
}

#[test]
fn a_stdout_nobody_reads_stops_neither_a_server_nor_panics_a_command() {
    let dir = temp_dir("stdout");
    // The server's stdout: a pipe whose reader is gone before the banner.
    let mut child = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .current_dir(&dir)
        .arg("serve")
        .args(SMALL)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let socket = dir.join("iocache-data/iocache.sock");
    let started = Instant::now();
    let mut c = loop {
        if let Ok(c) = Client::connect_unix(&socket, &ConnectOptions::export(String::new())) {
            break c;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the server died with its stdout"
        );
        assert!(started.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(50));
    };
    c.write(0, &[1u8; 4096], false).unwrap();
    drop(c);
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A command that prints, its reader gone: no panic.
    let mut policies = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .arg("policies")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(policies.stdout.take());
    let out = policies.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn exit_statuses_tell_configuration_errors_from_what_may_pass() {
    let dir = temp_dir("exits");
    // A configuration error: 2.
    let out = iocache(
        &dir,
        &["serve", "--backend-size", "16MiB", "--write-policy", "sometimes"],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A refusal an operator must answer (a backend that existed before,
    // no cache): 2.
    std::fs::write(dir.join("old.img"), vec![0u8; 1 << 20]).unwrap();
    let out = iocache(
        &dir,
        &["serve", "--backend", "old.img", "--cache", "new-cache.img"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--init"), "{stderr}");
    // An NBD backend nobody serves yet: 75, worth a restart.
    let socket = dir.join("not-yet.sock");
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let out = iocache(
        &dir,
        &["serve", "--init", "--backend", &uri, "--cache-size", "8MiB"],
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = iocache(
        &dir,
        &[
            "serve",
            "--init",
            "--backend",
            "nbd://127.0.0.1:1/",
            "--cache-size",
            "8MiB",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_example_systemd_unit_verifies() {
    let Some(dir) = temp_dir_with(&["systemd-analyze"], "unit") else {
        return;
    };
    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/iocache.service")).unwrap();
    assert!(
        unit.contains("RestartPreventExitStatus=2"),
        "a refusal is not restarted"
    );
    let path = dir.join("iocache.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/iocache", env!("CARGO_BIN_EXE_iocache")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.trim().is_empty(), "{text}");
}

#[test]
fn run_serves_for_the_life_of_one_command_and_returns_its_status() {
    let dir = temp_dir("captive");
    // Short flags as nbdkit and qemu-nbd users type them: -U socket, -e
    // export name, -P pid file, -t threads; the command sees the URI.
    let short_flags = [
        "-U",
        "s.sock",
        "-e",
        "disk",
        "-P",
        "pid",
        "-t",
        "2",
        "--run",
        r#"case "$nbd" in nbd+unix:///disk?socket=/*/s.sock) [ "$uri" = "$nbd" ] && [ -s pid ] && exit 7;; esac; exit 1"#,
    ];
    let out = iocache(&dir, &[&["serve"][..], &SMALL, &short_flags].concat());
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("stopped"), "stopped cleanly: {log}");
    assert!(!dir.join("pid").exists(), "the pid file is removed at the stop");
    // With a client: data written through the export reaches the backend
    // before the status comes back; -r serves read-only.
    if common::have("qemu-io") {
        // Serves the backend file above for one qemu-io command.
        let captive = |flag: &str, command: &str| {
            let run = format!(r#"qemu-io -f raw -c '{command}' "$nbd""#);
            iocache(
                &dir,
                &[
                    "serve",
                    "--backend",
                    "iocache-data/backend.img",
                    "--cache-size",
                    "8MiB",
                    flag,
                    "--run",
                    &run,
                ],
            )
        };
        let out = captive("--write-policy=wb", "write -P 0x5c 0 64k");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let backend = std::fs::read(dir.join("iocache-data/backend.img")).unwrap();
        assert!(backend[..65536].iter().all(|&b| b == 0x5c));
        let out = captive("-r", "write -P 0x11 0 4k");
        assert!(!out.status.success(), "a read-only export refuses the write");
    }
    // --port is not a flag: said, with the one that listens on TCP.
    let out = iocache(&dir, &["serve", "--port", "10809"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--listen 127.0.0.1:10809"), "{stderr}");
}
