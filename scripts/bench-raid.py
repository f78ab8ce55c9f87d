#!/usr/bin/env python3
"""Cache-optimized RAID against write-back on one device and write-through
(SYSTOR'14 §8, Fig. 20 and 21), measured side by side on this machine.

Not run by CI; results go in docs/results/durability.md. Configurations,
each with the same raw cache bytes (two 64 MiB files, or one 128 MiB file,
in /var/tmp, opened with O_DIRECT):

  * wb-one:      write-back on one 128 MiB device: no redundancy (a device
                 loss loses every dirty line);
  * wt-array:    write-through on a two-device array (clean lines striped;
                 nothing is ever dirty);
  * wb-array:    write-back on a two-device array: dirty lines mirrored
                 (--mirror-percent 25: dirty lines capped at 25 % of a
                 device's slots), a device loss loses nothing.

Workloads (fio nbd engine, 4 KiB, QD 16, SECONDS each, after a warm-up that
reads the range once): random writes on a 12 MiB range (fits the dirty cap),
random writes on 64 MiB (past it), a 70/30 read/write mix on 100 MiB with
85 % of accesses on 10 % of it, and random reads of a cached 32 MiB range.
Backend: nbdkit's file plugin behind its delay filter (1 ms per request), as
in scripts/bench-engine.py. Persistence `dirty` everywhere.

Usage: scripts/bench-raid.py [SECONDS_PER_RUN]   (default 10)
Needs: fio, nbdkit, a release build (cargo build --release).
"""

import importlib.util
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("bench_engine", os.path.join(HERE, "bench-engine.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

SECONDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
bench.SECONDS = SECONDS
WORK = bench.WORK = "/var/tmp/iocache-raid"
BIN = bench.BIN
MEMBER = 64 << 20

CONFIGS = [
    ("wb-one", "wb", False),
    ("wt-array", "wt", True),
    ("wb-array", "wb", True),
]

WORKLOADS = [
    ("random writes, 12 MiB range", 12 << 20, ["--rw=randwrite", "--size=12m"]),
    ("random writes, 64 MiB range", 64 << 20, ["--rw=randwrite", "--size=64m"]),
    ("70/30 read/write, 85 % on 10 % of 100 MiB", 100 << 20,
     ["--rw=randrw", "--rwmixread=70", "--size=100m", "--random_distribution=zoned:85/10:15/90"]),
    ("random reads, 32 MiB cached", 32 << 20, ["--rw=randread", "--size=32m"]),
]


def start(name, policy, array, backend_uri):
    d = f"{WORK}/{name}"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sock = bench.fresh("iocache")
    args = [BIN, "serve", "--backend", backend_uri, "--write-policy", policy, "--direct",
            "--persistence", "dirty", "--socket", sock, "--admin-socket", f"{d}/admin.sock",
            "--listen", "127.0.0.1:0"]
    if array:
        for i in range(2):
            with open(f"{d}/c{i}.img", "wb") as f:
                f.truncate(MEMBER)
        args += ["--cache", f"{d}/c0.img", "--cache-array", f"{d}/c1.img"]
    else:
        args += ["--cache", f"{d}/c0.img", "--cache-size", "120MiB"]
        with open(f"{d}/c0.img", "wb") as f:
            f.truncate(2 * MEMBER)
    import subprocess
    p = subprocess.Popen(args, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    bench.wait_socket(sock, p)
    return p, f"nbd+unix:///?socket={sock}", f"{d}/admin.sock"


def stats(admin):
    out = bench.sh([BIN, "stats", "--admin-socket", admin, "--json"]).stdout
    return json.loads(out)["volumes"][0]


def main():
    for tool in ("fio", "nbdkit"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed (apt-get install {tool})")
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    with open(f"{WORK}/backend.img", "wb") as f:
        f.truncate(bench.VOLUME)
    backend, backend_uri = bench.start_backend()
    results = {}
    try:
        for title, warm_bytes, extra in WORKLOADS:
            for name, policy, array in CONFIGS:
                p, uri, admin = start(name, policy, array, backend_uri)
                try:
                    bench.warm(uri, warm_bytes)
                    r = bench.fio(uri, name, extra + ["--iodepth=16"])
                    s = stats(admin)
                finally:
                    bench.stop(p)
                a = s.get("array") or {}
                results[(title, name)] = {
                    "read": r["read"], "write": r["write"], "dirty_lines": s["dirty_lines"],
                    "capacity_lines": s["capacity_lines"], "hit_ratio": s["hit_ratio"],
                    "cap_write_throughs": a.get("dirty_cap_write_throughs", 0),
                    "dirty_cap": a.get("dirty_cap"),
                }
                print(title, name, json.dumps(results[(title, name)]), file=sys.stderr, flush=True)
    finally:
        bench.stop(backend)
    print(f"# Cache RAID vs one-device write-back and write-through ({SECONDS} s per run)\n")
    print("| workload | config | read IOPS | write IOPS | write p99 µs | read p99 µs | line hit ratio |"
          " dirty lines at the end (cap) | capacity lines |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for title, _, _ in WORKLOADS:
        for name, _, _ in CONFIGS:
            r = results[(title, name)]
            cap = f" ({r['dirty_cap']})" if r["dirty_cap"] is not None else ""
            print(f"| {title} | {name} | {r['read']['iops']:.0f} | {r['write']['iops']:.0f} | "
                  f"{r['write']['p99_us']:.0f} | {r['read']['p99_us']:.0f} | {r['hit_ratio'] * 100:.1f} % | "
                  f"{r['dirty_lines']}{cap} | {r['capacity_lines']} |")


if __name__ == "__main__":
    main()
