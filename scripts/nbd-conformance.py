#!/usr/bin/python3
"""Probes an NBD server through libnbd: every command and flag it
advertises, and the errno of every refusal the protocol names.

    /usr/bin/python3 scripts/nbd-conformance.py [URI] [--read-only-uri URI]

Needs libnbd's Python binding (Debian: python3-libnbd, for the system's
python3). tests/conformance.rs runs it against `iocache serve` over the
Unix socket, TCP and TLS. Writes to the export: give it a scratch one.
Prints one line per check and a summary; exits 1 if any check failed.
"""

import argparse
import errno
import os
import sys

import nbd

failed = []
passed = []


def check(name, fn):
    """Runs one check: `fn` raises AssertionError or nbd.Error to fail."""
    try:
        fn()
    except (AssertionError, nbd.Error) as e:
        failed.append(name)
        print(f"FAIL {name}: {e}")
        return
    passed.append(name)
    print(f"ok   {name}")


def connect(uri, strict=True, allocation=True):
    h = nbd.NBD()
    if allocation:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    if not strict:
        # The client's own checks off: the server's answers are probed.
        h.set_strict_mode(0)
    # A TLS URI names its key or certificate files.
    h.set_uri_allow_local_file(True)
    h.connect_uri(uri)
    return h


def errno_of(e):
    """The errno of an nbd.Error (libnbd gives it as a number or a name)."""
    if isinstance(e.errno, str):
        return getattr(errno, e.errno, None)
    return e.errno


def refused_with(expected, fn):
    """Asserts `fn` fails with the NBD error `expected` (an errno)."""
    try:
        fn()
    except nbd.Error as e:
        assert errno_of(e) == expected, f"errno {e.errno} ({e.string}), expected {errno.errorcode[expected]}"
        return
    raise AssertionError(f"succeeded, expected {errno.errorcode[expected]}")


def pattern(length, seed):
    return bytes((i * 31 + seed * 7 + (i >> 9)) & 0xFF for i in range(length))


def extents(h, length, offset, flags=0):
    """The base:allocation extents of a BLOCK_STATUS: [(length, flags)]."""
    got = []

    def callback(metacontext, off, entries, err):
        if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
            got.extend(zip(entries[0::2], entries[1::2]))
        return 0

    h.block_status(length, offset, callback, flags)
    return got


def probe(uri):
    h = connect(uri)
    size = h.get_size()
    minimum = h.get_block_size(nbd.SIZE_MINIMUM) or 1
    maximum = h.get_block_size(nbd.SIZE_MAXIMUM) or (32 << 20)
    print(f"# {uri}: {size} bytes, block sizes {minimum}/"
          f"{h.get_block_size(nbd.SIZE_PREFERRED)}/{maximum}, structured "
          f"{h.get_structured_replies_negotiated()}")
    block = max(minimum, 4096)

    def advertised():
        for what in ["can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero", "can_cache",
                     "can_df", "can_multi_conn"]:
            assert getattr(h, what)(), f"{what} is not offered"
        assert not h.is_read_only(), "a writable export says read-only"
        assert h.get_structured_replies_negotiated(), "structured replies refused"
        assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION), "base:allocation refused"
        assert size >= 64 << 20, f"the probe needs a 64 MiB export, not {size} bytes"
    check("handshake advertises every command", advertised)

    def write_read():
        data = pattern(8 * block, 1)
        h.pwrite(data, 2 * block)
        assert h.pread(len(data), 2 * block) == data, "read back differs"
    check("WRITE then READ", write_read)

    def fua():
        data = pattern(block, 2)
        h.pwrite(data, 12 * block, nbd.CMD_FLAG_FUA)
        assert h.pread(block, 12 * block) == data
    check("WRITE with FUA", fua)
    check("FLUSH", h.flush)

    def read_df():
        chunks = []

        def chunk(data, offset, status, err):
            chunks.append((offset, status))
            return 0

        data = h.pread_structured(4 * block, 2 * block, chunk, nbd.CMD_FLAG_DF)
        assert data == pattern(8 * block, 1)[: 4 * block], "DF read differs"
        assert len(chunks) == 1, f"DF read in {len(chunks)} chunks"
    check("READ with DF (one chunk)", read_df)

    def zeroes():
        h.pwrite(pattern(4 * block, 3), 16 * block)
        h.zero(4 * block, 16 * block, nbd.CMD_FLAG_NO_HOLE)
        assert h.pread(4 * block, 16 * block) == bytes(4 * block), "NO_HOLE zeroes read non-zero"
        h.pwrite(pattern(4 * block, 4), 16 * block)
        h.zero(4 * block, 16 * block, nbd.CMD_FLAG_FUA)
        assert h.pread(4 * block, 16 * block) == bytes(4 * block), "zeroes read non-zero"
    check("WRITE_ZEROES (NO_HOLE, FUA)", zeroes)

    def fast_zero():
        # Either done quickly or refused at once with ENOTSUP, nothing changed.
        h.pwrite(pattern(block, 5), 24 * block)
        try:
            h.zero(block, 24 * block, nbd.CMD_FLAG_FAST_ZERO)
        except nbd.Error as e:
            assert errno_of(e) == errno.ENOTSUP, f"FAST_ZERO refused with {e.errno}, not ENOTSUP"
            assert h.pread(block, 24 * block) == pattern(block, 5), "a refused FAST_ZERO changed data"
            return
        assert h.pread(block, 24 * block) == bytes(block)
    check("WRITE_ZEROES with FAST_ZERO", fast_zero)

    def trim():
        h.pwrite(pattern(4 * block, 6), 32 * block)
        h.trim(4 * block, 32 * block)
        h.trim(4 * block, 32 * block, nbd.CMD_FLAG_FUA)
        h.pread(4 * block, 32 * block)  # any contents, but readable
    check("TRIM (and with FUA)", trim)
    check("CACHE", lambda: h.cache(1 << 20, 0))

    def block_status():
        got = extents(h, 1 << 20, 0)
        assert got, "no extent"
        assert sum(length for length, _ in got) <= 1 << 20 or len(got) == 1, \
            f"extents past the request: {got}"
        one = extents(h, 1 << 20, 0, nbd.CMD_FLAG_REQ_ONE)
        assert len(one) == 1, f"REQ_ONE gave {len(one)} extents"
        h.zero(1 << 20, 8 << 20)
        zeroed = extents(h, 1 << 20, 8 << 20)
        assert all(flags & nbd.STATE_ZERO for _, flags in zeroed[:1]), \
            f"a zeroed range is not reported zero: {zeroed}"
    check("BLOCK_STATUS base:allocation (and REQ_ONE)", block_status)

    def large():
        # Above the advertised maximum: served (in pieces) or refused with
        # EINVAL, the connection usable after either.
        length = 40 << 20
        data = pattern(length, 7)
        raw = connect(uri, strict=False)
        try:
            raw.pwrite(data, 0)
            assert raw.pread(length, 0) == data, "a 40 MiB read back differs"
        except nbd.Error as e:
            assert errno_of(e) == errno.EINVAL, f"refused with {e.errno}, not EINVAL"
        assert raw.pread(block, 0) is not None
        raw.shutdown()
    check("READ and WRITE of 40 MiB (above the maximum block size)", large)

    raw = connect(uri, strict=False)
    check("READ past the end: EINVAL",
          lambda: refused_with(errno.EINVAL, lambda: raw.pread(block, size)))
    check("WRITE past the end: ENOSPC",
          lambda: refused_with(errno.ENOSPC, lambda: raw.pwrite(bytes(block), size - block // 2)))
    check("WRITE_ZEROES past the end: ENOSPC",
          lambda: refused_with(errno.ENOSPC, lambda: raw.zero(2 * block, size - block)))
    check("TRIM past the end: EINVAL",
          lambda: refused_with(errno.EINVAL, lambda: raw.trim(2 * block, size - block)))
    check("BLOCK_STATUS past the end: EINVAL",
          lambda: refused_with(errno.EINVAL, lambda: extents(raw, block, size)))
    if minimum > 1:
        check("unaligned READ: EINVAL",
              lambda: refused_with(errno.EINVAL, lambda: raw.pread(minimum, minimum // 2)))
    check("READ with an unknown flag: EINVAL",
          lambda: refused_with(errno.EINVAL, lambda: raw.pread(block, 0, 1 << 9)))
    check("WRITE with an unknown flag: EINVAL (payload skipped)",
          lambda: refused_with(errno.EINVAL, lambda: raw.pwrite(bytes(block), 0, 1 << 9)))
    check("the connection is usable after every refusal", lambda: raw.pread(block, 0))
    raw.shutdown()

    def multi_conn():
        # A FLUSH on one connection makes another's writes visible on a third.
        a, b = connect(uri), connect(uri)
        data = pattern(block, 8)
        a.pwrite(data, 40 * block)
        b.flush()
        c = connect(uri)
        assert c.pread(block, 40 * block) == data, "a write is not seen on another connection"
        for x in (a, b, c):
            x.shutdown()
    check("MULTI_CONN: writes seen across connections", multi_conn)
    h.shutdown()


def probe_read_only(uri):
    ro = connect(uri, strict=False)
    block = max(ro.get_block_size(nbd.SIZE_MINIMUM) or 1, 4096)
    def says_read_only():
        assert ro.is_read_only(), "not read-only"
    check("read-only export says so", says_read_only)
    check("read-only WRITE: EPERM",
          lambda: refused_with(errno.EPERM, lambda: ro.pwrite(bytes(block), 0)))
    check("read-only WRITE_ZEROES: EPERM",
          lambda: refused_with(errno.EPERM, lambda: ro.zero(block, 0)))
    check("read-only TRIM: EPERM",
          lambda: refused_with(errno.EPERM, lambda: ro.trim(block, 0)))
    check("read-only READ", lambda: ro.pread(block, 0))
    ro.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("uri", nargs="?", help="a writable export (scratch: it is written)")
    parser.add_argument("--read-only-uri", help="a read-only export")
    args = parser.parse_args()
    if not args.uri and not args.read_only_uri:
        parser.error("give a URI, --read-only-uri, or both")
    if args.uri:
        probe(args.uri)
    if args.read_only_uri:
        probe_read_only(args.read_only_uri)
    print(f"{len(passed) + len(failed)} checks, {len(failed)} failed"
          + (f": {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
