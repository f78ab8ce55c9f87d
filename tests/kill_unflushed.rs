//! A killed server loses nothing older than the commit interval: writers
//! that never flush (our client, nbdcopy without `--flush`) are cut off by
//! SIGKILL, the server is started again on the same files, and every write
//! acknowledged more than the interval (plus a margin for a loaded machine)
//! before the kill must read back intact.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{client, nbd_uri, scrambled_file, temp_dir, temp_dir_with, Process};

const BLOCK: u64 = 4096;
const VOLUME: u64 = 64 << 20;
/// The default commit interval, and what a loaded machine may add to it
/// (the barrier itself, the cleaner's round, scheduling).
const INTERVAL: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(1500);

fn serve(dir: &Path, init: bool) -> Process {
    let mut args = vec!["--backend-size", "64MiB"];
    if init {
        args.push("--init");
    }
    Process::serve_write_back(dir, &args)
}

/// What block `block` holds after write `round`: every 8 bytes name both.
fn content(block: u64, round: u64) -> Vec<u8> {
    let word = (round << 40 | block).to_le_bytes();
    word.iter().copied().cycle().take(BLOCK as usize).collect()
}

#[test]
fn writes_acknowledged_an_interval_before_a_kill_survive_it() {
    let blocks = VOLUME / BLOCK;
    for round in 1..=3u64 {
        let dir = temp_dir(&format!("kill-{round}"));
        let server = serve(&dir, true);
        // Blocks in a scrambled order, each written once, none flushed.
        let acked: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (acked, stop, mut c) = (Arc::clone(&acked), Arc::clone(&stop), client(&dir));
            std::thread::spawn(move || {
                for i in 0..blocks {
                    let block = (i * 7919 + round * 31) % blocks;
                    if stop.load(Ordering::Relaxed)
                        || c.write(block * BLOCK, &content(block, round), false).is_err()
                    {
                        return;
                    }
                    acked.lock().unwrap().push((block, Instant::now()));
                    // A steady writer, not a burst: acknowledgements spread
                    // over the seconds before the kill.
                    if i % 64 == 63 {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(2500 + 500 * round));
        let killed = Instant::now();
        server.kill();
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        let acked = acked.lock().unwrap().clone();
        let old: Vec<u64> = acked
            .iter()
            .filter(|(_, at)| *at + INTERVAL + MARGIN < killed)
            .map(|(b, _)| *b)
            .collect();
        assert!(old.len() > 100, "round {round}: only {} old writes", old.len());

        let server = serve(&dir, false);
        let mut c = client(&dir);
        let mut buf = vec![0u8; BLOCK as usize];
        let mut lost = Vec::new();
        for &block in &old {
            c.read(block * BLOCK, &mut buf).unwrap();
            if buf != content(block, round) {
                lost.push(block);
            }
        }
        assert!(
            lost.is_empty(),
            "round {round}: {} of {} writes acknowledged over {:?} before the kill were lost (first: block {})\n{}",
            lost.len(),
            old.len(),
            INTERVAL + MARGIN,
            lost[0],
            std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
        );
        // Nothing appears where nothing was written, and what was written
        // later is there whole or not at all.
        for block in (0..blocks).step_by(61) {
            c.read(block * BLOCK, &mut buf).unwrap();
            assert!(
                buf.iter().all(|&b| b == 0) || buf == content(block, round),
                "round {round}: block {block} holds something never written there"
            );
        }
        drop(c);
        assert!(server.stop().success());
    }
}

#[test]
fn nbdcopy_without_flush_survives_a_kill_after_the_interval() {
    let Some(dir) = temp_dir_with(&["nbdcopy"], "kill-nbdcopy") else {
        return;
    };
    let source = dir.join("source.bin");
    let data = scrambled_file(&source, 32 << 20, 11);
    let server = serve(&dir, true);
    let uri = nbd_uri(&dir);
    let out = std::process::Command::new("nbdcopy")
        .arg(&source)
        .arg(&uri)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(INTERVAL + MARGIN);
    server.kill();
    let server = serve(&dir, false);
    let mut c = client(&dir);
    let mut got = vec![0u8; data.len()];
    for (i, chunk) in got.chunks_mut(4 << 20).enumerate() {
        c.read((i as u64) << 22, chunk).unwrap();
    }
    assert!(got == data, "the copy did not survive the kill");
    drop(c);
    assert!(server.stop().success());
}
