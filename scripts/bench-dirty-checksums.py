#!/usr/bin/env python3
"""What verifying dirty data costs on the write path.

Not run by CI; results go in docs/results/durability.md. Runs the cost run
of scripts/bench-persistence.py (fio nbd engine, 4 KiB, 70 % random writes,
a FLUSH every 32 writes, on a range that fits the cache; persistence `all`;
cache file in /var/tmp with O_DIRECT, backend nbdkit's file plugin behind a
1 ms delay) at QD 16 and at QD 1, with two builds, alternated, ROUNDS times
each:

  * this build (target/release/iocache): every write landing on flushed
    dirty data first makes its intent durable (one cache flush, shared by
    the writers waiting at once);
  * BASELINE: an earlier build, e.g. one whose first in-place rewrite of a
    flushed dirty line withdrew the checksum (b7714e6), or one from before
    checksums (d802549).

Usage: scripts/bench-dirty-checksums.py BASELINE [SECONDS_PER_RUN] [ROUNDS]
   e.g. git worktree add /tmp/old d802549 &&
        (cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo build --release) &&
        scripts/bench-dirty-checksums.py /tmp/old-target/release/iocache 10 2
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_persistence", os.path.join(HERE, "bench-persistence.py"))
persistence = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(persistence)
BASELINE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
SECONDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2


def main():
    if not BASELINE or not os.path.exists(BASELINE):
        raise SystemExit(__doc__)
    backend, backend_uri = benchlib.delayed_backend(persistence.WORK)
    rows = []
    try:
        for iodepth in (16, 1):
            for round_no in range(ROUNDS):
                for name, binary in (("this", benchlib.BIN), ("baseline", BASELINE)):
                    r, s = persistence.cost(binary, "all", backend_uri, iodepth, SECONDS)
                    rows.append((iodepth, round_no + 1, name, r, s))
                    print(name, iodepth, round_no + 1, f"{r['write']['iops']:.0f}", file=sys.stderr, flush=True)
    finally:
        benchlib.stop(backend)
    print(f"# Verified dirty data: cost ({SECONDS} s per run, {ROUNDS} rounds alternated)\n")
    print("| QD | round | build | read IOPS | write IOPS | write p99 µs | write p99.99 µs | barriers |"
          " records written | intents (flushes) | checksums withdrawn |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for iodepth, round_no, name, r, s in rows:
        intents = (f"{s['intents_written']} ({s['intent_flushes']})" if "intents_written" in s else "-")
        print(f"| {iodepth} | {round_no} | {name} | {r['read']['iops']:.0f} | {r['write']['iops']:.0f} | "
              f"{r['write']['p99_us']:.0f} | {r['write']['p9999_us']:.0f} | "
              f"{s['barriers']} | {s['records_written']} | {intents} | {s.get('checksums_withdrawn', '-')} |")


if __name__ == "__main__":
    main()
