#!/usr/bin/env python3
"""The engine benchmark (not run by CI; results go in docs/results/engine.md).

Side by side, in one run, on this machine:
  * iocache serve: cache file in /dev/shm, backend = an nbdkit file plugin with
    the delay filter (a slow backend) on a Unix socket;
  * nbdkit's cache filter (cache-on-read=true, its cache in /dev/shm) over the
    same file plugin with the same delay filter.
Workloads (fio nbd engine, 4 KiB):
  * random reads at QD 16 on a range that fits both caches (100 % hits after warm-up);
  * zoned random reads with about 85 % and 25 % hit potential;
  * a 70/30 random read/write mix on the 85 % distribution;
then iocache's lookup modes (fine, coarse, single) at 1, 2, 4, 8 and 16 jobs,
and the engine without NBD (examples/loadgen) against fio on the raw cache file.

Usage: scripts/bench-engine.py [SECONDS_PER_RUN]   (default 10)
Needs: fio, nbdkit, a release build (cargo build --release --examples).
"""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
from benchlib import fio, sh, stop, warm  # noqa: E402

SECONDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
WORK = "/var/tmp/iocache-bench"
SHM = "/dev/shm/iocache-bench"
VOLUME = benchlib.BACKEND_VOLUME  # 1 GiB backend
CACHE = 128 << 20                 # 128 MiB cache for both systems
DELAY = benchlib.BACKEND_DELAY    # backend latency per request (nbdkit delay filter)
BIN = benchlib.BIN
LOADGEN = os.path.abspath("target/release/examples/loadgen")


def start_nbdkit_cache():
    sock = benchlib.fresh_socket(WORK, "nbdkit-cache")
    env = dict(os.environ, TMPDIR=SHM)
    return benchlib.start_server(["nbdkit", "-f", "-U", sock, "--filter=cache", "--filter=delay", "file",
                                  f"{WORK}/backend.img", "cache-on-read=true", f"cache-max-size={CACHE}",
                                  f"delay-read={DELAY}", f"delay-write={DELAY}"], sock, env=env)


def start_iocache(backend_uri, lookup="fine", extra=()):
    d = f"{WORK}/iocache"
    benchlib.fresh_dirs(d)
    sock = benchlib.fresh_socket(WORK, "iocache")
    cache = f"{SHM}/iocache-cache.img"
    if os.path.exists(cache):
        os.remove(cache)
    return benchlib.start_iocache([BIN, "serve", "--backend", backend_uri, "--cache", cache,
                                   "--cache-size", f"{CACHE}B", "--socket", sock, "--admin-socket",
                                   f"{d}/admin.sock", "--listen", "127.0.0.1:0", "--lookup", lookup,
                                   "--init"] + list(extra), d, sock)


WORKLOADS = [
    ("random reads, 100 % hits (64 MiB range), QD 16", 64 << 20,
     ["--rw=randread", "--size=64m", "--iodepth=16"]),
    ("zoned random reads, ~85 % hit potential, QD 16", 100 << 20,
     ["--rw=randread", "--random_distribution=zoned:85/10:15/90", "--iodepth=16"]),
    ("zoned random reads, ~25 % hit potential, QD 16", 100 << 20,
     ["--rw=randread", "--random_distribution=zoned:25/10:75/90", "--iodepth=16"]),
    ("70/30 random read/write, ~85 % distribution, QD 16", 100 << 20,
     ["--rw=randrw", "--rwmixread=70", "--random_distribution=zoned:85/10:15/90", "--iodepth=16"]),
]


def main():
    benchlib.need_tools("fio", "nbdkit")
    benchlib.fresh_dirs(SHM)
    print(f"# Engine benchmark ({SECONDS} s per run; backend delay {DELAY} per request; caches of "
          f"{CACHE >> 20} MiB in /dev/shm; volume {VOLUME >> 30} GiB)\n")
    print("| workload | system | read IOPS | read p99 µs | read p99.99 µs | write IOPS | write p99.99 µs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    backend, backend_uri = benchlib.delayed_backend(WORK, VOLUME, DELAY)
    try:
        for label, warm_bytes, args in WORKLOADS:
            for system in ("iocache", "nbdkit cache filter"):
                if system == "iocache":
                    p, uri = start_iocache(backend_uri)
                else:
                    p, uri = start_nbdkit_cache()
                try:
                    warm(uri, warm_bytes)
                    r = fio(uri, "run", args + ([] if "size" in " ".join(args) else [f"--size={VOLUME}"]),
                            seconds=SECONDS)
                finally:
                    stop(p)
                print(f"| {label} | {system} | {r['read']['iops']:.0f} | {r['read']['p99_us']:.0f} | "
                      f"{r['read']['p9999_us']:.0f} | {r['write']['iops']:.0f} | {r['write']['p9999_us']:.0f} |",
                      flush=True)
        print("\n## Lookup architectures (iocache, 4 KiB random reads, 100 % hits, QD 1 per job)\n")
        print("| jobs | fine IOPS | coarse IOPS | single IOPS |")
        print("|---:|---:|---:|---:|")
        for jobs in (1, 2, 4, 8, 16):
            cells = []
            for lookup in ("fine", "coarse", "single"):
                p, uri = start_iocache(backend_uri, lookup)
                try:
                    warm(uri, 64 << 20)
                    r = fio(uri, "lookup", ["--rw=randread", "--size=64m", "--iodepth=1", f"--numjobs={jobs}",
                                            "--group_reporting"], seconds=SECONDS)
                finally:
                    stop(p)
                cells.append(f"{r['read']['iops']:.0f}")
            print(f"| {jobs} | " + " | ".join(cells) + " |", flush=True)
    finally:
        stop(backend)
    print("\n## The engine without NBD vs the raw cache device (4 KiB random reads, psync, all hits)\n")
    print("| jobs | engine IOPS (loadgen, fine) | fio psync on the cache file | ratio |")
    print("|---:|---:|---:|---:|")
    cache = f"{SHM}/loadgen.img"
    # Written in full first: in a sparse file fio would read holes (the
    # kernel's zero page), not data pages like the engine's slots. See
    # scripts/bench-hitpath.sh for the careful version (alternating runs).
    sh(["fio", "--name=fill", "--ioengine=psync", "--rw=write", "--bs=1m", f"--filename={cache}",
        f"--size={(256 + 32) << 20}", "--output-format=terse"])
    for jobs in (1, 2):
        out = sh([LOADGEN, cache, str(256 << 20), str(128 << 20), str(jobs), str(SECONDS), "fine"]).stdout
        engine_iops = float(out.split("iops=")[1].split()[0])
        raw = json.loads(sh(["fio", "--name=raw", "--ioengine=psync", "--rw=randread", "--bs=4k",
                             f"--numjobs={jobs}", f"--filename={cache}", "--size=128m", "--time_based",
                             f"--runtime={SECONDS}", "--group_reporting", "--output-format=json"]).stdout)
        raw_iops = raw["jobs"][0]["read"]["iops"]
        print(f"| {jobs} | {engine_iops:.0f} | {raw_iops:.0f} | {engine_iops / raw_iops:.2f} |", flush=True)
    shutil.rmtree(SHM, ignore_errors=True)


if __name__ == "__main__":
    main()
