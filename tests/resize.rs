//! A cache resized while it serves (`ctl set cache_size=`), with real
//! clients: fio verifies every block while the cache grows and shrinks
//! under it; a growth keeps every line and a shrink keeps the ones that
//! fit; a `kill -9` in the middle of resizing loses no flushed write (nor
//! one older than the commit interval), and the restart finds one of the
//! sizes set; sizes out of range are refused.

use std::path::Path;
use std::time::Duration;

use iocache_nbd::ConnectOptions;

mod common;
use common::{
    check_flushed, client, ctl, fio_verify_while_setting, stats_json, temp_dir, temp_dir_with,
    write_flushing_then_kill, Process,
};

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

const SIZES: [&[&str]; 6] = [
    &["cache_size=16MiB"],
    &["cache_size=2MiB"],
    &["cache_size=12MiB"],
    &["cache_size=4MiB"],
    &["cache_size=16MiB"],
    &["cache_size=8MiB"],
];

/// The bytes of a change of `SIZES`.
fn bytes_of(change: &[&str]) -> u64 {
    iocache_core::units::parse_byte_size(change[0].trim_start_matches("cache_size=")).unwrap()
}

fn device(dir: &Path) -> serde_json::Value {
    stats_json(dir)["volumes"][0].clone()
}

/// How often a size of `SIZES` is set.
const PAUSE: Duration = Duration::from_millis(30);

#[test]
fn fio_verifies_while_the_cache_grows_and_shrinks() {
    let Some(dir) = temp_dir_with(&["fio"], "resize-fio") else {
        return;
    };
    let server = start(&dir);
    let (passed, text, set) = fio_verify_while_setting(&dir, "24M", &SIZES, PAUSE);
    assert!(passed, "{text}");
    assert!(set >= SIZES.len(), "only {set} resizes while fio ran");
    let last = SIZES[(set - 1) % SIZES.len()];
    let d = device(&dir);
    assert_eq!(
        d["lines_in_service"].as_u64().unwrap() * 4096,
        bytes_of(last),
        "{d:#}"
    );
    assert!(server.stop().success());
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
    let log = server.stop_logged();
    assert!(log.contains("set cache_size=2MiB"), "the change is logged: {log}");
}

#[test]
fn kill_9_while_resizing_loses_no_flushed_write() {
    let dir = temp_dir("resize-kill");
    let server = start(&dir);
    let blocks = 6144u64; // 24 MiB of the 64 MiB volume: more than the cache
    let time = Duration::from_millis(4000);
    // Crash while the resizer is still at work.
    let (written, killed_at) = write_flushing_then_kill(&dir, server, blocks, time, &SIZES, PAUSE);
    let server = start(&dir);
    let lines = device(&dir)["lines_in_service"].as_u64().unwrap();
    assert!(
        SIZES.iter().any(|s| bytes_of(s) == lines * 4096),
        "{lines} lines in service after the kill: none of the sizes set"
    );
    check_flushed(&dir, &written.flushed);
    // Unflushed writes too, once the commit interval (1 s, and a margin
    // for a loaded machine) has made them durable (docs/ops.md).
    check_flushed(
        &dir,
        &written.acknowledged_before(killed_at - Duration::from_millis(2500)),
    );
    assert!(server.stop().success());
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
}
