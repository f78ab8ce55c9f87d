//! The test kit shared by the binary's integration tests: fresh
//! directories and tool detection. Each test file includes it with
//! `mod common;` and uses what it needs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The test binary's name without cargo's hash (`serve`, `tls`, ...), so
/// that directories of different test files never meet.
fn test_binary() -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let stem = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("test");
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
        _ => stem.to_string(),
    }
}

/// `base/iocache-BINARY-NAME-PID`, removed if it exists, not created.
pub fn temp_path_in(base: &Path, name: &str) -> PathBuf {
    let dir = base.join(format!("iocache-{}-{name}-{}", test_binary(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A fresh empty directory under the system's temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = temp_path_in(&std::env::temp_dir(), name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A fresh empty directory in memory (`/dev/shm`), or under the system's
/// temporary directory where there is none.
pub fn temp_dir_in_memory(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = temp_path_in(&base, name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
