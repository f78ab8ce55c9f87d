#!/usr/bin/env python3
"""A cache resized while it serves, against the restart it replaces.

Not run by CI; results go in docs/results/resize.md. The backend is
nbdkit's file plugin behind its delay filter (DELAY per request: a
remote volume). A cache of FROM bytes (4 KiB lines, write-back, the
device formatted for MAX) is warmed by fio (random 4 KiB reads and
writes, 70 % reads, zipf 1.1 over REGION bytes, QD 16), then sized TO:

  * live: `iocache ctl set cache_size=TO` while fio keeps running; the
    command's time is the resize (dirty lines leaving are written back
    first), and fio's worst latency in that run shows what clients felt;
  * none: the same run without a change (the cache stays at FROM): the
    worst latency clients see anyway;
  * restart: what a resize took before it could be done live: SIGTERM
    (every dirty line written back), then a start with `--cache-size TO
    --init` (the cache formatted anew, cold).

Then fio runs AFTER seconds more; the line hit ratio of that run (from
`iocache stats`) is the price of the lines the change lost. Modes
alternate from round to round.

Usage: scripts/bench-resize.py [--rounds N] [--from 128MiB] [--to 64MiB,256MiB]
                               [--max 256MiB] [--region 512MiB] [--delay 1ms]
Needs: fio, nbdkit, a release build (cargo build --release).
"""

import argparse
import os
import re
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

WORK = "/dev/shm/iocache-bench-resize"
WARM_SECONDS = 10
DURING_SECONDS = 6
AFTER_SECONDS = 5


def size_bytes(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def fio_mix(uri, region, seconds, name):
    return benchlib.fio(uri, name, ["--rw=randrw", "--rwmixread=70", f"--size={region}",
                                    "--random_distribution=zipf:1.1", "--iodepth=16", "--randseed=11"],
                        seconds=seconds, percentiles="50:99:100")


def hits(binary, admin):
    v = benchlib.volume_stats(binary, admin)
    return v["line_accesses"], v["read_hits"] + v["write_hits"], v


def run(binary, backend_uri, mode, frm, to, mx, region):
    d = f"{WORK}/iocache"
    benchlib.fresh_dirs(d)
    admin = f"{d}/admin.sock"

    def start(size, init):
        sock = benchlib.fresh_socket(WORK, "iocache")
        args = [binary, "serve", "--backend", backend_uri, "--cache", f"{d}/cache.img", "--cache-size", size,
                "--cache-size-max", mx, "--line-size", "4KiB", "--write-policy", "wb", "--socket", sock,
                "--admin-socket", admin] + (["--init", "--force"] if init else [])
        return benchlib.start_iocache(args, d, sock)

    p, uri = start(frm, True)
    try:
        fio_mix(uri, region, WARM_SECONDS, "warm")
        dirty = benchlib.volume_stats(binary, admin)["dirty_lines"]
        if mode in ("live", "none"):
            took = [0.0]

            def resize():
                time.sleep(2)
                started = time.monotonic()
                if mode == "live":
                    benchlib.sh([binary, "ctl", "--admin-socket", admin, "set", f"cache_size={to}"])
                took[0] = time.monotonic() - started

            t = threading.Thread(target=resize)
            t.start()
            during = fio_mix(uri, region, DURING_SECONDS, "during")
            t.join()
            change_s, worst_ms = took[0], max(during["read"]["percentiles_us"].get(100.0, 0),
                                              during["write"]["percentiles_us"].get(100.0, 0)) / 1e3
        else:
            started = time.monotonic()
            benchlib.stop(p)
            p, uri = start(to, True)
            change_s, worst_ms = time.monotonic() - started, None
        accesses0, hits0, _ = hits(binary, admin)
        after = fio_mix(uri, region, AFTER_SECONDS, "after")
        accesses1, hits1, v = hits(binary, admin)
    finally:
        benchlib.stop(p)
    # The server's log line: `cache resized ... (N dirty lines written back first; ...)`.
    logged = re.findall(r"(\d+) dirty lines written back first", p.stderr.read())
    return {
        "written_back": int(logged[-1]) if logged and mode == "live" else 0,
        "dirty_before": dirty,
        "change_s": change_s,
        "worst_ms": worst_ms,
        "hit_after": (hits1 - hits0) / max(1, accesses1 - accesses0),
        "iops_after": after["read"]["iops"] + after["write"]["iops"],
        "resident": v["resident_lines"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--from", dest="frm", default="128MiB")
    ap.add_argument("--to", default="64MiB,256MiB")
    ap.add_argument("--max", default="256MiB")
    ap.add_argument("--region", default="512MiB")
    ap.add_argument("--delay", default="1ms")
    args = ap.parse_args()
    benchlib.need_tools("fio", "nbdkit")
    binary = os.path.join(benchlib.REPO, "target/release/iocache")
    nbdkit, backend_uri = benchlib.delayed_backend(f"{WORK}/backend", delay=args.delay)
    results = {}
    try:
        for r in range(args.rounds):
            for to in args.to.split(","):
                modes = ["live", "restart", "none"] if r % 2 == 0 else ["none", "restart", "live"]
                for mode in modes:
                    res = run(binary, backend_uri, mode, args.frm, to, args.max, size_bytes(args.region))
                    results.setdefault((to, mode), []).append(res)
                    print(f"round {r} {args.frm}->{to} {mode}: {res}", flush=True)
    finally:
        benchlib.stop(nbdkit)
    print(f"\n{args.frm} -> TO, max {args.max}, region {args.region}, backend delay {args.delay}, "
          f"{args.rounds} rounds (median)")
    print("| to | mode | dirty lines before | written back | change (s) | worst latency during (ms) | line hit ratio after | IOPS after |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (to, mode), runs in results.items():
        med = lambda k: statistics.median(x[k] for x in runs)  # noqa: E731
        worst = "-" if mode == "restart" else f"{med('worst_ms'):.1f}"
        print(f"| {to} | {mode} | {med('dirty_before'):.0f} | {med('written_back'):.0f} | {med('change_s'):.2f} | {worst} | "
              f"{med('hit_after') * 100:.1f} % | {med('iops_after'):.0f} |")


if __name__ == "__main__":
    main()
