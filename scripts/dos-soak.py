#!/usr/bin/env python3
"""DoS soak of `iocache serve` (issue 11, section 4; not run by CI).

Why it exists: the unit and integration tests check each resource bound on
its own, in a second or two; this runs every attack at once against the real
binary for minutes and measures what the server holds.

It starts `iocache serve` (its own directory, Unix socket, TCP port and
admin socket) and runs, for --duration seconds, all at once:

- idle connections: --idle per listener (TCP and Unix), connect and say
  nothing; reconnected when the server closes them;
- slowloris handshakes: --slowloris per listener, one byte every --trickle
  seconds; reconnected when closed;
- unread replies: --unread connections (Unix) that negotiate, pipeline
  --reads reads of --read-size bytes and never read a reply; reconnected;
- admin floods: --admin idle admin connections, reconnected, plus one
  request line of 1 MiB without a newline every second.

Attackers reopen a connection the server closed after --reconnect-delay
seconds (0 turns every attack into a connection flood).

Every --probe seconds a fresh client connects on each listener, negotiates
and reads 4 KiB, and `stats` is asked on the admin socket; each probe is
counted as served or not, with its latency. Every half second the server's
VmRSS, VmHWM and thread count are read from /proc/PID/status. At the end it
prints the peak RSS (VmHWM), the peak thread count and the probe results,
and stops the server with SIGTERM.

    scripts/dos-soak.py --duration 60
    CARGO_TARGET_DIR=... scripts/dos-soak.py --binary path/to/iocache

The binary defaults to $CARGO_TARGET_DIR/release/iocache (target/ without
it); build it first with `cargo build --release`.
"""

import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
OPT_REPLY_MAGIC = 0x0003E889045565A9
NBD_OPT_GO = 7
NBD_REP_ACK = 1
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
CMD_READ = 0
# Seconds an attacker waits before reopening a connection the server closed
# (--reconnect-delay).
RECONNECT_DELAY = 1.0


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def negotiate(s):
    """Fixed newstyle handshake with NBD_OPT_GO on the default export."""
    greeting = recv_exact(s, 18)
    magic, opt, _flags = struct.unpack(">QQH", greeting)
    if magic != NBDMAGIC or opt != IHAVEOPT:
        raise ConnectionError("bad greeting")
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    data = struct.pack(">IH", 0, 0)  # empty name, no info requests
    s.sendall(struct.pack(">QII", IHAVEOPT, NBD_OPT_GO, len(data)) + data)
    while True:
        magic, _opt, rtype, length = struct.unpack(">QIII", recv_exact(s, 20))
        if magic != OPT_REPLY_MAGIC:
            raise ConnectionError("bad option reply")
        recv_exact(s, length)
        if rtype == NBD_REP_ACK:
            return
        if rtype & 0x80000000:
            raise ConnectionError("GO refused")


def read_request(handle, offset, length):
    return struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_READ, handle, offset, length)


class Target:
    def __init__(self, unix_path, tcp_addr, admin_path):
        self.unix_path = unix_path
        self.tcp_addr = tcp_addr
        self.admin_path = admin_path

    def connect(self, family, timeout=5.0):
        if family == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(self.unix_path)
        else:
            s = socket.create_connection(self.tcp_addr, timeout=timeout)
        return s


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.values = {}

    def add(self, key, n=1):
        with self.lock:
            self.values[key] = self.values.get(key, 0) + n


def wait_closed(s, stop, timeout=None):
    """Blocks until the peer closes `s` (or stop is set); drains what comes."""
    s.settimeout(0.5)
    started = time.monotonic()
    while not stop.is_set():
        if timeout is not None and time.monotonic() - started > timeout:
            return False
        try:
            if not s.recv(65536):
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def idle_worker(target, family, stop, counters):
    while not stop.is_set():
        try:
            s = target.connect(family)
        except OSError:
            counters.add(f"idle_{family}_connect_failed")
            time.sleep(0.2)
            continue
        counters.add(f"idle_{family}_connections")
        wait_closed(s, stop)
        s.close()
        stop.wait(RECONNECT_DELAY)


def slowloris_worker(target, family, stop, counters, trickle):
    while not stop.is_set():
        try:
            s = target.connect(family)
        except OSError:
            counters.add(f"slowloris_{family}_connect_failed")
            time.sleep(0.2)
            continue
        counters.add(f"slowloris_{family}_connections")
        s.settimeout(0.2)
        try:
            while not stop.is_set():
                try:
                    if not s.recv(65536):
                        break
                except socket.timeout:
                    pass
                s.send(b"\0")
                deadline = time.monotonic() + trickle
                while time.monotonic() < deadline and not stop.is_set():
                    try:
                        if not s.recv(65536):
                            raise ConnectionError
                    except socket.timeout:
                        pass
        except OSError:
            pass
        s.close()
        stop.wait(RECONNECT_DELAY)


def unread_worker(target, stop, counters, reads, read_size, export_size):
    while not stop.is_set():
        try:
            s = target.connect("unix")
            negotiate(s)
        except OSError:
            counters.add("unread_connect_failed")
            time.sleep(0.2)
            continue
        counters.add("unread_connections")
        try:
            s.settimeout(5)
            for h in range(reads):
                off = (h * read_size) % max(export_size - read_size, 1)
                s.sendall(read_request(h, off - off % 4096, read_size))
        except OSError:
            pass
        # Never read a reply: wait for the server to give up on us (the
        # replies already sent stay unread in our buffer, so watch for the
        # hang-up rather than for end of file).
        poller = select.poll()
        poller.register(s, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        while not stop.is_set():
            if poller.poll(500):
                counters.add("unread_closed_by_server")
                break
        s.close()
        stop.wait(RECONNECT_DELAY)


def admin_idle_worker(target, stop, counters):
    while not stop.is_set():
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(target.admin_path)
        except OSError:
            counters.add("admin_idle_connect_failed")
            time.sleep(0.2)
            continue
        counters.add("admin_idle_connections")
        wait_closed(s, stop)
        s.close()
        stop.wait(RECONNECT_DELAY)


def admin_long_line_worker(target, stop, counters):
    line = b"a" * (1 << 20)
    while not stop.is_set():
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(3)
            s.connect(target.admin_path)
            try:
                s.sendall(line)
            except OSError:
                pass
            reply = s.recv(4096)
            counters.add("admin_long_lines")
            if b"longer than" in reply:
                counters.add("admin_long_lines_refused")
            s.close()
        except OSError:
            counters.add("admin_long_line_failed")
        stop.wait(1.0)


def probe_nbd(target, family):
    started = time.monotonic()
    try:
        s = target.connect(family, timeout=15)
        negotiate(s)
        s.sendall(read_request(1, 0, 4096))
        magic, error, _handle = struct.unpack(">IIQ", recv_exact(s, 16))
        if magic != SIMPLE_REPLY_MAGIC or error != 0:
            return None
        recv_exact(s, 4096)
        s.close()
        return time.monotonic() - started
    except OSError:
        return None


def probe_admin(target):
    started = time.monotonic()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(target.admin_path)
        s.sendall(b"stats\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
        s.close()
        if b'"volumes"' in reply:
            return time.monotonic() - started
        return None
    except OSError:
        return None


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "Threads"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--idle", type=int, default=100, help="idle connections per listener")
    ap.add_argument("--slowloris", type=int, default=50, help="slowloris handshakes per listener")
    ap.add_argument("--trickle", type=float, default=2.0, help="seconds between slowloris bytes")
    ap.add_argument("--unread", type=int, default=64, help="connections with unread replies")
    ap.add_argument("--reads", type=int, default=8, help="pipelined reads per unread connection")
    ap.add_argument("--read-size", type=int, default=32 << 20)
    ap.add_argument("--admin", type=int, default=40, help="idle admin connections")
    ap.add_argument("--probe", type=float, default=2.0, help="seconds between fresh-client probes")
    ap.add_argument("--reconnect-delay", type=float, default=1.0,
                    help="seconds before an attacker reopens a connection the server closed (0: at once, a flood)")
    ap.add_argument("--keep", action="store_true", help="keep the server's directory")
    args = ap.parse_args()
    global RECONNECT_DELAY
    RECONNECT_DELAY = args.reconnect_delay

    binary = args.binary or os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "iocache")
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} not found: build with cargo build --release, or pass --binary")

    work = tempfile.mkdtemp(prefix="iocache-dos-soak-")
    p = lambda name: os.path.join(work, name)
    export_size = 256 << 20
    cmd = [
        binary, "serve",
        "--backend", p("backend.img"), "--backend-size", f"{export_size}B",
        "--cache", p("cache.img"), "--cache-size", "64MiB",
        "--socket", p("nbd.sock"), "--admin-socket", p("admin.sock"),
        "--listen", "127.0.0.1:0",
    ]
    print("server:", " ".join(cmd), flush=True)
    log = open(p("server.log"), "w+")
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    tcp_addr = None
    for line in server.stdout:
        m = re.search(r"nbd://([0-9.]+):(\d+)/", line)
        if m:
            tcp_addr = (m.group(1), int(m.group(2)))
        if line.startswith("Stop with"):
            break
    if tcp_addr is None:
        server.kill()
        sys.exit("the server did not start; see " + p("server.log"))
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
    target = Target(p("nbd.sock"), tcp_addr, p("admin.sock"))
    base = proc_status(server.pid)
    print(f"server pid {server.pid}, tcp {tcp_addr[0]}:{tcp_addr[1]}; at rest: "
          f"RSS {base.get('VmRSS', 0) // 1024} MiB, {base.get('Threads', 0)} threads", flush=True)
    baseline_probe = {fam: probe_nbd(target, fam) for fam in ("unix", "tcp")}

    stop = threading.Event()
    counters = Counters()
    threads = []

    def spawn(fn, *a):
        t = threading.Thread(target=fn, args=a, daemon=True)
        t.start()
        threads.append(t)

    for family in ("tcp", "unix"):
        for _ in range(args.idle):
            spawn(idle_worker, target, family, stop, counters)
        for _ in range(args.slowloris):
            spawn(slowloris_worker, target, family, stop, counters, args.trickle)
    for _ in range(args.unread):
        spawn(unread_worker, target, stop, counters, args.reads, args.read_size, export_size)
    for _ in range(args.admin):
        spawn(admin_idle_worker, target, stop, counters)
    spawn(admin_long_line_worker, target, stop, counters)
    print(f"attack: {args.idle} idle + {args.slowloris} slowloris per listener, "
          f"{args.unread} x {args.reads} unread {args.read_size >> 20} MiB reads, "
          f"{args.admin} idle admin connections + a 1 MiB admin line a second, "
          f"for {args.duration:.0f} s", flush=True)

    probes = {"unix": [], "tcp": [], "admin": []}
    peak_threads = 0
    peak_rss = 0
    started = time.monotonic()
    next_probe = started + 1.0
    while time.monotonic() - started < args.duration:
        if server.poll() is not None:
            print("the server exited!", flush=True)
            break
        st = proc_status(server.pid)
        peak_threads = max(peak_threads, st.get("Threads", 0))
        peak_rss = max(peak_rss, st.get("VmRSS", 0))
        if time.monotonic() >= next_probe:
            next_probe += args.probe
            for fam in ("unix", "tcp"):
                probes[fam].append(probe_nbd(target, fam))
            probes["admin"].append(probe_admin(target))
        time.sleep(0.5)
    final = proc_status(server.pid)
    stop.set()

    print()
    print(f"peak RSS (VmHWM): {final.get('VmHWM', 0) / 1024:.0f} MiB "
          f"(highest VmRSS sampled {peak_rss / 1024:.0f} MiB; at rest {base.get('VmRSS', 0) / 1024:.0f} MiB)")
    print(f"peak threads: {peak_threads} (at rest {base.get('Threads', 0)})")
    print(f"fresh-client probe before the attack: "
          + ", ".join(f"{k} {v * 1000:.1f} ms" if v else f"{k} FAILED" for k, v in baseline_probe.items()))
    for name, results in probes.items():
        ok = [r for r in results if r is not None]
        worst = f", worst {max(ok) * 1000:.0f} ms, median {sorted(ok)[len(ok) // 2] * 1000:.0f} ms" if ok else ""
        print(f"fresh {name} client during the attack: {len(ok)}/{len(results)} served{worst}")
    print("attack counters:", json.dumps(dict(sorted(counters.values.items()))))

    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(timeout=60)
        print(f"server stopped with SIGTERM: exit {code}")
    except subprocess.TimeoutExpired:
        server.kill()
        print("server did not stop within 60 s of SIGTERM: killed")
    log.seek(0)
    panics = [l for l in log if "panicked" in l]
    print(f"panics in the server log: {len(panics)}")
    if args.keep:
        print("kept", work)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
