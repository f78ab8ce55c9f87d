//! `iocache serve` over a backend that starts failing: an nbdkit export
//! behind nbdkit's `error` filter, switched on and off with its trigger
//! file. While the backend fails, cached data keeps being served and
//! written, requests that need the backend get EIO, dirty lines stay dirty
//! (the cleaner retries them), and the server keeps running; once the
//! backend answers again, everything acknowledged reaches it.
//! Skipped (with a message) when nbdkit is not installed.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use iocache_nbd::{Client, ConnectOptions};

mod common;
use common::{nbdkit_failing, temp_dir_with, Process};

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn stats(dir: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .args(["stats", "--json", "--admin-socket"])
        .arg(dir.join("admin.sock"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["volumes"][0].clone()
}

#[test]
fn a_failing_backend_gets_eio_loses_nothing_and_recovers() {
    let Some(dir) = temp_dir_with(&["nbdkit"], "eio") else {
        return;
    };
    let (nbdkit, backend_uri, backend_img, inject) = nbdkit_failing(&dir, 32 << 20, "");
    // 64 MiB of cache: 2 shards of 8,192 lines, so the 64 lines written
    // below (one shard's span) all fit.
    let mut command = Command::new(env!("CARGO_BIN_EXE_iocache"));
    command
        .args(["serve", "--backend", &backend_uri, "--cache"])
        .arg(dir.join("cache.img"))
        .args(["--cache-size", "64MiB", "--listen", "127.0.0.1:0", "--socket"])
        .arg(dir.join("nbd.sock"))
        .arg("--admin-socket")
        .arg(dir.join("admin.sock"))
        .args(["--write-policy", "wb", "--persistence", "dirty"])
        .args(["--flush", "aggressive:interval=5ms:batch=16"])
        // A new cache over a remote volume that exists already.
        .arg("--init");
    let mut server = Process::spawn(&mut command, &dir.join("server.log"));
    server.wait_until("iocache serve listens", || dir.join("nbd.sock").exists());
    let mut client = Client::connect_unix(&dir.join("nbd.sock"), &ConnectOptions::default()).unwrap();

    // 256 KiB written (cached, dirty) and made durable.
    let first = pattern(1, 256 << 10);
    client.write(0, &first, false).unwrap();
    client.flush().unwrap();

    // The backend fails from now on.
    std::fs::write(&inject, b"").unwrap();
    let mut buf = vec![0u8; 256 << 10];
    client.read(0, &mut buf).unwrap();
    assert!(buf == first, "cached data is served while the backend fails");
    let second = pattern(2, 64 << 10);
    client.write(64 << 10, &second, false).unwrap();
    let mut far = vec![0u8; 4096];
    let err = client
        .read(16 << 20, &mut far)
        .expect_err("a read that needs the backend fails");
    assert_eq!(err.errno(), Some(5), "EIO, got {err}");
    // Under write-back a FLUSH makes writes durable on the cache device,
    // with their metadata: it does not need the backend's writes (nbdkit's
    // error filter passes flushes through).
    client.flush().unwrap();
    // The server keeps serving, and its statistics say what happens.
    client.read(0, &mut buf[..4096]).unwrap();
    let started = Instant::now();
    loop {
        let s = stats(&dir);
        if s["backend_errors"].as_u64().unwrap() > 0 && s["failed_writebacks"].as_u64().unwrap() > 0 {
            assert!(
                s["dirty_lines"].as_u64().unwrap() > 0,
                "dirty lines stay dirty: {s}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no failed write-back reported: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The backend answers again: the cleaner drains the dirty lines, and a
    // clean stop leaves every acknowledged write on it.
    std::fs::remove_file(&inject).unwrap();
    let started = Instant::now();
    while stats(&dir)["dirty_lines"].as_u64().unwrap() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the dirty lines are not written back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    client.flush().unwrap();
    client.disconnect().unwrap();
    let status = server.stop();
    assert!(status.success(), "iocache serve exited with {status}");
    drop(nbdkit);
    let on_backend = std::fs::read(&backend_img).unwrap();
    let mut expected = first;
    expected[64 << 10..128 << 10].copy_from_slice(&second);
    assert!(
        on_backend[..256 << 10] == expected[..],
        "the backend holds every acknowledged write"
    );
}
