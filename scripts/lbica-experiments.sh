#!/bin/sh
# The experiments of docs/results/lbica.md: WB vs SIB vs LBICA on burst
# workloads in the simulator. Usage:
#
#   export CARGO_TARGET_DIR=...   (where the release binaries are)
#   cargo build --release --bin iocache && cargo build --release -p iocache-sim --example burst_trace
#   scripts/lbica-experiments.sh [OUT_DIR]
#
# Writes, per run, NAME.txt (the table), NAME.json (with the controller
# rows) and NAME.csv (the series joined with the controller rows), and
# prints one summary line per run (scripts/lbica-summary.py).
set -eu
OUT=${1:-/tmp/lbica-results}
T=${CARGO_TARGET_DIR:-target}/release
B=$T/iocache
G=$T/examples/burst_trace
HERE=$(cd "$(dirname "$0")" && pwd)
TRACES=${TRACES:-/work/shared/traces}
mkdir -p "$OUT"
cd "$OUT"

# A SATA SSD (ReCA Table 1: 20k/30k IOPS, one server) over 128 of ReCA's
# 7.2K disks, each with its own 120 MB/s channel (the preset's channel
# time divided by 128).
CACHE=ssd
ARRAY=hdd:servers=128:read-kib=67:write-kib=67

# Five bursts of 1 s after 2 s quiet (1000 requests/s, 70 % reads, 90 % to
# a 64 MiB hot set read once at the start: 256 warm-up requests).
gen() {
    name=$1
    shift
    "$G" --phase 2s@1000:read=0.7:hot=0.9 "$@" --repeat 5 --hot-lines 16384 --cold-lines 4194304 \
        >"$name.disksim" 2>/dev/null
}
gen rr --phase 1s@25000:read=0.95:hot=0.7  # random read: hits and promotions
gen mx --phase 1s@25000:read=0.5:hot=0.95  # mixed read-write on the hot set
gen wi --phase 1s@20000:read=0.1:hot=0.3   # write-intensive, mostly cold: W and E
gen hh --phase 1s@25000:read=0.98:hot=0.995 # read hits

# run NAME TRACE WARMUP CACHE BACKEND INTERVAL [extra flags]: WB, SIB over
# WT and over WO, LBICA over WB, and LBICA without our two extensions
# (no tail bypass for unclassified queues, no back-off).
run() {
    name=$1 trace=$2 warmup=$3 cache=$4 backend=$5 interval=$6
    shift 6
    for cfg in "wb|--write-policy wb --adapt observe" \
        "sib-wt|--write-policy wt --adapt sib" \
        "sib-wo|--write-policy wo --adapt sib" \
        "lbica|--write-policy wb --adapt lbica${LBICA:-}" \
        "lbica-paper|--write-policy wb --adapt lbica:other=none:backoff=0${LBICA:-}"; do
        label=${cfg%%|*}
        # shellcheck disable=SC2086
        "$B" sim --trace "$trace" --cache-size 32768 --warmup "$warmup" --threads 1 \
            --cache-device "$cache" --backend-device "$backend" \
            --series-interval "$interval" --series "$name-$label.csv" --json "$name-$label.json" \
            ${cfg#*|} "$@" >"$name-$label.txt"
        python3 "$HERE/lbica-summary.py" "$name-$label.json" "$name-$label"
    done
}

for w in rr mx wi hh; do
    run "$w" "$w.disksim" 256 "$CACHE" "$ARRAY" 100ms
done
# Sensitivity: the bottleneck test's floor at one backend service.
LBICA=:floor=1 run mx-floor1 mx.disksim 256 "$CACHE" "$ARRAY" 100ms
# The paper's kind of pair: a SATA SSD over 16 disks, read hits at 120k/s.
"$G" --phase 2s@500:read=0.95:hot=0.995 --phase 1s@120000:read=0.95:hot=0.995 --repeat 5 \
    --hot-lines 16384 --cold-lines 4194304 >hot16.disksim 2>/dev/null
run hot16 hot16.disksim 256 sata-ssd hdd:servers=16:read-kib=533:write-kib=533 100ms
# The TPC-C sample at a quarter, half and full speed.
for speed in 0.25 0.5 1; do
    run "tpcc-x$speed" "$TRACES/tpcc-small.disksim" 0 "$CACHE" "$ARRAY" 10ms --speed "$speed"
done
