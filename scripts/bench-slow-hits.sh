#!/usr/bin/env bash
# Hits on a cache device slower than memory, one NBD connection: 4 KiB
# random reads of a 64 MiB set read once (so every read hits) through
# `iocache serve --slow-cache LAT:servers=N` (a device that takes LAT per
# I/O and serves N at once, as an NVMe drive does), at several queue
# depths. With BASELINE set to another build, both binaries run each
# point, alternated, ROUNDS times; prints one line per run.
#
# usage: scripts/bench-slow-hits.sh [SECONDS]
# Environment: IOCACHE (default $CARGO_TARGET_DIR/release/iocache),
# BASELINE (another binary; optional), CACHE_DELAY (100us:servers=64),
# DEPTHS ("1 4 16 32"), ROUNDS (2), SERVE_ARGS (more `serve` options, e.g.
# "--threads-per-connection 16").
# Needs fio with the nbd engine.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/benchlib.sh
seconds=${1:-8}
bin=${IOCACHE:-${CARGO_TARGET_DIR:-target}/release/iocache}
cache_delay=${CACHE_DELAY:-100us:servers=64}
depths=${DEPTHS:-"1 4 16 32"}
rounds=${ROUNDS:-2}
bins=("$bin")
[ -n "${BASELINE:-}" ] && bins+=("$BASELINE")
dir=$(mktemp -d /dev/shm/slow-hits.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
fio_run() { # RW SIZE [extra fio args...]
    local rw=$1 size=$2
    shift 2
    fio --name=hits --ioengine=nbd --uri="nbd+unix:///iocache?socket=$dir/iocache.sock" \
        --rw="$rw" --size="$size" "$@" --output-format=json --output="$dir/fio.json" >/dev/null
    cat "$dir/fio.json"
}
for round in $(seq 1 "$rounds"); do
    for b in "${bins[@]}"; do
        rm -f "$dir"/*.img "$dir"/*.sock
        truncate -s 1G "$dir/backend.img"
        "$b" serve --backend "$dir/backend.img" --cache "$dir/cache.img" --cache-size 256MiB --init \
            --socket "$dir/iocache.sock" --admin-socket "$dir/admin.sock" \
            --slow-cache "$cache_delay" ${SERVE_ARGS:-} >/dev/null 2>"$dir/serve.log" &
        serve_pid=$!
        wait_for "$dir/admin.sock"
        wait_for "$dir/iocache.sock"
        fio_run read 64m --bs=1m --iodepth=4 >/dev/null
        for qd in $depths; do
            fio_run randread 64m --bs=4k --iodepth="$qd" --time_based --runtime="$seconds" |
                python3 -c '
import json, sys
r = json.load(sys.stdin)["jobs"][0]["read"]
iops, mean_us = r["iops"], r["lat_ns"]["mean"] / 1e3
print(f"round {sys.argv[1]}  {sys.argv[2]:<24}  QD {int(sys.argv[3]):>2}  iops {iops:9.0f}  mean {mean_us:7.0f} us")
' "$round" "$b" "$qd"
        done
        kill -TERM "$serve_pid"
        wait "$serve_pid" || true
    done
done
