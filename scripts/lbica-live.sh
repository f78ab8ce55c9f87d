#!/usr/bin/env bash
# WB vs SIB vs LBICA live: `iocache serve` over NBD with its cache device
# saturating (the hidden --slow-cache flag: a latency per I/O through one
# server) over an nbdkit memory backend behind the delay filter (a slower
# device that serves several requests at once: 8 backend connections),
# driven by fio's nbd engine. Prints one line per run and writes the fio
# and `iocache stats` JSON of each run to OUT.
#
# usage: scripts/lbica-live.sh [OUT] [SECONDS]
# Environment: IOCACHE (the binary; default $CARGO_TARGET_DIR/release/iocache),
# CACHE_DELAY (200us:servers=1), BACKEND_DELAY (2ms), WORKLOADS ("hits misses mixed"),
# ADAPTS ("none sib sib@wt lbica": the controller, none for plain WB, @POLICY for
# another write policy than wb).
# Needs fio (with the nbd engine) and nbdkit (memory plugin, delay filter).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/benchlib.sh
out=${1:-/tmp/lbica-live}
seconds=${2:-20}
bin=${IOCACHE:-${CARGO_TARGET_DIR:-target}/release/iocache}
cache_delay=${CACHE_DELAY:-200us:servers=1}
backend_delay=${BACKEND_DELAY:-2ms}
workloads=${WORKLOADS:-"hits misses mixed"}
adapts=${ADAPTS:-"none sib sib@wt lbica"}
mkdir -p "$out"
dir=$(mktemp -d /dev/shm/lbica-live.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT


fio_run() { # NAME RW SIZE [extra fio args...]
    local name=$1 rw=$2 size=$3
    shift 3
    fio --name="$name" --ioengine=nbd --uri="nbd+unix:///iocache?socket=$dir/iocache.sock" \
        --rw="$rw" --size="$size" "$@" --output-format=json --output="$dir/fio.json" >/dev/null
    cat "$dir/fio.json"
}

for workload in $workloads; do
    for run in $adapts; do
        adapt=${run%@*}
        policy=wb
        [[ $run == *@* ]] && policy=${run#*@}
        rm -f "$dir"/*.img "$dir"/*.sock "$dir"/*.json
        nbdkit -f -U "$dir/backend.sock" --filter=delay memory 1G \
            rdelay="$backend_delay" wdelay="$backend_delay" &
        nbdkit_pid=$!
        wait_for "$dir/backend.sock"
        adapt_args=()
        [ "$adapt" != none ] && adapt_args=(--adapt "$adapt")
        adapt=$run
        "$bin" serve --backend "nbd+unix:///?socket=$dir/backend.sock" \
            --cache "$dir/cache.img" --cache-size 256MiB --init \
            --socket "$dir/iocache.sock" --admin-socket "$dir/admin.sock" \
            --write-policy "$policy" --slow-cache "$cache_delay" "${adapt_args[@]}" >/dev/null 2>"$out/$workload-$adapt.log" &
        serve_pid=$!
        wait_for "$dir/admin.sock"
        wait_for "$dir/iocache.sock"
        case $workload in
        hits) # a 64 MiB hot set read once (cached), then 4 KiB random reads of it
            fio_run warm read 64m --bs=1m --iodepth=4 >/dev/null
            args=(randread 64m) ;;
        misses) # 4 KiB random reads of 1 GiB through the 256 MiB cache
            args=(randread 1g) ;;
        mixed) # the hot set written once, then half reads, half writes of it
            fio_run warm write 64m --bs=1m --iodepth=4 >/dev/null
            args=(randrw 64m --rwmixread=50) ;;
        esac
        fio_run "$workload" "${args[@]}" --bs=4k --numjobs=8 --iodepth=4 --group_reporting \
            --time_based --runtime="$seconds" >"$out/$workload-$adapt.json"
        "$bin" stats --admin-socket "$dir/admin.sock" --json >"$out/$workload-$adapt.stats.json"
        kill -TERM "$serve_pid"
        wait "$serve_pid" || true
        kill -TERM "$nbdkit_pid"
        wait "$nbdkit_pid" || true
        python3 - "$out/$workload-$adapt.json" "$out/$workload-$adapt.stats.json" "$workload" "$adapt" <<'EOF'
import json, sys
fio = json.load(open(sys.argv[1]))["jobs"][0]
stats = json.load(open(sys.argv[2]))["volumes"][0]
iops, lat_sum, n, p99, p999 = 0.0, 0.0, 0, 0.0, 0.0
for kind in ("read", "write"):
    k = fio[kind]
    if k["total_ios"] == 0:
        continue
    iops += k["iops"]
    lat_sum += k["lat_ns"]["mean"] * k["total_ios"]
    n += k["total_ios"]
    pct = k["clat_ns"].get("percentile", {})
    p99 = max(p99, pct.get("99.000000", 0))
    p999 = max(p999, pct.get("99.900000", 0))
b = stats.get("balance") or {}
q = stats["queues"]
print(f"{sys.argv[3]:<7} {sys.argv[4]:<6} iops {iops:8.0f}  mean {lat_sum / max(n, 1) / 1e3:8.0f} us  "
      f"p99 {p99 / 1e3:8.0f} us  p99.9 {p999 / 1e3:8.0f} us  "
      f"cache I/O {sum(c['completed'] for c in q['cache']['classes'].values()):7d}  "
      f"backend I/O {sum(c['completed'] for c in q['backend']['classes'].values()):7d}  "
      f"bypassed {stats['balance']['bypassed_requests'] if b else 0:7d}  "
      f"switches {b.get('switches', 0)}  hit ratio {stats['hit_ratio']:.3f}")
EOF
    done
done
