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

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

WORK = "/var/tmp/iocache-persistence"
CACHE = 128 << 20
RANGE = "96m"                # fits the cache


def start(binary, mode, backend_uri, init):
    d = f"{WORK}/iocache"
    os.makedirs(d, exist_ok=True)
    sock = benchlib.fresh_socket(WORK, "iocache")
    args = [binary, "serve", "--backend", backend_uri, "--cache", f"{WORK}/cache.img", "--cache-size", f"{CACHE}B",
            "--direct", "--persistence", mode, "--socket", sock, "--admin-socket", f"{d}/admin.sock",
            "--listen", "127.0.0.1:0"]
    if init:
        args.append("--init")
    if init or mode == "none":
        args.append("--force")
    p, uri = benchlib.start_iocache(args, d, sock)
    return p, uri, f"{d}/admin.sock"


def cost(binary, mode, backend_uri, iodepth, seconds):
    """The cost run of `binary` on a fresh cache: the range read once, then
    fio's write-heavy mix; returns fio's results and the volume's stats."""
    p, uri, admin = start(binary, mode, backend_uri, init=True)
    try:
        benchlib.warm(uri, 96 << 20)
        r = benchlib.fio(uri, "cost", ["--rw=randrw", "--rwmixwrite=70", f"--size={RANGE}", f"--iodepth={iodepth}",
                                       "--fsync=32"], seconds=seconds)
        s = benchlib.volume_stats(binary, admin)
    finally:
        benchlib.stop(p)
    return r, s


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()


def main():
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    binary = benchlib.BIN
    benchlib.need_tools("fio", "nbdkit")
    backend, backend_uri = benchlib.delayed_backend(WORK)
    rows = []
    try:
        for mode in ("none", "dirty", "all"):
            r, s = cost(binary, mode, backend_uri, 16, seconds)
            row = {"mode": mode, "cost": r, "barriers": s["barriers"], "records": s["records_written"]}
            # Benefit, after a clean stop and after a kill.
            for how in ("SIGTERM", "SIGKILL"):
                p, uri, admin = start(binary, mode, backend_uri, init=True)
                benchlib.warm(uri, 96 << 20)
                # Dirty some lines too, and make them durable.
                benchlib.fio(uri, "dirty", ["--rw=randwrite", f"--size={RANGE}", "--iodepth=16", "--fsync=64",
                                            "--number_ios=4096"], seconds=0)
                if how == "SIGTERM":
                    benchlib.stop(p)
                else:
                    kill(p)
                p, uri, admin = start(binary, mode, backend_uri, init=False)
                try:
                    after = benchlib.volume_stats(binary, admin)
                    benchlib.fio(uri, "after", ["--rw=randread", f"--size={RANGE}", "--iodepth=16"],
                                 seconds=max(2, seconds // 2))
                    s = benchlib.volume_stats(binary, admin)
                finally:
                    benchlib.stop(p)
                row[how] = {"hit_ratio": s["hit_ratio"], "loaded_dirty": after["recovery"]["dirty_lines"],
                            "loaded_clean": after["recovery"]["clean_lines"]}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        benchlib.stop(backend)
    print(f"# Persistence modes: cost and benefit ({seconds} s per cost run)\n")
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
