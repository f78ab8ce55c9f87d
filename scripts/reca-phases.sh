#!/bin/sh
# Per-phase byte hit ratios of ReCA (--adapt reca) against static
# configurations on a two-phase generated workload (docs/results/reca.md,
# "The generated phase workloads"). Phase 1 is simulated alone from an empty
# cache; phase 2 after phase 1 (--warmup counts phase 1's requests), so
# every configuration starts phase 2 with what phase 1 left.
# Usage: scripts/reca-phases.sh SPEC.toml PHASE1_REQUESTS [iocache] [window]
set -eu
SPEC=$1
N=$2
B=${3:-target/release/iocache}
W=${4:-10000}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
"$B" gen "$SPEC" -o "$D/all.csv" 2>/dev/null
head -n "$N" "$D/all.csv" > "$D/p1.csv"
# The built-in table's categories as static configurations: name policy wp line.
CATS="lru_4KiB:lru:wb:4KiB lru_128KiB:lru:wb:128KiB
random_consumers:reca:evict=priority:over=0:access=1/1/1:read=0/0/0:write=0/0/0:neighbours=0:wa:4KiB
sequential_producer_consumers:reca:evict=lru:over=0:access=1/1/1:read=0/0/0:write=0/0/0:neighbours=0:wt:128KiB
random_producer_consumers:reca:evict=priority:over=0:access=1/1/1:read=1/1/1:write=0/0/0:neighbours=0:wt:4KiB
archival_consumers:reca:evict=priority_lru:over=1:access=1/2/1:read=0/0/0:write=0/0/0:neighbours=0:wa:128KiB
large_file_generators:reca:evict=priority_lru:over=0:access=1/1/1:read=0/0/0:write=0/0/0:neighbours=16:wb:128KiB"
byte_hit() { # sim --json - -> byte hit ratio of the first run
    python3 -c 'import json, sys; print("%.4f" % json.load(sys.stdin)["runs"][0]["byte_hit_ratio"])'
}
printf '%-32s %8s %8s\n' configuration phase1 phase2
for c in $CATS; do
    name=${c%%:*}; rest=${c#*:}
    line=${rest##*:}; rest=${rest%:*}
    wp=${rest##*:}; policy=${rest%:*}
    a=$("$B" sim --trace "$D/p1.csv" --format msr --threads 1 --cache-size 64MiB --policy "$policy" --write-policy "$wp" --line-size "$line" --json - | byte_hit)
    b=$("$B" sim --trace "$D/all.csv" --format msr --threads 1 --cache-size 64MiB --policy "$policy" --write-policy "$wp" --line-size "$line" --warmup "$N" --json - | byte_hit)
    printf '%-32s %8s %8s\n' "$name" "$a" "$b"
done
a=$("$B" sim --trace "$D/p1.csv" --format msr --threads 1 --cache-size 64MiB --policy lru --adapt reca --reca-window "$W" --json - | byte_hit)
b=$("$B" sim --trace "$D/all.csv" --format msr --threads 1 --cache-size 64MiB --policy lru --adapt reca --reca-window "$W" --warmup "$N" --json - | byte_hit)
printf '%-32s %8s %8s\n' "adapt reca (from lru, wb, 4KiB)" "$a" "$b"
"$B" sim --trace "$D/all.csv" --format msr --threads 1 --cache-size 64MiB --policy lru --adapt reca --reca-window "$W" | grep '^  reca:' | cut -c1-110
