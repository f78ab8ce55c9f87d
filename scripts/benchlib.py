"""Helpers the benchmark and soak scripts share: starting servers and
waiting for their sockets, running fio and reading its JSON, timing
commands, scratch directories and the default trace. They live here once so
that a fix reaches every script; the scripts import this file from their own
directory (sys.path), and it needs nothing beyond the standard library.
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The release build, relative to the directory the script was started in.
BIN = os.path.abspath("target/release/iocache")
BACKEND_VOLUME = 1 << 30   # 1 GiB backend
BACKEND_DELAY = "1ms"      # backend latency per request (nbdkit delay filter)


def sh(cmd, **kw):
    """Runs cmd, which must succeed; its output is captured as text."""
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def need_tools(*tools, hint=True):
    """Stops the script unless every tool is on the PATH (`hint`: name the
    apt-get package, when it is the tool's name)."""
    for tool in tools:
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed (apt-get install {tool})" if hint else f"{tool} is needed")


def fresh_dirs(*dirs):
    """Each directory, created empty (whatever it held is removed)."""
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)


def wait_socket(path, proc):
    """Waits for `proc` to create the socket `path`; stops the script if
    `proc` exits first or the socket does not appear within ten seconds."""
    for _ in range(200):
        if os.path.exists(path):
            time.sleep(0.2)
            return
        if proc.poll() is not None:
            raise SystemExit(f"process for {path} exited: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    raise SystemExit(f"{path} did not appear")


_RUN = [0]


def fresh_socket(work, name):
    """A socket path in `work` not used before in this run (a stopping
    server may still hold the last one)."""
    _RUN[0] += 1
    return f"{work}/{name}-{_RUN[0]}.sock"


def delayed_backend(work, volume=BACKEND_VOLUME, delay=BACKEND_DELAY):
    """A slow NBD backend: `work` emptied, a sparse `volume`-byte
    backend.img in it, served by nbdkit's file plugin behind its delay
    filter (`delay` per request) on a Unix socket in `work`. Returns the
    nbdkit process and its URI."""
    fresh_dirs(work)
    with open(f"{work}/backend.img", "wb") as f:
        f.truncate(volume)
    sock = f"{work}/backend.sock"
    p = subprocess.Popen(["nbdkit", "-f", "-U", sock, "--filter=delay", "file", f"{work}/backend.img",
                          f"delay-read={delay}", f"delay-write={delay}"], stderr=subprocess.PIPE, text=True)
    wait_socket(sock, p)
    return p, f"nbd+unix:///?socket={sock}"


def start_server(args, sock, **kw):
    """Starts a server (`args`; its stderr kept for the error message) and
    waits for its socket `sock`; returns the process and its NBD URI."""
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, **kw)
    wait_socket(sock, p)
    return p, f"nbd+unix:///?socket={sock}"


def start_iocache(args, cwd, sock):
    """`iocache serve` with `args` (its --socket `sock`), run in `cwd` with
    its stdout discarded; returns the process and its NBD URI."""
    return start_server(args, sock, cwd=cwd, stdout=subprocess.DEVNULL)


def volume_stats(binary, admin, patience=120):
    """The first volume of `iocache stats --json` on the admin socket. A
    server that is still starting (after a crash it checks the cache's
    clean lines first) does not answer yet: asked again for up to
    `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        try:
            out = sh([binary, "stats", "--admin-socket", admin, "--json"]).stdout
            return json.loads(out)["volumes"][0]
        except subprocess.CalledProcessError as e:
            if time.monotonic() > deadline or "did not answer" not in e.stderr:
                raise
            time.sleep(0.5)


def stop(p):
    """SIGTERM, then SIGKILL if the process has not exited within a minute."""
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()


def fio_jobs(out):
    """The jobs of fio's --output-format=json output (anything fio printed
    before the JSON is skipped)."""
    return json.loads(out[out.index("{"):])["jobs"]


def fio(uri, name, extra, seconds, percentiles="50:99:99.99"):
    """One fio run (nbd engine, 4 KiB unless `extra` says otherwise), time
    based for `seconds` (0 or None: until its size is done). Returns the
    first job's IOPS, I/O count, MB/s and completion latencies in µs, by
    direction."""
    cmd = ["fio", f"--name={name}", "--ioengine=nbd", f"--uri={uri}", "--bs=4k", "--output-format=json",
           f"--percentile_list={percentiles}"] + extra
    if seconds:
        cmd += ["--time_based", f"--runtime={seconds}"]
    job = fio_jobs(sh(cmd).stdout)[0]
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


def env_trace():
    """The trace $TRACE names, or the ARC trace P2 in shared/traces/ beside the checkout."""
    return os.environ.get("TRACE", os.path.join(REPO, "..", "shared", "traces", "arc-P2.lis.zst"))


def scratch_dir(prefix):
    """A new temporary directory, in /dev/shm when it may be written."""
    return tempfile.mkdtemp(prefix=prefix, dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)


def decompress(trace, path):
    """zstd -d of `trace` into `path`."""
    with open(path, "wb") as f:
        subprocess.run(["zstd", "-dcq", trace], stdout=f, check=True)


def timed(argv, stdout=subprocess.PIPE):
    """Runs argv, which must succeed; returns its wall time, its user CPU
    time (from the children's rusage) and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(argv, stdout=stdout, check=True).stdout
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime, out
