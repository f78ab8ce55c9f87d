#!/usr/bin/env python3
"""One line per `iocache sim --json` run with an --adapt controller (see
scripts/lbica-experiments.sh): latency after warm-up, hit ratio, the largest
per-interval maximum queue time of both devices (Eq. 1, the paper's Figs.
4-5) over the intervals after warm-up, switches, bypasses, and the policy
changes as (seconds, policy, group, R/W/P/E %)."""

import json
import sys


def main(path, label):
    run = json.load(open(path))["runs"][0]
    t = run["timing"]
    a = run["adapt"]
    start = t["start_ns"]  # the end of the warm-up
    rows = [r for r in a["rows"] if r["start_ns"] >= start]
    peak_c = max((r["max_cache_queue_time_ns"] for r in rows), default=0) / 1e6
    peak_b = max((r["max_backend_queue_time_ns"] for r in rows), default=0) / 1e6
    changes = [
        f'{r["end_ns"] / 1e9:.1f}s:{r["policy"]}({r["group"]} '
        f'{r["share_r"] * 100:.0f}/{r["share_w"] * 100:.0f}/{r["share_p"] * 100:.0f}/{r["share_e"] * 100:.0f})'
        for r in a["rows"]
        if r["changed"]
    ]
    us = lambda ns: ns / 1e3
    print(
        f'{label:18} mean {us(t["all"]["mean_ns"]):9.0f} us  p99 {us(t["all"]["p99_ns"]):9.0f}  '
        f'p99.99 {us(t["all"]["p9999_ns"]):9.0f}  hit {run["hit_ratio"] * 100:5.1f} %  '
        f'peak Tc {peak_c:8.1f} ms  Tb {peak_b:8.1f} ms  switches {a["switches"]:2}  '
        f'bypassed {a["bypassed"]:6}  {" ".join(changes[:4])}{" ..." if len(changes) > 4 else ""}'
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
