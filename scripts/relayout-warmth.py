#!/usr/bin/env python3
"""How warm the cache is right after a live line size change (not run by CI).

Why it exists: when ReCA changes the line size while serving, the new
engine starts with an empty cache and the old one's data comes back
(crates/iocache-serving/src/relayout.rs): read again from the backend at a
bounded rate, or, where the old cache's data was copied into memory before
the change, filled from those copies. This measures what clients see: the
read hit ratio of a client that reads a hot set, just before and in the
seconds right after the change, for one or two builds alternated.

Each run: a 4 GiB sparse backend file beside this script's work directory,
a cache file in /dev/shm of --cache-size, ReCA with windows of --window
requests. fio (nbd engine) first reads the hot set (64 MiB at 3 GiB) once
(random order: sequential reads may bypass the cache),
then runs two jobs at once: `driver`, sequential 4 KiB writes looping over
64 MiB at 0 at QD 4 (ReCA's large file generators: 128 KiB lines, from the
configured 4 KiB), and `probe`, random 4 KiB reads of the hot set at QD 1,
--probe-iops per second. The volume's counters (client requests only; a
new engine's start at zero) are read every 50 ms; the hit ratio after the
change counts the probe's reads from the change on.

    cargo build --release
    scripts/relayout-warmth.py --binary target/release/iocache [--binary OTHER] --rounds 2
"""

import argparse
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

HOT = ("3G", "64M")
AFTER = [0.25, 0.5, 1.0, 2.0, 4.0]


def stats(binary, admin):
    out = subprocess.run([binary, "stats", "--admin-socket", admin, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)["volumes"][0]


def run_once(binary, cache_size, window, probe_iops, seconds):
    work = tempfile.mkdtemp(prefix="relayout-warmth-", dir="/work" if os.path.isdir("/work") else None)
    shm = tempfile.mkdtemp(prefix="relayout-warmth-", dir="/dev/shm")
    sock, admin = os.path.join(work, "s.sock"), os.path.join(work, "admin.sock")
    log_path = os.path.join(work, "server.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [binary, "serve", "--backend", os.path.join(work, "backend.img"), "--backend-size", "4GiB",
             "--cache", os.path.join(shm, "cache.img"), "--cache-size", cache_size,
             "--adapt", "reca", "--reca-window", str(window), "--reca-line-size", "live",
             "--socket", sock, "--admin-socket", admin],
            stdout=log, stderr=log, cwd=work)
    samples = []  # (seconds since the jobs started, volume stats)
    try:
        benchlib.wait_socket(sock, server)
        uri = f"nbd+unix:///?socket={sock}"
        fio = ["fio", "--output-format=json", "--ioengine=nbd", f"--uri={uri}", "--bs=4k"]
        subprocess.run(fio + ["--name=warm", "--rw=randread", f"--offset={HOT[0]}", f"--size={HOT[1]}",
                              "--iodepth=4"], capture_output=True, text=True, check=True)
        jobs = subprocess.Popen(
            fio + ["--time_based", f"--runtime={seconds}",
                   "--name=driver", "--rw=write", "--offset=0", "--size=64M", "--iodepth=4",
                   "--name=probe", "--rw=randread", f"--offset={HOT[0]}", f"--size={HOT[1]}", "--iodepth=1",
                   f"--rate_iops={probe_iops}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started = time.monotonic()
        while jobs.poll() is None:
            s = stats(binary, admin)
            if s is not None:
                samples.append((time.monotonic() - started, s))
            time.sleep(0.05)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    text = open(log_path).read()
    held = re.search(r"requests held [^\n]*?\)", text)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)
    change = next((i for i, (_, s) in enumerate(samples) if s.get("line_size_changes")), None)
    row = {"binary": binary, "changed": change is not None, "held": held.group(0) if held else None}
    if change is None or change == 0:
        row["log"] = text[-2000:]
        return row
    t0, first = samples[change]
    # Before: the old engine's last second (its counters run from the start).
    before = [s for t, s in samples[:change] if t >= samples[change - 1][0] - 1.0]
    a, b = before[0], before[-1]
    reads = b["read_requests"] - a["read_requests"]
    row["hit_before"] = (b["read_hits"] - a["read_hits"]) / reads if reads else float("nan")
    c = first["line_size_changes"][0]
    row["change"] = f"{c['old_line_bytes'] // 1024}KiB -> {c['new_line_bytes'] // 1024}KiB"
    row["paused_ms"] = c["paused_ms"]
    row["kept_mib"] = c.get("kept_bytes", 0) / 2**20
    row["warm_mib"] = c["warm_bytes"] / 2**20
    # After: the new engine's counters from zero (the change was seen at
    # most 50 ms after it happened).
    for after in AFTER:
        at = next((s for t, s in samples[change:] if t >= t0 + after), None)
        if at is None or at.get("line_size_changes") != first["line_size_changes"]:
            row[f"hit_{after}"] = None
            continue
        row[f"hit_{after}"] = at["read_hits"] / at["read_requests"] if at["read_requests"] else None
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", action="append", help="a build to measure (repeat to alternate two)")
    p.add_argument("--cache-size", default="256MiB")
    p.add_argument("--window", type=int, default=20000, help="ReCA window in requests")
    p.add_argument("--probe-iops", type=int, default=2000)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    binaries = args.binary or [os.path.join(benchlib.REPO, "target/release/iocache")]
    if shutil.which("fio") is None:
        sys.exit("fio is not installed")
    rows = []
    for r in range(args.rounds):
        for binary in (binaries if r % 2 == 0 else binaries[::-1]):
            row = run_once(binary, args.cache_size, args.window, args.probe_iops, args.seconds)
            row["round"] = r + 1
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(f"cache {args.cache_size}, window {args.window} requests, probe {args.probe_iops} reads/s")
    heads = " | ".join(f"hit ratio first {a} s" for a in AFTER)
    print(f"| round | binary | change | held ms | kept MiB / warm MiB | hit ratio the second before | {heads} |")
    print("|---:|---|---|---:|---|---:|" + "---:|" * len(AFTER))
    pct = lambda v: "-" if v is None or v != v else f"{100 * v:.1f} %"  # noqa: E731
    for row in rows:
        if not row["changed"] or "change" not in row:
            print(f"| {row['round']} | {row['binary']} | no change seen | | | | " + " |" * len(AFTER))
            continue
        hits = " | ".join(pct(row[f"hit_{a}"]) for a in AFTER)
        print(f"| {row['round']} | {row['binary']} | {row['change']} | {row['paused_ms']:.1f} | "
              f"{row['kept_mib']:.0f} / {row['warm_mib']:.0f} | {pct(row['hit_before'])} | {hits} |")


if __name__ == "__main__":
    main()
