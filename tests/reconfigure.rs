//! Knobs changed on a running server (`iocache ctl set`), with
//! real clients: fio verifies every block (crc32c) while the write policy,
//! the replacement policy and the other knobs switch under it, wb <-> wt,
//! wa, wi, pt with dirty lines present; and a `kill -9` in the middle of
//! switching loses no flushed write, with the last values back after the
//! restart.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use iocache_nbd::{Client, ConnectOptions};

mod common;
use common::{ctl, have, temp_dir, Process};

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

/// Applies `CHANGES` in turn until `stop`, returning how many were applied.
fn switch_until(dir: &Path, stop: &AtomicBool) -> usize {
    let mut applied = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut args = vec!["set"];
        args.extend_from_slice(CHANGES[applied % CHANGES.len()]);
        let (ok, text) = ctl(dir, &args);
        assert!(ok, "ctl {args:?}: {text}");
        applied += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    applied
}

#[test]
fn fio_verifies_while_every_knob_switches() {
    if !have("fio") {
        eprintln!("SKIPPED: fio is not installed");
        return;
    }
    let dir = temp_dir("fio");
    let server = start(&dir, &[]);
    let uri = format!(
        "nbd+unix:///?socket={}",
        dir.join("iocache-data/iocache.sock").display()
    );
    let stop = AtomicBool::new(false);
    let (fio, applied) = std::thread::scope(|s| {
        let switcher = s.spawn(|| switch_until(&dir, &stop));
        let fio = Command::new("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randrw",
                "--rwmixread=50",
                "--bs=4k",
                "--size=32M",
                "--iodepth=16",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--do_verify=1",
                "--number_ios=30000",
                "--verify_state_save=0",
            ])
            .output()
            .unwrap();
        stop.store(true, Ordering::Relaxed);
        (fio, switcher.join().unwrap())
    });
    let text = String::from_utf8_lossy(&fio.stdout).to_string() + &String::from_utf8_lossy(&fio.stderr);
    assert!(fio.status.success() && !text.contains("verify: bad"), "{text}");
    assert!(
        applied >= CHANGES.len(),
        "only {applied} changes were made while fio ran"
    );
    let (ok, text) = ctl(&dir, &["get"]);
    assert!(ok && text.contains("in force"), "{text}");
    assert!(server.stop().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// One 4 KiB block's content: its index and the write's number.
fn block(index: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for chunk in b.chunks_mut(16) {
        chunk[..8].copy_from_slice(&index.to_le_bytes());
        chunk[8..].copy_from_slice(&seq.to_le_bytes());
    }
    b
}

#[test]
fn kill_9_while_switching_loses_no_flushed_write_and_keeps_the_last_values() {
    let dir = temp_dir("kill");
    let server = start(&dir, &[]);
    let socket = dir.join("iocache-data/iocache.sock");
    let blocks = 2048u64; // 8 MiB of a 64 MiB volume
    let mut durable = vec![0u64; blocks as usize];
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let switcher = s.spawn(|| switch_until(&dir, &stop));
        let mut client = Client::connect_unix(&socket, &ConnectOptions::default()).unwrap();
        let mut pending = Vec::new();
        let started = Instant::now();
        let mut seq = 0u64;
        while started.elapsed() < Duration::from_millis(1500) {
            seq += 1;
            let index = (seq * 7919) % blocks;
            client.write(index * 4096, &block(index, seq), false).unwrap();
            pending.push((index, seq));
            if seq.is_multiple_of(16) {
                client.flush().unwrap();
                for (i, s) in pending.drain(..) {
                    durable[i as usize] = s;
                }
            }
        }
        // Crash while the switcher is still at work.
        server.kill();
        stop.store(true, Ordering::Relaxed);
        let _ = switcher.join();
    });
    // The last values set survive the crash (or the one before, had the
    // kill come between a change and its record: check they are coherent).
    let server = start(&dir, &[]);
    let (ok, settings) = ctl(&dir, &["get"]);
    assert!(ok, "{settings}");
    let mut client = Client::connect_unix(&socket, &ConnectOptions::default()).unwrap();
    let mut buf = vec![0u8; 4096];
    for index in 0..blocks {
        let seq = durable[index as usize];
        if seq == 0 {
            continue;
        }
        client.read(index * 4096, &mut buf).unwrap();
        let got_index = u64::from_le_bytes(buf[..8].try_into().unwrap());
        let got_seq = u64::from_le_bytes(buf[8..16].try_into().unwrap());
        assert_eq!(got_index, index, "block {index} holds another block's data");
        assert!(
            got_seq >= seq,
            "block {index}: flushed write {seq} lost (found {got_seq})"
        );
    }
    drop(client);
    assert!(server.stop().success());
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(log.contains("set write_policy="), "the changes are logged: {log}");
    let _ = std::fs::remove_dir_all(&dir);
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
    let _ = std::fs::remove_dir_all(&dir);
}
