//! `iocache lab reproduce` end to end: each reproduction's `--quick` run
//! writes its figures (SVG), a `verdict.json` that parses with one of the
//! three outcomes per claim, and a `verdict.md`; without the shared traces
//! the reproductions that need them say what they skipped. The full runs
//! need `../shared/traces` (compiled as ignored, with the reason, when it
//! was absent: see build.rs); the skip test runs everywhere.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

mod common;
use common::{iocache, json_strings, run_ok, stderr, stdout, temp_dir, TestDir};

/// The arguments of `iocache lab reproduce NAME --quick [--traces TRACES]
/// --out OUT`.
fn quick_args<'a>(name: &'a str, traces: Option<&'a Path>, out: &'a Path) -> Vec<&'a str> {
    let mut args = vec!["lab", "reproduce", name, "--quick"];
    if let Some(traces) = traces {
        args.extend(["--traces", traces.to_str().unwrap()]);
    }
    args.extend(["--out", out.to_str().unwrap()]);
    args
}

/// `iocache lab reproduce NAME --quick ...` (see [`quick_args`]), which
/// must succeed.
fn reproduce_quick(name: &str, traces: Option<&Path>, out: &Path) -> Output {
    run_ok(&quick_args(name, traces, out))
}

const OUTCOMES: [&str; 4] = ["reproduced", "partially", "not", "undecided"];

/// The reproductions `all` runs.
const IN_ALL: [&str; 13] = [
    "arc-p2",
    "asplos23",
    "asplos23-flush",
    "asplos23-lookup",
    "asplos23-real",
    "icpp22",
    "systor14",
    "reca",
    "reca-policies",
    "reca-priorities",
    "reca-processes",
    "lbica",
    "lbica-setting",
];

/// Reads and checks one reproduction's directory; returns its verdict.
fn check_dir(dir: &Path, name: &str) -> Value {
    let text = std::fs::read_to_string(dir.join("verdict.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("verdict.json").display()));
    let verdict: Value = serde_json::from_str(&text).expect("verdict.json parses");
    assert_eq!(verdict["name"], name);
    let md = std::fs::read_to_string(dir.join("verdict.md")).expect("verdict.md");
    assert!(md.starts_with(&format!("# {name}")), "{md}");
    for claim in verdict["claims"].as_array().expect("claims") {
        let outcome = claim["outcome"].as_str().expect("an outcome");
        assert!(OUTCOMES.contains(&outcome), "{claim}");
        assert!(!claim["why"].as_str().unwrap_or("").is_empty(), "{claim}");
        assert!(!claim["claim"].as_str().unwrap_or("").is_empty(), "{claim}");
    }
    for figure in verdict["figures"].as_array().expect("figures") {
        let path = dir.join(figure.as_str().unwrap());
        let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(svg.trim_start().starts_with("<svg"), "{}", path.display());
        assert!(svg.trim_end().ends_with("</svg>"), "{}", path.display());
        assert!(md.contains(figure.as_str().unwrap()), "verdict.md links {figure}");
    }
    verdict
}

/// Runs one reproduction that needs no trace, quickly, in a directory of
/// its own name; checks what it wrote and returns its verdict, with the
/// directory (kept, as every test directory, when the test fails).
fn quick_verdict(name: &str) -> (TestDir, Value) {
    let out = temp_dir(name);
    reproduce_quick(name, None, &out);
    let verdict = check_dir(&out.join(name), name);
    (out, verdict)
}

#[test]
#[cfg_attr(
    not(shared_traces),
    ignore = "needs ../shared/traces beside the repository (absent when this crate was built; scripts/get-traces.sh fetches it)"
)]
fn every_quick_reproduction_writes_figures_and_a_verdict() {
    let out = temp_dir("all");
    let o = reproduce_quick("all", None, &out);
    let stdout = stdout(&o);
    for name in IN_ALL {
        let verdict = check_dir(&out.join(name), name);
        assert!(
            !verdict["claims"].as_array().unwrap().is_empty(),
            "{name}: no claim checked"
        );
        assert!(
            !verdict["figures"].as_array().unwrap().is_empty(),
            "{name}: no figure"
        );
        let outcome = verdict["outcome"].as_str().expect("an overall outcome");
        assert!(OUTCOMES.contains(&outcome));
        assert!(stdout.contains(name), "{stdout}");
    }
    // The live one is not part of `all` (it needs fio and a quiet machine).
    assert!(!out.join("asplos23-live").exists());
    // The lookup designs are also measured on the samples' own requests.
    let lookup = check_dir(&out.join("asplos23-lookup"), "asplos23-lookup");
    let on_traces = lookup["claims"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["source"].as_str().unwrap().contains("on the real traces"))
        .count();
    assert_eq!(on_traces, 2, "{lookup}");
    // The fidelity check holds at the paper's size even in a quick run.
    let arc = check_dir(&out.join("arc-p2"), "arc-p2");
    assert_eq!(arc["outcome"], "reproduced", "{arc}");
}

#[test]
fn without_the_traces_the_reproductions_say_what_they_skipped() {
    let out = temp_dir("skip");
    let empty = temp_dir("empty-traces");
    // Nothing checked: said, written, and not a pass for a script.
    let o = iocache(&quick_args("arc-p2", Some(&empty), &out));
    assert!(
        !o.status.success(),
        "a reproduction that checked nothing exited 0"
    );
    assert!(stderr(&o).contains("checked nothing: arc-p2"), "{}", stderr(&o));
    let said = stdout(&o);
    assert!(
        said.contains("skipped") && said.contains("arc-P2.lis.zst"),
        "{said}"
    );
    let verdict = check_dir(&out.join("arc-p2"), "arc-p2");
    assert!(verdict["outcome"].is_null(), "{verdict}");
    assert!(!verdict["skipped"].as_array().unwrap().is_empty());

    // The generated workloads run without them; the samples are skipped.
    reproduce_quick("icpp22", Some(&empty), &out);
    let verdict = check_dir(&out.join("icpp22"), "icpp22");
    assert!(!verdict["claims"].as_array().unwrap().is_empty());
    assert!(json_strings(&verdict["skipped"])
        .iter()
        .any(|s| s.contains("sample")));

    // So does LBICA, and its real-trace part is listed as skipped.
    reproduce_quick("lbica", Some(&empty), &out);
    let verdict = check_dir(&out.join("lbica"), "lbica");
    assert_eq!(verdict["claims"].as_array().unwrap().len(), 6, "{verdict}");
    assert!(
        verdict["skipped"]
            .to_string()
            .contains("real traces (SSD over 128 disks)"),
        "{verdict}"
    );

    let o = iocache(&["lab", "reproduce", "list"]);
    assert!(o.status.success());
    let list = stdout(&o);
    for name in IN_ALL.into_iter().chain(["asplos23-live", "all"]) {
        assert!(list.contains(name), "{list}");
    }
    let o = iocache(&["lab", "reproduce", "nosuch"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("known: arc-p2"));
}

/// The claims a verdict checked on the real traces, each in threes (the
/// cache's load against WB and against SIB, the mean latency) and after
/// those on the generated workloads.
fn real_trace_claims(verdict: &Value) -> usize {
    let claims = verdict["claims"].as_array().unwrap();
    let on_traces = claims
        .iter()
        .filter(|c| c["source"].as_str().unwrap().contains("on the real traces"))
        .count();
    assert_eq!(on_traces % 3, 0, "{verdict}");
    for claim in &claims[claims.len() - on_traces..] {
        assert!(
            claim["source"].as_str().unwrap().contains("(not in the paper)"),
            "{claim}"
        );
    }
    on_traces
}

/// LBICA needs no trace (its bursts are generated): the quick run checks
/// every claim, writes the latency and load figures, and the claim that a
/// WB cache is the bottleneck during bursts holds (it is the premise of the
/// paper and of the workloads' devices: docs/results/lbica.md).
#[test]
fn lbica_compares_wb_sib_and_lbica_under_bursts() {
    let (_out, verdict) = quick_verdict("lbica");
    let claims = verdict["claims"].as_array().unwrap();
    // The six on the burst workloads, then three on the real traces when
    // the samples are at hand.
    let on_traces = real_trace_claims(&verdict);
    assert_eq!(claims.len(), 6 + on_traces, "{verdict}");
    let figures = json_strings(&verdict["figures"]);
    for name in [
        "lbica-fig7-latency.svg",
        "lbica-fig4-5-load-rr.svg",
        "lbica-latency-hh.svg",
    ] {
        assert!(figures.contains(&name), "{figures:?}");
    }
    let bottleneck = &claims[0];
    assert!(bottleneck["claim"].as_str().unwrap().contains("bottleneck"));
    assert_eq!(bottleneck["outcome"], "reproduced", "{bottleneck}");
    // The measured numbers are in the verdict, one entry per workload and configuration.
    let setup = json_strings(&verdict["setup"])
        .into_iter()
        .find(|s| s.starts_with("measured: "))
        .expect("the measured numbers")
        .to_string();
    for case in ["rr WB:", "mx SIB over WT:", "wi SIB over WO:", "hh LBICA:"] {
        assert!(setup.contains(case), "{setup}");
    }
}

/// The paper's own setting (one SSD over one disk) and bounded clients:
/// the six claims once per setting, each naming its setting, a Fig. 7 per
/// setting, and every run's numbers in the setup.
#[test]
fn lbica_setting_checks_the_claims_over_one_disk_and_with_clients() {
    let (_out, verdict) = quick_verdict("lbica-setting");
    let claims = verdict["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 18 + real_trace_claims(&verdict), "{verdict}");
    for claim in &claims[18..] {
        assert!(claim["claim"].as_str().unwrap().contains("[here: "), "{claim}");
    }
    for (i, setting) in [
        "SSD over 128 disks, 32 clients",
        "one SSD over one disk]",
        "one SSD over one disk, 32 clients",
    ]
    .iter()
    .enumerate()
    {
        for claim in &claims[i * 6..(i + 1) * 6] {
            assert!(claim["claim"].as_str().unwrap().contains(setting), "{claim}");
        }
    }
    let figures = verdict["figures"].to_string();
    for key in ["128-disks-clients", "one-disk", "one-disk-clients"] {
        assert!(
            figures.contains(&format!("lbica-fig7-latency-{key}.svg")),
            "{figures}"
        );
    }
    let setup = verdict["setup"].to_string();
    for case in [
        "measured (one SSD over one disk): rr WB:",
        "measured (one SSD over one disk, 32 clients): rr WB:",
        "--clients 32",
        "hh LBICA:",
    ] {
        assert!(setup.contains(case), "{setup}");
    }
}

/// ReCA's Fig. 17: four claims; every mix of two categories in the first,
/// with the categories the per-process runs gave each process; the real
/// traces listed as skipped (none records processes).
#[test]
fn reca_processes_compares_global_and_per_process_characterization() {
    let out = temp_dir("reca-processes");
    reproduce_quick("reca-processes", None, &out);
    let verdict = check_dir(&out.join("reca-processes"), "reca-processes");
    let claims = verdict["claims"].as_array().unwrap();
    let all = verdict.to_string();
    assert_eq!(claims.len(), 4, "{all}");
    let mixes = claims[0]["ours"].as_str().unwrap();
    assert_eq!(mixes.matches("(whole mix: ").count(), 10, "{mixes}");
    assert!(
        mixes.contains("archival_consumers + large_file_generators"),
        "{mixes}"
    );
    assert!(
        mixes.contains("process 2: (none) -> large_file_generators (write policy wb, fills of 128KiB lines)"),
        "{mixes}"
    );
    assert!(
        verdict["skipped"].to_string().contains("records processes"),
        "{all}"
    );
    assert!(!all.contains("NaN"), "{all}");
    assert!(out.join("reca-processes/reca-fig17-processes.svg").is_file());
}

/// ReCA's Fig. 16: two claims on the reference workloads (two more on the
/// samples when at hand), a chart per category whose eviction reads
/// priorities, and every sweep in `table.md`, the idle parameters named.
#[test]
fn reca_priorities_sweeps_each_categorys_weights() {
    let out = temp_dir("reca-priorities");
    reproduce_quick("reca-priorities", None, &out);
    let dir = out.join("reca-priorities");
    let verdict = check_dir(&dir, "reca-priorities");
    let all = verdict.to_string();
    let claims = verdict["claims"].as_array().unwrap();
    let traces_absent = verdict["skipped"].to_string().contains("Fig. 16 on a real trace");
    assert_eq!(claims.len(), if traces_absent { 2 } else { 4 }, "{all}");
    for claim in claims {
        assert!(claim["ours"].as_str().unwrap().contains(" of "), "{claim}");
    }
    let figures = verdict["figures"].to_string();
    for category in [
        "random_consumers",
        "random_producer_consumers",
        "archival_consumers",
        "large_file_generators",
    ] {
        assert!(
            figures.contains(&format!("reca-fig16-{category}.svg")),
            "{figures}"
        );
    }
    assert!(figures.contains("reca-fig16-neighbours.svg"), "{figures}");
    let table = std::fs::read_to_string(dir.join("table.md")).expect("table.md");
    assert!(table.contains("**sequential_producer_consumers**"), "{table}");
    assert!(table.contains("lru eviction reads no priority"), "{table}");
    assert!(table.contains("access_priority[random]"), "{table}");
    assert!(!all.contains("NaN") && !table.contains("NaN"), "{all}");
}

/// ReCA's Figs. 13-15: seven claims, each naming its numbers; every
/// category's response times in Fig. 15's claim; the figure written.
#[test]
fn reca_policies_compares_write_policies_lines_and_architectures() {
    let out = temp_dir("reca-policies");
    reproduce_quick("reca-policies", None, &out);
    let verdict = check_dir(&out.join("reca-policies"), "reca-policies");
    let claims = verdict["claims"].as_array().unwrap();
    let all = verdict.to_string();
    // One more on the real traces, when they are at hand.
    let traces_absent = verdict["skipped"].to_string().contains("Fig. 15 on a real trace");
    assert_eq!(claims.len(), if traces_absent { 7 } else { 8 }, "{all}");
    if !traces_absent {
        let real = claims[7]["ours"].as_str().unwrap();
        assert!(
            real.contains("msr-hm0-sample.csv (") && real.contains("systor17"),
            "{real}"
        );
    }
    for category in [
        "random_consumers",
        "sequential_producer_consumers",
        "random_producer_consumers",
        "archival_consumers",
        "large_file_generators",
    ] {
        assert!(claims[0]["ours"].as_str().unwrap().contains(category), "{all}");
    }
    assert!(!all.contains("NaN"), "{all}");
    assert!(
        verdict["figures"]
            .to_string()
            .contains("reca-fig15-architectures.svg"),
        "{all}"
    );
}
