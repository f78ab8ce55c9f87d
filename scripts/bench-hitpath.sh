#!/usr/bin/env bash
# The engine's cache-hit path without NBD against the raw cache file, read
# with the same method (psync, 4 KiB random reads) and the same number of
# threads, alternating runs so both see the same machine state.
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
            done
        done
    done
    rm -f "$file"
done
