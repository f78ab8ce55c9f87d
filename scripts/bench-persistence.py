#!/usr/bin/env python3
"""Cost and benefit of each metadata persistence mode (SYSTOR'14 Fig. 18/19).

Not run by CI; results go in docs/results/durability.md. For each of
`--persistence none` (with --force), `dirty` and `all`, on this machine:

  * cost: a write-heavy fio run (nbd engine, 4 KiB, 70 % random writes,
    QD 16, a FLUSH every 32 writes) on a range that fits the cache: read and
    write IOPS and write latency percentiles;
  * benefit: the cache is warmed (the range read once), the server stopped
    cleanly (SIGTERM) or killed (SIGKILL) and started again, and the line hit
    ratio of a random-read run right after the restart is read from
    `iocache stats --json`.

Cache: a file in /var/tmp opened with O_DIRECT (a real disk, so barriers pay
for real flushes). Backend: nbdkit's file plugin behind its delay filter
(1 ms per request), as in scripts/bench-engine.py.

Usage: scripts/bench-persistence.py [SECONDS_PER_RUN]   (default 10)
Needs: fio, nbdkit, a release build (cargo build --release).
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("bench_engine", os.path.join(HERE, "bench-engine.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

SECONDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
bench.SECONDS = SECONDS
WORK = bench.WORK = "/var/tmp/iocache-persistence"
CACHE = 128 << 20
RANGE = "96m"                # fits the cache
BIN = bench.BIN


def start(mode, backend_uri, init):
    d = f"{WORK}/iocache"
    os.makedirs(d, exist_ok=True)
    sock = bench.fresh("iocache")
    args = [BIN, "serve", "--backend", backend_uri, "--cache", f"{WORK}/cache.img", "--cache-size", f"{CACHE}B",
            "--direct", "--persistence", mode, "--socket", sock, "--admin-socket", f"{d}/admin.sock",
            "--listen", "127.0.0.1:0"]
    if init:
        args.append("--init")
    if init or mode == "none":
        args.append("--force")
    p = subprocess.Popen(args, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    bench.wait_socket(sock, p)
    return p, f"nbd+unix:///?socket={sock}", f"{d}/admin.sock"


def stats(admin):
    out = bench.sh([BIN, "stats", "--admin-socket", admin, "--json"]).stdout
    return json.loads(out)["volumes"][0]


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()


def main():
    for tool in ("fio", "nbdkit"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed (apt-get install {tool})")
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    with open(f"{WORK}/backend.img", "wb") as f:
        f.truncate(bench.VOLUME)
    backend, backend_uri = bench.start_backend()
    rows = []
    try:
        for mode in ("none", "dirty", "all"):
            # Cost.
            p, uri, admin = start(mode, backend_uri, init=True)
            try:
                bench.warm(uri, 96 << 20)
                r = bench.fio(uri, "cost", ["--rw=randrw", "--rwmixwrite=70", f"--size={RANGE}", "--iodepth=16",
                                            "--fsync=32"])
                s = stats(admin)
            finally:
                bench.stop(p)
            row = {"mode": mode, "cost": r, "barriers": s["barriers"], "records": s["records_written"]}
            # Benefit, after a clean stop and after a kill.
            for how in ("SIGTERM", "SIGKILL"):
                p, uri, admin = start(mode, backend_uri, init=True)
                bench.warm(uri, 96 << 20)
                # Dirty some lines too, and make them durable.
                bench.fio(uri, "dirty", ["--rw=randwrite", f"--size={RANGE}", "--iodepth=16", "--fsync=64",
                                         "--number_ios=4096"], seconds=0)
                if how == "SIGTERM":
                    bench.stop(p)
                else:
                    kill(p)
                p, uri, admin = start(mode, backend_uri, init=False)
                try:
                    after = stats(admin)
                    bench.fio(uri, "after", ["--rw=randread", f"--size={RANGE}", "--iodepth=16"],
                              seconds=max(2, SECONDS // 2))
                    s = stats(admin)
                finally:
                    bench.stop(p)
                row[how] = {"hit_ratio": s["hit_ratio"], "loaded_dirty": after["recovery"]["dirty_lines"],
                            "loaded_clean": after["recovery"]["clean_lines"]}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        bench.stop(backend)
    print(f"# Persistence modes: cost and benefit ({SECONDS} s per cost run)\n")
    print("| persistence | read IOPS | write IOPS | write p99 µs | write p99.99 µs | barriers | records written |"
          " hit ratio after a clean restart (lines loaded) | hit ratio after a kill -9 (lines loaded) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        c = row["cost"]
        cells = [row["mode"], f"{c['read']['iops']:.0f}", f"{c['write']['iops']:.0f}",
                 f"{c['write']['p99_us']:.0f}", f"{c['write']['p9999_us']:.0f}", str(row["barriers"]),
                 str(row["records"])]
        for how in ("SIGTERM", "SIGKILL"):
            b = row[how]
            cells.append(f"{b['hit_ratio'] * 100:.1f} % ({b['loaded_clean']} clean, {b['loaded_dirty']} dirty)")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
