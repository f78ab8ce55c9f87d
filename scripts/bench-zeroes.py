#!/usr/bin/env python3
"""Zeroing a large volume: iocache beside nbdkit's file plugin.

Not run by CI; results go in docs/results/block-commands.md. Each system
serves the same sparse backend file (SIZE, default 8 GiB, in /var/tmp) that
holds 256 MiB of data at its start; the client is qemu-io, which zeroes the
whole volume with `write -z` (NO_HOLE: the range stays allocated) or
`write -z -u` (a hole may be punched), 1 GiB per command, in requests
qemu sizes itself. The
time is qemu-io's wall clock; the backend's allocated size after the stop
shows what reached it. Systems alternate within each round; ROUNDS rounds;
medians printed.

  * iocache: `iocache serve`, write-back, a 1 GiB cache file in /dev/shm,
    the 256 MiB of data read through it first (cached, clean) and 64 MiB
    rewritten (dirty);
  * baseline (optional): another iocache binary, same setup;
  * nbdkit-file: nbdkit's file plugin on the backend file.

Usage: scripts/bench-zeroes.py [--size BYTES] [--rounds N] [--baseline PATH]
Needs: qemu-io, nbdkit, a release build (cargo build --release).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

MIB = 1 << 20


def prepare_backend(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
        f.write(b"\x5a" * (256 * MIB))
        os.fsync(f.fileno())


def qemu_io(uri, *commands):
    argv = ["qemu-io", "-f", "raw", uri]
    for c in commands:
        argv += ["-c", c]
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True)
    took = time.monotonic() - started
    if out.returncode != 0 or "failed" in out.stdout + out.stderr:
        raise SystemExit(f"qemu-io {commands}: {out.stdout}{out.stderr}")
    return took


def zero_commands(size, unmap):
    """qemu-io commands zeroing `size` bytes, 1 GiB each (qemu-io takes at
    most 2 GiB per command)."""
    step = 1 << 30
    return [f"write -z {'-u ' if unmap else ''}{at} {min(step, size - at)}" for at in range(0, size, step)]


def run_iocache(binary, work, size, unmap):
    backend = f"{work}/backend.img"
    prepare_backend(backend, size)
    cache_dir = benchlib.scratch_dir("iocache-zeroes-")
    sock = benchlib.fresh_socket(work, "iocache")
    p, uri = benchlib.start_iocache(
        [binary, "serve", "--init", "--backend", backend, "--cache", f"{cache_dir}/cache.img",
         "--cache-size", "1GiB", "--write-policy", "wb", "--socket", sock,
         "--admin-socket", f"{work}/admin.sock"], work, sock)
    try:
        qemu_io(uri, "read 0 256M", "write -P 0x33 0 64M")
        took = qemu_io(uri, *zero_commands(size, unmap))
    finally:
        benchlib.stop(p)
        subprocess.run(["rm", "-rf", cache_dir])
    return took, os.stat(backend).st_blocks * 512


def run_nbdkit(work, size, unmap):
    backend = f"{work}/backend.img"
    prepare_backend(backend, size)
    sock = benchlib.fresh_socket(work, "nbdkit")
    p, uri = benchlib.start_server(["nbdkit", "-f", "-U", sock, "file", backend], sock)
    try:
        took = qemu_io(uri, *zero_commands(size, unmap))
    finally:
        benchlib.stop(p)
    return took, os.stat(backend).st_blocks * 512


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=8 << 30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", help="another iocache binary to run beside this one")
    args = ap.parse_args()
    benchlib.need_tools("qemu-io", "nbdkit")
    work = "/var/tmp/iocache-bench-zeroes"
    systems = [("iocache", lambda w, s, u: run_iocache(benchlib.BIN, w, s, u))]
    if args.baseline:
        systems.append(("baseline", lambda w, s, u: run_iocache(os.path.abspath(args.baseline), w, s, u)))
    systems.append(("nbdkit-file", run_nbdkit))
    results = {}
    for r in range(args.rounds):
        order = systems if r % 2 == 0 else list(reversed(systems))
        for unmap in (False, True):
            for name, run in order:
                benchlib.fresh_dirs(work)
                took, allocated = run(work, args.size, unmap)
                results.setdefault((name, unmap), []).append((took, allocated))
                print(f"round {r + 1} {name} {'-u' if unmap else 'no-hole'}: {took:.3f} s, "
                      f"{allocated / MIB:.0f} MiB allocated", flush=True)
    subprocess.run(["rm", "-rf", work])
    print(f"\nzeroing {args.size / (1 << 30):g} GiB with qemu-io, median of {args.rounds}:")
    print("| system | write -z (NO_HOLE) | write -z -u (may punch) | allocated after, MiB (NO_HOLE / punch) |")
    print("|---|---|---|---|")
    for name, _ in systems:
        keep = results[(name, False)]
        punch = results[(name, True)]
        print(f"| {name} | {statistics.median(t for t, _ in keep):.3f} s | "
              f"{statistics.median(t for t, _ in punch):.3f} s | "
              f"{statistics.median(a for _, a in keep) / MIB:.0f} / {statistics.median(a for _, a in punch) / MIB:.0f} |")


if __name__ == "__main__":
    main()
