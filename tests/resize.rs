//! A cache resized while it serves (`ctl set cache_size=`), with real
//! clients: fio verifies every block while the cache grows and shrinks
//! under it; a growth keeps every line and a shrink keeps the ones that
//! fit; a `kill -9` in the middle of resizing loses no flushed write, and
//! the restart finds one of the sizes set; sizes out of range are refused.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use iocache_nbd::ConnectOptions;

mod common;
use common::{client, ctl, have, stats_json, temp_dir, Process};

/// `iocache serve` of a 64 MiB backend through an 8 MiB cache formatted
/// for 16 MiB.
fn start(dir: &Path) -> Process {
    Process::serve(
        dir,
        &[
            "--backend-size",
            "64MiB",
            "--cache-size",
            "8MiB",
            "--cache-size-max",
            "16MiB",
        ],
        ConnectOptions::default(),
    )
}

const SIZES: [&str; 6] = ["16MiB", "2MiB", "12MiB", "4MiB", "16MiB", "8MiB"];

fn device(dir: &Path) -> serde_json::Value {
    stats_json(dir)["volumes"][0].clone()
}

/// Sets the sizes in turn until `stop`; returns how many were set.
fn resize_until(dir: &Path, stop: &AtomicBool) -> usize {
    let mut set = 0;
    while !stop.load(Ordering::Relaxed) {
        let size = SIZES[set % SIZES.len()];
        let (ok, text) = ctl(dir, &["set", &format!("cache_size={size}")]);
        assert!(ok, "ctl set cache_size={size}: {text}");
        set += 1;
        std::thread::sleep(Duration::from_millis(30));
    }
    set
}

#[test]
fn fio_verifies_while_the_cache_grows_and_shrinks() {
    if !have("fio") {
        eprintln!("SKIPPED: fio is not installed");
        return;
    }
    let dir = temp_dir("resize-fio");
    let server = start(&dir);
    let uri = format!(
        "nbd+unix:///?socket={}",
        dir.join("iocache-data/iocache.sock").display()
    );
    let stop = AtomicBool::new(false);
    let (fio, set) = std::thread::scope(|s| {
        let resizer = s.spawn(|| resize_until(&dir, &stop));
        let fio = Command::new("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randrw",
                "--rwmixread=50",
                "--bs=4k",
                "--size=24M",
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
        (fio, resizer.join().unwrap())
    });
    let text = String::from_utf8_lossy(&fio.stdout).to_string() + &String::from_utf8_lossy(&fio.stderr);
    assert!(fio.status.success() && !text.contains("verify: bad"), "{text}");
    assert!(set >= SIZES.len(), "only {set} resizes while fio ran");
    let last = SIZES[(set - 1) % SIZES.len()];
    let d = device(&dir);
    assert_eq!(
        d["lines_in_service"].as_u64().unwrap() * 4096,
        iocache_core::units::parse_byte_size(last).unwrap(),
        "{d:#}"
    );
    assert!(server.stop().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_growth_keeps_every_line_and_the_size_survives_a_restart() {
    let dir = temp_dir("resize-keep");
    let server = start(&dir);
    let mut c = client(&dir);
    // 1,536 lines (6 MiB) cached, read back so they are resident.
    let data: Vec<u8> = (0..6u64 << 20).map(|i| (i / 4096 % 251) as u8).collect();
    c.write(0, &data, false).unwrap();
    c.flush().unwrap();
    let resident = |dir: &Path| stats_json(dir)["volumes"][0]["resident_lines"].as_u64().unwrap();
    assert_eq!(resident(&dir), 1536);
    let (ok, text) = ctl(&dir, &["set", "cache_size=16MiB"]);
    assert!(ok, "{text}");
    assert_eq!(resident(&dir), 1536, "a growth dropped lines");
    let (ok, text) = ctl(&dir, &["set", "cache_size=2MiB"]);
    assert!(ok, "{text}");
    assert_eq!(resident(&dir), 512, "a shrink keeps the lines that fit");
    let mut back = vec![0u8; data.len()];
    c.read(0, &mut back).unwrap();
    assert!(back == data, "data changed across the resizes");
    // Out of range: refused, naming the limit; the size unchanged.
    let (ok, text) = ctl(&dir, &["set", "cache_size=32MiB"]);
    assert!(
        !ok && text.contains("to 16MiB") && text.contains("formatted for 4096"),
        "{text}"
    );
    drop(c);
    assert!(server.stop().success());
    let server = start(&dir);
    let d = device(&dir);
    assert_eq!(
        (d["capacity_lines"].as_u64(), d["lines_in_service"].as_u64()),
        (Some(4096), Some(512)),
        "{d:#}"
    );
    let (ok, text) = ctl(&dir, &["get"]);
    assert!(
        ok && text.contains("cache_size") && text.contains("2MiB"),
        "{text}"
    );
    assert!(server.stop().success());
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(log.contains("set cache_size=2MiB"), "the change is logged: {log}");
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
fn kill_9_while_resizing_loses_no_flushed_write() {
    let dir = temp_dir("resize-kill");
    let server = start(&dir);
    let blocks = 6144u64; // 24 MiB of the 64 MiB volume: more than the cache
    let mut durable = vec![0u64; blocks as usize];
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let resizer = s.spawn(|| resize_until(&dir, &stop));
        let mut c = client(&dir);
        let mut pending = Vec::new();
        let started = Instant::now();
        let mut seq = 0u64;
        while started.elapsed() < Duration::from_millis(1500) {
            seq += 1;
            let index = (seq * 7919) % blocks;
            c.write(index * 4096, &block(index, seq), false).unwrap();
            pending.push((index, seq));
            if seq.is_multiple_of(16) {
                c.flush().unwrap();
                for (i, s) in pending.drain(..) {
                    durable[i as usize] = s;
                }
            }
        }
        // Crash while the resizer is still at work.
        server.kill();
        stop.store(true, Ordering::Relaxed);
        let _ = resizer.join();
    });
    let server = start(&dir);
    let lines = device(&dir)["lines_in_service"].as_u64().unwrap();
    assert!(
        SIZES
            .iter()
            .any(|s| iocache_core::units::parse_byte_size(s).unwrap() == lines * 4096),
        "{lines} lines in service after the kill: none of the sizes set"
    );
    let mut c = client(&dir);
    let mut buf = vec![0u8; 4096];
    for index in 0..blocks {
        let seq = durable[index as usize];
        if seq == 0 {
            continue;
        }
        c.read(index * 4096, &mut buf).unwrap();
        let got_index = u64::from_le_bytes(buf[..8].try_into().unwrap());
        let got_seq = u64::from_le_bytes(buf[8..16].try_into().unwrap());
        assert_eq!(got_index, index, "block {index} holds another block's data");
        assert!(
            got_seq >= seq,
            "block {index}: flushed write {seq} lost (found {got_seq})"
        );
    }
    drop(c);
    assert!(server.stop().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_smaller_cache_size_at_a_restart_keeps_the_lines_that_fit() {
    let dir = temp_dir("resize-restart");
    let args = |size: &'static str| ["--backend-size", "64MiB", "--cache-size", size];
    let server = Process::serve(&dir, &args("8MiB"), ConnectOptions::default());
    let mut c = client(&dir);
    let data: Vec<u8> = (0..6u64 << 20).map(|i| (i / 4096 % 249) as u8).collect();
    c.write(0, &data, false).unwrap();
    c.flush().unwrap();
    drop(c);
    assert!(server.stop().success());
    let server = Process::serve(&dir, &args("4MiB"), ConnectOptions::default());
    let v = device(&dir);
    assert_eq!(
        (v["capacity_lines"].as_u64(), v["lines_in_service"].as_u64()),
        (Some(2048), Some(1024)),
        "{v:#}"
    );
    assert_eq!(
        v["resident_lines"].as_u64(),
        Some(1024),
        "the lines that fit stay: {v:#}"
    );
    let mut c = client(&dir);
    let mut back = vec![0u8; data.len()];
    c.read(0, &mut back).unwrap();
    assert!(back == data, "data changed across the restart");
    drop(c);
    assert!(server.stop().success());
    let _ = std::fs::remove_dir_all(&dir);
}
