//! A cache file on tmpfs outlives the server, so what
//! a SIGKILL leaves in it is what a restart serves. A copy into a mapping
//! of the file can be cut anywhere, leaving a 512-byte sector half old and
//! half new; `FileDevice` writes a mapped file with `pwrite`, which the
//! kernel stops only between pages. This kills a process in the middle of
//! large writes through a mapped `FileDevice`, again and again, and checks
//! that every sector of the file is one write's or another's, never mixed.
//! (The crash soak on /dev/shm found such a torn sector once in 634 kills of
//! the whole server; here the writes are large, so a copy is nearly always
//! in progress at the kill.)

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use iocache_device::{BlockDevice, FileDevice, OpenOptions};

const FILE_BYTES: u64 = 32 << 20;
const SECTOR_BYTES: usize = 512;
/// Set in the child: the file it writes.
const WRITER_ENV: &str = "IOCACHE_KILL_MID_WRITE_FILE";

fn open_mapped(path: &Path) -> Option<FileDevice> {
    let mut device = FileDevice::open(
        path,
        OpenOptions {
            create_size: Some(FILE_BYTES),
            ..Default::default()
        },
    )
    .ok()?;
    device.map_if_in_memory().ok()?.then_some(device)
}

/// The child: writes the whole file again and again, each pass with the
/// next byte value in every byte, and says when it has begun.
#[test]
#[ignore = "the child process of every_sector_is_whole_after_a_kill_mid_write"]
fn writer_child() {
    let Some(path) = std::env::var_os(WRITER_ENV) else {
        return;
    };
    let device = open_mapped(Path::new(&path)).expect("the parent checked that it maps");
    let mut data = vec![0u8; FILE_BYTES as usize];
    for pass in 1u64.. {
        data.fill((pass % 251) as u8 + 1);
        device.write_at(&data, 0).unwrap();
        if pass == 1 {
            println!("writing");
        }
    }
}

#[test]
fn every_sector_is_whole_after_a_kill_mid_write() {
    let path: PathBuf = Path::new("/dev/shm").join(format!("iocache-kill-mid-write-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    if open_mapped(&path).is_none() {
        eprintln!("skipped: /dev/shm is not tmpfs here (no mapped device to test)");
        let _ = std::fs::remove_file(&path);
        return;
    }
    let mut torn = Vec::new();
    for kill in 0..12u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "writer_child", "--ignored", "--nocapture"])
            .env(WRITER_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("the writer started").unwrap();
            if line.contains("writing") {
                break;
            }
        }
        // A pass of 32 MiB takes a few milliseconds: land in the middle of
        // different passes, at different points.
        std::thread::sleep(Duration::from_micros(1500 + 700 * kill));
        child.kill().unwrap();
        child.wait().unwrap();
        let file = std::fs::read(&path).unwrap();
        for (i, sector) in file.chunks(SECTOR_BYTES).enumerate() {
            if sector.iter().any(|&b| b != sector[0]) {
                torn.push((kill, i));
                break;
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    assert!(
        torn.is_empty(),
        "(kill, first torn sector) for every kill that left one: {torn:?}"
    );
}
