#!/usr/bin/env python3
"""Readahead in front of a slow backend (not run by CI; results go in
docs/results/admission.md).

A sequential reader (fio, nbd engine, one job at QD 1) reads a cold
256 MiB region of a 1 GiB backend served by nbdkit's file plugin behind
its delay filter (1 ms per request), through:
  * iocache serve --readahead off (cache file in /dev/shm);
  * iocache serve --readahead seq (the same);
  * nbdkit's cache filter (cache-on-read=true) and its readahead filter
    over the same delayed backend, in both orders (the readahead filter
    above the cache fills the cache with its prefetches; below it, it
    prefetches into the plugin).
Each configuration starts cold; they alternate, ROUNDS times (default 3).

Usage: scripts/bench-readahead.py [ROUNDS] [BS]   (default 3 64k)
Needs: fio, nbdkit, a release build (cargo build --release).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
from benchlib import fio, stop  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
BS = sys.argv[2] if len(sys.argv) > 2 else "64k"
WORK = "/var/tmp/iocache-bench-readahead"
SHM = "/dev/shm/iocache-bench-readahead"
CACHE = 512 << 20
REGION = "256m"


def iocache(backend_uri, readahead):
    d = f"{WORK}/iocache"
    benchlib.fresh_dirs(d, SHM)
    sock = benchlib.fresh_socket(WORK, "iocache")
    return benchlib.start_iocache([benchlib.BIN, "serve", "--backend", backend_uri, "--cache",
                                   f"{SHM}/cache.img", "--cache-size", f"{CACHE}B", "--socket", sock,
                                   "--admin-socket", f"{d}/admin.sock", "--listen", "127.0.0.1:0", "--init",
                                   "--readahead", readahead], d, sock)


def nbdkit_readahead(filters):
    benchlib.fresh_dirs(SHM)
    sock = benchlib.fresh_socket(WORK, "nbdkit")
    env = dict(os.environ, TMPDIR=SHM)
    return benchlib.start_server(["nbdkit", "-f", "-U", sock] + [f"--filter={f}" for f in filters] +
                                 ["--filter=delay", "file", f"{WORK}/backend.img", "cache-on-read=true",
                                  f"cache-max-size={CACHE}", f"delay-read={benchlib.BACKEND_DELAY}",
                                  f"delay-write={benchlib.BACKEND_DELAY}"], sock, env=env)


def main():
    benchlib.need_tools("fio", "nbdkit")
    backend, uri = benchlib.delayed_backend(WORK)
    configs = [("iocache --readahead off", lambda: iocache(uri, "off")),
               ("iocache --readahead seq", lambda: iocache(uri, "seq")),
               ("nbdkit cache over readahead filter", lambda: nbdkit_readahead(["cache", "readahead"])),
               ("nbdkit readahead over cache filter", lambda: nbdkit_readahead(["readahead", "cache"]))]
    results = {name: [] for name, _ in configs}
    try:
        for _ in range(ROUNDS):
            for name, start in configs:
                server, server_uri = start()
                try:
                    r = fio(server_uri, "seq", ["--rw=read", f"--bs={BS}", "--iodepth=1", f"--size={REGION}"],
                            seconds=0)
                finally:
                    stop(server)
                results[name].append(r["read"]["mbps"])
                print(f"{name}: {r['read']['mbps']:.1f} MB/s", file=sys.stderr)
    finally:
        stop(backend)
    print(f"Sequential {BS} reads at QD 1 of a cold {REGION} region, backend delay {benchlib.BACKEND_DELAY} "
          f"per request, {ROUNDS} alternated rounds (MB/s, each round):\n")
    print("| configuration | MB/s | rounds |")
    print("|---|---:|---|")
    for name, _ in configs:
        v = sorted(results[name])
        print(f"| {name} | {v[len(v) // 2]:.1f} | {', '.join(f'{x:.1f}' for x in results[name])} |")


if __name__ == "__main__":
    main()
