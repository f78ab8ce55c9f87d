#!/usr/bin/env python3
"""What a live line size change costs the clients (not run by CI).

Why it exists: `iocache serve --adapt reca` replaces its engine when ReCA
wants another line size (src/live_relayout.rs): dirty lines written back,
requests held while the old engine shuts down and a new one formats the
device, the old cache's ranges read again from the backend. This measures
that on a real client against the same run without the change
(`--reca-line-size next_start`), alternated.

Each run: a cache file in /dev/shm of --cache-size, a backend file on disk;
fio (nbd engine) runs two jobs at once for --seconds:
- `driver`: sequential 4 KiB writes over the first half of the backend
  (ReCA's large file generators: 128 KiB lines, from the configured 4 KiB),
  QD 4, which also fills the cache with dirty lines;
- `probe`: random 4 KiB reads at QD 1, 1000 per second, over a range the
  driver does not touch, whose latencies show the pause.
It reports the server's log line of the change (dirty lines written back
first, the pause, the warm-up), the probe's p50/p99.9/max latency and the
driver's throughput.

    cargo build --release
    scripts/reca-live-relayout.py --cache-size 256MiB --rounds 2
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def run_once(binary, mode, cache_size, seconds, window):
    work = tempfile.mkdtemp(prefix="reca-relayout-", dir="/work" if os.path.isdir("/work") else None)
    shm = tempfile.mkdtemp(prefix="reca-relayout-", dir="/dev/shm")
    sock = os.path.join(work, "s.sock")
    admin = os.path.join(work, "admin.sock")
    log_path = os.path.join(work, "server.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [binary, "serve", "--backend", os.path.join(work, "backend.img"), "--backend-size", "4GiB",
             "--cache", os.path.join(shm, "cache.img"), "--cache-size", cache_size,
             "--adapt", "reca", "--reca-window", str(window), "--reca-line-size", mode,
             "--socket", sock, "--admin-socket", admin],
            stdout=log, stderr=log, cwd=work)
    try:
        deadline = time.time() + 20
        while not os.path.exists(sock):
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit(open(log_path).read())
            time.sleep(0.05)
        uri = f"nbd+unix:///?socket={sock}"
        out = subprocess.run(
            ["fio", "--output-format=json", "--ioengine=nbd", f"--uri={uri}", "--time_based",
             f"--runtime={seconds}", "--bs=4k",
             "--name=driver", "--rw=write", "--offset=0", "--size=2G", "--iodepth=4",
             "--name=probe", "--rw=randread", "--offset=3G", "--size=256M", "--iodepth=1",
             "--rate_iops=1000"],
            capture_output=True, text=True, check=True)
        jobs = {j["jobname"]: j for j in benchlib.fio_jobs(out.stdout)}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    text = open(log_path).read()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)
    probe = jobs["probe"]["read"]
    pct = probe["clat_ns"].get("percentile", {})
    change = re.search(r"line size (\S+) -> (\S+) while serving: (\d+) dirty lines written back first, "
                       r"requests held ([\d.]+) ms \((\d+) lines dirtied meanwhile written back ([\d.]+) ms, "
                       r"(?:\S+ of copied data kept [\d.]+ ms, )?"
                       r"shutdown ([\d.]+) ms, opening with the new line size ([\d.]+) ms\)", text)
    warm = re.search(r"warm-up done: (\S+) read again(?: \(\S+ of it from the backend\))? in ([\d.]+) s", text)
    return {
        "mode": mode,
        "change": f"{change.group(1)} -> {change.group(2)}" if change else "none",
        "written_back_first": int(change.group(3)) if change else 0,
        "held_ms": float(change.group(4)) if change else 0.0,
        "held_parts": (f"{change.group(5)} lines {change.group(6)} + shutdown {change.group(7)} + open {change.group(8)}"
                       if change else "-"),
        "warm": f"{warm.group(1)} in {warm.group(2)} s" if warm else "-",
        "probe_p50_us": pct.get("50.000000", 0) / 1e3,
        "probe_p99_9_us": pct.get("99.900000", 0) / 1e3,
        "probe_max_us": probe["clat_ns"]["max"] / 1e3,
        "driver_mb_s": jobs["driver"]["write"]["bw_bytes"] / 1e6,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default=os.path.join(benchlib.REPO, "target/release/iocache"))
    p.add_argument("--cache-size", default="256MiB")
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--window", type=int, default=20000, help="ReCA window in requests")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    for tool in ["fio"]:
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed")
    rows = []
    for r in range(args.rounds):
        for mode in (["live", "next_start"] if r % 2 == 0 else ["next_start", "live"]):
            row = run_once(args.binary, mode, args.cache_size, args.seconds, args.window)
            row["round"] = r + 1
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(f"cache {args.cache_size}, window {args.window} requests, {args.seconds} s per run")
    print("| round | reca_line_size | change | dirty lines written back first | requests held ms "
          "| of which (ms) | warm-up | probe p50 µs | probe p99.9 µs | probe max µs | driver MB/s |")
    print("|---:|---|---|---:|---:|---|---|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['round']} | {row['mode']} | {row['change']} | {row['written_back_first']} | "
              f"{row['held_ms']:.1f} | {row['held_parts']} | {row['warm']} | {row['probe_p50_us']:.0f} | "
              f"{row['probe_p99_9_us']:.0f} | {row['probe_max_us']:.0f} | {row['driver_mb_s']:.0f} |")


if __name__ == "__main__":
    main()
