#!/usr/bin/env python3
"""A client that reads its replies late, as nbd-tester-client does: it
sends a pipeline of READs and WRITEs (1 MiB each, alternating) before it
reads any reply, then reads them all. Times both halves against
`iocache serve`, nbdkit's memory plugin (when nbdkit is installed) and,
with --baseline, another iocache binary, on the Unix socket, alternated.

    scripts/bench-late-reader.py [--pairs 24] [--rounds 3] [--baseline BIN]

A server that stops reading requests while its replies wait stalls the
client: its sends block until a timeout (here the client gives up after
--timeout seconds and the round counts as stalled).
"""

import argparse
import os
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

NBD_OPT_GO = 7
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
IHAVEOPT = 0x49484156454F5054
CMD_READ, CMD_WRITE = 0, 1
PIECE = 1 << 20


def read_exact(s, n):
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        out += chunk
    return bytes(out)


def connect(path, timeout):
    """A fixed-newstyle handshake with NBD_OPT_GO on the default export,
    without structured replies: replies are simple."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    read_exact(s, 18)  # NBDMAGIC, IHAVEOPT, handshake flags
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    s.sendall(struct.pack(">QII", IHAVEOPT, NBD_OPT_GO, 6) + struct.pack(">IH", 0, 0))
    while True:
        _magic, _option, reply_type, length = struct.unpack(">QIII", read_exact(s, 20))
        read_exact(s, length)
        if reply_type == 1:  # ACK
            return s
        if reply_type & 0x80000000:
            raise ConnectionError(f"NBD_OPT_GO refused: {reply_type:#x}")


def late_reader(path, pairs, timeout):
    """Seconds to send the pipeline and to read every reply; None if the
    client's sends or reads timed out (a stall)."""
    s = connect(path, timeout)
    payload = os.urandom(PIECE)
    started = time.monotonic()
    try:
        for i in range(pairs):
            s.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_READ, 2 * i, i * PIECE, PIECE))
            header = struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_WRITE, 2 * i + 1, (pairs + i) * PIECE, PIECE)
            s.sendall(header + payload)
        sent = time.monotonic() - started
        for _ in range(2 * pairs):
            magic, error, handle = struct.unpack(">IIQ", read_exact(s, 16))
            assert magic == SIMPLE_REPLY_MAGIC and error == 0, (magic, error)
            if handle % 2 == 0:
                read_exact(s, PIECE)
        total = time.monotonic() - started
    except (socket.timeout, ConnectionError):
        return None
    finally:
        s.close()
    return sent, total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=24, help="READ+WRITE pairs of 1 MiB in the pipeline")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--baseline", help="another iocache binary, run alternated")
    args = parser.parse_args()
    binaries = [("iocache", benchlib.BIN)]
    if args.baseline:
        binaries.append(("baseline", args.baseline))
    if benchlib.shutil.which("nbdkit"):
        binaries.append(("nbdkit", "nbdkit"))
    results = {name: [] for name, _ in binaries}
    for r in range(args.rounds):
        for name, binary in binaries:
            with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
                if name == "nbdkit":
                    sock = os.path.join(d, "nbdkit.sock")
                    server, _ = benchlib.start_server(["nbdkit", "-f", "-U", sock, "memory", "256M"], sock)
                else:
                    sock = os.path.join(d, "iocache-data", "iocache.sock")
                    server, _ = benchlib.start_iocache(
                        [binary, "serve", "--backend-size", "256MiB", "--cache-size", "128MiB"], d, sock)
                try:
                    got = late_reader(sock, args.pairs, args.timeout)
                finally:
                    benchlib.stop(server)
            results[name].append(got)
            shown = "stalled (client timeout)" if got is None else f"sent in {got[0]:.3f} s, all replies in {got[1]:.3f} s"
            print(f"round {r + 1} {name:9} {shown}", flush=True)
    print(f"\n| server | pipeline of {args.pairs} × (1 MiB READ + 1 MiB WRITE), replies read after | stalled rounds |")
    print("|---|---:|---:|")
    for name, rows in results.items():
        done = sorted(t for _, t in filter(None, rows))
        median = f"{done[len(done) // 2]:.3f} s" if done else "-"
        print(f"| {name} | {median} (median of the rounds not stalled) | {rows.count(None)} of {len(rows)} |")


if __name__ == "__main__":
    main()
