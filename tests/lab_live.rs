//! `iocache lab run` with `target = ["sim", "live"]` end to end: a 2-point
//! grid runs in the simulator and against `iocache serve` driven by fio
//! over NBD (a second of fio per point), as two shards merged; each point
//! gets a simulated and a live row with sane measurements, a rerun runs
//! nothing, the report takes both, no server outlives the run, and Ctrl-C
//! stops the server it interrupts. Skipped, with the reason printed, when fio is absent
//! (CI installs it). The errors that need no fio run everywhere.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::temp_dir_in_memory;

fn iocache(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iocache"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("iocache runs")
}

fn have_fio() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

const SPEC: &str =
    "seed = 5\nvolume_size = \"64MiB\"\n[[phase]]\nname = \"z\"\nrequests = 5000\nrate = 5000\n\
read_percent = 80\ndistribution = \"zoned:85/10:15/90\"\n";

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .chars()
            .all(|c| c.is_ascii_digit())
        {
            continue;
        }
        if let Ok(raw) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

/// A directory in memory for a live experiment: DIR/live for the live
/// target, DIR/w.toml the workload, DIR/e.toml `experiment` with `{live}`
/// replaced by DIR/live. `None` (the test skipped) without fio.
fn live_experiment(name: &str, experiment: &str) -> Option<(PathBuf, PathBuf)> {
    if !have_fio() {
        eprintln!("skipped: fio is not installed (apt-get install fio); the live target needs it");
        return None;
    }
    let dir = temp_dir_in_memory(name);
    let live = dir.join("live");
    std::fs::create_dir_all(&live).unwrap();
    std::fs::write(dir.join("w.toml"), SPEC).unwrap();
    std::fs::write(
        dir.join("e.toml"),
        experiment.replace("{live}", &live.display().to_string()),
    )
    .unwrap();
    Some((dir, live))
}

#[test]
fn a_live_grid_gets_a_row_beside_each_simulated_one_and_stops_its_servers() {
    let Some((dir, live)) = live_experiment(
        "grid",
        "target = [\"sim\", \"live\"]\n[[workload]]\nname = \"z\"\nspec = \"w.toml\"\n\
             [grid]\ncache_size = [\"8MiB\"]\npromotion = [\"always\", \"nhit:2\"]\n\
             [live]\ndir = \"{live}\"\nduration = \"1s\"\nwarmup = \"1s\"\niodepth = 4\n",
    ) else {
        return;
    };
    // Two shards (a point each, simulated and live), merged.
    for (shard, out) in [("0/2", "a.jsonl"), ("1/2", "b.jsonl")] {
        let o = iocache(&["lab", "run", "e.toml", "--shard", shard, "--out", out], &dir);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let part = std::fs::read_to_string(dir.join(out)).unwrap();
        assert_eq!(part.lines().count(), 2, "{shard}: {part}");
    }
    let o = iocache(
        &[
            "lab",
            "merge",
            "a.jsonl",
            "b.jsonl",
            "-o",
            "e.results.jsonl",
            "--csv",
            "e.csv",
        ],
        &dir,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(dir.join("e.results.jsonl")).unwrap();
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 4, "{text}");
    for point in 0..2 {
        let of = |target: &str| {
            rows.iter()
                .find(|r| r["point"] == point && r["target"] == target)
                .unwrap_or_else(|| panic!("no {target} row for point {point}: {text}"))
        };
        let (sim, live_row) = (of("sim"), of("live"));
        assert_eq!(sim["point_id"], live_row["point_id"]);
        assert_eq!(live_row["cache_lines"], 2048);
        let n = |k: &str| live_row[k].as_f64().unwrap_or_else(|| panic!("{k}: {live_row}"));
        assert!(n("read_iops") > 100.0, "{live_row}");
        assert!(n("write_iops") > 10.0, "{live_row}");
        assert!((n("iops") - n("read_iops") - n("write_iops")).abs() < 1e-6);
        assert!(n("read_mbps") > 0.0 && n("seconds") >= 0.9, "{live_row}");
        for side in ["read", "write"] {
            let p = |q: &str| n(&format!("{side}_{q}_ns"));
            assert!(p("p50") > 0.0, "{live_row}");
            assert!(p("p50") <= p("p99") && p("p99") <= p("p999") && p("p999") <= p("p9999"));
            assert!(p("p9999") < 10e9, "{live_row}");
        }
        // The server's own count: line accesses during the measured second.
        assert!(n("accesses") >= n("read_iops") * 0.5, "{live_row}");
        assert!((0.0..=1.0).contains(&n("hit_ratio")), "{live_row}");
    }
    let csv = std::fs::read_to_string(dir.join("e.csv")).unwrap();
    assert!(
        csv.lines().next().unwrap().contains("target") && csv.lines().count() == 5,
        "{csv}"
    );
    // Every server stopped, and its files are gone.
    let left = processes_mentioning(&live.display().to_string());
    assert!(left.is_empty(), "still running: {left:?}");
    assert_eq!(std::fs::read_dir(&live).unwrap().count(), 0);
    // A rerun over the merged results finds every point (simulated and live) done.
    let o = iocache(&["lab", "run", "e.toml"], &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.join("e.results.jsonl")).unwrap(),
        text
    );
    // The report takes simulated and live rows together (their columns
    // differ) and plots the live latency columns.
    let o = iocache(&["lab", "report", "e.results.jsonl"], &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(dir.join("e.results.html")).unwrap();
    assert!(page.contains("read_p99_ns") && page.contains("live"), "{page}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn live_errors_name_the_point_the_key_or_the_missing_program() {
    let dir = temp_dir_in_memory("errors");
    std::fs::write(dir.join("w.toml"), SPEC).unwrap();
    std::fs::write(dir.join("t.csv"), "0,h,0,Read,0,4096,0\n").unwrap();
    let run = |experiment: &str| {
        std::fs::write(dir.join("e.toml"), experiment).unwrap();
        let o = iocache(&["lab", "run", "e.toml"], &dir);
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let err = run("target = [\"live\"]\n[[workload]]\nname = \"t\"\ntrace = \"t.csv\"\nformat = \"msr\"\n");
    assert!(
        err.contains("live point 0") && err.contains("is a trace"),
        "{err}"
    );
    let err = run("target = [\"live\"]\n[[workload]]\nname = \"z\"\nspec = \"w.toml\"\n[live]\nfio = \"/nonexistent/fio\"\n");
    assert!(
        err.contains("needs fio") && err.contains("/nonexistent/fio"),
        "{err}"
    );
    let err = run("target = [\"live\"]\n[[workload]]\nname = \"z\"\nspec = \"w.toml\"\n[live]\nbackend_delay = \"300us\"\n");
    assert!(err.contains("e.toml: live.backend_delay"), "{err}");
    let err = run("target = [\"simulator\"]\n[[workload]]\nname = \"z\"\nspec = \"w.toml\"\n");
    assert!(err.contains("target: `simulator`"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C (SIGINT to `lab run` alone) in the middle of a live point stops
/// fio and the server, writes no row for the point and says why.
#[test]
fn an_interrupted_live_run_stops_its_server() {
    let Some((dir, live)) = live_experiment(
        "interrupt",
        "target = [\"live\"]\n[[workload]]\nname = \"z\"\nspec = \"w.toml\"\n\
             [live]\ndir = \"{live}\"\nduration = \"60s\"\nwarmup = \"0s\"\niodepth = 2\n",
    ) else {
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .args(["lab", "run", "e.toml"])
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until fio runs against the server (its job file is written).
    let started = std::time::Instant::now();
    let running = || {
        std::fs::read_dir(&live)
            .unwrap()
            .flatten()
            .any(|d| d.path().join("measure.fio").exists())
    };
    while !running() {
        let exited = child.try_wait().unwrap().is_some();
        if exited || started.elapsed().as_secs() >= 90 {
            // Say what it was doing: the lab's messages and every log of
            // the point's work directory.
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            let mut logs = String::new();
            for work in std::fs::read_dir(&live).unwrap().flatten() {
                for file in std::fs::read_dir(work.path()).unwrap().flatten() {
                    let name = file.file_name().to_string_lossy().to_string();
                    if !(name.ends_with(".log") || name.ends_with(".err") || name.ends_with(".fio")) {
                        logs += &format!("--- {name} ({} bytes)\n", file.metadata().map_or(0, |m| m.len()));
                        continue;
                    }
                    let text = std::fs::read_to_string(file.path()).unwrap_or_default();
                    logs += &format!("--- {}:\n{text}\n", file.path().display());
                }
            }
            panic!(
                "the live point never started (lab run {} after {:?}):\n{}\n{logs}",
                if exited { "exited" } else { "still running" },
                started.elapsed(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let fio_started = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill(2) on our own child's id.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("interrupted") && stderr.contains("live point 0"),
        "{stderr}"
    );
    assert!(fio_started.elapsed().as_secs() < 50, "it ran fio to the end");
    let left = processes_mentioning(&live.display().to_string());
    assert!(left.is_empty(), "still running: {left:?}");
    assert_eq!(std::fs::read_dir(&live).unwrap().count(), 0);
    let rows = std::fs::read_to_string(dir.join("e.results.jsonl")).unwrap_or_default();
    assert!(rows.trim().is_empty(), "{rows}");
    let _ = std::fs::remove_dir_all(&dir);
}
