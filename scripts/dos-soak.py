#!/usr/bin/env python3
"""DoS soak of `iocache serve` (not run by CI).

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
- half-sent writes: --half-writes connections (Unix) that negotiate,
  pipeline a few 4 KiB reads, send a 1 MiB write header and half its
  payload, then hang up (a client dying in the middle of a request);
  reconnected at once;
- admin floods: --admin idle admin connections, reconnected, plus one
  request line of 1 MiB without a newline every second.

Attackers reopen a connection the server closed after --reconnect-delay
seconds (0 turns every attack into a connection flood).

The server limits connections per peer (a user id on the Unix socket, an
address on TCP), so by default the attackers and the probes are one peer,
the probing client's. To attack as someone else:

- --attacker-uid UID runs the NBD attacks (idle, slowloris, unread) in a
  child process with that user and group id (as root only); the server is
  started with --socket-group UID and its directory made traversable, so
  that user may connect. The admin attacks stay the server owner's (the
  admin socket is 0600).
- --attacker-source ADDR (repeatable) binds the TCP attackers' sockets to
  these local addresses in turn (127.0.0.2, 127.0.0.3: all of 127/8 is
  loopback on Linux); probes come from 127.0.0.1.
- --serve-arg ARG (repeatable) appends ARG to the server's command line
  (e.g. --serve-arg=--max-connections-per-peer --serve-arg=8).

Every --probe seconds a fresh client connects on each listener, negotiates
and reads 4 KiB, and `stats` is asked on the admin socket; each probe is
counted as served or not, with its latency. Every half second the server's
VmRSS, VmHWM, RssAnon and thread count are read from /proc/PID/status. At the
end it prints the peak RSS (VmHWM; with TMPDIR on tmpfs the cache file is
mapped and counts in it), the highest anonymous RSS sampled, the peak thread
count and the probe results,
and stops the server with SIGTERM.

    scripts/dos-soak.py --duration 60
    scripts/dos-soak.py --duration 30 --reconnect-delay 0 \
        --attacker-uid 65534 --attacker-source 127.0.0.2
    CARGO_TARGET_DIR=... scripts/dos-soak.py --binary path/to/iocache

The binary defaults to $CARGO_TARGET_DIR/release/iocache (target/ without
it); build it first with `cargo build --release`.
"""

import argparse
# Loaded now: --attacker-uid's child drops to a user that may not be able
# to read the Python library, and connecting to a host name needs it.
import encodings.idna  # noqa: F401
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
OPT_REPLY_MAGIC = 0x0003E889045565A9
NBD_OPT_GO = 7
NBD_REP_ACK = 1
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
CMD_READ = 0
CMD_WRITE = 1
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
    def __init__(self, unix_path, tcp_addr, admin_path, sources=None):
        self.unix_path = unix_path
        self.tcp_addr = tcp_addr
        self.admin_path = admin_path
        # Local addresses TCP connections are bound to, in turn (none: the
        # system's choice).
        self.sources = list(sources or [])
        self.next_source = 0
        self.lock = threading.Lock()

    def source(self):
        if not self.sources:
            return None
        with self.lock:
            addr = self.sources[self.next_source % len(self.sources)]
            self.next_source += 1
        return (addr, 0)

    def connect(self, family, timeout=5.0):
        if family == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(self.unix_path)
        else:
            s = socket.create_connection(self.tcp_addr, timeout=timeout, source_address=self.source())
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


def reconnecting(what, connect, hold, stop, counters):
    """Until `stop` is set: a connection from `connect()`, counted as
    `{what}_connections` (a failure as `{what}_connect_failed`, retried
    after 0.2 s), kept while `hold(s)` runs, then closed and reopened after
    RECONNECT_DELAY."""
    while not stop.is_set():
        try:
            s = connect()
        except OSError:
            counters.add(f"{what}_connect_failed")
            time.sleep(0.2)
            continue
        counters.add(f"{what}_connections")
        hold(s)
        s.close()
        stop.wait(RECONNECT_DELAY)


def idle_worker(target, family, stop, counters):
    reconnecting(f"idle_{family}", lambda: target.connect(family), lambda s: wait_closed(s, stop), stop, counters)


def slowloris_worker(target, family, stop, counters, trickle):
    def trickle_handshake(s):
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

    reconnecting(f"slowloris_{family}", lambda: target.connect(family), trickle_handshake, stop, counters)


def unread_worker(target, stop, counters, reads, read_size, export_size):
    def connect():
        s = target.connect("unix")
        negotiate(s)
        return s

    def pipeline_unread(s):
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

    reconnecting("unread", connect, pipeline_unread, stop, counters)


def half_write_worker(target, stop, counters):
    """Pipelines reads, starts a 1 MiB write, sends half of it, hangs up."""
    payload = b"\xa5" * (512 << 10)
    while not stop.is_set():
        try:
            s = target.connect("unix")
            negotiate(s)
            s.settimeout(5)
            for h in range(4):
                s.sendall(read_request(h, h * 4096, 4096))
            s.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_WRITE, 99, 0, 1 << 20) + payload)
            counters.add("half_writes")
        except OSError:
            counters.add("half_write_connect_failed")
            time.sleep(0.2)
            continue
        finally:
            try:
                s.close()
            except (OSError, UnboundLocalError):
                pass
        stop.wait(min(RECONNECT_DELAY, 0.1))


def admin_idle_worker(target, stop, counters):
    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(target.admin_path)
        return s

    reconnecting("admin_idle", connect, lambda s: wait_closed(s, stop), stop, counters)


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
                if key in ("VmRSS", "VmHWM", "RssAnon", "Threads"):
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
    ap.add_argument("--half-writes", type=int, default=8,
                    help="connections that send half a write and hang up, again and again")
    ap.add_argument("--admin", type=int, default=40, help="idle admin connections")
    ap.add_argument("--probe", type=float, default=2.0, help="seconds between fresh-client probes")
    ap.add_argument("--reconnect-delay", type=float, default=1.0,
                    help="seconds before an attacker reopens a connection the server closed (0: at once, a flood)")
    ap.add_argument("--attacker-uid", type=int,
                    help="run the NBD attackers as this user and group id (needs root)")
    ap.add_argument("--attacker-source", action="append", default=[],
                    help="local address the TCP attackers connect from (repeatable)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument for iocache serve (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the server's directory")
    ap.add_argument("--fio", type=int, default=0,
                    help="well-behaved pipelined fio clients on the Unix socket meanwhile (each: a 70/30 "
                         "random 4 KiB mix at QD 16 and 64 KiB sequential reads at QD 4)")
    args = ap.parse_args()
    if args.attacker_uid is not None and os.geteuid() != 0:
        sys.exit("--attacker-uid needs root")
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
    if args.attacker_uid is not None:
        # The attackers' user must reach the socket: through its group,
        # and a directory others may traverse.
        cmd += ["--socket-group", str(args.attacker_uid)]
        os.chmod(work, 0o711)
    cmd += args.serve_arg
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
    target = Target(p("nbd.sock"), tcp_addr, p("admin.sock"))
    attack_target = Target(p("nbd.sock"), tcp_addr, p("admin.sock"), args.attacker_source)

    def nbd_attacks(spawn, stop, counters):
        for family in ("tcp", "unix"):
            for _ in range(args.idle):
                spawn(idle_worker, attack_target, family, stop, counters)
            for _ in range(args.slowloris):
                spawn(slowloris_worker, attack_target, family, stop, counters, args.trickle)
        for _ in range(args.unread):
            spawn(unread_worker, attack_target, stop, counters, args.reads, args.read_size, export_size)
        for _ in range(args.half_writes):
            spawn(half_write_worker, attack_target, stop, counters)

    # Another user's attackers: a child forked before any thread exists,
    # which drops to that user, attacks until the parent closes `stop_w`,
    # then writes its counters to `out_w`.
    attacker_pid = None
    if args.attacker_uid is not None:
        stop_r, stop_w = os.pipe()
        out_r, out_w = os.pipe()
        attacker_pid = os.fork()
        if attacker_pid == 0:
            try:
                os.close(stop_w)
                os.close(out_r)
                os.setgroups([])
                os.setgid(args.attacker_uid)
                os.setuid(args.attacker_uid)
                child_stop = threading.Event()
                child_counters = Counters()

                def child_spawn(fn, *a):
                    threading.Thread(target=fn, args=a, daemon=True).start()

                nbd_attacks(child_spawn, child_stop, child_counters)
                os.read(stop_r, 1)
                child_stop.set()
                os.write(out_w, json.dumps(child_counters.values).encode())
            finally:
                os._exit(0)
        os.close(stop_r)
        os.close(out_w)

    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
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

    if attacker_pid is None:
        nbd_attacks(spawn, stop, counters)
    for _ in range(args.admin):
        spawn(admin_idle_worker, target, stop, counters)
    spawn(admin_long_line_worker, target, stop, counters)
    who = f"as uid {args.attacker_uid}" if attacker_pid else "as this user"
    if args.attacker_source:
        who += ", TCP from " + " ".join(args.attacker_source)
    print(f"attack ({who}): {args.idle} idle + {args.slowloris} slowloris per listener, "
          f"{args.unread} x {args.reads} unread {args.read_size >> 20} MiB reads, "
          f"{args.admin} idle admin connections + a 1 MiB admin line a second, "
          f"for {args.duration:.0f} s", flush=True)

    fio_procs = []
    for i in range(args.fio):
        uri = f"nbd+unix:///?socket={p('nbd.sock')}"
        fio_procs.append(subprocess.Popen(
            ["fio", "--output-format=json", "--ioengine=nbd", f"--uri={uri}", "--time_based",
             f"--runtime={max(1, int(args.duration) - 2)}",
             f"--name=mix{i}", "--rw=randrw", "--rwmixread=70", "--bs=4k", "--iodepth=16",
             f"--offset={(i % 4) * 32}M", "--size=32M",
             f"--name=seq{i}", "--rw=read", "--bs=64k", "--iodepth=4", "--offset=128M", "--size=64M"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    if fio_procs:
        print(f"well-behaved clients: {len(fio_procs)} fio processes (70/30 4 KiB mix QD 16 + "
              f"64 KiB sequential reads QD 4 each)", flush=True)

    probes = {"unix": [], "tcp": [], "admin": []}
    peak_threads = 0
    peak_rss = 0
    peak_anon = 0
    started = time.monotonic()
    next_probe = started + 1.0
    while time.monotonic() - started < args.duration:
        if server.poll() is not None:
            print("the server exited!", flush=True)
            break
        st = proc_status(server.pid)
        peak_threads = max(peak_threads, st.get("Threads", 0))
        peak_rss = max(peak_rss, st.get("VmRSS", 0))
        peak_anon = max(peak_anon, st.get("RssAnon", 0))
        if time.monotonic() >= next_probe:
            next_probe += args.probe
            for fam in ("unix", "tcp"):
                probes[fam].append(probe_nbd(target, fam))
            probes["admin"].append(probe_admin(target))
        time.sleep(0.5)
    final = proc_status(server.pid)
    stop.set()
    if attacker_pid is not None:
        os.close(stop_w)
        chunks = []
        while True:
            chunk = os.read(out_r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.waitpid(attacker_pid, 0)
        for key, n in json.loads(b"".join(chunks) or b"{}").items():
            counters.add(key, n)

    print()
    print(f"peak RSS (VmHWM): {final.get('VmHWM', 0) / 1024:.0f} MiB "
          f"(highest VmRSS sampled {peak_rss / 1024:.0f} MiB; at rest {base.get('VmRSS', 0) / 1024:.0f} MiB)")
    # A cache file in memory (tmpfs) is mapped whole, and its pages count in
    # VmRSS as shared file pages: the anonymous part is what clients can grow.
    print(f"highest anonymous RSS (RssAnon) sampled: {peak_anon / 1024:.0f} MiB "
          f"(at rest {base.get('RssAnon', 0) / 1024:.0f} MiB)")
    print(f"peak threads: {peak_threads} (at rest {base.get('Threads', 0)})")
    print(f"fresh-client probe before the attack: "
          + ", ".join(f"{k} {v * 1000:.1f} ms" if v else f"{k} FAILED" for k, v in baseline_probe.items()))
    for name, results in probes.items():
        ok = [r for r in results if r is not None]
        worst = f", worst {max(ok) * 1000:.0f} ms, median {sorted(ok)[len(ok) // 2] * 1000:.0f} ms" if ok else ""
        print(f"fresh {name} client during the attack: {len(ok)}/{len(results)} served{worst}")
    print("attack counters:", json.dumps(dict(sorted(counters.values.items()))))
    for i, proc in enumerate(fio_procs):
        out, _ = proc.communicate(timeout=120)
        try:
            jobs = benchlib.fio_jobs(out)
            summary = ", ".join(
                f"{j['jobname']} {j['read']['iops'] + j['write']['iops']:.0f} IOPS error={j['error']}"
                for j in jobs)
        except (ValueError, KeyError):
            summary = "no JSON: " + out[-300:]
        print(f"fio client {i}: exit {proc.returncode}; {summary}")

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
