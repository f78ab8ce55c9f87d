#!/usr/bin/env python3
"""Cuts the cache away from a file system under ordered write-back.

Each cut: ext4 on a backend file, served by iocache with a small cache
(write-back, ordered unless --unordered) and mounted through nbdfuse and a
loop device; a workload creates and rewrites files, fsyncing each; at a
random moment the server is killed with SIGKILL and its cache is never used
again. The backend file alone is then copied, mounted (journal replay) and
checked:

  * it mounts, and `e2fsck -fn` finds no error after the replay;
  * the files are what the workload had synced up to some point P (every
    file synced by then holds its last synced contents, or blocks of a
    later version written after P), the state a disk with a volatile write
    cache could be in after a power cut.

The next cut starts from that backend with a new cache. Needs root,
nbdfuse, mkfs.ext4 and e2fsck. Usage:

  scripts/ordered-cut-test.py [--cuts N] [--unordered] [--binary PATH] [--seed S]

Prints one line per cut and a summary; exits 1 if any cut failed.
"""

import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

BLOCK = 4096


def run(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300, **kw)


def content(name, version, size):
    """A file's bytes for one version: each block names the file, the version and the block."""
    out = bytearray()
    block = 0
    while len(out) < size:
        seed = hashlib.sha256(f"{name}:{version}:{block}".encode()).digest()
        out += (seed * (BLOCK // len(seed) + 1))[:BLOCK]
        block += 1
    return bytes(out[:size])


class Workload:
    """Creates and rewrites files under `root`, fsyncing each; logs what was synced."""

    def __init__(self, root, rng):
        self.root, self.rng = root, rng
        self.log = []  # (name, version, size), in the order the fsyncs returned
        self.pending = None  # the one under way: it may be on the backend, whole or in part
        self.sizes = {}
        self.next_file = 0

    def step(self):
        rewrite = self.sizes and self.rng.random() < 0.35
        if rewrite:
            name = self.rng.choice(sorted(self.sizes))
            size = self.sizes[name]
            version = 1 + max(v for n, v, _ in self.log if n == name)
        else:
            name, version = f"f{self.next_file:05d}", 0
            self.next_file += 1
            size = self.rng.choice([512, 4096, 3 * 4096 + 100, 16384, 65536, 200000])
        self.pending = (name, version, size)
        path = os.path.join(self.root, name)
        flags = os.O_WRONLY | (0 if rewrite else os.O_CREAT | os.O_EXCL)
        fd = os.open(path, flags, 0o644)
        try:
            os.pwrite(fd, content(name, version, size), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        if not rewrite:
            dfd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self.sizes[name] = size
        self.log.append((name, version, size))
        self.pending = None


def check_files(root, log, pending):
    """Where the backend's state stops, P (-1: before the first fsync): the
    largest P such that every file holds, block by block, its last version
    synced by P or a later one (the write under way at the cut counts as
    the last, unsynced). Then no block may come from a version written
    after the fsync that follows P: those writes began after that fsync's
    FLUSH. Returns P, the files breaking that rule, and the files that
    cannot be read."""
    versions = {}
    for i, (name, version, size) in enumerate(log + ([pending] if pending else [])):
        versions.setdefault(name, []).append((i, version, size))
    p_max, unreadable, blocks_of, bound = len(log) - 1, [], {}, None
    # The unsynced write is never needed (P stays within the log).
    for name, entries in versions.items():
        try:
            with open(os.path.join(root, name), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        except OSError as e:
            unreadable.append(f"{name}: {e}")
            data = None
        size = entries[0][2]
        # Per block, the log entries whose version it holds.
        blocks = []
        if data is not None:
            expected = [(i, content(name, v, size)) for i, v, _ in entries]
            for b in range(0, len(data), BLOCK):
                fit = [i for i, e in expected if e[b:b + BLOCK] == data[b:b + BLOCK]]
                if not fit and len(expected) > 1 and expected[-1][0] == len(log):
                    # The write under way may have been caught mid-copy in
                    # a page: each byte from the version before or from it.
                    old, new = expected[-2][1][b:b + BLOCK], expected[-1][1][b:b + BLOCK]
                    if all(x in (o, n) for x, o, n in zip(data[b:b + BLOCK], old, new)):
                        fit = [len(log)]
                blocks.append(fit)
        blocks_of[name] = blocks
        # The last version every block can come from (or a later one).
        last_fit = -1
        if data is not None and len(data) == size:
            last_fit = min((max((k for k, (i, _, _) in enumerate(entries) if i in fit), default=-1)
                            for fit in blocks), default=len(entries) - 1)
        if last_fit + 1 < len(entries) and entries[last_fit + 1][0] < len(log) \
                and entries[last_fit + 1][0] - 1 < p_max:
            p_max = entries[last_fit + 1][0] - 1
            bound = f"{name} (entries {[e[0] for e in entries]}, blocks from {blocks[:6]})"
    too_new = []
    for name, blocks in blocks_of.items():
        for fit in blocks:
            if fit and min(fit) > p_max + 1:
                too_new.append(f"{name} holds a block of entry {min(fit)}; P is set by {bound}")
                break
    return p_max, too_new, unreadable


def unmount_fully(mnt, image, problems):
    """Unmounts the check mount and waits until no loop device holds
    `image`: a copy taken (or checked) while the file system is still
    mounted would be a harness fault, not the cache's. A busy unmount
    (a loaded machine) is retried; if it never succeeds the cut fails
    as the harness's."""
    for _ in range(50):
        if run("umount", mnt, check=False).returncode == 0 or not os.path.ismount(mnt):
            held = run("losetup", "-j", image, check=False).stdout.strip()
            if not held:
                return
        time.sleep(0.1)
    problems.append(f"harness: {image} still mounted or on a loop device after 5 s")


def cut(args, i, rng, work, backend):
    d = os.path.join(work, f"cut{i}")
    os.makedirs(d)
    fuse, mnt, check_mnt = (os.path.join(d, x) for x in ("fuse", "mnt", "check"))
    for x in (fuse, mnt, check_mnt):
        os.makedirs(x)
    flush = rng.choice(["nop", "lazy", "aggressive"])
    cmd = [args.binary, "serve", "--backend", backend, "--cache", os.path.join(d, "cache"),
           "--cache-size", rng.choice(["4MiB", "8MiB", "16MiB"]), "--line-size", "4KiB",
           "--write-policy", "wb", "--flush", flush, "--persistence", "dirty", "--init", "--force"]
    if not args.unordered:
        cmd.append("--ordered-write-back")
    log = open(os.path.join(d, "server.log"), "w")
    server = subprocess.Popen(cmd, cwd=d, stdout=log, stderr=subprocess.STDOUT)
    sock = os.path.join(d, "iocache-data", "iocache.sock")
    for _ in range(200):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    nbdfuse = subprocess.Popen(["nbdfuse", os.path.join(fuse, "disk"), "--unix", sock],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    disk = os.path.join(fuse, "disk")
    for _ in range(200):
        if os.path.exists(disk):
            break
        time.sleep(0.05)
    run("mount", "-o", "loop", disk, mnt)
    # Each cut in a directory of its own (the backend goes on from cut to
    # cut); the one before is removed, so the file system never fills.
    shutil.rmtree(os.path.join(mnt, f"c{i - 1}"), ignore_errors=True)
    os.mkdir(os.path.join(mnt, f"c{i}"))
    dfd = os.open(mnt, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    workload = Workload(os.path.join(mnt, f"c{i}"), rng)
    delay = rng.uniform(0.3, args.max_seconds)
    killed = threading.Event()

    def kill():
        killed.set()
        server.send_signal(signal.SIGKILL)

    killer = threading.Timer(delay, kill)
    killer.start()
    error = None
    try:
        while not killed.is_set():
            workload.step()
    except OSError as e:
        # The server is gone, or something else failed while it ran.
        error = None if killed.is_set() else e
    killer.join()
    server.wait()
    run("umount", "-l", mnt, check=False)
    nbdfuse.kill()
    nbdfuse.wait()
    run("umount", "-l", fuse, check=False)
    # The backend alone, as a copy, from here on.
    copy = os.path.join(d, "backend.copy")
    shutil.copyfile(backend, copy)
    problems = []
    mounted = run("mount", "-o", "loop", copy, check_mnt, check=False)
    p = None
    if mounted.returncode != 0:
        problems.append(f"mount: {mounted.stdout.strip()}")
    else:
        p, too_new, unreadable = check_files(os.path.join(check_mnt, f"c{i}"), workload.log, workload.pending)
        if too_new:
            problems.append(f"the backend stops after fsync {p} but {len(too_new)} files hold later writes: "
                            f"{too_new[0]}")
        if unreadable:
            problems.append(f"{len(unreadable)} files cannot be read: {unreadable[0]}")
        unmount_fully(check_mnt, copy, problems)
    fsck = run("e2fsck", "-fn", copy, check=False)
    if fsck.returncode != 0:
        problems.append(f"e2fsck -fn exit {fsck.returncode}: " + " | ".join(fsck.stdout.strip().splitlines()[-3:]))
    synced = len(workload.log)
    behind = synced - 1 - p if p is not None else None

    if error is not None:
        problems.append(f"the workload failed before the cut: {error}")
    status = "FAIL " + "; ".join(problems) if problems else "ok"
    print(f"cut {i}: flush {flush}, killed after {delay:.2f} s, {synced} fsyncs, "
          f"backend {behind} behind: {status}", flush=True)
    if not problems:
        # The next cut continues on the backend as the check found it
        # (journal replayed).
        shutil.copyfile(copy, backend)
        shutil.rmtree(d, ignore_errors=True)
    return not problems, behind


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuts", type=int, default=200)
    ap.add_argument("--unordered", action="store_true", help="plain write-back, for comparison")
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "iocache"))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--max-seconds", type=float, default=3.0)
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("nbdfuse", "mkfs.ext4", "e2fsck")):
        print("skipped: needs root, nbdfuse, mkfs.ext4 and e2fsck")
        return 0
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="iocache-cut-", dir=args.dir)
    backend = os.path.join(work, "backend")
    with open(backend, "wb") as f:
        f.truncate(128 << 20)
    run("mkfs.ext4", "-q", "-F", "-E", "nodiscard", backend)
    print(f"seed {seed}, {'plain' if args.unordered else 'ordered'} write-back, work in {work}", flush=True)
    failed, behind = 0, []
    for i in range(args.cuts):
        ok, b = cut(args, i, rng, work, backend)
        failed += not ok
        if b is not None:
            behind.append(b)
        if not ok:
            # Start the next cut from a sound file system again.
            run("e2fsck", "-fy", backend, check=False)
    mean = sum(behind) / len(behind) if behind else 0
    print(f"{args.cuts} cuts, {failed} failed; the backend was {mean:.1f} fsyncs behind on average "
          f"(at most {max(behind, default=0)})")
    if failed == 0:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
