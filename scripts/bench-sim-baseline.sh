#!/usr/bin/env bash
# The simulator against a minimal C LRU loop (not run by
# CI; results go in docs/results/sim-bench.md).
#
# 1. Side by side, alternating in the same run, RUNS times each (default 5):
#      - scripts/bench/lru-baseline.c (gcc -O2): a hash map and a linked list,
#        counting hits only;
#      - iocache sim --policy lru   --cache-size 131072 --line-size 512B --threads 1
#      - iocache sim --policy arc   (same, for reference)
#      - the policies in POLICIES besides (default: fifo clock s3fifo 2q)
#    on the ARC trace P2. Both read the same decompressed text (zstd -dc into
#    a temporary file first, in /dev/shm when it exists): parsing is included
#    in both, decompression in neither. Wall time is measured around each
#    process (python3 time.perf_counter), and its CPU time (user + sys, from
#    the children's rusage): on a shared machine CPU time is the steadier
#    figure. The C loop must report the same hit count as iocache's LRU, or
#    the script stops.
# 2. A 16-configuration sweep in one pass (--policy lru,arc,fifo,clock
#    --cache-size 32768,131072 --line-size 512B,4KiB) with --threads 1, 2
#    and all cores: line accesses of all 16 caches per second of wall time
#    (and the process's CPU time).
#
# With BEFORE_BIN=path/to/another/iocache (say, a build of an earlier
# commit), that binary's runs of every policy join the same alternation and
# tables, as "before", each next to the same policy's run (the two in turn
# first), and the tables add the paired speed-up (before / after, per round).
#
# Usage: scripts/bench-sim-baseline.sh   (TRACE=path RUNS=n SWEEP_RUNS=n
#        BEFORE_BIN=path POLICIES="fifo clock ..."; CARGO_TARGET_DIR honoured)
# Needs: cargo, gcc, zstd, python3.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/benchlib.sh

TRACE=${TRACE:-../shared/traces/arc-P2.lis.zst}
RUNS=${RUNS:-5}
SWEEP_RUNS=${SWEEP_RUNS:-3}
POLICIES=${POLICIES:-fifo clock s3fifo 2q}
TARGET=${CARGO_TARGET_DIR:-./target}
BIN=$TARGET/release/iocache

need_trace "$TRACE"
need_tools gcc zstd python3 cargo

SCRATCH=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && SCRATCH=/dev/shm
WORK=$(mktemp -d "$SCRATCH/iocache-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

echo "==> building (release) and compiling the C baseline (gcc -O2)" >&2
cargo build --release --locked -p iocache >&2
gcc -O2 -o "$WORK/lru-baseline" scripts/bench/lru-baseline.c
zstd -dcqf "$TRACE" >"$WORK/trace.lis"

python3 - "$WORK" "$BIN" "$RUNS" "$SWEEP_RUNS" "$TRACE" "${BEFORE_BIN:-}" "$POLICIES" <<'PY'
import json, os, statistics, subprocess, sys, time

work, binary, runs, sweep_runs, trace_name, before = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
extra_policies = sys.argv[7].split()
trace = os.path.join(work, "trace.lis")

def timed(argv, stdin=None):
    """Runs argv; returns its wall time, its CPU time (user + sys) and its stdout."""
    started, cpu_before = time.perf_counter(), os.times()
    out = subprocess.run(argv, stdin=stdin, stdout=subprocess.PIPE, check=True).stdout
    wall, cpu_after = time.perf_counter() - started, os.times()
    cpu = (cpu_after.children_user - cpu_before.children_user) + (cpu_after.children_system - cpu_before.children_system)
    return wall, cpu, out

def run_c():
    with open(trace, "rb") as f:
        wall, cpu, out = timed([os.path.join(work, "lru-baseline"), "131072"], stdin=f)
    fields = dict(line.split() for line in out.decode().splitlines())
    return wall, cpu, int(fields["accesses"]), int(fields["hits"])

def run_sim(policies, sizes, line_sizes, threads, program=binary):
    out_json = os.path.join(work, "sim.json")
    wall, cpu, _ = timed([program, "sim", "--trace", trace, "--format", "arc", "--policy", policies,
                          "--cache-size", sizes, "--line-size", line_sizes, "--threads", str(threads),
                          "--json", out_json])
    report = json.load(open(out_json))
    return wall, cpu, report["runs"]

print("## Simulator vs a minimal C LRU loop\n")
print(f"- commit: {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}")
print(f"- {subprocess.run(['rustc', '--version'], capture_output=True, text=True).stdout.strip()}; {subprocess.run(['gcc', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}")
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), 'unknown')
print(f"- CPU: {cpu}, {os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.1f}")
print(f"- trace: {trace_name}, decompressed first (parsing included, decompression excluded)")
print()

policies = ["lru", "arc"] + extra_policies
# Each policy's before run (if any) is next to its own run, the two in
# turn first, so that the paired speed-up compares runs seconds apart
# (this machine's memory speed changes from one minute to the next).
programs = [(policy, binary, policy) for policy in policies]
rows = {"c-lru": [], **{name: [] for name, _, _ in programs}}
if before:
    rows.update({f"before-{policy}": [] for policy in policies})
for i in range(runs):
    wall, cpu, accesses, hits = run_c()
    rows["c-lru"].append((wall, cpu, accesses, hits))
    for policy in policies:
        pair = [(policy, binary)] + ([(f"before-{policy}", before)] if before else [])
        for name, program in pair if i % 2 == 0 else reversed(pair):
            wall, cpu, results = run_sim(policy, "131072", "512B", 1, program)
            r = results[0]
            rows[name].append((wall, cpu, r["accesses"], r["hits"]))
    print(f"    run {i + 1}: C {rows['c-lru'][-1][0]:.3f} s, iocache lru {rows['lru'][-1][0]:.3f} s, "
          f"arc {rows['arc'][-1][0]:.3f} s", file=sys.stderr)

c_hits, sim_hits = rows["c-lru"][0][3], rows["lru"][0][3]
if c_hits != sim_hits or rows["c-lru"][0][2] != rows["lru"][0][2]:
    sys.exit(f"error: the C loop counted {c_hits} hits, iocache's LRU {sim_hits}: not like for like")

print("One cache of 131,072 lines x 512 B, one core (`--threads 1`), wall and CPU (user + sys) time of the whole process.")
print(f"Each round runs C, then iocache with each policy ({', '.join(policies)}){', each next to the before build (which goes first every other round)' if before else ''}. "
      "Ratio = iocache accesses/s / C accesses/s: medians, and min..max of per-run ratios against the C run of the same round."
      + (" Speed-up vs before: the before run's wall time / this run's, per round (paired), median (min..max)." if before else "") + "\n")
print("| program | accesses | hits | hit ratio | wall s (median) | wall s (min..max) | CPU s (median) | M accesses/s (wall) | ratio to C, wall | ratio to C, CPU |" + (" speed-up vs before |" if before else ""))
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if before else ""))
c_wall = statistics.median(w for w, _, _, _ in rows["c-lru"])
c_cpu = statistics.median(c for _, c, _, _ in rows["c-lru"])
labels = [("c-lru", "C LRU baseline")] + [(p, f"iocache sim, {p}") for p in policies]
if before:
    labels += [(f"before-{p}", f"iocache sim, {p}, before") for p in policies]
for name, label in labels:
    walls = [w for w, _, _, _ in rows[name]]
    cpus = [c for _, c, _, _ in rows[name]]
    accesses, hits = rows[name][0][2], rows[name][0][3]
    med, cpu_med = statistics.median(walls), statistics.median(cpus)
    per_run = [c[0] / w for c, w in zip(rows["c-lru"], walls)]
    per_run_cpu = [c[1] / max(x, 1e-9) for c, x in zip(rows["c-lru"], cpus)]
    if name == "c-lru":
        ratio, ratio_cpu = "1", "1"
    else:
        ratio = f"{c_wall / med:.2f} ({min(per_run):.2f}..{max(per_run):.2f})"
        ratio_cpu = f"{c_cpu / cpu_med:.2f} ({min(per_run_cpu):.2f}..{max(per_run_cpu):.2f})"
    paired = ""
    if before:
        if name in policies:
            speed = [b[0] / w for b, w in zip(rows[f"before-{name}"], walls)]
            paired = f" {statistics.median(speed):.2f} ({min(speed):.2f}..{max(speed):.2f}) |"
        else:
            paired = " |"
    print(f"| {label} | {accesses} | {hits} | {hits / accesses * 100:.2f} % | {med:.3f} | {min(walls):.3f}..{max(walls):.3f} | {cpu_med:.2f} | {accesses / med / 1e6:.1f} | {ratio} | {ratio_cpu} |{paired}")

print()
print("16 configurations in one pass: `--policy lru,arc,fifo,clock --cache-size 32768,131072 --line-size 512B,4KiB`;")
print(f"accesses/s = line accesses of all 16 caches / wall time (median of {sweep_runs} runs, runs alternate thread counts).\n")
threads_list = sorted({1, 2, os.cpu_count() or 1})
sweep_programs = [("", binary)] + ([("before", before)] if before else [])
sweep = {(p, t): [] for p, _ in sweep_programs for t in threads_list}
for _ in range(sweep_runs):
    for p, program in sweep_programs:
        for t in threads_list:
            wall, cpu, results = run_sim("lru,arc,fifo,clock", "32768,131072", "512B,4KiB", t, program)
            assert len(results) == 16, len(results)
            sweep[(p, t)].append((wall, sum(r["accesses"] for r in results), cpu))
            print(f"    sweep {p} --threads {t}: {wall:.2f} s", file=sys.stderr)
print("| program | --threads | configurations | accesses (all caches) | wall s (median) | wall s (min..max) | CPU s (median) | M accesses/s | speed-up vs 1 thread |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for p, _ in sweep_programs:
    base = statistics.median(w for w, _, _ in sweep[(p, 1)])
    for t in threads_list:
        walls = [w for w, _, _ in sweep[(p, t)]]
        med = statistics.median(walls)
        cpu_med = statistics.median(c for _, _, c in sweep[(p, t)])
        acc = sweep[(p, t)][0][1]
        label = f"{t} (all)" if t == os.cpu_count() else str(t)
        print(f"| iocache sim{', ' + p if p else ''} | {label} | 16 | {acc} | {med:.2f} | {min(walls):.2f}..{max(walls):.2f} | {cpu_med:.2f} | {acc / med / 1e6:.1f} | {base / med:.2f} |")
PY
