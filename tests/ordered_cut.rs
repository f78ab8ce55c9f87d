//! Ordered write-back under a real file system: ext4 over nbdfuse, files
//! created and rewritten with fsyncs, the server killed at random moments
//! and its cache thrown away; the backend alone must mount, pass
//! `e2fsck -fn` and hold the files synced up to some point. A few cuts
//! here; `scripts/ordered-cut-test.py --cuts 220` is the soak.

use std::process::Command;

mod common;
use common::root_and_installed;

#[test]
fn ext4_survives_losing_the_cache_at_random_moments() {
    if !root_and_installed(&["nbdfuse", "mkfs.ext4", "e2fsck", "python3"]) {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/ordered-cut-test.py");
    let out = Command::new("python3")
        .args([
            script,
            "--cuts",
            "6",
            "--max-seconds",
            "1.5",
            "--binary",
            env!("CARGO_BIN_EXE_iocache"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("6 cuts, 0 failed"), "{text}");
}
