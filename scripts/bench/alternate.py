#!/usr/bin/env python3
"""Why this exists: on a shared machine whose memory speed changes from one
minute to the next, two builds are only comparable when timed side by side.
This runs shell commands in turn, N rounds (the order reversed every other
round), and prints each one's wall times and its speed against the first
command, per round (paired: the first's time / this one's, same round).

Usage: scripts/bench/alternate.py N name=command [name=command ...]
Example (from a directory holding a decompressed trace):
  scripts/bench/alternate.py 8 \\
    "c=./lru-baseline < trace.lis" \\
    "new=iocache sim --trace trace.lis --policy lru --cache-size 131072 --line-size 512B --threads 1 --json /dev/null"
"""
import statistics
import subprocess
import sys
import time


def main() -> int:
    if len(sys.argv) < 3 or not sys.argv[1].isdigit() or any("=" not in a for a in sys.argv[2:]):
        print(__doc__, file=sys.stderr)
        return 2
    rounds = int(sys.argv[1])
    commands = [a.split("=", 1) for a in sys.argv[2:]]
    times = {name: [] for name, _ in commands}
    for r in range(rounds):
        for name, command in commands if r % 2 == 0 else reversed(commands):
            started = time.perf_counter()
            subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - started)
    first = times[commands[0][0]]
    print(f"{rounds} rounds; speed = {commands[0][0]}'s wall time / this one's, per round")
    print("| command | wall s (median) | wall s (min..max) | speed (median) | speed (min..max) |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in commands:
        walls = times[name]
        speed = [f / w for f, w in zip(first, walls)]
        print(f"| {name} | {statistics.median(walls):.3f} | {min(walls):.3f}..{max(walls):.3f} "
              f"| {statistics.median(speed):.2f} | {min(speed):.2f}..{max(speed):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
