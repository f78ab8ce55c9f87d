#!/usr/bin/env bash
# The engine's cache-hit path without NBD against the raw cache file, read
# with the same method (psync, 4 KiB random reads) and the same number of
# threads, alternating runs so both see the same machine state.
#
# This machine's speed drifts by tens of percent from one run to the next
# (other guests on the host), so each configuration alternates short runs of
# both and the summary gives medians, the median of the paired ratios and the
# share of pairs at or above 0.8.
#
# usage: scripts/bench-hitpath.sh [RUNS] [SECONDS]
# Needs root for the noatime tmpfs mount (skipped otherwise) and fio.
# Environment: JOBS (default "1 2"), HOT_MIB (default "128 16"), POLICY (lru).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
seconds=${2:-4}
jobs_list=${JOBS:-"1 2"}
hot_list=${HOT_MIB:-"128 16"}
policy=${POLICY:-lru}
cache_bytes=$((256 << 20))
cargo build --release -q -p iocache-engine --example loadgen
loadgen=target/release/examples/loadgen

dirs=("/dev/shm")
if [ "$(id -u)" = 0 ]; then
    mkdir -p /mnt/iocache-noatime
    mountpoint -q /mnt/iocache-noatime ||
        mount -t tmpfs -o noatime,size=400m tmpfs /mnt/iocache-noatime
    dirs+=("/mnt/iocache-noatime")
else
    echo "not root: skipping the noatime tmpfs" >&2
fi

summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
printf '| cache file on | hot set | jobs | run | engine IOPS | fio IOPS | ratio |\n'
printf '|---|---:|---:|---:|---:|---:|---:|\n'
for dir in "${dirs[@]}"; do
    file=$dir/iocache-hitpath.img
    # Write every byte of the file first: fio reads the file's first HOT
    # bytes, and in a sparse file it would read holes (the kernel copies its
    # zero page, which is always in the CPU caches), not data pages like the
    # engine's slots.
    rm -f "$file"
    fio --name=fill --ioengine=psync --rw=write --bs=1m --filename="$file" \
        --size=$((cache_bytes + (32 << 20))) --output-format=terse >/dev/null
    for hot in $hot_list; do
        for jobs in $jobs_list; do
            for run in $(seq 1 "$runs"); do
                engine=$($loadgen "$file" $cache_bytes $((hot << 20)) "$jobs" "$seconds" fine 0 psync "$policy" |
                    sed -n 's/.* iops=\([0-9]*\).*/\1/p')
                raw=$(fio --name=raw --ioengine=psync --rw=randread --bs=4k --numjobs="$jobs" \
                    --group_reporting --filename="$file" --size=${hot}m --time_based \
                    --runtime="$seconds" --output-format=json |
                    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')
                ratio=$(python3 -c "print(f'{$engine/$raw:.2f}')")
                printf '| %s | %s MiB | %s | %s | %s | %s | %s |\n' "$dir" "$hot" "$jobs" "$run" "$engine" "$raw" "$ratio"
                printf '%s %s %s %s %s\n' "$dir" "$hot" "$jobs" "$engine" "$raw" >>"$summary"
            done
        done
    done
    rm -f "$file"
done

echo
python3 - "$summary" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    d, hot, jobs, engine, raw = line.split()
    rows.setdefault((d, hot, jobs), []).append((int(engine), int(raw)))
print("| cache file on | hot set | jobs | pairs | engine IOPS (median) | fio IOPS (median) | ratio (median of pairs) | pairs >= 0.8 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for (d, hot, jobs), pairs in rows.items():
    ratios = [e / r for e, r in pairs]
    print(f"| {d} | {hot} MiB | {jobs} | {len(pairs)} | {statistics.median(e for e, _ in pairs):,.0f} "
          f"| {statistics.median(r for _, r in pairs):,.0f} | {statistics.median(ratios):.2f} "
          f"| {sum(x >= 0.8 for x in ratios)} of {len(ratios)} |")
PY
