#!/usr/bin/env python3
"""Writes the bundled synthetic trace crates/iocache-sim/data/sample.lis.

ARC "lis" format (start_sector nsectors 0 request_no, 512-byte sectors). The
mix is made to separate recency from frequency policies: a Zipf-popular hot
set of 4 KiB blocks, sequential scans that flush an LRU cache, a loop over a
region slightly larger than a small cache, and uniform random noise. The
generator is a fixed 64-bit LCG, so the file is identical on every machine.
"""

import bisect
import sys

REQUESTS = 20_000
HOT_BLOCKS = 4_000          # 4 KiB blocks in the hot set
ZIPF_S = 0.9
SPACE_SECTORS = 1 << 21     # 1 GiB address space

state = 0x2545F4914F6CDD1D


def rand():
    """Uniform float in [0, 1) from a 64-bit LCG (Knuth's MMIX constants)."""
    global state
    state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    return (state >> 11) / float(1 << 53)


def main(path):
    weights = [1.0 / (rank ** ZIPF_S) for rank in range(1, HOT_BLOCKS + 1)]
    cumulative = []
    total = 0.0
    for w in weights:
        total += w
        cumulative.append(total)
    # Scatter hot blocks over the space so they do not form one run.
    hot_start = [int(rand() * (SPACE_SECTORS // 8)) * 8 for _ in range(HOT_BLOCKS)]
    lines = []
    scan_left, scan_at = 0, 0
    loop_at = 0
    while len(lines) < REQUESTS:
        if scan_left > 0:
            lines.append((scan_at, 16))
            scan_at += 16
            scan_left -= 1
            continue
        r = rand()
        if r < 0.60:
            block = bisect.bisect_left(cumulative, rand() * total)
            lines.append((hot_start[min(block, HOT_BLOCKS - 1)], 8))
        elif r < 0.603:
            scan_left = 150
            scan_at = int(rand() * (SPACE_SECTORS - 150 * 16) // 8) * 8
        elif r < 0.85:
            # A loop over 1,200 blocks of 4 KiB starting at 512 MiB.
            lines.append(((1 << 20) + loop_at * 8, 8))
            loop_at = (loop_at + 1) % 1_200
        else:
            lines.append((int(rand() * (SPACE_SECTORS // 8)) * 8, 8 * (1 + int(rand() * 4))))
    with open(path, "w") as out:
        for i, (start, sectors) in enumerate(lines[:REQUESTS]):
            out.write(f"{start} {sectors} 0 {i}\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "crates/iocache-sim/data/sample.lis")
