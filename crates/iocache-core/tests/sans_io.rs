//! The core's first invariant, checked on its source: no I/O, no threads, no clock.
//! (A decision that read the time or touched a file could differ between the
//! simulator and the engine; this keeps such a dependency from creeping in.)

use std::path::Path;

const FORBIDDEN: [&str; 10] = [
    "std::fs",
    "std::net",
    "std::io",
    "std::thread",
    "std::time",
    "std::process",
    "std::env",
    "Instant::",
    "SystemTime",
    "std::sync",
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_core_uses_no_io_threads_or_clock() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 5, "found the core's sources");
    let mut offences = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for word in FORBIDDEN {
                if line.contains(word) {
                    offences.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "the core must not do I/O, threads or time:\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_core_depends_on_nothing_that_does() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap_or("");
    let names: Vec<&str> = deps
        .lines()
        .filter_map(|l| l.split(['=', '.']).next())
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.starts_with('#'))
        .collect();
    assert_eq!(
        names,
        vec!["thiserror"],
        "new core dependency: check it does no I/O, then update this test"
    );
}
