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
import signal
import subprocess
import sys
import time

SECONDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
WORK = "/var/tmp/iocache-bench"
SHM = "/dev/shm/iocache-bench"
VOLUME = 1 << 30           # 1 GiB backend
CACHE = 128 << 20          # 128 MiB cache for both systems
DELAY = "1ms"              # backend latency per request (nbdkit delay filter)
BIN = os.path.abspath("target/release/iocache")
LOADGEN = os.path.abspath("target/release/examples/loadgen")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def wait_socket(path, proc):
    for _ in range(200):
        if os.path.exists(path):
            time.sleep(0.2)
            return
        if proc.poll() is not None:
            raise SystemExit(f"process for {path} exited: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    raise SystemExit(f"{path} did not appear")


def start_backend():
    sock = f"{WORK}/backend.sock"
    p = subprocess.Popen(["nbdkit", "-f", "-U", sock, "--filter=delay", "file", f"{WORK}/backend.img",
                          f"delay-read={DELAY}", f"delay-write={DELAY}"], stderr=subprocess.PIPE, text=True)
    wait_socket(sock, p)
    return p, f"nbd+unix:///?socket={sock}"


RUN = [0]


def fresh(name):
    """A socket path not used before in this run (a stopping server may still hold the last one)."""
    RUN[0] += 1
    return f"{WORK}/{name}-{RUN[0]}.sock"


def start_nbdkit_cache():
    sock = fresh("nbdkit-cache")
    env = dict(os.environ, TMPDIR=SHM)
    p = subprocess.Popen(["nbdkit", "-f", "-U", sock, "--filter=cache", "--filter=delay", "file",
                          f"{WORK}/backend.img", "cache-on-read=true", f"cache-max-size={CACHE}",
                          f"delay-read={DELAY}", f"delay-write={DELAY}"], stderr=subprocess.PIPE, text=True,
                         env=env)
    wait_socket(sock, p)
    return p, f"nbd+unix:///?socket={sock}"


def start_iocache(backend_uri, lookup="fine", extra=()):
    d = f"{WORK}/iocache"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sock = fresh("iocache")
    cache = f"{SHM}/iocache-cache.img"
    if os.path.exists(cache):
        os.remove(cache)
    p = subprocess.Popen([BIN, "serve", "--backend", backend_uri, "--cache", cache, "--cache-size", f"{CACHE}B",
                          "--socket", sock, "--admin-socket", f"{d}/admin.sock", "--listen", "127.0.0.1:0",
                          "--lookup", lookup, "--init"] + list(extra),
                         cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_socket(sock, p)
    return p, f"nbd+unix:///?socket={sock}"


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()


def fio(uri, name, extra, seconds=SECONDS, percentiles="50:99:99.99"):
    cmd = ["fio", f"--name={name}", "--ioengine=nbd", f"--uri={uri}", "--bs=4k", "--output-format=json",
           f"--percentile_list={percentiles}"] + extra
    if seconds:
        cmd += ["--time_based", f"--runtime={seconds}"]
    out = sh(cmd).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    res = {}
    for kind in ("read", "write"):
        k = job[kind]
        pct = k.get("clat_ns", {}).get("percentile", {})
        res[kind] = {"iops": k["iops"], "ios": k["total_ios"], "mbps": k["bw_bytes"] / 1e6,
                     "p50_us": pct.get("50.000000", 0) / 1e3,
                     "mean_us": k.get("clat_ns", {}).get("mean", 0) / 1e3,
                     "p99_us": pct.get("99.000000", 0) / 1e3, "p9999_us": pct.get("99.990000", 0) / 1e3,
                     "percentiles_us": {float(p): v / 1e3 for p, v in pct.items()}}
    return res


def warm(uri, size):
    """Reads [0, size) once, sequentially, so it is cached."""
    fio(uri, "warm", ["--rw=read", f"--size={size}", "--iodepth=16", "--bs=1m"], seconds=0)


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
    for tool in ("fio", "nbdkit"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed (apt-get install {tool})")
    shutil.rmtree(WORK, ignore_errors=True)
    shutil.rmtree(SHM, ignore_errors=True)
    os.makedirs(WORK)
    os.makedirs(SHM)
    with open(f"{WORK}/backend.img", "wb") as f:
        f.truncate(VOLUME)
    print(f"# Engine benchmark ({SECONDS} s per run; backend delay {DELAY} per request; caches of "
          f"{CACHE >> 20} MiB in /dev/shm; volume {VOLUME >> 30} GiB)\n")
    print("| workload | system | read IOPS | read p99 µs | read p99.99 µs | write IOPS | write p99.99 µs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    backend, backend_uri = start_backend()
    try:
        for label, warm_bytes, args in WORKLOADS:
            for system in ("iocache", "nbdkit cache filter"):
                if system == "iocache":
                    p, uri = start_iocache(backend_uri)
                else:
                    p, uri = start_nbdkit_cache()
                try:
                    warm(uri, warm_bytes)
                    r = fio(uri, "run", args + ([] if "size" in " ".join(args) else [f"--size={VOLUME}"]))
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
                                            "--group_reporting"])
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
