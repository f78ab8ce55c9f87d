#!/usr/bin/env bash
# The cost of the commit interval on writes that are never flushed: fio's
# nbd engine, 4 KiB random writes at QD 16 and 64 KiB sequential writes at
# QD 4 over 256 MiB, write-back, cache file in /dev/shm, backend a sparse
# 1 GiB file in /var/tmp; `--commit-interval 1s` (the default) and `0s`
# alternated, ROUNDS rounds of SECONDS s. Prints IOPS or MB/s with the
# barriers, intents and intent flushes each run took. Not run by CI; the
# results are in docs/results/durability.md.
#
# Usage: scripts/bench-commit-interval.sh [SECONDS] [ROUNDS]   (from the repository's root)
set -euo pipefail
. scripts/benchlib.sh
need_tools fio
SECONDS_PER_RUN=${1:-8}
ROUNDS=${2:-3}
BIN=$PWD/target/release/iocache
W=/dev/shm/iocache-bench-commit
BACKEND=/var/tmp/iocache-bench-commit.img
trap 'rm -rf "$W" "$BACKEND"' EXIT

run() { # INTERVAL FIO-ARGS...: one server, one fio run, one line
    local interval=$1
    shift
    rm -rf "$W" "$BACKEND"
    mkdir -p "$W"
    truncate -s 1G "$BACKEND"
    (cd "$W" && exec "$BIN" serve --init --backend "$BACKEND" --cache "$W/cache.img" --cache-size 512MiB \
        --write-policy wb --commit-interval "$interval" --socket "$W/s.sock" >/dev/null 2>&1) &
    local pid=$!
    for _ in $(seq 100); do [[ -S $W/s.sock ]] && break; sleep 0.1; done
    sleep 0.3
    local result
    result=$(fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$W/s.sock" --size=256M --time_based \
        --runtime="$SECONDS_PER_RUN" --output-format=json "$@" 2>/dev/null | sed -n '/^{/,$p' |
        python3 -c 'import json,sys; w=json.load(sys.stdin)["jobs"][0]["write"]; print("%.0f IOPS, %.0f MB/s" % (w["iops"], w["bw_bytes"] / 1e6))')
    local meta
    meta=$("$BIN" stats --admin-socket "$W/iocache-data/admin.sock" --json |
        python3 -c 'import json,sys; v=json.load(sys.stdin)["volumes"][0]; print("%d barriers, %d intents, %d intent flushes" % (v["barriers"], v["intents_written"], v["intent_flushes"]))')
    kill "$pid"
    wait "$pid" || true
    echo "$result; $meta"
}

for workload in "--rw=randwrite --bs=4k --iodepth=16" "--rw=write --bs=64k --iodepth=4"; do
    for round in $(seq "$ROUNDS"); do
        for interval in 1s 0s; do
            # shellcheck disable=SC2086
            echo "$workload, round $round, --commit-interval $interval: $(run "$interval" $workload)"
        done
    done
done
