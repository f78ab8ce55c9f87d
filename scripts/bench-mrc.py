#!/usr/bin/env python3
"""The time of the exact miss-ratio curve against one LRU simulation (issue
17 section 3: "the MRC in about the time of one LRU simulation"; not run by
CI; results go in docs/results/mrc.md).

Alternates, RUNS times (default 5), on the decompressed ARC trace P2 (in
/dev/shm when it can; parsing included, decompression excluded):

  iocache trace mrc P2.lis --format arc --line-size 512B --method exact --json F
  iocache sim --trace P2.lis --format arc --line-size 512B --policy lru \
      --cache-size 131072 --threads 1 --json F
  (and the exact curve of BEFORE_BIN, when given)

and prints the median and range of wall and user CPU time of each, and
checks that every curve is the same.

Usage: BIN=path/to/iocache [BEFORE_BIN=path] [RUNS=n] [TRACE=path] scripts/bench-mrc.py
"""

import json
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def main():
    trace = benchlib.env_trace()
    runs = int(os.environ.get("RUNS", "5"))
    binary = os.environ.get("BIN") or sys.exit("error: set BIN=path/to/iocache")
    before = os.environ.get("BEFORE_BIN")
    work = benchlib.scratch_dir("iocache-bench-mrc.")
    try:
        lis = os.path.join(work, "trace.lis")
        benchlib.decompress(trace, lis)
        out = os.path.join(work, "out.json")

        def mrc(program):
            return [program, "-q", "trace", "mrc", lis, "--format", "arc", "--line-size", "512B",
                    "--method", "exact", "--json", out]

        variants = [("exact curve", mrc(binary)),
                    ("one LRU simulation (131,072 lines)",
                     [binary, "-q", "sim", "--trace", lis, "--format", "arc", "--line-size", "512B",
                      "--policy", "lru", "--cache-size", "131072", "--threads", "1", "--json", out])]
        if before:
            variants.append(("exact curve, before", mrc(before)))
        times = {name: [] for name, _ in variants}
        curves = {}
        loads = []
        for i in range(runs):
            for name, argv in variants:
                loads.append(os.getloadavg()[0])
                times[name].append(benchlib.timed(argv, stdout=subprocess.DEVNULL)[:2])
                if "curve" in name:
                    curves.setdefault(name, json.load(open(out))["curves"][0]["points"])
                print(f"    run {i + 1}: {name}: {times[name][-1][0]:.2f} s wall, "
                      f"{times[name][-1][1]:.2f} s user", file=sys.stderr)
        reference = curves["exact curve"]
        for name, points in curves.items():
            if points != reference:
                sys.exit(f"error: {name} differs from the exact curve")
        print(f"- load average (1 min) before each command: {min(loads):.2f} to {max(loads):.2f}")
        print(f"- {runs} runs of each, alternated; medians (min..max)\n")
        print("| what | wall s | user s |")
        print("|---|---:|---:|")
        for name, _ in variants:
            walls = [t[0] for t in times[name]]
            users = [t[1] for t in times[name]]
            print(f"| {name} | {statistics.median(walls):.2f} ({min(walls):.2f}..{max(walls):.2f}) | "
                  f"{statistics.median(users):.2f} ({min(users):.2f}..{max(users):.2f}) |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
