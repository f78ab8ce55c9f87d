#!/usr/bin/env bash
# The simulator benchmark (not run by CI; results go in docs/results/sim-bench.md).
#
# On the ARC paper's trace P2, for LRU and ARC at 131072 lines x 512 B, runs
#   iocache sim --threads 1 --json ...
# RUNS times (default 3) under /usr/bin/time -v and reports per run:
#   - accesses/s inside the cache decisions (runs[0].accesses_per_second of
#     the JSON: time spent in Cache::access only),
#   - accesses/s end to end (accesses / wall time of the whole process,
#     decompression and parsing included),
#   - peak RSS (time -v's "Maximum resident set size").
# Then a memory-vs-trace-length check: the decompressed trace once and four
# times over, run with LRU, to show that peak RSS does not grow with trace
# length.
#
# Usage: scripts/bench-sim.sh            (TRACE=path RUNS=n to override)
# Needs: cargo, GNU time (/usr/bin/time), zstd, python3.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/benchlib.sh

TRACE=${TRACE:-../shared/traces/arc-P2.lis.zst}
RUNS=${RUNS:-3}
LINES=131072
LINE_SIZE=512
BIN=./target/release/iocache

if [[ ! -f "$TRACE" ]]; then
    echo "error: trace $TRACE not found." >&2
    echo "It is the ARC paper's trace P2, kept in shared/traces/ beside the checkout" >&2
    echo "(see shared/traces/README.md); set TRACE=/path/to/arc-P2.lis.zst to use another copy." >&2
    exit 1
fi
need_tools --hint " (GNU time: apt-get install time; zstd: apt-get install zstd)" /usr/bin/time zstd python3 cargo
if ! /usr/bin/time -v true >/dev/null 2>&1; then
    echo "error: /usr/bin/time is not GNU time (no -v); apt-get install time" >&2
    exit 1
fi

WORK=$(mktemp -d /tmp/iocache-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
RESULTS=$WORK/results.tsv
: >"$RESULTS"

echo "==> building (release)"
cargo build --release --locked

# run_one LABEL POLICY TRACE [EXTRA ARGS...]: one timed run, appended to $RESULTS.
run_one() {
    local label=$1 policy=$2 trace=$3
    shift 3
    local n
    n=$(($(wc -l <"$RESULTS") + 1))
    local json=$WORK/run-$n.json time_out=$WORK/run-$n.time
    /usr/bin/time -v -o "$time_out" "$BIN" sim --trace "$trace" --policy "$policy" \
        --cache-size "$LINES" --line-size "$LINE_SIZE" --threads 1 --json "$json" "$@" >/dev/null
    python3 - "$label" "$policy" "$json" "$time_out" >>"$RESULTS" <<'EOF'
import json, sys
label, policy, json_path, time_path = sys.argv[1:5]
report = json.load(open(json_path))
run = report["runs"][0]
wall = rss_kb = None
for line in open(time_path):
    line = line.strip()
    if line.startswith("Elapsed (wall clock) time"):
        seconds = 0.0
        for part in line.rsplit(" ", 1)[1].split(":"):
            seconds = seconds * 60 + float(part)
        wall = seconds
    elif line.startswith("Maximum resident set size"):
        rss_kb = int(line.rsplit(" ", 1)[1])
if wall is None or rss_kb is None:
    sys.exit(f"could not read wall time and peak RSS from {time_path}")
print("\t".join(str(v) for v in [
    label, policy, report["trace_records"], run["accesses"], run["hit_ratio"],
    run["accesses_per_second"], run["accesses"] / wall if wall > 0 else 0.0, wall, rss_kb,
]))
EOF
    tail -n 1 "$RESULTS" | awk -F'\t' '{printf "    %-8s %-4s %.2f M acc/s in cache, %.2f M acc/s end to end, %.2f s, %.1f MiB peak RSS\n", $1, $2, $6/1e6, $7/1e6, $8, $9/1024}'
}

echo "==> speed: $TRACE, $LINES lines x $LINE_SIZE B, 1 thread, $RUNS runs per policy"
for policy in lru arc; do
    for _ in $(seq "$RUNS"); do
        run_one speed "$policy" "$TRACE"
    done
done

echo "==> memory vs trace length (LRU, plain text, --format arc)"
name=$(basename "$TRACE" .zst)
# -f passes a trace that is not zstd-compressed through unchanged.
zstd -dcqf "$TRACE" >"$WORK/p2x1.lis"
for _ in 1 2 3 4; do
    cat "$WORK/p2x1.lis"
done >"$WORK/p2x4.lis"
run_one "$name x1" lru "$WORK/p2x1.lis" --format arc
run_one "$name x4" lru "$WORK/p2x4.lis" --format arc

echo
echo "## Simulator benchmark"
echo
echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
echo "- $(rustc --version)"
echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || echo unknown), $(nproc) cores"
echo "- trace: $TRACE; cache $LINES lines x $LINE_SIZE B; --threads 1"
echo
python3 - "$RESULTS" <<'EOF'
import statistics, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
def mib(kb): return f"{int(kb) / 1024:.1f}"
def m(x): return f"{float(x) / 1e6:.2f}"

print("accesses/s in cache = runs[0].accesses_per_second (time inside Cache::access only);")
print("end to end = accesses / wall time of the whole process (decompression and parsing included).")
print()
print("| policy | run | accesses | hit ratio | M accesses/s in cache | M accesses/s end to end | wall s | peak RSS MiB |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
speed = [r for r in rows if r[0] == "speed"]
for policy in ("lru", "arc"):
    mine = [r for r in speed if r[1] == policy]
    for i, r in enumerate(mine, 1):
        print(f"| {policy} | {i} | {r[3]} | {float(r[4]) * 100:.2f} % | {m(r[5])} | {m(r[6])} | {float(r[7]):.2f} | {mib(r[8])} |")
    if mine:
        med = lambda k: statistics.median(float(r[k]) for r in mine)
        print(f"| {policy} | median | | | {m(med(5))} | {m(med(6))} | {med(7):.2f} | {mib(med(8))} |")
print()
print("Memory vs trace length (LRU, decompressed trace, same cache):")
print()
print("| trace | requests | accesses | wall s | peak RSS MiB |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    if r[0] != "speed":
        print(f"| {r[0]} | {r[2]} | {r[3]} | {float(r[7]):.2f} | {mib(r[8])} |")
EOF
