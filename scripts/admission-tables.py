#!/usr/bin/env python3
"""Produces the tables of docs/results/admission.md from `iocache sim --json`:
each admission policy and the readahead, on every available sample trace.

Usage: scripts/admission-tables.py [TRACES_DIR]   (default ../shared/traces)
Needs a release build (cargo build --release). Prints markdown on stdout;
each table is preceded by the command lines that produced it.
"""

import json
import os
import subprocess
import sys

BIN = "./target/release/iocache"
TRACES = sys.argv[1] if len(sys.argv) > 1 else "../shared/traces"
SAMPLES = ["arc-P2.lis.zst", "cloudphysics-w106-sample.csv", "msr-hm0-sample.csv", "systor17-sample.csv.gz",
           "tencent-cbs-sample.csv.bz2", "tpcc-small.disksim", "wsrch-small.disksim"]
ADMISSIONS = ["always", "nhit:2", "random:0.25", "second-hit", "request-size:16KiB", "write-rate:1MiB/s"]
READAHEADS = ["off", "seq", "seq:min=16KiB:max=256KiB"]
SIZE = "10%"
LINE = "4KiB"


def sim(args):
    cmd = [BIN, "sim"] + args + ["--json", "-"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return " ".join(["iocache", "sim"] + args), json.loads(out)["runs"][0]


def pct(x):
    return f"{x * 100:.2f}"


def mib(b):
    return f"{b / 2**20:.1f}"


def main():
    samples = [s for s in SAMPLES if os.path.exists(os.path.join(TRACES, s))]
    if not samples:
        sys.exit(f"no sample trace in {TRACES} (scripts/get-traces.sh fetches them)")
    print(f"LRU, {LINE} lines, a cache of {SIZE} of each trace's footprint, write policy wb.\n")
    print("### Admission\n")
    print("```sh")
    rows = []
    for name in samples:
        path = os.path.join(TRACES, name)
        base = None
        for admission in ADMISSIONS:
            cmd, r = sim(["--trace", path, "--policy", "lru", "--cache-size", SIZE, "--line-size", LINE,
                          "--promotion", admission])
            print(cmd)
            base = base or r
            writes = r["cache_write_bytes"] / base["cache_write_bytes"] if base["cache_write_bytes"] else 0
            rows.append(f"| {name} | `{admission}` | {pct(r['hit_ratio'])} | {pct(r['byte_hit_ratio'])} | "
                        f"{r['promotions']} | {mib(r['cache_write_bytes'])} | {writes:.2f} |")
    print("```\n")
    print("| trace | promotion | hit ratio % | byte hit ratio % | lines inserted | cache device writes MiB "
          "| writes vs `always` |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n### Readahead\n")
    print("```sh")
    rows = []
    for name in samples:
        path = os.path.join(TRACES, name)
        for readahead in READAHEADS:
            cmd, r = sim(["--trace", path, "--policy", "lru", "--cache-size", SIZE, "--line-size", LINE,
                          "--readahead", readahead])
            print(cmd)
            fetched = r["prefetched_lines"]
            used = f"{r['prefetch_used_lines'] / fetched * 100:.1f}" if fetched else "-"
            rows.append(f"| {name} | `{readahead}` | {pct(r['hit_ratio'])} | {pct(r['byte_hit_ratio'])} | "
                        f"{mib(r['backend_read_bytes'])} | {r['prefetch_requests']} | {fetched} | {used} | "
                        f"{r['prefetch_unused_lines']} |")
    print("```\n")
    print("| trace | readahead | hit ratio % | byte hit ratio % | backend reads MiB | fills | lines fetched "
          "| used % | left unused |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
