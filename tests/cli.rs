//! The `iocache` binary end to end: outputs, JSON schema and error messages.

use std::path::PathBuf;
use std::process::{Command, Output};

mod common;
use common::{iocache, json_strings, run_ok, stderr, stdout, temp_dir};

/// Runs `iocache args`, which must succeed, and parses its stdout as JSON.
fn run_json(args: &[&str]) -> serde_json::Value {
    let o = run_ok(args);
    serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", stdout(&o)))
}

/// Runs `iocache sim --trace TRACE ARGS`, which must succeed.
fn sim_ok(trace: &str, args: &[&str]) -> Output {
    run_ok(&[&["sim", "--trace", trace], args].concat())
}

/// Runs `iocache sim --trace TRACE ARGS --json -`, which must succeed, and
/// parses its stdout as JSON.
fn sim_json(trace: &str, args: &[&str]) -> serde_json::Value {
    run_json(&[&["sim", "--trace", trace], args, &["--json", "-"]].concat())
}

/// Runs `iocache trace mrc TRACE ARGS --json -`, which must succeed, and
/// parses its stdout as JSON.
fn mrc_json(trace: &str, args: &[&str]) -> serde_json::Value {
    run_json(&[&["trace", "mrc", trace], args, &["--json", "-"]].concat())
}

/// Runs `iocache args`, which must fail with an error saying each of `said`.
fn fails_saying(args: &[&str], said: &[&str]) -> Output {
    let o = iocache(args);
    assert!(!o.status.success(), "{args:?} succeeded");
    for s in said {
        assert!(
            stderr(&o).contains(s),
            "{args:?}: the error does not say {s:?}: {}",
            stderr(&o)
        );
    }
    o
}

const SAMPLE: &str = "crates/iocache-sim/data/sample.lis";

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iocache-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// An output that is not a regular file (`/dev/null`) is written, not
/// truncated (truncating a character device fails).
#[test]
fn outputs_may_be_dev_null() {
    use std::os::unix::fs::FileTypeExt;
    for args in [
        &[
            "sim",
            "--trace",
            SAMPLE,
            "--cache-size",
            "256",
            "--json",
            "/dev/null",
        ][..],
        &["trace", "mrc", SAMPLE, "--json", "/dev/null"][..],
    ] {
        let o = iocache(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn sim_json_has_the_documented_fields_for_every_combination() {
    let json = sim_json(
        SAMPLE,
        &[
            "--policy",
            "lru,arc",
            "--cache-size",
            "256,4MiB",
            "--line-size",
            "4KiB",
        ],
    );
    assert_eq!(json["schema_version"], 2);
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
    let o = sim_ok(SAMPLE, &["--policy", "arc", "--cache-size", "512"]);
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
    assert!(err.contains("add --skip-bad-lines"), "{err}");
    let o = sim_ok(p, &["--format", "tencent", "--skip-bad-lines", "--json", "-"]);
    assert!(stderr(&o).contains("1 malformed line skipped"), "{}", stderr(&o));
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
    fails_saying(
        &["sim", "--trace", "/nonexistent/trace.csv"],
        &["/nonexistent/trace.csv"],
    );
}

#[test]
fn trace_stats_reports_requests_footprint_and_windows() {
    let json = run_json(&["trace", "stats", SAMPLE, "--window", "5000req", "--json", "-"]);
    assert_eq!(json["requests"], 20_000);
    assert_eq!(json["read_requests"], 20_000);
    assert_eq!(json["window"], "5000req");
    let windows = json["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 4);
    let footprint = json["footprint_lines"].as_u64().unwrap();
    for w in windows {
        assert_eq!(w["requests"], 5000);
        assert!(w["unique_lines"].as_u64().unwrap() <= footprint);
        assert!(w["cumulative_lines"].as_u64().unwrap() >= w["unique_lines"].as_u64().unwrap());
    }
    // The cumulative curve never falls and ends at the footprint.
    let cumulative: Vec<u64> = windows
        .iter()
        .map(|w| w["cumulative_lines"].as_u64().unwrap())
        .collect();
    assert!(cumulative.windows(2).all(|p| p[0] <= p[1]), "{cumulative:?}");
    assert_eq!(*cumulative.last().unwrap(), footprint);
}

#[test]
fn an_empty_trace_is_an_error() {
    let path = temp_file("empty.lis", "\n");
    fails_saying(
        &["sim", "--trace", path.to_str().unwrap(), "--format", "arc"],
        &["no data requests"],
    );
}

/// A timed simulation of a 1024-line cache on an Optane device before one
/// HDD: the set-up of the timing tests below.
const TIMED_OPTANE_OVER_HDD: [&str; 6] = [
    "--cache-size",
    "1024",
    "--cache-device",
    "optane",
    "--backend-device",
    "hdd",
];

#[test]
fn timing_reports_latency_and_writes_a_series() {
    let dir = temp_dir("series");
    let csv = dir.join("series.csv");
    let json = sim_json(
        SAMPLE,
        &[
            &["--policy", "lru,arc"][..],
            &TIMED_OPTANE_OVER_HDD,
            &[
                "--closed-loop",
                "4",
                "--series-interval",
                "100ms",
                "--series",
                csv.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
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
    let json = sim_json(SAMPLE, &["--cache-size", "64"]);
    assert!(json["runs"][0].get("timing").is_none());
    // Bad devices are named.
    fails_saying(
        &["sim", "--trace", SAMPLE, "--cache-device", "floppy"],
        &["floppy"],
    );
}

/// `--clients N`: trace times, at most N outstanding. Replayed 1000× faster,
/// the sample queues at the one disk open loop; with one client no request
/// waits behind another, so its worst latency is far below the open loop's.
#[test]
fn clients_bound_what_is_outstanding_at_trace_time() {
    let args = |extra: &[&'static str]| -> Vec<&'static str> {
        [&TIMED_OPTANE_OVER_HDD[..], &["--speed", "1000"], extra].concat()
    };
    let open = sim_json(SAMPLE, &args(&[]));
    let one = sim_json(SAMPLE, &args(&["--clients", "1"]));
    let max = |j: &serde_json::Value| j["runs"][0]["timing"]["read"]["max_ns"].as_u64().unwrap();
    assert_eq!(one["runs"][0]["timing"]["requests"], 20_000);
    assert!(max(&one) * 10 < max(&open), "{} vs {}", max(&one), max(&open));
    fails_saying(&["sim", "--trace", SAMPLE, "--clients", "0"], &["outstanding"]);
    fails_saying(
        &["sim", "--trace", SAMPLE, "--clients", "2", "--closed-loop", "2"],
        &["--closed-loop"],
    );
}

/// Runs `iocache args` with `input` on its stdin.
fn iocache_with_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("iocache runs");
    // The command may refuse before reading its input (a closed pipe).
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

#[test]
fn sizes_take_one_grammar_and_a_bare_number_is_a_line_count_only_in_sim() {
    // A bare --cache-size is lines in sim; a size with a unit is bytes.
    let json = sim_json(SAMPLE, &["--cache-size", "64,1.5MiB"]);
    assert_eq!(json["runs"][0]["cache_lines"], 64, "{json}");
    assert_eq!(json["runs"][1]["cache_lines"], 384, "{json}");
    // A line size without a unit is refused, saying how to write it.
    fails_saying(
        &["sim", "--trace", SAMPLE, "--line-size", "4096"],
        &["4096B for bytes or 4KiB"],
    );
    // KB/MB are refused, naming the 1024-based spelling.
    fails_saying(
        &["sim", "--trace", SAMPLE, "--cache-size", "2MB"],
        &["ambiguous", "2MiB"],
    );
    let help = stdout(&iocache(&["sim", "--help"]));
    assert!(help.contains("a bare number is a line count"), "{help}");
    let help = stdout(&iocache(&["serve", "--help"]));
    assert!(help.contains("powers of 1024"), "{help}");
}

#[test]
fn errors_say_each_cause_once_and_the_way_out() {
    let o = iocache(&["sim", "--trace", "no/such/trace.csv"]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert!(err.contains("no/such/trace.csv"), "{err}");

    // A compressed trace cut short: how far it got, and the file.
    let sample = std::fs::read(SAMPLE).unwrap();
    let mut packed = zstd_compress(&sample);
    packed.truncate(packed.len() / 2);
    let cut = temp_file("cut.lis.zst", "");
    std::fs::write(&cut, packed).unwrap();
    let o = iocache(&["sim", "--trace", cut.to_str().unwrap(), "--format", "arc"]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("cut.lis.zst: truncated after "), "{err}");
    assert_eq!(err.matches("incomplete frame").count(), 1, "{err}");

    // The wrong --format: the detected one is suggested.
    let msr = temp_file(
        "msr.csv",
        "128166372003061629,hm,0,Read,383726592,4096,1\n128166372016382155,hm,0,Write,3041245184,4096,1\n",
    );
    fails_saying(
        &["sim", "--trace", msr.to_str().unwrap(), "--format", "systor"],
        &["try --format msr"],
    );

    // --json into a directory that does not exist fails before the run.
    let o = fails_saying(
        &["sim", "--trace", SAMPLE, "--json", "/no/such/dir/out.json"],
        &["--json /no/such/dir/out.json"],
    );
    assert!(!stdout(&o).contains("hit%"), "the run went ahead: {}", stdout(&o));

    // stats and ctl with no server say so and name the socket.
    for command in [
        &["stats", "--admin-socket", "/no/such/admin.sock"][..],
        &["ctl", "--admin-socket", "/no/such/admin.sock", "get"],
    ] {
        let o = iocache(command);
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains("no iocache server is running") && err.contains("/no/such/admin.sock"),
            "{err}"
        );
    }
}

fn zstd_compress(data: &[u8]) -> Vec<u8> {
    // The binary's own dependency tree has zstd; the test shells out to the
    // command to stay independent of it.
    let dir = temp_dir("zstd");
    let plain = dir.join("in");
    std::fs::write(&plain, data).unwrap();
    let out = Command::new("zstd").args(["-q", "-f", "-c"]).arg(&plain).output();
    match out {
        Ok(o) if o.status.success() => o.stdout,
        _ => panic!("the zstd command is needed (scripts/test.sh installs it)"),
    }
}

#[test]
fn a_trace_on_stdin_and_the_warmup_fraction_it_cannot_give() {
    let sample = std::fs::read(SAMPLE).unwrap();
    let o = iocache_with_stdin(
        &["sim", "--trace", "-", "--format", "arc", "--json", "-"],
        &sample,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let piped: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let from_file = sim_json(SAMPLE, &[]);
    assert_eq!(piped["runs"][0]["hits"], from_file["runs"][0]["hits"]);
    assert_eq!(piped["trace"], "stdin");
    let o = iocache_with_stdin(&["sim", "--trace", "-", "--warmup", "0.2"], &sample);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("request count"), "{}", stderr(&o));
}

#[test]
fn counts_read_as_english() {
    let one = temp_file("one.lis", "0 8 0 1\n");
    let o = sim_ok(one.to_str().unwrap(), &["--format", "arc", "--threads", "1"]);
    let out = stdout(&o);
    assert!(out.contains(": 1 request, 0 warmup, 1 run on 1 thread"), "{out}");
    let o = iocache(&[
        "sim",
        "--trace",
        one.to_str().unwrap(),
        "--format",
        "arc",
        "--skip-bad-lines",
        "--threads",
        "1",
    ]);
    assert!(
        stdout(&o).contains("1 request, 0 malformed lines skipped"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn log_levels_completions_and_man_pages() {
    // -q keeps warnings, drops info; each line has a UTC timestamp.
    let o = run_ok(&["-q", "sim", "--trace", SAMPLE, "--warmup", "1000000"]);
    let err = stderr(&o);
    let warning = err
        .lines()
        .find(|l| l.contains("covers the whole trace"))
        .expect("the warning");
    assert!(warning.contains(" WARN "), "{warning}");
    assert!(
        warning.len() > 24 && warning.as_bytes()[10] == b'T' && warning[..24].ends_with('Z'),
        "{warning}"
    );
    let o = iocache(&["-qq", "sim", "--trace", SAMPLE, "--warmup", "1000000"]);
    assert!(!stderr(&o).contains("covers the whole trace"), "{}", stderr(&o));

    let o = iocache(&["completions", "bash"]);
    assert!(
        o.status.success() && stdout(&o).contains("_iocache"),
        "{}",
        stderr(&o)
    );
    let dir = std::env::temp_dir().join(format!("iocache-cli-man-{}", std::process::id()));
    run_ok(&["man", dir.to_str().unwrap()]);
    let page = std::fs::read_to_string(dir.join("iocache-serve.1")).unwrap();
    assert!(
        page.contains("read\\-only") || page.contains("read-only"),
        "{page}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn trace_mrc_writes_the_documented_json_and_matches_sim() {
    let json = mrc_json(SAMPLE, &["--sizes", "64,1MiB", "--method", "exact,shards:0.5"]);
    let curves = json["curves"].as_array().unwrap();
    assert_eq!(curves.len(), 2);
    assert_eq!(curves[0]["method"], "exact");
    let points = curves[0]["points"].as_array().unwrap();
    assert_eq!(points[0]["cache_lines"], 64);
    assert_eq!(points[1]["cache_lines"], 256);
    assert_eq!(points[1]["cache_bytes"], 1 << 20);
    assert!(curves[1]["max_error_vs_exact"].as_f64().is_some());
    let (mean, max) = (
        curves[1]["mean_error_vs_exact"].as_f64().unwrap(),
        curves[1]["max_error_vs_exact"].as_f64().unwrap(),
    );
    assert!(mean <= max, "the mean {mean} is at most the largest {max}");
    let sim = sim_json(SAMPLE, &["--policy", "lru", "--cache-size", "64,256"]);
    for (point, run) in points.iter().zip(sim["runs"].as_array().unwrap()) {
        let miss = 1.0 - run["hits"].as_f64().unwrap() / run["accesses"].as_f64().unwrap();
        assert!(
            (point["miss_ratio"].as_f64().unwrap() - miss).abs() < 1e-12,
            "{point} vs {miss}"
        );
    }
    fails_saying(&["trace", "mrc", SAMPLE, "--method", "belady"], &["shards:RATE"]);
}

#[test]
fn gen_writes_a_trace_sim_reads_and_a_fio_job() {
    let dir = temp_dir("gen");
    let trace = dir.join("zoned.csv.gz");
    let fio = dir.join("zoned.fio");
    run_ok(&[
        "gen",
        "examples/workloads/asplos-zoned.toml",
        "-o",
        trace.to_str().unwrap(),
        "--fio",
        fio.to_str().unwrap(),
    ]);
    assert!(std::fs::read_to_string(&fio)
        .unwrap()
        .contains("random_distribution=zoned:85/10:15/90"));
    let json = sim_json(trace.to_str().unwrap(), &["--cache-size", "100MiB"]);
    assert_eq!(json["format"], "msr");
    assert_eq!(json["trace_records"], 300_000);
    let again = iocache(&["gen", "examples/workloads/asplos-zoned.toml"]);
    let once_more = iocache(&["gen", "examples/workloads/asplos-zoned.toml"]);
    assert!(
        again.status.success() && again.stdout == once_more.stdout,
        "not reproducible"
    );
    let bad = temp_file(
        "bad.toml",
        "volume_size = \"1GiB\"\n[[phase]]\nrequests = 10\ndistribution = \"zipf\"\n",
    );
    fails_saying(&["gen", bad.to_str().unwrap()], &["phase 1", "zipf"]);
}

/// `lab run`: shards merged equal one run, and a rerun runs only what is
/// missing.
#[test]
fn lab_shards_merge_to_one_run_and_runs_resume() {
    let (dir, experiment) = sample_experiment("lab", "[[workload]]\nname = \"sample\"\ntrace = \"{trace}\"\nformat = \"arc\"\n\n[grid]\npolicy = [\"lru\", \"arc\"]\ncache_size = [\"64\", \"1MiB\", \"512\"]\nwrite_policy = [\"wb\", \"wt\"]\n");
    let e = experiment.to_str().unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let strip = |file: &str| json_lines(std::path::Path::new(file));
    run_ok(&["lab", "run", e, "--out", &path("whole.jsonl"), "--threads", "1"]);
    let whole = strip(&path("whole.jsonl"));
    assert_eq!(whole.len(), 12);
    run_shards(e, 3, &dir);
    for i in 0..3 {
        assert_eq!(strip(&path(&format!("part{i}.jsonl"))).len(), 4);
    }
    run_ok(&[
        "lab",
        "merge",
        &path("part2.jsonl"),
        &path("part0.jsonl"),
        &path("part1.jsonl"),
        "-o",
        &path("merged.jsonl"),
        "--csv",
        &path("merged.csv"),
    ]);
    assert_eq!(
        strip(&path("merged.jsonl")),
        whole,
        "shards merged differ from one run"
    );
    // Byte for byte: every merged line is a line of a part, as written
    // (floats read back and written again come out the same).
    let parts: std::collections::HashSet<String> = (0..3)
        .flat_map(|i| {
            std::fs::read_to_string(path(&format!("part{i}.jsonl")))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    for line in std::fs::read_to_string(path("merged.jsonl")).unwrap().lines() {
        assert!(parts.contains(line), "rewritten by the merge: {line}");
    }
    let csv = std::fs::read_to_string(path("merged.csv")).unwrap();
    assert_eq!(csv.lines().count(), 13);
    assert!(csv.lines().next().unwrap().contains("write_policy"));
    // Resume: a file holding one shard gets only the other points.
    std::fs::copy(path("part0.jsonl"), path("resumed.jsonl")).unwrap();
    let o = run_ok(&["lab", "run", e, "--out", &path("resumed.jsonl")]);
    assert!(
        stderr(&o).contains("4 already in") && stderr(&o).contains("8 to run"),
        "{}",
        stderr(&o)
    );
    let mut resumed = strip(&path("resumed.jsonl"));
    resumed.sort_by_key(|r| r["point"].as_u64());
    assert_eq!(resumed, whole);
}

/// The admission policies and the readahead are lab knobs: every point of
/// a grid over them equals `iocache sim` with the same flags, and only
/// readahead points carry the fetch counts.
#[test]
fn lab_grids_admission_and_readahead_as_sim_runs_them() {
    let (dir, experiment) = sample_experiment(
        "lab-admission",
        "[[workload]]\nname = \"s\"\ntrace = \"{trace}\"\nformat = \"arc\"\n[grid]\ncache_size = [\"256\"]\n\
         promotion = [\"always\", \"second-hit\", \"random:0.5\", \"request-size:4KiB\"]\n\
         readahead = [\"off\", \"seq:min=8KiB\"]\n",
    );
    let rows = lab_run_rows(&experiment, &dir.join("r.jsonl"));
    assert_eq!(rows.len(), 8);
    let mut fetched = 0;
    for row in &rows {
        let promotion = row["promotion"].as_str().unwrap();
        let readahead = row["readahead"].as_str().unwrap();
        let sim = sim_json(
            SAMPLE,
            &[
                "--cache-size",
                "256",
                "--promotion",
                promotion,
                "--readahead",
                readahead,
            ],
        );
        let run = &sim["runs"][0];
        for key in ["hits", "promotions", "cache_write_bytes", "backend_read_bytes"] {
            assert_eq!(row[key], run[key], "{key} of {promotion} {readahead}");
        }
        if readahead == "off" {
            assert!(row.get("prefetched_lines").is_none(), "{row}");
        } else {
            assert_eq!(row["prefetched_lines"], run["prefetched_lines"]);
            fetched += row["prefetched_lines"].as_u64().unwrap();
        }
    }
    assert!(
        fetched > 0,
        "the sample has sequential runs: readahead fetched something"
    );
}

/// A generated trace over several volumes (MSR CSV, the disk number the
/// volume), its path.
fn volumes_trace(dir: &std::path::Path) -> PathBuf {
    let spec = dir.join("volumes.toml");
    std::fs::write(
        &spec,
        "seed = 5\nvolume_size = \"16MiB\"\n[[phase]]\nrequests = 40000\nrate = 100000\nread_percent = 80\n\
         distribution = \"zipf:0.9\"\nvolumes = 5\nvolume_distribution = \"zipf:1\"\n",
    )
    .unwrap();
    let trace = dir.join("volumes.csv");
    run_ok(&["gen", spec.to_str().unwrap(), "-o", trace.to_str().unwrap()]);
    trace
}

/// `trace mrc --per-volume`: each volume's curve is the curve of that
/// volume's requests alone.
#[test]
fn per_volume_curves_equal_each_volume_alone() {
    let dir = temp_dir("mrc-volumes");
    let trace = volumes_trace(&dir);
    let all = mrc_json(
        trace.to_str().unwrap(),
        &["--per-volume", "--sizes", "64,256,1024"],
    );
    let volumes = all["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 5);
    let text = std::fs::read_to_string(&trace).unwrap();
    let total: u64 = volumes.iter().map(|v| v["line_accesses"].as_u64().unwrap()).sum();
    assert_eq!(
        total,
        text.lines().count() as u64,
        "4 KiB requests: a line access each"
    );
    // The busiest volume is disk 0 (Zipf over volumes): its requests alone.
    let alone = dir.join("disk0.csv");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.split(',').nth(2) == Some("0"))
        .collect();
    std::fs::write(&alone, lines.join("\n") + "\n").unwrap();
    let one = mrc_json(alone.to_str().unwrap(), &["--sizes", "64,256,1024"]);
    assert_eq!(volumes[0]["line_accesses"], one["line_accesses"]);
    assert_eq!(volumes[0]["curve"]["points"], one["curves"][0]["points"]);
    fails_saying(
        &[
            "trace",
            "mrc",
            trace.to_str().unwrap(),
            "--per-volume",
            "--method",
            "exact,opt",
        ],
        &["--per-volume", "one --method"],
    );
}

/// `trace allocate`: the best split's predicted misses are what the
/// simulation of it counts (exact curves), and it misses no more than the
/// equal and proportional splits.
#[test]
fn allocation_by_curves_is_what_simulation_finds_and_beats_the_others() {
    let dir = temp_dir("allocate");
    let trace = volumes_trace(&dir);
    let r = run_json(&[
        "trace",
        "allocate",
        "--trace",
        trace.to_str().unwrap(),
        "--cache-size",
        "4MiB",
        "--units",
        "32",
        "--json",
        "-",
    ]);
    let splits = r["splits"].as_array().unwrap();
    let by = |name: &str| splits.iter().find(|s| s["name"] == name).unwrap();
    let best = by("best");
    let simulated = best["simulated"]["misses"].as_u64().unwrap();
    assert_eq!(
        best["predicted_misses"].as_f64().unwrap().round() as u64,
        simulated
    );
    for other in ["equal", "proportional"] {
        let misses = by(other)["simulated"]["misses"].as_u64().unwrap();
        assert!(simulated <= misses, "best {simulated} against {other} {misses}");
        assert_eq!(
            by(other)["lines"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_u64().unwrap())
                .sum::<u64>(),
            1024
        );
    }
    assert!(
        best["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_u64().unwrap())
            .sum::<u64>()
            <= 1024
    );
    fails_saying(
        &[
            "trace",
            "allocate",
            "--trace",
            trace.to_str().unwrap(),
            "--cache-size",
            "16",
            "--units",
            "64",
        ],
        &["--cache-size 16", "fewer units"],
    );
}

/// Above 32 KiB lines `trace mrc`'s exact curve is a simulation of every
/// size: each point equals `iocache sim` at that size; the methods that
/// track a line's sectors in one mask are refused.
#[test]
fn large_line_curves_equal_the_simulator() {
    for line in ["64KiB", "1MiB"] {
        let mrc = mrc_json(SAMPLE, &["--line-size", line, "--sizes", "4,32"]);
        let sim = sim_json(SAMPLE, &["--line-size", line, "--cache-size", "4,32"]);
        for (point, run) in mrc["curves"][0]["points"]
            .as_array()
            .unwrap()
            .iter()
            .zip(sim["runs"].as_array().unwrap())
        {
            let hits = 1.0 - point["miss_ratio"].as_f64().unwrap();
            assert!(
                (hits - run["hit_ratio"].as_f64().unwrap()).abs() < 1e-12,
                "{line}: {point} against {run}"
            );
        }
        assert_eq!(mrc["curves"][0]["method"], "exact");
    }
    fails_saying(
        &[
            "trace",
            "mrc",
            SAMPLE,
            "--line-size",
            "1MiB",
            "--method",
            "exact,opt",
        ],
        &["--method opt", "lines up to 32768 B"],
    );
}

/// `cache_size = "10%"` in a lab grid is that share of the workload's
/// footprint (as `iocache trace stats` counts it), and the point equals
/// `iocache sim` at that many lines.
#[test]
fn lab_sizes_a_cache_as_a_share_of_the_footprint() {
    let (dir, experiment) = sample_experiment(
        "lab-share",
        "[[workload]]\nname = \"s\"\ntrace = \"{trace}\"\n[grid]\ncache_size = [\"10%\"]\n",
    );
    let row = lab_run_rows(&experiment, &dir.join("r.jsonl")).remove(0);
    let stats: serde_json::Value =
        serde_json::from_str(&stdout(&iocache(&["trace", "stats", SAMPLE, "--json", "-"]))).unwrap();
    let footprint = stats["footprint_lines"].as_u64().unwrap();
    assert_eq!(row["footprint_lines"], footprint);
    let lines = (footprint as f64 * 0.1).ceil() as u64;
    assert_eq!(row["cache_lines"], lines);
    let sim: serde_json::Value = serde_json::from_str(&stdout(&iocache(&[
        "sim",
        "--trace",
        SAMPLE,
        "--cache-size",
        &lines.to_string(),
        "--json",
        "-",
    ])))
    .unwrap();
    assert_eq!(row["hits"], sim["runs"][0]["hits"]);
    // `sim` takes the same share, sized the same way.
    let share = sim_json(SAMPLE, &["--cache-size", "10%"]);
    assert_eq!(share["runs"][0]["cache_lines"], lines);
    assert_eq!(share["runs"][0]["hits"], row["hits"]);
    fails_saying(
        &["sim", "--trace", SAMPLE, "--cache-size", "0%"],
        &["--cache-size 0%"],
    );
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[[workload]]\nname = \"s\"\ntrace = \"x\"\n[grid]\ncache_size = [\"150%\"]\n",
    )
    .unwrap();
    fails_saying(&["lab", "run", bad.to_str().unwrap()], &["grid.cache_size"]);
}

/// `--report`: the page is written beside the usual output, checked before
/// the run, and refused on stdout; `lab report` names its page after the
/// results and refuses an empty file. (tests/report.rs loads the pages in a
/// browser.)
#[test]
fn reports_are_written_where_asked() {
    let dir = temp_dir("report");
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();

    // One size: the table, no curve against size.
    let o = sim_ok(SAMPLE, &["--cache-size", "256", "--report", &path("one.html")]);
    assert!(stdout(&o).contains("lru"), "the table is still printed");
    let html = std::fs::read_to_string(path("one.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<table>"));
    assert!(!html.contains("<svg"), "no sweep, no plot");

    // With --json -, stdout holds only the JSON and the page is written.
    let o = run_ok(&[
        "trace",
        "mrc",
        SAMPLE,
        "--json",
        "-",
        "--report",
        &path("mrc.html"),
    ]);
    serde_json::from_str::<serde_json::Value>(&stdout(&o)).expect("only JSON on stdout");
    assert!(std::fs::read_to_string(path("mrc.html"))
        .unwrap()
        .contains("<svg"));

    fails_saying(
        &["sim", "--trace", SAMPLE, "--report", "-"],
        &["--report: give a file name"],
    );
    fails_saying(
        &["sim", "--trace", SAMPLE, "--report", "/nonexistent-dir/r.html"],
        &["--report /nonexistent-dir/r.html: cannot write there"],
    );

    let experiment = write_experiment(&dir, "[[workload]]\nname = \"sample\"\ntrace = \"{trace}\"\nformat = \"arc\"\n\n[grid]\ncache_size = [\"64\", \"512\"]\n", &sample_path());
    run_ok(&["lab", "run", experiment.to_str().unwrap(), "--threads", "1"]);
    run_ok(&["lab", "report", &path("e.results.jsonl")]);
    let html = std::fs::read_to_string(path("e.results.html")).unwrap();
    assert!(html.contains("sample: hit ratio vs cache size"));
    // Nothing varies but the size: one series, every knob said once.
    assert!(
        html.contains("<dt>policy</dt><dd>lru</dd>"),
        "constant knobs at the top"
    );
    std::fs::write(path("empty.jsonl"), "").unwrap();
    fails_saying(
        &[
            "lab",
            "report",
            &path("empty.jsonl"),
            "--out",
            &path("empty.html"),
        ],
        &["no results"],
    );
}

/// An MSR trace of `n` requests over three disks, one request per
/// millisecond, reads and writes, with reuse: written into `dir`.
fn three_volume_trace(dir: &std::path::Path, n: u64) -> PathBuf {
    let mut x = 99u64;
    let mut text = String::new();
    for i in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = x >> 33;
        let kind = if r.is_multiple_of(4) { "Write" } else { "Read" };
        let ticks = 128_166_385_295_514_663u64 + i * 10_000;
        text += &format!(
            "{ticks},host,{},{kind},{},4096,0\n",
            r % 3,
            ((r >> 4) % 900) * 4096
        );
    }
    let path = dir.join("three.csv");
    std::fs::write(&path, text).unwrap();
    path
}

/// The sample trace's absolute path.
fn sample_path() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(SAMPLE)
}

/// A fresh directory for one test, and its experiment DIR/e.toml: `text`
/// over the sample trace (see [`write_experiment`]).
fn sample_experiment(name: &str, text: &str) -> (common::TestDir, PathBuf) {
    let dir = temp_dir(name);
    let experiment = write_experiment(&dir, text, &sample_path());
    (dir, experiment)
}

/// Writes DIR/e.toml: `text` with `{trace}` replaced by `trace`'s path.
fn write_experiment(dir: &std::path::Path, text: &str, trace: &std::path::Path) -> PathBuf {
    let path = dir.join("e.toml");
    std::fs::write(&path, text.replace("{trace}", &trace.display().to_string())).unwrap();
    path
}

/// `iocache lab run EXPERIMENT --out OUT`, which must succeed.
fn lab_run(experiment: &std::path::Path, out: &std::path::Path) {
    run_ok(&[
        "lab",
        "run",
        experiment.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
}

/// `iocache lab run EXPERIMENT --shard I/N --out DIR/partI.jsonl` for each
/// of the `n` shards, which must succeed.
fn run_shards(experiment: &str, n: usize, dir: &std::path::Path) {
    for i in 0..n {
        let out = dir.join(format!("part{i}.jsonl"));
        run_ok(&[
            "lab",
            "run",
            experiment,
            "--shard",
            &format!("{i}/{n}"),
            "--out",
            out.to_str().unwrap(),
        ]);
    }
}

/// `iocache lab run EXPERIMENT --out OUT`, and the rows it wrote.
fn lab_run_rows(experiment: &std::path::Path, out: &std::path::Path) -> Vec<serde_json::Value> {
    lab_run(experiment, out);
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn json_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("seconds");
            v
        })
        .collect()
}

/// Every point of a grid over the timing, adaptation, restart and warmup
/// knobs equals `iocache sim` run alone with the same flags: totals,
/// latency, restarts, controller switches, the per-volume results and the
/// cache series.
#[test]
fn lab_grid_over_timing_adapt_and_restarts_equals_sim_alone() {
    let dir = temp_dir("lab-knobs");
    let trace = three_volume_trace(&dir, 3000);
    let experiment = write_experiment(&dir, "per_volume = true\n[[workload]]\nname = \"three\"\ntrace = \"{trace}\"\n\n[grid]\ncache_size = [\"512\"]\n\
             cache_device = [\"optane\"]\nspeed = [1, 4]\nadapt = [\"none\", \"observe\", \"reca\"]\nreca_window = [500]\n\
             restart_every = [\"off\", \"700ms:persistence=dirty\"]\nwarmup = [\"0\", \"0.2\"]\n\n[series]\nevery = \"1000\"\n", &trace);
    let out = dir.join("r.jsonl");
    lab_run(&experiment, &out);
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 24);
    let volumes = json_lines(&dir.join("r.volumes.jsonl"));
    let series = json_lines(&dir.join("r.series.jsonl"));
    for row in &rows {
        let knob = |k: &str| row[k].as_str().unwrap().to_string();
        let mut args = vec![
            "sim".to_string(),
            "--trace".into(),
            trace.to_str().unwrap().into(),
            "--cache-size".into(),
            knob("cache_size"),
            "--cache-device".into(),
            knob("cache_device"),
            "--speed".into(),
            knob("speed"),
            "--per-volume".into(),
            "all".into(),
            "--series-every".into(),
            "1000".into(),
            "--json".into(),
            "-".into(),
        ];
        if knob("adapt") != "none" {
            args.extend(["--adapt".into(), knob("adapt")]);
        }
        if knob("adapt") == "reca" {
            args.extend(["--reca-window".into(), knob("reca_window")]);
        }
        if knob("restart_every") != "off" {
            args.extend(["--restart-every".into(), knob("restart_every")]);
        }
        if knob("warmup") != "0" {
            args.extend(["--warmup".into(), knob("warmup")]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let sim = run_json(&args);
        let run = &sim["runs"][0];
        let id = &row["point_id"];
        assert_eq!(row["hits"], run["hits"], "{id}");
        assert_eq!(row["accesses"], run["accesses"], "{id}");
        assert_eq!(
            row["write_backs"].as_u64().unwrap(),
            run["dirty_writebacks"].as_u64().unwrap() + run["flushed_lines"].as_u64().unwrap()
        );
        assert_eq!(row["iops"], run["timing"]["iops"], "{id}");
        assert_eq!(row["latency_p99_ns"], run["timing"]["all"]["p99_ns"], "{id}");
        assert_eq!(row["read_p9999_ns"], run["timing"]["read"]["p9999_ns"], "{id}");
        assert_eq!(row["write_mean_ns"], run["timing"]["write"]["mean_ns"], "{id}");
        assert_eq!(
            row["backend_utilization"],
            run["timing"]["backend_device"]["utilization"]
        );
        assert_eq!(
            row["restarts"].as_u64().unwrap_or(0),
            run["restarts"].as_u64().unwrap(),
            "{id}"
        );
        assert_eq!(row["adapt_switches"], run["adapt"]["switches"], "{id}");
        if knob("restart_every") != "off" {
            assert!(row["restarts"].as_u64().unwrap() > 0, "{id}");
        }
        let mine = |rows: &[serde_json::Value]| -> Vec<serde_json::Value> {
            rows.iter()
                .filter(|r| r["point_id"] == *id)
                .map(|r| {
                    let mut r = r.clone();
                    let map = r.as_object_mut().unwrap();
                    map.retain(|k, _| {
                        run["volumes"][0].get(k).is_some() || run["cache_series"][0].get(k).is_some()
                    });
                    r
                })
                .collect()
        };
        assert_eq!(mine(&volumes), *run["volumes"].as_array().unwrap(), "{id}");
        assert_eq!(volumes.iter().filter(|r| r["point_id"] == *id).count(), 3);
        assert_eq!(mine(&series), *run["cache_series"].as_array().unwrap(), "{id}");
    }
}

/// Knob values that cannot run together are refused when the experiment
/// is read, naming the knobs and values, before any workload is opened.
#[test]
fn lab_refuses_invalid_knob_combinations_at_load() {
    let dir = temp_dir("lab-invalid");
    for (grid, message) in [
        (
            "adapt = [\"none\", \"lbica\"]",
            "adapt = lbica with timing = false",
        ),
        (
            "speed = [2]\nclosed_loop = [\"off\", \"8\"]",
            "speed = 2 with closed_loop = 8",
        ),
        (
            "timing = [true]\ncache_device = [\"floppy\"]",
            "grid.cache_device",
        ),
        ("restart_every = [\"soon\"]", "grid.restart_every"),
        ("colour = [\"red\"]", "grid.colour: not a knob"),
        ("per_volume = true", "goes at the top of the file"),
    ] {
        let experiment = dir.join("bad.toml");
        std::fs::write(
            &experiment,
            format!("[[workload]]\nname = \"w\"\ntrace = \"no-such-trace\"\n[grid]\n{grid}\n"),
        )
        .unwrap();
        let o = iocache(&["lab", "run", experiment.to_str().unwrap()]);
        assert!(!o.status.success());
        assert!(stderr(&o).contains(message), "{grid}: {}", stderr(&o));
        assert!(!stderr(&o).contains("no-such-trace"), "{}", stderr(&o));
    }
}

/// `sim --series-every` without timing: the windows add up to the run's
/// totals; `--per-volume` adds up to them too; `--series` writes the CSV
/// and is refused when there is no series to write.
#[test]
fn sim_series_without_timing_and_per_volume_add_up() {
    let dir = temp_dir("sim-series");
    let trace = three_volume_trace(&dir, 4000);
    let csv = dir.join("s.csv");
    let report = dir.join("s.html");
    let sim = sim_json(
        trace.to_str().unwrap(),
        &[
            "--cache-size",
            "300",
            "--series-every",
            "500ms",
            "--per-volume",
            "--series",
            csv.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ],
    );
    let run = &sim["runs"][0];
    assert!(run.get("timing").is_none());
    let windows: Vec<&serde_json::Value> = run["cache_series"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w.get("volume").is_none())
        .collect();
    assert_eq!(windows.len(), 8, "4000 requests at 1 ms in windows of 500 ms");
    let sum = |rows: &[&serde_json::Value], k: &str| rows.iter().map(|r| r[k].as_u64().unwrap()).sum::<u64>();
    for k in [
        "requests",
        "hits",
        "accesses",
        "read_hits",
        "write_hits",
        "backend_read_bytes",
        "backend_write_bytes",
    ] {
        assert_eq!(sum(&windows, k), run[k].as_u64().unwrap(), "{k}");
    }
    let volumes: Vec<&serde_json::Value> = run["volumes"].as_array().unwrap().iter().collect();
    assert_eq!(volumes.len(), 3);
    for k in [
        "requests",
        "hits",
        "hit_bytes",
        "backend_read_bytes",
        "backend_write_bytes",
    ] {
        assert_eq!(sum(&volumes, k), run[k].as_u64().unwrap(), "{k}");
    }
    assert_eq!(
        sum(&volumes, "resident_lines_at_end"),
        run["resident_lines_at_end"].as_u64().unwrap()
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(
        text.starts_with("policy,cache_size,index,volume,start_ns"),
        "{text}"
    );
    assert_eq!(
        text.lines().count(),
        1 + 8 * 4,
        "a row per window, and per volume"
    );
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(
        page.contains("hit ratio over trace time (s)") && page.contains("dirty lines over trace time (s)")
    );
    // The table shows the busiest volumes.
    let o = iocache(&["sim", "--trace", trace.to_str().unwrap(), "--per-volume", "2"]);
    assert!(
        stdout(&o).contains("per volume (busiest first)"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("1 quieter volume rows left out"),
        "{}",
        stdout(&o)
    );
    fails_saying(
        &[
            "sim",
            "--trace",
            trace.to_str().unwrap(),
            "--series",
            csv.to_str().unwrap(),
        ],
        &["--series-every"],
    );
}

/// With the later knobs, a series and per-volume results, shards merged
/// equal one run (side files included), and a resumed run completes one
/// shard's results to the whole.
#[test]
fn lab_shards_and_resumption_hold_with_the_new_knobs() {
    let dir = temp_dir("lab-shards-knobs");
    let trace = three_volume_trace(&dir, 2000);
    let experiment = write_experiment(&dir, "per_volume = true\n[[workload]]\nname = \"three\"\ntrace = \"{trace}\"\n\n[grid]\ncache_size = [\"128\", \"512\"]\n\
             timing = [false, true]\ncache_device = [\"optane\", \"nvme\"]\nadapt = [\"none\", \"reca\"]\nreca_window = [300]\n\
             restart_every = [\"off\", \"500ms:persistence=none\"]\n\n[series]\nevery = \"400ms\"\n", &trace);
    let e = experiment.to_str().unwrap();
    let path = |name: &str| dir.join(name);
    let s = |name: &str| path(name).to_str().unwrap().to_string();
    run_ok(&["lab", "run", e, "--out", &s("whole.jsonl")]);
    let whole = json_lines(&path("whole.jsonl"));
    // Without timing the device knobs do not apply: 8 untimed points, 16 timed.
    assert_eq!(whole.len(), 24);
    assert_eq!(
        whole.iter().filter(|r| r.get("cache_device").is_none()).count(),
        8
    );
    run_shards(e, 2, &dir);
    run_ok(&[
        "lab",
        "merge",
        &s("part1.jsonl"),
        &s("part0.jsonl"),
        "-o",
        &s("merged.jsonl"),
    ]);
    assert_eq!(json_lines(&path("merged.jsonl")), whole);
    // A shell glob over the parts names their side files too: they are
    // left out of the results (a decision row once replaced a point's).
    let mut globbed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.contains("/part") && p.ends_with(".jsonl"))
        .collect();
    globbed.sort();
    assert!(
        globbed.iter().any(|p| p.ends_with(".decisions.jsonl")),
        "{globbed:?}"
    );
    let mut args = vec!["lab".to_string(), "merge".into()];
    args.extend(globbed);
    args.extend(["-o".into(), s("globbed.jsonl")]);
    run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(json_lines(&path("globbed.jsonl")), whole);
    // ReCA's points: the totals in the row, each window in the side file.
    let decisions = json_lines(&path("whole.decisions.jsonl"));
    let reca_points: Vec<&serde_json::Value> = whole.iter().filter(|r| r["adapt"] == "reca").collect();
    assert_eq!(reca_points.len(), 12);
    for point in reca_points {
        let windows: Vec<&serde_json::Value> = decisions
            .iter()
            .filter(|d| d["point_id"] == point["point_id"] && d["controller"] == "reca")
            .collect();
        assert_eq!(point["reca_windows"], windows.len(), "{point}");
        assert!(!windows.is_empty());
        let changed = windows
            .iter()
            .filter(|w| !w["window"]["change"].is_null())
            .count();
        assert_eq!(point["reca_changes"], changed, "{point}");
    }
    for side in ["series", "volumes", "decisions"] {
        let whole_side = json_lines(&path(&format!("whole.{side}.jsonl")));
        assert!(!whole_side.is_empty());
        assert_eq!(
            json_lines(&path(&format!("merged.{side}.jsonl"))),
            whole_side,
            "{side}"
        );
    }
    // Resume from one shard's results (and side files): the rest is run.
    for ext in ["jsonl", "series.jsonl", "volumes.jsonl"] {
        std::fs::copy(path(&format!("part0.{ext}")), path(&format!("resumed.{ext}"))).unwrap();
    }
    let o = run_ok(&["lab", "run", e, "--out", &s("resumed.jsonl")]);
    assert!(
        stderr(&o).contains("12 already in") && stderr(&o).contains("12 to run"),
        "{}",
        stderr(&o)
    );
    run_ok(&["lab", "merge", &s("resumed.jsonl"), "-o", &s("resorted.jsonl")]);
    assert_eq!(json_lines(&path("resorted.jsonl")), whole);
    assert_eq!(
        json_lines(&path("resorted.series.jsonl")),
        json_lines(&path("whole.series.jsonl"))
    );
    run_ok(&["lab", "report", &s("whole.jsonl")]);
    let page = std::fs::read_to_string(path("whole.html")).unwrap();
    assert!(
        page.contains("three: hit ratio over trace time (s)"),
        "the series is plotted"
    );
}

/// The lines of a help text's `Commands:` section: each subcommand's name.
fn help_commands(help: &str) -> Vec<String> {
    help.split("Commands:")
        .nth(1)
        .unwrap_or("")
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|name| name != "help")
        .collect()
}

/// Help text agrees with what the binary does: `ctl`'s summary names every
/// subcommand, `lab reproduce` lists every reproduction `list` prints, and
/// `lab run` says it runs live too.
#[test]
fn help_names_what_the_commands_do() {
    let ctl = String::from_utf8(iocache(&["ctl", "--help"]).stdout).unwrap();
    let summary = ctl.lines().next().unwrap().to_lowercase();
    for name in help_commands(&ctl) {
        assert!(summary.contains(&name), "`ctl` summary misses {name}: {summary}");
    }
    let list = String::from_utf8(iocache(&["lab", "reproduce", "list"]).stdout).unwrap();
    let help = String::from_utf8(iocache(&["lab", "reproduce", "--help"]).stdout).unwrap();
    let names: Vec<&str> = list.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(names.len() >= 8, "{list}");
    for name in names {
        assert!(help.contains(name), "`lab reproduce --help` misses {name}");
    }
    let lab = String::from_utf8(iocache(&["lab", "--help"]).stdout).unwrap();
    assert!(lab.contains("or live"), "{lab}");
    let serve = String::from_utf8(iocache(&["serve", "--help"]).stdout).unwrap();
    assert!(
        !serve.contains("applied at a restart"),
        "--adapt help says ReCA waits for a restart"
    );
}

/// The long flags `--help` of `iocache ARGS` lists.
fn flags_in_help(args: &[&str]) -> std::collections::BTreeSet<String> {
    let out = run_ok(args);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_string)
        .collect()
}

#[test]
fn every_serve_flag_is_documented_and_every_documented_flag_exists() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut docs = std::fs::read_to_string(root.join("README.md")).unwrap();
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            docs += &std::fs::read_to_string(path).unwrap();
        }
    }
    let serve = flags_in_help(&["serve", "--help"]);
    // Global flags, documented by their short forms in docs/ops.md.
    let global = ["--help", "--version", "--verbose", "--quiet"];
    let undocumented: Vec<&String> = serve
        .iter()
        .filter(|f| !global.contains(&f.as_str()))
        .filter(|f| {
            // The flag itself, or the configuration key it sets.
            let key = format!("`{}`", f.trim_start_matches("--").replace('-', "_"));
            !docs.contains(f.as_str()) && !docs.contains(&key)
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "serve flags no doc mentions: {undocumented:?}"
    );
    // docs/config.md's "Also `--flag`" names a flag serve has.
    let config = std::fs::read_to_string(root.join("docs/config.md")).unwrap();
    let named: Vec<&str> = config
        .split("Also `")
        .skip(1)
        .filter_map(|rest| rest.split('`').next())
        .collect();
    assert!(named.len() >= 9, "{named:?}");
    let missing: Vec<&&str> = named.iter().filter(|f| !serve.contains(**f)).collect();
    assert!(
        missing.is_empty(),
        "docs/config.md names flags serve lacks: {missing:?}"
    );
}

/// Every output of `sim` is written whatever else is asked for, or the
/// run is refused before it starts, naming the conflict.
#[test]
fn every_sim_output_is_written_with_every_other() {
    let dir = temp_dir("outputs");
    let at = |name: &str| dir.join(name).display().to_string();
    let base = [
        "sim",
        "--trace",
        SAMPLE,
        "--cache-size",
        "256",
        "--adapt",
        "reca",
        "--reca-window",
        "2000",
        "--series-every",
        "4000",
    ];
    for (json, reca_series, series) in [
        ("-", "a.csv", "a-series.json"),
        ("run.json", "b.json", "b-series.csv"),
        ("", "c.csv", "c-series.csv"),
    ] {
        let mut args: Vec<String> = base.iter().map(|a| a.to_string()).collect();
        args.extend([
            "--reca-series".into(),
            at(reca_series),
            "--series".into(),
            at(series),
        ]);
        args.extend(["--report".into(), at(&format!("{reca_series}.html"))]);
        match json {
            "" => {}
            "-" => args.extend(["--json".to_string(), "-".to_string()]),
            file => args.extend(["--json".to_string(), at(file)]),
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_ok(&args);
        for file in [reca_series, series, &format!("{reca_series}.html")] {
            let written = std::fs::read_to_string(dir.join(file))
                .unwrap_or_else(|e| panic!("--json {json:?}: {file} not written: {e}"));
            assert!(written.lines().count() > 1, "{file}: {written}");
        }
        let json_text = match json {
            "" => continue,
            "-" => stdout(&out),
            file => std::fs::read_to_string(dir.join(file)).unwrap(),
        };
        let json: serde_json::Value =
            serde_json::from_str(&json_text).unwrap_or_else(|e| panic!("the JSON alone: {e}\n{json_text}"));
        assert!(json["runs"][0]["reca"]["windows"]
            .as_array()
            .is_some_and(|w| w.len() == 10));
    }
    // Refused before running, naming the flags.
    let clash = at("same.json");
    fails_saying(
        &[&base[..], &["--json", &clash, "--series", &clash]].concat(),
        &["--json and --series both name", "same.json"],
    );
    fails_saying(
        &[&base[..], &["--reca-series", &clash, "--report", &clash]].concat(),
        &["--reca-series and --report both name"],
    );
    fails_saying(
        &[&base[..], &["--series", "-"]].concat(),
        &["--series -: give a file name"],
    );
    fails_saying(
        &[
            "sim",
            "--trace",
            SAMPLE,
            "--timing",
            "--adapt",
            "lbica",
            "--reca-series",
            &at("x.csv"),
        ],
        &["--reca-series", "needs --adapt reca"],
    );
    assert!(!dir.join("same.json").exists() && !dir.join("x.csv").exists());
}

/// The JSON of an adaptive run carries the decisions the text prints: on
/// a generated phase workload, ReCA's category changes, what each changed
/// and the windows, and a load balancer's totals.
#[test]
fn adaptive_decisions_in_the_json_equal_the_text() {
    let dir = temp_dir("decisions");
    let trace = dir.join("phases.csv").display().to_string();
    run_ok(&["gen", "examples/workloads/reca-phases.toml", "-o", &trace]);
    let sim = [
        "sim",
        "--trace",
        &trace,
        "--format",
        "msr",
        "--threads",
        "1",
        "--cache-size",
        "64MiB",
    ];
    let reca = [&sim[..], &["--adapt", "reca", "--reca-window", "10000"]].concat();
    let text = stdout(&run_ok(&reca));
    let json = run_json(&[&reca[..], &["--json", "-"]].concat());
    let run = &json["runs"][0]["reca"];
    let windows = run["windows"].as_array().unwrap();
    // The summary line's totals.
    let summary = text
        .lines()
        .find(|l| l.starts_with("ReCA on "))
        .expect("a ReCA summary");
    let expected = format!(
        "{} windows, {} category changes, {} cache rebuilds",
        windows.len(),
        run["category_changes"],
        run["relayouts"]
    );
    assert!(summary.contains(&expected), "{summary} / {expected}");
    // Each change event: its request, categories and what it changed.
    let events: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("reca: request "))
        .collect();
    let changes: Vec<&serde_json::Value> = windows.iter().filter(|w| !w["change"].is_null()).collect();
    assert_eq!(events.len(), changes.len(), "{text}");
    assert!(changes.len() >= 2, "the phase change is seen: {text}");
    assert!(
        changes.iter().any(|w| !w["change"]["relayout"].is_null()),
        "a line size change"
    );
    for (event, window) in events.iter().zip(&changes) {
        let change = &window["change"];
        let old = change["old"].as_str().unwrap_or("(none)");
        let head = format!("reca: request {} ", window["requests"]);
        assert!(event.trim_start().starts_with(&head), "{event} / {head}");
        assert!(
            event.contains(&format!(" {old} -> {} [", change["new"].as_str().unwrap())),
            "{event}"
        );
        let said = json_strings(&change["changes"]);
        assert!(
            event.ends_with(&format!("; {}", said.join("; "))),
            "{event} / {said:?}"
        );
        for d in window["distances"].as_array().unwrap() {
            let shown = format!(
                " {}={:.3}",
                d["category"].as_str().unwrap(),
                d["distance"].as_f64().unwrap()
            );
            assert!(event.contains(&shown), "{event} / {shown}");
        }
    }
    // The window table: number, end request, category, line size, write policy.
    for window in windows {
        let line_kib = window["line_bytes"].as_u64().unwrap() / 1024;
        let row = format!(
            "{} {} {} {line_kib}KiB {}",
            window["index"],
            window["requests"],
            window["category"].as_str().unwrap(),
            window["write_policy"].as_str().unwrap()
        );
        assert!(
            text.lines().any(|l| l
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .starts_with(&row)),
            "no window row {row:?} in\n{text}"
        );
    }
    // A load balancer's totals, as its summary line gives them.
    let lbica = [&sim[..], &["--timing", "--adapt", "lbica"]].concat();
    let text = stdout(&run_ok(&lbica));
    let json = run_json(&[&lbica[..], &["--json", "-"]].concat());
    let adapt = &json["runs"][0]["adapt"];
    let rows = adapt["rows"].as_array().unwrap();
    assert_eq!(
        adapt["switches"],
        rows.iter().filter(|r| r["changed"] == true).count()
    );
    let mut summary = format!(
        ": {} switches, {} requests bypassed; intervals by policy:",
        adapt["switches"], adapt["bypassed"]
    );
    let mut counted = 0;
    for p in adapt["intervals_by_policy"].as_array().unwrap() {
        let n = p["intervals"].as_u64().unwrap();
        counted += n;
        summary += &format!(
            " {} {:.1} %",
            p["policy"].as_str().unwrap(),
            n as f64 * 100.0 / rows.len() as f64
        );
    }
    assert_eq!(counted, rows.len() as u64);
    assert!(text.contains(&summary), "{summary} not in\n{text}");
}

/// `lab run --shard auto` takes its slice from a Slurm array task or a
/// Kubernetes Indexed Job's pod, as the examples in examples/cluster/ run
/// it; the slices merged equal one run.
#[test]
fn lab_shards_come_from_slurm_and_kubernetes_environments() {
    let (dir, experiment) = sample_experiment("lab-auto", "[[workload]]\nname = \"sample\"\ntrace = \"{trace}\"\nformat = \"arc\"\n\n[grid]\npolicy = [\"lru\", \"arc\"]\ncache_size = [\"64\", \"512\"]\n");
    let e = experiment.to_str().unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    run_ok(&["lab", "run", e, "--out", &path("whole.jsonl"), "--threads", "1"]);
    let slurm_array: &[(&str, &str)] = &[("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "3")];
    let scheduler_env = [("slurm", slurm_array, "auto"), ("k8s", &[][..], "auto:3")];
    for (name, fixed, flag) in scheduler_env {
        let mut parts = Vec::new();
        for i in 0..3usize {
            let out = path(&format!("{name}{i}.jsonl"));
            let mut command = Command::new(env!("CARGO_BIN_EXE_iocache"));
            command
                .args(["lab", "run", e, "--shard", flag, "--out", &out, "--threads", "1"])
                .env_remove("SLURM_ARRAY_TASK_ID")
                .env_remove("JOB_COMPLETION_INDEX");
            for (k, v) in fixed {
                command.env(k, v);
            }
            match name {
                "slurm" => command.env("SLURM_ARRAY_TASK_ID", (i + 1).to_string()),
                _ => command.env("JOB_COMPLETION_INDEX", i.to_string()),
            };
            let o = command.output().unwrap();
            assert!(o.status.success(), "{name} {i}: {}", stderr(&o));
            assert!(
                stderr(&o).contains(&format!("shard {i}/3 from")),
                "{}",
                stderr(&o)
            );
            parts.push(out);
        }
        let merged = path(&format!("{name}-merged.jsonl"));
        let mut args = vec!["lab", "merge"];
        args.extend(parts.iter().map(String::as_str));
        args.extend(["-o", &merged]);
        run_ok(&args);
        assert_eq!(
            json_lines(std::path::Path::new(&merged)),
            json_lines(std::path::Path::new(&path("whole.jsonl"))),
            "{name}"
        );
    }
    // Outside a scheduler: refused, naming both.
    let o = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .args(["lab", "run", e, "--shard", "auto", "--out", &path("none.jsonl")])
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("SLURM_ARRAY_TASK_ID") && stderr(&o).contains("JOB_COMPLETION_INDEX"),
        "{}",
        stderr(&o)
    );
}

/// `sim --csv` writes one row per run, in the reading order and with the
/// columns of `lab run --csv`, its numbers those of `--json`.
#[test]
fn sim_csv_has_a_row_per_run_with_the_lab_columns() {
    let dir = temp_dir("sim-csv");
    let csv = dir.join("runs.csv");
    let csv_text = csv.display().to_string();
    let json = sim_json(
        SAMPLE,
        &[
            "--policy",
            "lru,arc",
            "--cache-size",
            "256,1024",
            "--csv",
            &csv_text,
        ],
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        header[..4],
        ["workload", "target", "policy", "cache_size"],
        "{header:?}"
    );
    let column = |name: &str| header.iter().position(|c| *c == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(rows.len(), runs.len());
    for (row, run) in rows.iter().zip(runs) {
        assert_eq!(row[column("policy")], run["policy"].as_str().unwrap());
        assert_eq!(row[column("cache_size")], run["cache_size"].as_str().unwrap());
        assert_eq!(
            row[column("hit_ratio")].parse::<f64>().unwrap(),
            run["hit_ratio"].as_f64().unwrap()
        );
        assert_eq!(row[column("hits")], run["hits"].to_string());
    }
    fails_saying(
        &["sim", "--trace", SAMPLE, "--csv", "-"],
        &["--csv -: give a file name"],
    );
}

/// `trace mrc --method mini:RATE --policy P,Q`: at rate 1 a miniature
/// curve is the full simulation, point for point, for any policy (and
/// LRU's is the exact curve); sampled, LRU's is compared with exact.
#[test]
fn miniature_curves_of_any_policy_equal_full_simulations_at_rate_one() {
    let json = mrc_json(
        SAMPLE,
        &[
            "--method",
            "exact,mini:1,mini:0.5",
            "--policy",
            "lru,arc,s3fifo",
            "--sizes",
            "64,1000,5000",
        ],
    );
    let curves = json["curves"].as_array().unwrap();
    let curve = |method: &str| {
        curves
            .iter()
            .find(|c| c["method"] == method)
            .unwrap_or_else(|| panic!("no {method} in {json}"))
    };
    for policy in ["lru", "arc", "s3fifo"] {
        let mini = curve(&format!("mini:1 {policy}"));
        assert_eq!(mini["policy"], policy);
        for point in mini["points"].as_array().unwrap() {
            let lines = point["cache_lines"].to_string();
            let sim = sim_json(SAMPLE, &["--policy", policy, "--cache-size", &lines]);
            let miss = 1.0 - sim["runs"][0]["hit_ratio"].as_f64().unwrap();
            let got = point["miss_ratio"].as_f64().unwrap();
            assert!(
                (got - miss).abs() < 1e-12,
                "{policy} at {lines}: mini {got}, sim {miss}"
            );
        }
    }
    assert_eq!(curve("mini:1 lru")["max_error_vs_exact"].as_f64(), Some(0.0));
    assert!(curve("mini:0.5 lru")["mean_error_vs_exact"].as_f64().is_some());
    // Only LRU's miniature estimates the exact (LRU) curve.
    assert!(curve("mini:0.5 arc").get("max_error_vs_exact").is_none());
    fails_saying(
        &["trace", "mrc", SAMPLE, "--method", "mini:0"],
        &["mini:RATE", "at most 1"],
    );
}

/// Ordered write-back is refused, naming both, beside a controller that
/// changes write policies on its own, and beside write-through.
#[test]
fn ordered_write_back_names_what_it_is_not_combined_with() {
    let dir = temp_dir("ordered");
    let backend = dir.join("b.img");
    let cache = dir.join("c.img");
    let base = [
        "serve",
        "--backend",
        backend.to_str().unwrap(),
        "--backend-size",
        "16MiB",
        "--cache",
        cache.to_str().unwrap(),
        "--cache-size",
        "4MiB",
        "--init",
        "--force",
        "--ordered-write-back",
    ];
    let with = |more: &[&'static str]| {
        base.iter()
            .copied()
            .chain(more.iter().copied())
            .collect::<Vec<_>>()
    };
    fails_saying(
        &with(&["--adapt", "reca"]),
        &["--ordered-write-back: not combined with --adapt"],
    );
    fails_saying(
        &with(&["--write-policy", "wt"]),
        &["ordered_write_back with write_policy wt", "use wb or wo"],
    );
}

/// `lab reca-table`: every category's reference workload measured and
/// nearest its own category in the built-in table; `--toml` prints the
/// table's keys, the six class shares summing to 1.
#[test]
fn lab_reca_table_measures_each_category_on_its_reference_workload() {
    let text = stdout(&run_ok(&["lab", "reca-table", "--requests", "2000"]));
    let measured: Vec<&str> = text
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("measured"))
        .collect();
    assert_eq!(measured.len(), 5, "{text}");
    for line in measured {
        let name = line.split_whitespace().next().unwrap();
        // The nearest category is printed after the vector: its own.
        assert!(line.contains(&format!("  {name} (")), "{text}");
    }
    let toml = stdout(&run_ok(&["lab", "reca-table", "--requests", "2000", "--toml"]));
    for block in toml.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let shares: f64 = block
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("overlapped"))
            .map(|l| l.split(" = ").nth(1).unwrap().parse::<f64>().unwrap())
            .sum();
        assert!((shares - 1.0).abs() < 1e-9, "{block}");
    }
    fails_saying(&["lab", "reca-table", "--requests", "0"], &["--requests"]);
}
