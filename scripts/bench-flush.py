#!/usr/bin/env python3
"""Writing back a cache full of random 4 KiB dirty lines to a slow backend.

Not run by CI; results go in docs/results/write-back.md. The backend is
nbdkit's memory plugin made to behave like one hard disk: the noparallel
filter (serialize=all-requests: one request at a time, one head), the delay
filter (DELAY per request, a seek and half a turn) and the rate filter
(RATE, the platter's transfer rate, with a bucket of 50 ms). With --backend
remote it is the delay filter alone: DELAY per request, requests served in
parallel (a remote volume). Its sequential write bandwidth is measured
first, with fio writing 1 MiB and 8 MiB requests straight to it at QD 4.

Then, for each binary (this build, and --baseline when given, alternated
within each round): `iocache serve` in write-back mode with no background
flushing and a CACHE-byte cache of 4 KiB lines in /dev/shm; fio writes
CACHE bytes of random 4 KiB blocks, each block once (fio's random map), over
a region SPREAD times the cache's size, so the cache ends full of dirty
lines (SPREAD 1: every line of the region is dirty; SPREAD 4: one in four);
then `iocache ctl flush` is timed. The flush rate is the dirty bytes over
that time.

With --gap SIZE, this build runs with `--write-back-gap SIZE`: gaps of up
to SIZE between dirty lines are read from the backend and written back with
them in one request.

Usage: scripts/bench-flush.py [--baseline PATH] [--rounds N] [--cache BYTES]
                              [--spread N] [--backend disk|remote] [--delay 4ms]
                              [--rate 150] [--gap SIZE]
Needs: fio, nbdkit, a release build (cargo build --release).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

MIB = 1 << 20
WORK = "/dev/shm/iocache-bench-flush"


def slow_backend(work, kind, size, delay, rate_bytes):
    sock = f"{work}/backend.sock"
    delays = [f"delay-read={delay}", f"delay-write={delay}"]
    if kind == "disk":
        argv = ["--filter=noparallel", "--filter=delay", "--filter=rate", "memory", str(size),
                "serialize=all-requests", *delays, f"rate={rate_bytes * 8}", "burstiness=0.05"]
    else:
        argv = ["--filter=delay", "memory", str(size), *delays]
    p = subprocess.Popen(["nbdkit", "-f", "-U", sock, *argv], stderr=subprocess.PIPE, text=True)
    benchlib.wait_socket(sock, p)
    return p, f"nbd+unix:///?socket={sock}"


def sequential_bandwidth(uri, bs, size):
    r = benchlib.fio(uri, f"seq{bs}", ["--rw=write", f"--bs={bs}", f"--size={size}", "--iodepth=4"], seconds=0)
    return r["write"]["mbps"]


def flush_run(binary, backend_uri, cache, spread, gap):
    d = f"{WORK}/iocache"
    benchlib.fresh_dirs(d)
    sock = benchlib.fresh_socket(WORK, "iocache")
    admin = f"{d}/admin.sock"
    args = [binary, "serve", "--backend", backend_uri, "--cache", f"{d}/cache.img", "--cache-size", f"{cache}B",
            "--init", "--force", "--write-policy", "wb", "--flush", "nop", "--socket", sock,
            "--admin-socket", admin, "--listen", "127.0.0.1:0"] + (["--write-back-gap", gap] if gap else [])
    p, uri = benchlib.start_iocache(args, d, sock)
    try:
        benchlib.fio(uri, "fill", ["--rw=randwrite", f"--size={cache * spread}", f"--io_size={cache}",
                                   "--iodepth=16", "--randseed=42"], seconds=0)
        before = benchlib.volume_stats(binary, admin)
        dirty = before["dirty_lines"]
        started = time.monotonic()
        benchlib.sh([binary, "ctl", "--admin-socket", admin, "flush", before["export"]])
        took = time.monotonic() - started
        after = benchlib.volume_stats(binary, admin)
        if after["dirty_lines"] != 0:
            raise SystemExit(f"{binary}: {after['dirty_lines']} dirty lines left after the flush")
    finally:
        benchlib.stop(p)
    return dirty, took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cache", type=int, default=64 * MIB)
    ap.add_argument("--spread", type=int, default=1)
    ap.add_argument("--backend", choices=("disk", "remote"), default="disk")
    ap.add_argument("--delay", default="4ms")
    ap.add_argument("--rate", type=int, default=150, help="MB/s")
    ap.add_argument("--gap", help="iocache's --write-back-gap (this build only)")
    a = ap.parse_args()
    benchlib.need_tools("fio", "nbdkit")
    benchlib.fresh_dirs(WORK)
    backend, backend_uri = slow_backend(WORK, a.backend, max(1 << 30, a.cache * a.spread), a.delay,
                                        a.rate * 1000 * 1000)
    try:
        seq = {bs: sequential_bandwidth(backend_uri, bs, f"{max(a.cache, 64 * MIB)}") for bs in ("1m", "8m")}
        kind = f"one request at a time, {a.delay} each, {a.rate} MB/s" if a.backend == "disk" else \
            f"{a.delay} per request, requests in parallel"
        print(f"backend: {kind}; sequential writes at QD 4: "
              + ", ".join(f"{bs} requests {mbps:.1f} MB/s" for bs, mbps in seq.items()))
        binaries = [("iocache", benchlib.BIN)] + ([("baseline", os.path.abspath(a.baseline))] if a.baseline else [])
        results = {name: [] for name, _ in binaries}
        for r in range(a.rounds):
            for name, binary in (binaries if r % 2 == 0 else binaries[::-1]):
                dirty, took = flush_run(binary, backend_uri, a.cache, a.spread, a.gap if name == "iocache" else None)
                mbps = dirty * 4096 / took / 1e6
                results[name].append(mbps)
                print(f"round {r + 1} {name}: {dirty} dirty lines written back in {took:.2f} s: {mbps:.1f} MB/s, "
                      f"{mbps / seq['1m']:.2f}x the 1 MiB sequential rate", flush=True)
        for name, rates in results.items():
            print(f"{name}: median {statistics.median(rates):.1f} MB/s over {len(rates)} round(s)")
    finally:
        benchlib.stop(backend)


if __name__ == "__main__":
    main()
