//! The block commands around reads and writes, through a served export:
//! TRIM drops dirty lines and frees the backend's blocks (or keeps them, per
//! `--discard`), WRITE_ZEROES zeroes without zero buffers, real clients
//! (qemu-io, fstrim on ext4 over nbdfuse) see what they expect.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{
    client, nbd_uri, nbdkit_file, root_and_installed, sparse_file, temp_dir, temp_dir_with, Process, TestDir,
};
use iocache_nbd::ConnectOptions;

const MIB: u64 = 1 << 20;

/// KiB the file takes on its file system.
fn allocated_kib(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() / 2
}

/// A 256 MiB sparse backend with 64 MiB of data written directly at its start.
fn backend(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("backend.img");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(256 * MIB).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&vec![0x5a; (64 * MIB) as usize], 0).unwrap();
    file.sync_all().unwrap();
    path
}

fn serve(dir: &Path, extra: &[&str]) -> Process {
    Process::serve_write_back(dir, &[&["--init"], extra].concat())
}

/// A test's directory (when every tool in `tools` is installed), its
/// [`backend`], and a server of it with `extra`.
fn backend_served(
    tools: &[&str],
    name: &str,
    extra: &[&str],
) -> Option<(TestDir, std::path::PathBuf, Process)> {
    let dir = temp_dir_with(tools, name)?;
    let path = backend(&dir);
    let server = serve(&dir, extra);
    Some((dir, path, server))
}

/// The reproduction: 64 MiB more written through the cache (dirty), a
/// FLUSH, then all 128 MiB trimmed and the server stopped.
fn write_flush_trim(dir: &Path) {
    let mut c = client(dir);
    let data = vec![0xa5u8; (4 * MIB) as usize];
    for i in 0..16 {
        c.write(64 * MIB + i * 4 * MIB, &data, false).unwrap();
    }
    c.flush().unwrap();
    c.trim(0, 128 * MIB).unwrap();
    c.flush().unwrap();
}

#[test]
fn a_trim_passed_down_frees_the_backend_and_writes_nothing_back() {
    let dir = temp_dir("trim-passdown");
    let path = backend(&dir);
    let kib = allocated_kib(&path);
    assert!((64 * 1024..65 * 1024).contains(&kib), "{kib} KiB");
    let server = serve(&dir, &[]);
    write_flush_trim(&dir);
    let mut c = client(&dir);
    let mut buf = vec![0u8; MIB as usize];
    c.read(64 * MIB, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0),
        "a trimmed range passed down reads as the hole"
    );
    drop(c);
    assert!(server.stop().success());
    // Before: the trimmed dirty data was written back and nothing punched
    // (131,072 KiB allocated).
    let kib = allocated_kib(&path);
    assert!(kib < 1024, "{kib} KiB still allocated after trimming all of it");
}

#[test]
fn a_trim_kept_in_the_cache_drops_dirty_lines_and_leaves_the_backend() {
    let (dir, path, server) = backend_served(&[], "trim-cache", &["--discard", "cache"]).unwrap();
    write_flush_trim(&dir);
    let mut c = client(&dir);
    let mut buf = vec![0u8; MIB as usize];
    c.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a), "the backend keeps its data");
    drop(c);
    assert!(server.stop().success());
    let kib = allocated_kib(&path);
    assert!(
        (64 * 1024..65 * 1024).contains(&kib),
        "the dropped dirty lines are not written back: {kib} KiB"
    );
    let written = std::fs::read(&path).unwrap();
    assert!(written[(64 * MIB) as usize..(128 * MIB) as usize]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn an_ignored_trim_changes_nothing() {
    let (dir, path, server) = backend_served(&[], "trim-ignore", &["--discard", "ignore"]).unwrap();
    write_flush_trim(&dir);
    assert!(server.stop().success());
    // File systems may add a block or two of their own (extent trees).
    let kib = allocated_kib(&path);
    assert!(
        (128 * 1024..129 * 1024).contains(&kib),
        "the dirty data is written back at the stop: {kib} KiB"
    );
}

#[test]
fn write_zeroes_through_qemu_io_reads_back_as_zeroes() {
    let Some((dir, path, server)) = backend_served(&["qemu-io"], "zeroes", &[]) else {
        return;
    };
    let uri = nbd_uri(&dir);
    // Dirty data, then zeroes over most of it (unaligned ends), with and
    // without leaving holes, then every byte checked.
    let out = Command::new("qemu-io")
        .args(["-f", "raw", &uri])
        .args(["-c", "write -P 0x33 0 32M"])
        .args(["-c", "write -z 4608 16M"])
        .args(["-c", "write -z -u 20M 4M"])
        .args(["-c", "read -P 0x33 0 4608"])
        .args(["-c", "read -P 0 4608 16M"])
        .args(["-c", "read -P 0x33 16781824 4189696"])
        .args(["-c", "read -P 0 20M 4M"])
        .args(["-c", "read -P 0x33 24M 8M"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !text.contains("Pattern verification failed"),
        "{text}"
    );
    let (ok, stats) = common::ctl(&dir, &["stats", "--json"]);
    assert!(ok, "{stats}");
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let zeroings = &stats["volumes"][0]["zeroings"];
    assert_eq!(zeroings, 2, "{stats:#}");
    assert!(server.stop().success());
    let data = std::fs::read(&path).unwrap();
    assert!(data[4608..4608 + (16 * MIB) as usize].iter().all(|&b| b == 0));
    assert!(data[..4608].iter().all(|&b| b == 0x33));
    assert!(data[(20 * MIB) as usize..(24 * MIB) as usize]
        .iter()
        .all(|&b| b == 0));
    assert!(data[(24 * MIB) as usize..(32 * MIB) as usize]
        .iter()
        .all(|&b| b == 0x33));
}

#[test]
fn fstrim_on_ext4_over_nbdfuse_frees_backend_blocks() {
    if !root_and_installed(&["nbdfuse", "mkfs.ext4", "fstrim"]) {
        return;
    }
    let dir = temp_dir("fstrim");
    let path = dir.join("backend.img");
    sparse_file(&path, 256 * MIB);
    let server = serve(&dir, &[]);
    let fuse = common::FuseDisk::mount(&dir);
    let (disk, mnt) = (&fuse.disk, dir.join("mnt"));
    std::fs::create_dir_all(&mnt).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {text}");
        text
    };
    let (disk_s, mnt_s) = (disk.to_str().unwrap(), mnt.to_str().unwrap());
    run(&["mkfs.ext4", "-q", "-F", "-E", "nodiscard", disk_s]);
    run(&["mount", "-o", "loop", disk_s, mnt_s]);
    let file = mnt.join("big");
    std::fs::write(&file, vec![0x77u8; (96 * MIB) as usize]).unwrap();
    run(&["sync"]);
    std::fs::remove_file(&file).unwrap();
    run(&["sync"]);
    let trimmed = run(&["fstrim", "-v", mnt_s]);
    run(&["umount", mnt_s]);
    drop(fuse);
    assert!(server.stop().success());
    // Without the trim the stop writes the file's 96 MiB back.
    let after = allocated_kib(&path);
    assert!(
        after < 32 * 1024,
        "fstrim ({}) freed too little: {after} KiB allocated after the stop",
        trimmed.trim()
    );
}

/// The number `key` of the first volume in `iocache stats --json`.
fn stat(dir: &Path, key: &str) -> u64 {
    let (ok, text) = common::ctl(dir, &["stats", "--json"]);
    assert!(ok, "{text}");
    let stats: serde_json::Value = serde_json::from_str(&text).unwrap();
    stats["volumes"][0][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no `{key}` in {stats:#}"))
}

#[test]
fn nbd_cache_and_ctl_warm_read_a_range_into_the_cache() {
    let dir = temp_dir("warm");
    backend(&dir);
    let server = serve(&dir, &[]);
    let mut c = client(&dir);
    assert_ne!(
        c.transmission_flags() & iocache_nbd::proto::NBD_FLAG_SEND_CACHE,
        0
    );
    // NBD_CMD_CACHE of 8 MiB: 2,048 lines come in, no data comes back.
    c.raw_request(iocache_nbd::proto::NBD_CMD_CACHE, 0, 0, 8 << 20, &[], None)
        .unwrap();
    assert_eq!(stat(&dir, "resident_lines"), 2048);
    assert_eq!(stat(&dir, "read_requests"), 0, "not counted as a client's read");
    // An operator warms the next 56 MiB in the background.
    let (ok, out) = common::ctl(
        &dir,
        &["warm", "iocache", "--offset", "8MiB", "--length", "56MiB"],
    );
    assert!(ok && out.contains("56MiB at 8388608"), "{out}");
    let started = Instant::now();
    while stat(&dir, "warmed_bytes") < 64 * MIB {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the warm-up did not finish"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stat(&dir, "warm_requested_bytes"), 64 * MIB);
    assert_eq!(stat(&dir, "resident_lines"), 16384);
    // The warmed range is served from the cache.
    let mut buf = vec![0u8; MIB as usize];
    c.read(32 * MIB, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a));
    assert_eq!(stat(&dir, "full_misses"), 0);
    let (ok, out) = common::ctl(&dir, &["warm", "iocache", "--offset", "1GiB"]);
    assert!(!ok && out.contains("past its end"), "{out}");
    drop(c);
    assert!(server.stop().success());
}

#[test]
fn copies_skip_the_backend_s_holes_but_not_dirty_data_in_them() {
    // The backend: 256 MiB, data in the first 64 MiB.
    let Some((dir, path, server)) = backend_served(&["nbdcopy", "nbdinfo"], "block-status", &[]) else {
        return;
    };
    // Dirty data in a hole of the backend: only the cache has it.
    let mut c = client(&dir);
    c.write(200 * MIB, &vec![0x77u8; MIB as usize], false).unwrap();
    drop(c);
    let uri = nbd_uri(&dir);
    let map = Command::new("nbdinfo").args(["--map", &uri]).output().unwrap();
    let map = String::from_utf8_lossy(&map.stdout).to_string();
    assert!(map.contains("hole"), "holes reported:\n{map}");
    let out = dir.join("copy.img");
    let copy = Command::new("nbdcopy").arg(&uri).arg(&out).output().unwrap();
    assert!(copy.status.success(), "{}", String::from_utf8_lossy(&copy.stderr));
    assert!(server.stop().success());
    let copied = std::fs::read(&out).unwrap();
    let mut want = std::fs::read(&path).unwrap();
    assert_eq!(want.len(), copied.len());
    assert!(
        want[(200 * MIB) as usize..(201 * MIB) as usize]
            .iter()
            .all(|&b| b == 0x77),
        "written back"
    );
    // The copy has the dirty data the backend lacked when it was made.
    want.truncate(copied.len());
    assert!(copied == want, "the copy differs from the volume");
    let kib = allocated_kib(&out);
    assert!(
        kib < 80 * 1024,
        "the holes were read and written: {kib} KiB allocated in the copy"
    );
}

#[test]
fn an_nbd_backend_s_holes_are_reported_too() {
    let Some(dir) = temp_dir_with(&["nbdkit", "nbdinfo"], "nbd-holes") else {
        return;
    };
    backend(&dir); // 256 MiB, data in the first 64 MiB
    let (kit, backend_uri) = nbdkit_file(&dir, &dir.join("backend.img"), &[], &[]);
    let server = Process::serve(
        &dir,
        &[
            "--init",
            "--backend",
            &backend_uri,
            "--cache",
            "cache.img",
            "--cache-size",
            "32MiB",
        ],
        ConnectOptions::export(String::new()),
    );
    let uri = nbd_uri(&dir);
    let map = Command::new("nbdinfo").args(["--map", &uri]).output().unwrap();
    let map = String::from_utf8_lossy(&map.stdout).to_string();
    let lines: Vec<&str> = map.lines().collect();
    assert!(
        lines.len() == 2 && lines[0].contains("data") && lines[1].contains("hole"),
        "64 MiB of data, then a hole:\n{map}"
    );
    assert!(lines[1].trim_start().starts_with("67108864"), "{map}");
    assert!(server.stop().success());
    drop(kit);
}

#[test]
fn fio_trims_through_its_nbd_engine() {
    let Some((dir, path, server)) = backend_served(&["fio"], "fio-trim", &[]) else {
        return;
    };
    let mut c = client(&dir);
    c.write(64 * MIB, &vec![0xa5u8; (16 * MIB) as usize], false)
        .unwrap();
    drop(c);
    let uri = nbd_uri(&dir);
    let out = Command::new("fio")
        .args([
            "--name=trim",
            "--ioengine=nbd",
            "--rw=trim",
            "--bs=1M",
            "--size=128M",
        ])
        .arg(format!("--uri={uri}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        stat(&dir, "dropped_dirty_lines"),
        4096,
        "the 16 MiB written were dropped unwritten"
    );
    assert!(stat(&dir, "discards") >= 128);
    assert!(server.stop().success());
    let kib = allocated_kib(&path);
    assert!(kib < 1024, "{kib} KiB still allocated");
}
