#!/usr/bin/env python3
"""Produces the tables of docs/results/policies.md from `iocache sim --json`.

Usage: scripts/policy-tables.py [TRACES_DIR]   (default ../shared/traces)
Needs a release build (cargo build --release). Prints markdown on stdout;
every table is preceded by the exact command lines that produced it.
"""

import json
import os
import subprocess
import sys

BIN = "./target/release/iocache"
TRACES = sys.argv[1] if len(sys.argv) > 1 else "../shared/traces"
POLICIES = ["lru", "arc", "fifo", "clock", "lfu", "2q", "sieve", "s3fifo", "smq", "larc", "access",
            "cflru", "bplru", "vbbms", "reqblock"]
SAMPLES = ["arc-P2.lis.zst", "cloudphysics-w106-sample.csv", "msr-hm0-sample.csv", "systor17-sample.csv.gz",
           "tencent-cbs-sample.csv.bz2", "tpcc-small.disksim", "wsrch-small.disksim"]
WRITE_SAMPLES = ["msr-hm0-sample.csv", "systor17-sample.csv.gz", "tencent-cbs-sample.csv.bz2",
                 "tpcc-small.disksim", "cloudphysics-w106-sample.csv"]
WBUF_POLICIES = ["reqblock", "lru", "cflru", "bplru", "vbbms"]


def sim(args):
    cmd = [BIN, "sim"] + args + ["--json", "-"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return " ".join(c if " " not in c else repr(c) for c in ["iocache", "sim"] + args), json.loads(out)


def pct(x):
    return f"{x * 100:.2f}"


def hit_table(sizes, line_size, samples, promotions=False):
    print(f"Hit ratio (%), {line_size}-byte lines, write policy wb, promotion always, cache sizes in lines:\n")
    print("```sh")
    commands = []
    rows = []
    for name in samples:
        path = os.path.join(TRACES, name)
        cmd, j = sim(["--trace", path, "--policy", ",".join(POLICIES), "--cache-size", ",".join(map(str, sizes)),
                      "--line-size", f"{line_size}B"])
        commands.append(cmd)
        by = {(r["policy"], r["cache_lines"]): r for r in j["runs"]}
        for size in sizes:
            cells = [pct(by[(p, size)]["hit_ratio"]) for p in POLICIES]
            best = max(float(c) for c in cells)
            cells = [f"**{c}**" if float(c) == best and best > 0 else c for c in cells]
            rows.append(f"| {name} | {size} | " + " | ".join(cells) + " |")
            if promotions:
                cells = [f"{by[(p, size)]['promotions'] / 1e6:.2f}M" for p in POLICIES]
                rows.append(f"| {name} | {size} | " + " | ".join(cells) + " |")
    print("\n".join(commands))
    print("```\n")
    if promotions:
        print("Each size has two rows: hit ratio (%), then lines promoted (written into the cache).\n")
    print("| trace | lines | " + " | ".join(POLICIES) + " |")
    print("|---|---:|" + "---:|" * len(POLICIES))
    print("\n".join(rows))
    print()


def wbuf_table(sizes):
    print("Write-buffer mode (`--write-policy wo`, 4 KiB lines = flash pages): hit ratio (%), "
          "pages per eviction (mean), flash page writes:\n")
    print("```sh")
    commands, rows = [], []
    for name in WRITE_SAMPLES:
        path = os.path.join(TRACES, name)
        cmd, j = sim(["--trace", path, "--policy", ",".join(WBUF_POLICIES), "--cache-size",
                      ",".join(map(str, sizes)), "--line-size", "4KiB", "--write-policy", "wo"])
        commands.append(cmd)
        by = {(r["policy"], r["cache_lines"]): r for r in j["runs"]}
        for size in sizes:
            cells = []
            for p in WBUF_POLICIES:
                r = by[(p, size)]
                per = r["lines_per_eviction_batch"]
                cells.append(f"{pct(r['hit_ratio'])} / {per:.2f} / {r['dirty_writebacks']}")
            rows.append(f"| {name} | {size} | " + " | ".join(cells) + " |")
    print("\n".join(commands))
    print("```\n")
    print("| trace | lines | " + " | ".join(f"{p}: hit % / pages per eviction / flash writes" if i == 0 else p
                                         for i, p in enumerate(WBUF_POLICIES)) + " |")
    print("|---|---:|" + "---:|" * len(WBUF_POLICIES))
    print("\n".join(rows))
    print()


def flushing_table():
    name = "tencent-cbs-sample.csv.bz2"
    path = os.path.join(TRACES, name)
    print("Flushing and write-miss bypass with device timing (ASPLOS'23 §5.3), "
          f"{name}, 1024 lines of 4 KiB, LRU, write-back, Optane cache, SSD RAID-5 backend, "
          "closed loop with 16 requests outstanding:\n")
    configs = [("nop", []), ("nop + write-miss bypass", ["--write-miss-bypass"]),
               ("lazy:idle=1ms:interval=1ms", ["--flush", "lazy:idle=1ms:interval=1ms:batch=128:stale=0ns"]),
               ("aggressive (10 ms, 128)", ["--flush", "aggressive"]),
               ("aggressive (1 ms, 1024)", ["--flush", "aggressive:interval=1ms:batch=1024"])]
    print("```sh")
    rows = []
    for label, extra in configs:
        cmd, j = sim(["--trace", path, "--policy", "lru", "--cache-size", "1024", "--cache-device", "optane",
                      "--backend-device", "ssd-raid5", "--closed-loop", "16"] + extra)
        print(cmd)
        r = j["runs"][0]
        t = r["timing"]
        rows.append(f"| {label} | {pct(r['hit_ratio'])} | {t['iops']:.0f} | {t['read']['mean_ns'] / 1e3:.1f} | "
                    f"{t['read']['p9999_ns'] / 1e3:.1f} | {t['write']['mean_ns'] / 1e3:.1f} | "
                    f"{t['write']['p9999_ns'] / 1e3:.1f} | {r['flushed_lines']} | {r['write_miss_bypasses']} |")
    print("```\n")
    print("| flushing | hit % | IOPS | read mean µs | read p99.99 µs | write mean µs | write p99.99 µs | "
          "flushed lines | write-miss bypasses |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print()


if __name__ == "__main__":
    hit_table([1024, 8192], 4096, SAMPLES)
    hit_table([32768, 131072], 512, ["arc-P2.lis.zst"], promotions=True)
    wbuf_table([128, 1024])
    flushing_table()
