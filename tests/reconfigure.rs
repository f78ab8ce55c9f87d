//! Knobs changed on a running server (`iocache ctl set`), with
//! real clients: fio verifies every block (crc32c) while the write policy,
//! the replacement policy and the other knobs switch under it, wb <-> wt,
//! wa, wi, pt with dirty lines present; and a `kill -9` in the middle of
//! switching loses no flushed write, with the last values back after the
//! restart.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use iocache_nbd::ConnectOptions;

mod common;
use common::{
    check_flushed, ctl, fio_verify_while_setting, temp_dir, temp_dir_with, write_flushing_then_kill, Process,
};

/// `iocache serve` of a 64 MiB backend through an 8 MiB cache, with `extra`.
fn start(dir: &Path, extra: &[&str]) -> Process {
    let mut args = vec!["--backend-size", "64MiB", "--cache-size", "8MiB"];
    args.extend_from_slice(extra);
    Process::serve(dir, &args, ConnectOptions::default())
}

const CHANGES: [&[&str]; 10] = [
    &["write_policy=wt", "policy=arc"],
    &["write_policy=wb", "max_dirty_lines=64"],
    &["write_policy=pt"],
    &["write_policy=wb", "promotion=nhit:2", "policy=s3fifo"],
    &["write_policy=wa", "seq_cutoff=256KiB"],
    &["write_policy=wo", "flush=aggressive:interval=5ms:batch=16"],
    &["write_policy=wi", "policy=clock"],
    &["write_policy=wb", "max_dirty_lines=off", "write_miss_bypass=true"],
    &["promotion=always", "seq_cutoff=off", "flush=nop"],
    &["write_policy=wb", "policy=lru", "write_miss_bypass=false"],
];

/// How often a change of `CHANGES` is made.
const PAUSE: Duration = Duration::from_millis(20);

#[test]
fn fio_verifies_while_every_knob_switches() {
    let Some(dir) = temp_dir_with(&["fio"], "fio") else {
        return;
    };
    let server = start(&dir, &[]);
    let (passed, text, applied) = fio_verify_while_setting(&dir, "32M", &CHANGES, PAUSE);
    assert!(passed, "{text}");
    assert!(
        applied >= CHANGES.len(),
        "only {applied} changes were made while fio ran"
    );
    let (ok, text) = ctl(&dir, &["get"]);
    assert!(ok && text.contains("in force"), "{text}");
    assert!(server.stop().success());
}

#[test]
fn kill_9_while_switching_loses_no_flushed_write_and_keeps_the_last_values() {
    let dir = temp_dir("kill");
    let server = start(&dir, &[]);
    let blocks = 2048u64; // 8 MiB of a 64 MiB volume
    let time = Duration::from_millis(1500);
    // Crash while the switcher is still at work.
    let (written, _) = write_flushing_then_kill(&dir, server, blocks, time, &CHANGES, PAUSE);
    // The last values set survive the crash (or the one before, had the
    // kill come between a change and its record: check they are coherent).
    let server = start(&dir, &[]);
    let (ok, settings) = ctl(&dir, &["get"]);
    assert!(ok, "{settings}");
    check_flushed(&dir, &written.flushed);
    let log = server.stop_logged();
    assert!(log.contains("set write_policy="), "the changes are logged: {log}");
}

/// `stats` (text and JSON) names the replacement policy in force, as `ctl
/// get` does, not the one configured at start; the text shows values
/// without JSON's quotes.
#[test]
fn stats_name_the_policy_in_force() {
    let dir = temp_dir("policy");
    let server = start(&dir, &[]);
    let (ok, text) = ctl(&dir, &["set", "policy=s3fifo"]);
    assert!(ok, "{text}");
    let stats = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_iocache"));
        cmd.current_dir(&dir)
            .args(["stats", "--admin-socket", "iocache-data/admin.sock"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let json: serde_json::Value = serde_json::from_str(&stats(true)).unwrap();
    assert_eq!(json["volumes"][0]["policy"], "s3fifo", "{json:#}");
    let text = stats(false);
    assert!(text.contains(", s3fifo policy, wb write policy"), "{text}");
    assert!(server.stop().success());
}
