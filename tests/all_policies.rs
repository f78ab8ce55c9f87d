//! Every registered replacement policy runs on every published sample trace
//! (when `../shared/traces` is present), under write-back and write-buffer
//! mode, and agrees with the others on what the trace contains.

use std::path::{Path, PathBuf};

mod common;
use common::iocache;

fn policy_names() -> Vec<String> {
    let out = iocache(&["policies"]);
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn samples() -> Option<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    assert!(
        dir.is_dir(),
        "{} went away since this crate was built",
        dir.display()
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md"))
        // P2 is large; its own test covers it.
        .filter(|p| !p.to_string_lossy().contains("arc-P2"))
        .collect();
    files.sort();
    Some(files)
}

#[test]
#[cfg_attr(
    not(shared_traces),
    ignore = "needs ../shared/traces beside the repository (absent when this crate was built; scripts/get-traces.sh fetches it)"
)]
fn every_policy_runs_on_every_sample() {
    let names = policy_names();
    assert!(
        names.iter().any(|n| n == "lru") && names.iter().any(|n| n == "arc"),
        "{names:?}"
    );
    let Some(traces) = samples() else { return };
    assert!(traces.len() >= 6, "{traces:?}");
    let policies = names.join(",");
    for trace in &traces {
        for wp in ["wb", "wo"] {
            let t = trace.to_str().unwrap();
            let out = iocache(&[
                "sim",
                "--trace",
                t,
                "--policy",
                &policies,
                "--cache-size",
                "256,4096",
                "--write-policy",
                wp,
                "--json",
                "-",
            ]);
            assert!(
                out.status.success(),
                "{t} {wp}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let runs = json["runs"].as_array().unwrap();
            assert_eq!(runs.len(), names.len() * 2);
            let accesses = runs[0]["accesses"].as_u64().unwrap();
            assert!(accesses > 0, "{t}");
            for run in runs {
                let policy = run["policy"].as_str().unwrap();
                assert_eq!(run["accesses"].as_u64().unwrap(), accesses, "{t} {policy}");
                let ratio = run["hit_ratio"].as_f64().unwrap();
                assert!((0.0..=1.0).contains(&ratio), "{t} {policy}: {ratio}");
                let lines = run["cache_lines"].as_u64().unwrap();
                assert!(
                    run["resident_lines_at_end"].as_u64().unwrap() <= lines,
                    "{t} {policy}"
                );
                // Every eviction batch evicts at least one line.
                assert!(
                    run["evictions"].as_u64().unwrap() >= run["eviction_batches"].as_u64().unwrap(),
                    "{t} {policy}"
                );
            }
        }
    }
}
