#!/usr/bin/env python3
"""Miniature simulation against full simulations: the miss-ratio curves of
several policies from `iocache trace mrc --method mini:RATE --policy ...`
compared, size by size, with `iocache sim` at the same sizes (the full
simulations, every point its own cache); mean and largest absolute error per
policy, and the seconds of each side.

    scripts/bench-mini.py TRACE [--line-size 4KiB] [--rate 0.01] [--policies lru,arc,s3fifo]

Run from the repository's root after `cargo build --release`.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def timed_json(argv):
    started = time.monotonic()
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out), time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--line-size", default="4KiB")
    parser.add_argument("--rate", default="0.01")
    parser.add_argument("--policies", default="lru,arc,s3fifo")
    args = parser.parse_args()
    mini, mini_seconds = timed_json([benchlib.BIN, "trace", "mrc", args.trace, "--line-size", args.line_size,
                                     "--method", f"mini:{args.rate}", "--policy", args.policies, "--json", "-"])
    sizes = [p["cache_lines"] for p in mini["curves"][0]["points"]]
    full, full_seconds = timed_json([benchlib.BIN, "sim", "--trace", args.trace, "--line-size", args.line_size,
                                     "--policy", args.policies, "--cache-size", ",".join(map(str, sizes)),
                                     "--json", "-"])
    print(f"# {os.path.basename(args.trace)}: {mini['footprint_lines']:,} lines of {args.line_size}, "
          f"{len(sizes)} sizes; mini:{args.rate} {mini_seconds:.2f} s, full simulations {full_seconds:.2f} s "
          f"({full_seconds / mini_seconds:.1f}x)")
    print("| policy | mean abs. error | largest |")
    print("|---|---:|---:|")
    for curve in mini["curves"]:
        policy = curve["policy"]
        errors = []
        for point in curve["points"]:
            run = next(r for r in full["runs"]
                       if r["policy"] == policy and r["cache_lines"] == point["cache_lines"])
            errors.append(abs(point["miss_ratio"] - (1.0 - run["hit_ratio"])))
        print(f"| {policy} | {sum(errors) / len(errors):.4f} | {max(errors):.4f} |")


if __name__ == "__main__":
    main()
