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

The cache files are written whole before each run (no sparse holes: a
first write into a hole would allocate blocks mid-run, which a block device
never does). Workloads (fio nbd engine, 4 KiB, QD 16, SECONDS each, after a warm-up that
reads the range once): random writes on a 12 MiB range (fits the dirty cap),
random writes on 64 MiB (past it), a 70/30 read/write mix on 100 MiB with
85 % of accesses on 10 % of it, and random reads of a cached 32 MiB range.
Backend: nbdkit's file plugin behind its delay filter (1 ms per request), as
in scripts/bench-engine.py. Persistence `dirty` everywhere.

Usage: scripts/bench-raid.py [SECONDS_PER_RUN] [CACHE_DIR]
  (defaults 10 and /var/tmp/iocache-raid: a disk, O_DIRECT; a directory under
  /dev/shm puts the cache devices in RAM, opened without O_DIRECT)
Needs: fio, nbdkit, a release build (cargo build --release).
"""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

SECONDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
WORK = "/var/tmp/iocache-raid"
CACHE_DIR = sys.argv[2] if len(sys.argv) > 2 else WORK
DIRECT = not CACHE_DIR.startswith("/dev/shm")
BIN = benchlib.BIN
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


def allocated_file(path, size):
    """A file of `size` zero bytes, all blocks allocated: a cache device
    behaves like a block device, with no block allocation (and file-system
    journal writes) on a first write into a hole during the run."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def start(name, policy, array, backend_uri):
    d = f"{WORK}/{name}"
    c = f"{CACHE_DIR}/{name}-cache"
    benchlib.fresh_dirs(d, c)
    sock = benchlib.fresh_socket(WORK, "iocache")
    args = [BIN, "serve", "--backend", backend_uri, "--write-policy", policy,
            "--persistence", "dirty", "--socket", sock, "--admin-socket", f"{d}/admin.sock",
            "--listen", "127.0.0.1:0", "--init"] + (["--direct"] if DIRECT else [])
    if array:
        for i in range(2):
            allocated_file(f"{c}/c{i}.img", MEMBER)
        args += ["--cache", f"{c}/c0.img", "--cache-array", f"{c}/c1.img"]
    else:
        args += ["--cache", f"{c}/c0.img", "--cache-size", "120MiB"]
        allocated_file(f"{c}/c0.img", 2 * MEMBER)
    p, uri = benchlib.start_iocache(args, d, sock)
    return p, uri, f"{d}/admin.sock"


def main():
    benchlib.need_tools("fio", "nbdkit")
    backend, backend_uri = benchlib.delayed_backend(WORK)
    results = {}
    try:
        for title, warm_bytes, extra in WORKLOADS:
            for name, policy, array in CONFIGS:
                p, uri, admin = start(name, policy, array, backend_uri)
                try:
                    benchlib.warm(uri, warm_bytes)
                    r = benchlib.fio(uri, name, extra + ["--iodepth=16"], seconds=SECONDS)
                    s = benchlib.volume_stats(BIN, admin)
                finally:
                    benchlib.stop(p)
                a = s.get("array") or {}
                results[(title, name)] = {
                    "read": r["read"], "write": r["write"], "dirty_lines": s["dirty_lines"],
                    "capacity_lines": s["capacity_lines"], "hit_ratio": s["hit_ratio"],
                    "cap_write_throughs": a.get("dirty_cap_write_throughs", 0),
                    "dirty_cap": a.get("dirty_cap"),
                }
                print(title, name, json.dumps(results[(title, name)]), file=sys.stderr, flush=True)
    finally:
        benchlib.stop(backend)
        if CACHE_DIR != WORK:
            for name, _, _ in CONFIGS:
                shutil.rmtree(f"{CACHE_DIR}/{name}-cache", ignore_errors=True)
    where = f"{CACHE_DIR} ({'O_DIRECT' if DIRECT else 'buffered'})"
    print(f"# Cache RAID vs one-device write-back and write-through ({SECONDS} s per run, caches in {where})\n")
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
