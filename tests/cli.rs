//! The `iocache` binary end to end: outputs, JSON schema and error messages.

use std::path::PathBuf;
use std::process::{Command, Output};

fn iocache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iocache"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("iocache runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const SAMPLE: &str = "crates/iocache-sim/data/sample.lis";

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iocache-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn sim_json_has_the_documented_fields_for_every_combination() {
    let o = iocache(&[
        "sim",
        "--trace",
        SAMPLE,
        "--policy",
        "lru,arc",
        "--cache-size",
        "256,4MiB",
        "--line-size",
        "4096",
        "--json",
        "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    assert_eq!(json["schema_version"], 1);
    assert_eq!(json["trace_records"], 20_000);
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    let fields = [
        "policy",
        "cache_lines",
        "line_size",
        "requests",
        "accesses",
        "hits",
        "hit_ratio",
        "read_accesses",
        "read_hits",
        "write_accesses",
        "write_hits",
        "byte_hit_ratio",
        "promotions",
        "evictions",
        "dirty_writebacks",
        "backend_read_bytes",
        "backend_write_bytes",
        "cache_read_bytes",
        "cache_write_bytes",
        "wall_seconds",
    ];
    for run in runs {
        for field in fields {
            assert!(run.get(field).is_some(), "run lacks `{field}`: {run}");
        }
        let (hits, accesses) = (run["hits"].as_u64().unwrap(), run["accesses"].as_u64().unwrap());
        let ratio = run["hit_ratio"].as_f64().unwrap();
        assert!((ratio - hits as f64 / accesses as f64).abs() < 1e-12);
    }
    assert_eq!(runs[1]["cache_lines"], 1024, "4MiB of 4 KiB lines");
    assert_eq!(runs[0]["policy"], "lru");
    assert_eq!(runs[2]["policy"], "arc");
}

#[test]
fn sim_prints_a_table_without_json() {
    let o = iocache(&["sim", "--trace", SAMPLE, "--policy", "arc", "--cache-size", "512"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("hit%") && out.contains("arc"), "{out}");
    assert!(
        !stderr(&o).contains('\r'),
        "no progress bar when stdout is not a terminal"
    );
}

#[test]
fn malformed_lines_are_reported_with_file_line_and_field() {
    let path = temp_file("bad.csv", "0,0,8,0,1\n1,xyz,8,0,1\n2,8,8,1,1\n");
    let p = path.to_str().unwrap();
    let o = iocache(&["sim", "--trace", p, "--format", "tencent"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("bad.csv:2") && err.contains("offset"), "{err}");
    let o = iocache(&[
        "sim",
        "--trace",
        p,
        "--format",
        "tencent",
        "--skip-bad-lines",
        "--json",
        "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("skipped 1 malformed line"), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(json["skipped_lines"], 1);
    assert_eq!(json["runs"][0]["requests"], 2);
}

#[test]
fn bad_options_name_what_is_wrong() {
    let cases: [(&[&str], &str); 6] = [
        (&["--policy", "mru"], "mru"),
        (&["--cache-size", "12parsecs"], "parsecs"),
        (&["--line-size", "3000B"], "power of two"),
        (&["--write-policy", "wz"], "wz"),
        (&["--promotion", "nhit:zero"], "nhit:zero"),
        (&["--format", "nosuch"], "nosuch"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["sim", "--trace", SAMPLE];
        args.extend_from_slice(extra);
        let o = iocache(&args);
        assert!(!o.status.success(), "{extra:?} was accepted");
        assert!(stderr(&o).contains(needle), "{extra:?}: {}", stderr(&o));
    }
    let o = iocache(&["sim", "--trace", "/nonexistent/trace.csv"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/nonexistent/trace.csv"), "{}", stderr(&o));
}

#[test]
fn trace_stats_reports_requests_footprint_and_windows() {
    let o = iocache(&["trace", "stats", SAMPLE, "--window", "5000req", "--json", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(json["requests"], 20_000);
    assert_eq!(json["read_requests"], 20_000);
    assert_eq!(json["window"], "5000req");
    let windows = json["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 4);
    let footprint = json["footprint_lines"].as_u64().unwrap();
    for w in windows {
        assert_eq!(w["requests"], 5000);
        assert!(w["unique_lines"].as_u64().unwrap() <= footprint);
    }
}

#[test]
fn an_empty_trace_is_an_error() {
    let path = temp_file("empty.lis", "\n");
    let o = iocache(&["sim", "--trace", path.to_str().unwrap(), "--format", "arc"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no data requests"), "{}", stderr(&o));
}

#[test]
fn timing_reports_latency_and_writes_a_series() {
    let dir = std::env::temp_dir().join(format!("iocache-cli-series-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("series.csv");
    let o = iocache(&[
        "sim",
        "--trace",
        SAMPLE,
        "--policy",
        "lru,arc",
        "--cache-size",
        "1024",
        "--cache-device",
        "optane",
        "--backend-device",
        "hdd",
        "--closed-loop",
        "4",
        "--series-interval",
        "100ms",
        "--series",
        csv.to_str().unwrap(),
        "--json",
        "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for run in json["runs"].as_array().unwrap() {
        let t = &run["timing"];
        assert_eq!(t["requests"], 20_000, "{t}");
        assert!(t["iops"].as_f64().unwrap() > 0.0);
        let read = &t["read"];
        assert!(read["p99_ns"].as_u64().unwrap() >= read["p50_ns"].as_u64().unwrap());
        // One HDD, four outstanding reads that mostly miss: the backend is nearly saturated.
        assert!(t["backend_device"]["utilization"].as_f64().unwrap() > 0.5, "{t}");
    }
    let series = std::fs::read_to_string(&csv).unwrap();
    let mut lines = series.lines();
    assert!(lines.next().unwrap().starts_with("policy,cache_size,start_ns"));
    assert!(lines.clone().any(|l| l.starts_with("lru,1024,")) && lines.any(|l| l.starts_with("arc,1024,")));
    // Without timing flags there is no timing block.
    let o = iocache(&["sim", "--trace", SAMPLE, "--cache-size", "64", "--json", "-"]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(json["runs"][0].get("timing").is_none());
    // Bad devices are named.
    let o = iocache(&["sim", "--trace", SAMPLE, "--cache-device", "floppy"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("floppy"), "{}", stderr(&o));
}
