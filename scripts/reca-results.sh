#!/bin/sh
# Reproduces docs/results/reca.md: ReCA's classifier on every trace sample,
# and ReCA (--adapt reca) against LRU, LARC, Access, the static reca policy
# and each category's static configuration, at a cache of 20 % of the
# trace's footprint (the paper's setting, §6.1).
# Usage: scripts/reca-results.sh [path/to/iocache] [trace dir]
set -eu
B=${1:-target/release/iocache}
T=${2:-../shared/traces}
cat_spec() { # name -> "policy write_policy line_size" (from the built-in table)
    case $1 in
    random_consumers) echo "reca:evict=priority:over=0:access=1/1/1:read=0/0/0:write=0/0/0:neighbours=0 wa 4KiB" ;;
    sequential_producer_consumers) echo "reca:evict=lru:over=0:access=1/1/1:read=0/0/0:write=0/0/0:neighbours=0 wt 128KiB" ;;
    random_producer_consumers) echo "reca:evict=priority:over=0:access=1/1/1:read=1/1/1:write=0/0/0:neighbours=0 wt 4KiB" ;;
    archival_consumers) echo "reca:evict=priority_lru:over=1:access=1/2/1:read=0/0/0:write=0/0/0:neighbours=0 wa 128KiB" ;;
    large_file_generators) echo "reca:evict=priority_lru:over=0:access=1/1/1:read=0/0/0:write=0/0/0:neighbours=16 wb 128KiB" ;;
    esac
}
for t in "$T"/arc-P2.lis.zst "$T"/cloudphysics-w106-sample.csv "$T"/msr-hm0-sample.csv \
    "$T"/systor17-sample.csv.gz "$T"/tencent-cbs-sample.csv.bz2 "$T"/tpcc-small.disksim "$T"/wsrch-small.disksim; do
    requests=$("$B" trace stats "$t" | awk '/^requests/ {print $2}')
    lines=$("$B" trace stats "$t" | awk '/^footprint/ {print $2}')
    size=$((lines * 4096 / 5 / 131072 * 131072)) # 20 % of the footprint, whole 128 KiB lines
    [ "$size" -ge 131072 ] || size=131072
    window=$((requests / 5)); [ "$window" -le 100000 ] || window=100000
    echo "=== $t: $requests requests, footprint $lines x 4 KiB, cache $size B, window $window"
    "$B" trace stats "$t" --reca --reca-window "$window" | sed -n '/^ReCA classes/,$p'
    echo "--- baselines and static reca (wb, 4 KiB lines)"
    "$B" sim --trace "$t" --threads 1 --cache-size "${size}B" --line-size 4KiB --write-policy wb \
        --policy lru,larc,access,reca | tail -n +2
    echo "--- --adapt reca (starting from lru, wb, 4 KiB)"
    "$B" sim --trace "$t" --threads 1 --cache-size "${size}B" --line-size 4KiB --write-policy wb \
        --policy lru --adapt reca --reca-window "$window" | sed -n '2,3p;/^ReCA on/,$p'
    for c in random_consumers sequential_producer_consumers random_producer_consumers archival_consumers large_file_generators; do
        set -- $(cat_spec $c)
        echo "--- static $c"
        "$B" sim --trace "$t" --threads 1 --cache-size "${size}B" --line-size "$3" --write-policy "$2" \
            --policy "$1" | tail -n 1
    done
done
