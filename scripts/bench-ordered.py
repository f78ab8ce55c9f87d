#!/usr/bin/env python3
"""What ordered write-back costs against plain write-back.

Not run by CI; results go in docs/results/write-back.md. The backend is
nbdkit's file plugin behind its delay filter (DELAY per request, requests
in parallel: a remote volume), or with --backend disk one hard disk: the
memory plugin behind noparallel (one request at a time), delay (DELAY per
request) and rate (150 MB/s) filters, as in scripts/bench-flush.py. For each workload, plain and ordered
write-back are run in turn (alternated from round to round), each on a new
CACHE-byte cache of 4 KiB lines with the aggressive cleaner:

  * fio writes random 4 KiB blocks at QD 16 for SECONDS over a region of
    REGION times the cache, with a FLUSH after every FSYNC writes;
  * `iocache stats` then gives the dirty lines left, how many FLUSH epochs
    the backend is behind and how many writes waited for it;
  * `iocache ctl flush` is timed: writing back what is left.

Usage: scripts/bench-ordered.py [--rounds N] [--seconds S] [--cache BYTES]
                                [--delay 1ms] [--workloads hot,stream] [--backend remote|disk]
Needs: fio, nbdkit, a release build (cargo build --release).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

MIB = 1 << 20
WORK = "/dev/shm/iocache-bench-ordered"
# name: (region as a multiple of the cache, writes per FLUSH)
WORKLOADS = {
    "hot": (0.5, 32),  # rewrites of lines dirty from earlier epochs
    "stream": (4.0, 256),  # mostly new lines
    "rare-flush": (0.5, 4096),
}


def run(binary, backend_uri, cache, ordered, region, fsync, seconds):
    d = f"{WORK}/iocache"
    benchlib.fresh_dirs(d)
    sock = benchlib.fresh_socket(WORK, "iocache")
    admin = f"{d}/admin.sock"
    args = [binary, "serve", "--backend", backend_uri, "--cache", f"{d}/cache.img", "--cache-size", f"{cache}B",
            "--line-size", "4KiB", "--init", "--force", "--write-policy", "wb", "--flush", "aggressive",
            "--socket", sock, "--admin-socket", admin] + (["--ordered-write-back"] if ordered else [])
    p, uri = benchlib.start_iocache(args, d, sock)
    try:
        r = benchlib.fio(uri, "w", ["--rw=randwrite", f"--size={int(cache * region)}", "--iodepth=16",
                                    f"--fsync={fsync}", "--randseed=7"], seconds=seconds)
        stats = benchlib.volume_stats(binary, admin)
        ordered_stats = stats.get("ordered") or {}
        dirty = stats["dirty_lines"]
        started = time.monotonic()
        benchlib.sh([binary, "ctl", "--admin-socket", admin, "flush", stats["export"]])
        took = time.monotonic() - started
    finally:
        benchlib.stop(p)
    return {
        "iops": r["write"]["iops"],
        "p99_us": r["write"]["p99_us"],
        "dirty": dirty,
        "behind": ordered_stats.get("epochs_behind", 0),
        "waits": ordered_stats.get("waits", 0),
        "flush_s": took,
        "flush_mbps": dirty * 4096 / took / 1e6 if took > 0 else 0,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--cache", type=int, default=64 * MIB)
    ap.add_argument("--delay", default="1ms")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--backend", choices=("remote", "disk"), default="remote")
    a = ap.parse_args()
    benchlib.need_tools("fio", "nbdkit")
    benchlib.fresh_dirs(WORK)
    if a.backend == "disk":
        import subprocess
        sock = f"{WORK}/disk.sock"
        backend = subprocess.Popen(
            ["nbdkit", "-f", "-U", sock, "--filter=noparallel", "--filter=delay", "--filter=rate", "memory",
             str(8 * a.cache), "serialize=all-requests", f"delay-read={a.delay}", f"delay-write={a.delay}",
             f"rate={150 * 1000 * 1000 * 8}", "burstiness=0.05"], stderr=subprocess.PIPE, text=True)
        benchlib.wait_socket(sock, backend)
        backend_uri = f"nbd+unix:///?socket={sock}"
    else:
        backend, backend_uri = benchlib.delayed_backend(f"{WORK}/backend", volume=8 * a.cache, delay=a.delay)
    try:
        for name in a.workloads.split(","):
            region, fsync = WORKLOADS[name]
            results = {False: [], True: []}
            for r in range(a.rounds):
                for ordered in ((False, True) if r % 2 == 0 else (True, False)):
                    res = run(benchlib.BIN, backend_uri, a.cache, ordered, region, fsync, a.seconds)
                    results[ordered].append(res)
                    print(f"{name} round {r + 1} {'ordered' if ordered else 'plain  '}: "
                          f"{res['iops']:.0f} write IOPS, p99 {res['p99_us']:.0f} µs; "
                          f"{res['dirty']} dirty lines left ({res['dirty'] * 4096 / a.cache:.0%} of the cache), "
                          f"{res['behind']} epochs behind, {res['waits']} waits; "
                          f"flush {res['flush_s']:.2f} s ({res['flush_mbps']:.1f} MB/s)", flush=True)
            med = {o: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for o, rs in results.items()}
            print(f"{name}: ordered/plain write IOPS {med[True]['iops'] / med[False]['iops']:.2f}x; "
                  f"dirty left {med[True]['dirty']:.0f} vs {med[False]['dirty']:.0f} lines; "
                  f"flush {med[True]['flush_mbps']:.1f} vs {med[False]['flush_mbps']:.1f} MB/s", flush=True)
    finally:
        benchlib.stop(backend)


if __name__ == "__main__":
    main()
