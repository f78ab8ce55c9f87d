#!/usr/bin/env python3
"""The NBD serving path side by side with nbdkit.

Not run by CI; results go in docs/results/engine.md. Every system serves a
256 MiB volume whose data is all in memory, so only the serving path is
measured:

  * iocache: `iocache serve`, backend a file in /var/tmp (page cache),
    cache file in /dev/shm, the range read once first (100 % hits);
  * baseline (optional): another iocache binary, same setup (e.g. a build
    from before a change, to compare in the same run);
  * nbdkit-cache: nbdkit's file plugin behind its cache filter with
    `cache-min-block-size=4096` (its best block size for 4 KiB requests),
    its cache in /dev/shm (TMPDIR), warmed the same way;
  * nbdkit-memory: nbdkit's memory plugin, its volume written whole first
    (the transport's ceiling here).

Workloads (fio's nbd engine, 4 KiB random reads over 64 MiB): QD 1 on one
connection, QD 16 on one connection, QD 16 on each of 4 connections; and
sequential 64 KiB and 1 MiB reads and writes (MB/s) at QD 4; and nbdcopy of
the whole volume out of the export and into it (MB/s over five copies back to
back; not with --cpu). iocache's
cache (320 MiB) holds the whole volume. Over the Unix
socket, and over TCP on loopback with --tcp. Systems alternate within each
round; ROUNDS rounds.

With --cpu, every (workload, system) gets a server of its own, and the
server's CPU time and context switches (all its threads, from wait4 when it
exits, less those of a server started, warmed and stopped without a
workload) are divided by the requests fio completed: CPU µs and switches
per request, which a busy machine disturbs far less than IOPS.

With --percentiles, the IOPS rows print each run's completion-latency
distribution (p1 to p99.99) instead of medians.

Usage: scripts/bench-serving.py [--seconds S] [--rounds N] [--tcp] [--baseline PATH] [--only LIST] [--cpu]
       [--percentiles]
Needs: fio, nbdkit, a release build (cargo build --release).
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

BIN = os.environ.get("IOCACHE_BIN", os.path.join(benchlib.REPO, "target/release/iocache"))
WORK = "/var/tmp/iocache-serving"
SHM = "/dev/shm/iocache-serving"
VOLUME = 256 << 20
RANGE = "64m"


def wait_ready(uri, proc):
    for _ in range(400):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        if subprocess.run(["nbdinfo", "--size", uri], capture_output=True).returncode == 0:
            return
        time.sleep(0.05)
    raise SystemExit(f"{uri} did not answer")


def knows_flag(binary, flag):
    """Whether `binary serve` takes `flag` (a baseline may predate it)."""
    return flag in subprocess.run([binary, "serve", "--help"], capture_output=True, text=True).stdout


class Server:
    def __init__(self, name, tcp, port):
        self.name, self.tcp, self.port = name, tcp, port
        self.sock = f"{WORK}/{name}.sock"
        self.proc = None

    def uri(self):
        if self.tcp:
            return f"nbd://127.0.0.1:{self.port}/"
        return f"nbd+unix:///?socket={self.sock}"

    def start(self):
        if os.path.exists(self.sock):
            os.remove(self.sock)
        listen = ["-p", str(self.port), "-i", "127.0.0.1"] if self.tcp else ["-U", self.sock]
        if self.name in ("iocache", "baseline"):
            binary = BIN if self.name == "iocache" else BASELINE
            d = f"{WORK}/{self.name}-data"
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            cache = f"{SHM}/{self.name}-cache.img"
            if os.path.exists(cache):
                os.remove(cache)
            args = [binary, "serve", "--backend", f"{WORK}/backend.img", "--cache", cache,
                    "--cache-size", "320MiB", "--socket", self.sock, "--admin-socket", f"{d}/admin.sock",
                    "--init", "--force"]
            if knows_flag(binary, "--commit-interval"):
                # Unflushed writes lost to a kill, as with the cache
                # filter (docs/results/durability.md, "the commit interval").
                args += ["--commit-interval", "0s"]
            if self.tcp:
                args += ["--listen", f"127.0.0.1:{self.port}"]
            self.proc = subprocess.Popen(args, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        elif self.name == "nbdkit-cache":
            env = dict(os.environ, TMPDIR=SHM)
            self.proc = subprocess.Popen(["nbdkit", "-f", *listen, "--filter=cache", "file", f"{WORK}/backend.img",
                                          "cache-min-block-size=4096", "cache-on-read=true"],
                                         stderr=subprocess.PIPE, text=True, env=env)
        elif self.name == "nbdkit-memory":
            self.proc = subprocess.Popen(["nbdkit", "-f", *listen, "memory", str(VOLUME)],
                                         stderr=subprocess.PIPE, text=True)
        wait_ready(self.uri(), self.proc)
        if self.name == "nbdkit-memory":
            # Written whole: a sparse volume would have nbdcopy skip its
            # holes, and the plugin would not be the others' ceiling.
            fio(self.uri(), ["--rw=write", "--bs=1m", f"--size={VOLUME}", "--iodepth=4"], seconds=0)
        # Warm: every system holds the range before it is measured.
        fio(self.uri(), ["--rw=read", "--bs=1m", f"--size={RANGE}", "--iodepth=4"], seconds=0)

    def stop(self):
        """Stops the server; returns (CPU seconds, context switches) of all its threads."""
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 60
        while time.time() < deadline:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = status
                return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw
            time.sleep(0.01)
        self.proc.kill()
        _, _, usage = os.wait4(self.proc.pid, 0)
        return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


NBDCOPY_READ = ["nbdcopy-read"]
NBDCOPY_WRITE = ["nbdcopy-write"]
NBDCOPY_REPEATS = 5


def nbdcopy(uri, extra):
    """Times nbdcopy of the whole volume (export to /dev/null, or a file in
    /dev/shm to the export), after reading the volume once; MB/s."""
    fio(uri, ["--rw=read", "--bs=1m", f"--size={VOLUME}", "--iodepth=4"], seconds=0)
    if extra == NBDCOPY_READ:
        cmd = ["nbdcopy", uri, "null:"]
    else:
        src = f"{SHM}/nbdcopy-src.img"
        if not os.path.exists(src):
            with open(src, "wb") as f:
                f.write(os.urandom(1 << 20) * (VOLUME >> 20))
        cmd = ["nbdcopy", src, uri]
    # One copy takes about 0.2 s here, so a single one is mostly noise
    # (and its start-up): NBDCOPY_REPEATS copies back to back, timed together.
    started = time.monotonic()
    for _ in range(NBDCOPY_REPEATS):
        subprocess.run(cmd, check=True, capture_output=True)
    took = time.monotonic() - started
    r = {"mbps": NBDCOPY_REPEATS * VOLUME / took / 1e6, "ios": NBDCOPY_REPEATS * VOLUME // (256 << 10), "iops": 0,
         "p50_us": 0, "p9999_us": 0, "mean_us": 0}
    return {"read": r, "write": r}


def run(uri, extra, seconds):
    """One workload: fio's (or nbdcopy's) results by direction."""
    if extra in (NBDCOPY_READ, NBDCOPY_WRITE):
        return nbdcopy(uri, extra)
    return fio(uri, extra + [f"--size={RANGE}"], seconds=seconds)


def fio(uri, extra, seconds=None, percentiles="50:99:99.99"):
    """benchlib's fio run (4 KiB unless `extra` says otherwise), jobs reported as one."""
    return benchlib.fio(uri, "x", ["--group_reporting"] + extra, seconds=seconds, percentiles=percentiles)


# --percentiles: the completion latencies reported for each run.
DISTRIBUTION = "1:10:25:50:75:90:99:99.99"


WORKLOADS = [
    ("4k rand read QD1 x1", ["--rw=randread", "--bs=4k", "--iodepth=1", "--numjobs=1"], "read", "iops"),
    ("4k rand read QD16 x1", ["--rw=randread", "--bs=4k", "--iodepth=16", "--numjobs=1"], "read", "iops"),
    ("4k rand read QD16 x4", ["--rw=randread", "--bs=4k", "--iodepth=16", "--numjobs=4"], "read", "iops"),
    ("64k seq read QD4", ["--rw=read", "--bs=64k", "--iodepth=4"], "read", "mbps"),
    ("1m seq read QD4", ["--rw=read", "--bs=1m", "--iodepth=4"], "read", "mbps"),
    ("64k seq write QD4", ["--rw=write", "--bs=64k", "--iodepth=4"], "write", "mbps"),
    ("1m seq write QD4", ["--rw=write", "--bs=1m", "--iodepth=4"], "write", "mbps"),
    # Not fio: nbdcopy of the whole volume (its defaults: 4 connections,
    # 64 requests in flight, 256 KiB requests), after reading it all once.
    ("nbdcopy read 256 MiB", NBDCOPY_READ, "read", "mbps"),
    ("nbdcopy write 256 MiB", NBDCOPY_WRITE, "write", "mbps"),
]


def main():
    global BASELINE
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tcp", action="store_true")
    ap.add_argument("--baseline", help="another iocache binary to compare in the same run")
    ap.add_argument("--only", help="comma-separated workload numbers (1-based) to run")
    ap.add_argument("--cpu", action="store_true", help="a server per workload: CPU µs and context switches per request")
    ap.add_argument("--percentiles", action="store_true",
                    help=f"each run's latency distribution (percentiles {DISTRIBUTION}) for the IOPS rows")
    args = ap.parse_args()
    BASELINE = os.path.abspath(args.baseline) if args.baseline else None
    benchlib.need_tools("fio", "nbdkit", "nbdinfo", hint=False)
    benchlib.fresh_dirs(WORK, SHM)
    with open(f"{WORK}/backend.img", "wb") as f:
        f.write(os.urandom(1 << 20) * (VOLUME >> 20))
    names = ["iocache"] + (["baseline"] if BASELINE else []) + ["nbdkit-cache", "nbdkit-memory"]
    workloads = WORKLOADS
    if args.only:
        workloads = [WORKLOADS[int(i) - 1] for i in args.only.split(",")]
    if args.cpu:
        return cpu_main(args, names, workloads)
    if args.percentiles:
        return percentiles_main(args, names, workloads)
    results = {}  # (workload, system) -> list of (value, p50, p9999, mean)
    for round_no, name, server in alternated_servers(args, names):
        for label, extra, kind, unit in workloads:
            r = run(server.uri(), extra, args.seconds)[kind]
            results.setdefault((label, name), []).append(
                (r[unit], r["p50_us"], r["p9999_us"], r["mean_us"]))
            print(f"round {round_no + 1} {name:14} {label:22} {r[unit]:10.0f} {unit}"
                  f"  p50 {r['p50_us']:.0f} µs  mean {r['mean_us']:.0f} µs  p99.99 {r['p9999_us']:.0f} µs",
                  file=sys.stderr, flush=True)

    def cell(unit, value, p50, p9999, mean):
        if unit == "iops":
            return f"{value / 1000:.1f}k IOPS, p50 {p50:.0f} µs, mean {mean:.0f} µs, p99.99 {p9999:.0f} µs"
        return f"{value:.0f} MB/s"

    print_medians(args, "Serving path", names, workloads, results, cell)


def transport(args):
    return "TCP loopback" if args.tcp else "Unix socket"


def print_medians(args, title, names, workloads, results, cell):
    """A table of workloads by system; each cell is `cell(unit, ...)` of the
    medians over the rounds of each of the system's results."""
    print(f"# {title}, {transport(args)}: {args.rounds} rounds of {args.seconds} s, alternated; medians\n")
    print("| workload | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for label, _, _, unit in workloads:
        cells = []
        for name in names:
            rows = results[(label, name)]
            cells.append(cell(unit, *(statistics.median(column) for column in zip(*rows))))
        print(f"| {label} | " + " | ".join(cells) + " |")


def alternation(args, names):
    """(round number, system, its listening port) for each system of each
    round, in order and reversed on alternate rounds."""
    for round_no in range(args.rounds):
        order = names if round_no % 2 == 0 else list(reversed(names))
        for i, name in enumerate(order):
            yield round_no, name, 10900 + i


def alternated_servers(args, names):
    """(round number, system, its running server) for each system of each
    round, as `alternation` orders them; each server is stopped when the
    caller moves on (or leaves the loop)."""
    for round_no, name, port in alternation(args, names):
        server = Server(name, args.tcp, port)
        server.start()
        try:
            yield round_no, name, server
        finally:
            server.stop()


def percentiles_main(args, names, workloads):
    """--percentiles: every run's completion-latency distribution (IOPS rows only), one line per run."""
    workloads = [w for w in workloads if w[3] == "iops"]
    points = [float(p) for p in DISTRIBUTION.split(":")]
    rows = []
    for round_no, name, server in alternated_servers(args, names):
        for label, extra, kind, _ in workloads:
            r = fio(server.uri(), extra + [f"--size={RANGE}"], seconds=args.seconds,
                    percentiles=DISTRIBUTION)[kind]
            rows.append((label, round_no + 1, name, r))
            print(f"round {round_no + 1} {name:14} {label:22} {r['iops']:10.0f} IOPS", file=sys.stderr, flush=True)
    print(f"# Completion latency distributions, {transport(args)}: {args.rounds} rounds of {args.seconds} s, "
          "alternated\n")
    print("| workload | round | system | IOPS | mean µs | " + " | ".join(f"p{p:g}" for p in points) + " |")
    print("|---|---:|---|---:|---:|" + "---:|" * len(points))
    labels = [w[0] for w in workloads]
    for label, round_no, name, r in sorted(rows, key=lambda row: (labels.index(row[0]), row[1])):
        cells = [f"{r['percentiles_us'].get(p, 0):.0f}" for p in points]
        print(f"| {label} | {round_no} | {name} | {r['iops']:.0f} | {r['mean_us']:.0f} | " + " | ".join(cells) + " |")


def cpu_main(args, names, workloads):
    """--cpu: a server per (workload, system); its CPU and context switches per request."""
    # nbdcopy's rows count no requests of their own (and warm the volume).
    workloads = [w for w in workloads if w[1] not in (NBDCOPY_READ, NBDCOPY_WRITE)]
    results = {}  # (workload, system) -> list of (value, cpu µs per request, switches per request)
    for round_no, name, port in alternation(args, names):
        idle = Server(name, args.tcp, port)
        idle.start()
        idle_cpu, idle_cs = idle.stop()
        for label, extra, kind, unit in workloads:
            server = Server(name, args.tcp, port)
            server.start()
            try:
                r = fio(server.uri(), extra + [f"--size={RANGE}"], seconds=args.seconds)[kind]
            finally:
                cpu, cs = server.stop()
            ios = max(r["ios"], 1)
            cpu_us = max(cpu - idle_cpu, 0) * 1e6 / ios
            cs_per = max(cs - idle_cs, 0) / ios
            results.setdefault((label, name), []).append((r[unit], cpu_us, cs_per))
            print(f"round {round_no + 1} {name:14} {label:22} {r[unit]:10.0f} {unit}"
                  f"  {cpu_us:.2f} CPU µs/req  {cs_per:.3f} switches/req", file=sys.stderr, flush=True)

    def cell(unit, value, cpu_us, cs_per):
        shown = f"{value / 1000:.1f}k IOPS" if unit == "iops" else f"{value:.0f} MB/s"
        return f"{cpu_us:.2f} µs, {cs_per:.2f} cs ({shown})"

    print_medians(args, "Server CPU per request", names, workloads, results, cell)


if __name__ == "__main__":
    main()
