#!/usr/bin/env bash
# Why this exists: wall times on this shared machine follow its memory's
# phase (the C loop of scripts/bench-sim-baseline.sh takes 0.25 s in one
# minute and 1.1 s in another), so a change's effect on the simulator's
# inner loop is hard to see in seconds alone. Instructions and mispredicted
# branches, counted by valgrind's cachegrind on the same input, do not
# depend on the phase: the same binary and input give the same counts to
# within a few hundred in hundreds of millions.
# This prints them per line access for the minimal C LRU loop
# (scripts/bench/lru-baseline.c) and for `iocache sim` with each policy,
# on the first LINES lines of the trace (valgrind runs ~50x slower than
# native, hence a prefix).
#
# Usage: scripts/bench/instructions.sh   (TRACE=path LINES=n
#        POLICIES="lru arc ..." BIN=path/to/iocache BEFORE_BIN=path)
# Needs: valgrind, gcc, zstd, python3 (and cargo unless BIN is given).
# Not run by CI.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. scripts/benchlib.sh

TRACE=${TRACE:-../shared/traces/arc-P2.lis.zst}
LINES=${LINES:-161150}
POLICIES=${POLICIES:-lru arc fifo clock s3fifo 2q}
BEFORE_BIN=${BEFORE_BIN:-}

need_trace "$TRACE"
need_tools valgrind gcc zstd python3
if [[ -z "${BIN:-}" ]]; then
    cargo build --release --locked -p iocache >&2
    BIN=${CARGO_TARGET_DIR:-./target}/release/iocache
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/iocache-instructions.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -o "$WORK/lru-baseline" scripts/bench/lru-baseline.c
# `head` closes the pipe early: zstd's write error is expected.
(zstd -dcqf "$TRACE" || true) | head -n "$LINES" >"$WORK/part.lis"

# Prints "instructions mispredicted-branches" of one command under cachegrind.
counts() {
    local log=$WORK/cachegrind.log
    valgrind --tool=cachegrind --cache-sim=no --branch-sim=yes \
        --cachegrind-out-file=/dev/null --log-file="$log" "$@" >/dev/null
    python3 - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
ir = re.search(r"I\s+refs:\s+([\d,]+)", text)
mis = re.search(r"Mispredicts:\s+([\d,]+)", text)
if not ir or not mis:
    sys.exit(f"error: no counts in the cachegrind log {sys.argv[1]}")
print(ir.group(1).replace(",", ""), mis.group(1).replace(",", ""))
PY
}

accesses=$("$WORK/lru-baseline" 131072 <"$WORK/part.lis" | awk '$1 == "accesses" {print $2}')
echo "## Instructions and mispredicted branches per line access"
echo
echo "- trace: $TRACE, first $LINES lines ($accesses line accesses at 512 B lines)"
echo "- one cache of 131,072 lines x 512 B; valgrind --tool=cachegrind --branch-sim=yes (counts include start-up)"
echo "- iocache: $BIN (this checkout: $(git rev-parse --short HEAD 2>/dev/null || echo unknown))${BEFORE_BIN:+; before: $BEFORE_BIN}"
echo
echo "| program | instructions | per access | mispredicted branches | per access |"
echo "|---|---:|---:|---:|---:|"
row() {
    local name=$1
    shift
    read -r ir mis < <(counts "$@" <"$WORK/part.lis")
    python3 -c "import sys; ir, mis, acc = map(int, sys.argv[2:]); print(f'| {sys.argv[1]} | {ir:,} | {ir / acc:.1f} | {mis:,} | {mis / acc:.2f} |')" \
        "$name" "$ir" "$mis" "$accesses"
}
row "C LRU loop" "$WORK/lru-baseline" 131072
for policy in $POLICIES; do
    for which in now before; do
        binary=$BIN
        label="iocache sim, $policy"
        if [[ $which == before ]]; then
            [[ -n "$BEFORE_BIN" ]] || continue
            binary=$BEFORE_BIN
            label="$label, before"
        fi
        row "$label" "$binary" sim --trace "$WORK/part.lis" --format arc --policy "$policy" \
            --cache-size 131072 --line-size 512B --threads 1 --json /dev/null
    done
done
