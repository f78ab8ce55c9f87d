#!/usr/bin/env python3
"""The 100-point sweep benchmark (not run by CI;
results go in docs/results/sim-bench.md).

One grid, 5 policies x 20 cache sizes at 512-byte lines on the ARC trace P2,
run in the same session, alternating, RUNS times (default 2):

  lab-1   `iocache lab run` with --threads 1 (one trace pass for all 100 points)
  lab-N   `iocache lab run` with --threads N (all cores)
  sim-1   the 100 points as separate `iocache sim` processes, one at a time
  sim-2   the same, two at a time (`xargs -P2`)
  lcs-1   libCacheSim (its official Python binding, which runs the C
          simulator: one `process_trace` per point) on the same trace
          converted to its binary oracleGeneral format, one point at a time
  lcs-2   the same in two processes, each with half of the points

The iocache runs read the decompressed text trace (parsing included), the
libCacheSim runs its binary file (converted once beforehand; the
conversion is not timed). Every timing is the wall time of the whole
command. The script stops if the lab's hit counts differ from the separate
sims' at any point, or if libCacheSim's LRU differs from iocache's LRU at any
size (both count one access per 512-byte sector: there is nothing to tell
them apart). For the other policies it prints both miss ratios side by side.

Usage:
  LCS_PYTHON=/path/to/python-with-libcachesim scripts/bench-lab-sweep.py
  (TRACE=path RUNS=n BIN=path/to/iocache; CARGO_TARGET_DIR honoured; without
  BIN the script builds `iocache` in release mode first)

libCacheSim: `python3 -m venv V && V/bin/pip install libcachesim` (PyPI; the
wheel bundles the C library), then LCS_PYTHON=V/bin/python.

After the timed runs, not timed: libCacheSim's ARC with objects of size 1
(its ARC adapts its target in bytes, by at least one byte per ghost hit,
so with 512-byte objects it adapts 512 times slower than the paper's ARC)
and its S3FIFOv0 (the authors' earlier S3-FIFO, which iocache's follows),
hit counts beside iocache's.

Internal modes, run by the script itself with LCS_PYTHON:
  bench-lab-sweep.py convert IN.lis OUT.oracleGeneral OUT.unit.oracleGeneral
  bench-lab-sweep.py lcs TRACE.oracleGeneral POLICY:LINES ...
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

POLICIES = ["lru", "fifo", "clock", "arc", "s3fifo"]
# 2^10 to 2^19.5 lines in steps of sqrt(2): 20 sizes, 0.5 MiB to 371 MiB of
# 512-byte lines (P2's footprint is 913,347 lines).
SIZES = [round(1024 * 2 ** (k / 2)) for k in range(20)]
if os.environ.get("SIZES"):  # a smaller grid, to try the script out
    SIZES = [int(s) for s in os.environ["SIZES"].split(",")]
LINE_BYTES = 512
# oracleGeneral: uint32 time, uint64 object id, uint32 object size, int64
# the index of the object's next request (-1: none), little endian, packed.
ORACLE_GENERAL = "<IQIq"


def convert(lis_path, out_path, unit_path):
    """The ARC trace (start_sector nsectors ignored request_no) as one
    oracleGeneral record per 512-byte sector, object id = sector number, size
    512, time = the request's index, with each record's next access; and the
    same with objects of size 1 at `unit_path`."""
    import numpy as np

    fields = np.array(open(lis_path, "rb").read().split(), dtype=np.int64).reshape(-1, 4)
    starts, counts = fields[:, 0], fields[:, 1]
    keep = counts > 0
    starts, counts = starts[keep], counts[keep]
    request = np.repeat(np.arange(len(starts), dtype=np.int64), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    ids = np.repeat(starts, counts) + (np.arange(len(request), dtype=np.int64) - first)
    order = np.argsort(ids, kind="stable")
    next_access = np.full(len(ids), -1, dtype=np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    next_access[order[:-1][same]] = order[1:][same]
    records = np.zeros(
        len(ids),
        dtype=np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]),
    )
    assert records.dtype.itemsize == 24
    records["time"] = request
    records["id"] = ids
    records["size"] = LINE_BYTES
    records["next"] = next_access
    records.tofile(out_path)
    records["size"] = 1
    records.tofile(unit_path)
    print(json.dumps({"requests": int(len(starts)), "records": int(len(ids))}))


def lcs(trace, points):
    """Runs each POLICY:LINES point in libCacheSim; one JSON line each."""
    import libcachesim as lc
    from libcachesim.cache import CacheBase, _create_common_params
    from libcachesim.libcachesim_python import S3FIFOv0_init

    def s3fifo_v0(cache_size):
        # The authors' earlier S3-FIFO (S3FIFOv0.c), which the binding does
        # not wrap in a class; default parameters (0.1 small, threshold 2).
        params = _create_common_params(cache_size, 86400 * 300, 24, False, None)
        return CacheBase(_cache=S3FIFOv0_init(params, ""))

    classes = {"lru": lc.LRU, "fifo": lc.FIFO, "clock": lc.Clock, "arc": lc.ARC, "s3fifo": lc.S3FIFO,
               "s3fifov0": s3fifo_v0}
    # Cache sizes in the trace's object sizes: 512 per line, or 1 per line
    # for the unit-size file.
    unit = os.path.basename(trace).endswith(".unit.oracleGeneral")
    for point in points:
        policy, lines = point.split(":")
        reader = lc.TraceReader(trace, lc.TraceType.ORACLE_GENERAL_TRACE)
        cache = classes[policy](int(lines) * (1 if unit else LINE_BYTES))
        miss_ratio, _byte_miss_ratio = cache.process_trace(reader)
        requests = reader.n_total_req
        print(json.dumps({
            "policy": policy,
            "lines": int(lines),
            "cache_name": cache.cache_name,
            "requests": requests,
            "hits": round((1 - miss_ratio) * requests),
            "miss_ratio": miss_ratio,
        }), flush=True)


def main():
    repo = benchlib.REPO
    trace_name = benchlib.env_trace()
    runs = int(os.environ.get("RUNS", "2"))
    lcs_python = os.environ.get("LCS_PYTHON", sys.executable)
    binary = os.environ.get("BIN")
    if not os.path.isfile(trace_name):
        sys.exit(f"error: trace {trace_name} not found (see shared/traces/README.md; set TRACE=...)")
    for tool in ["zstd", "xargs"]:
        if shutil.which(tool) is None:
            sys.exit(f"error: {tool} is needed")
    probe = subprocess.run([lcs_python, "-c", "import libcachesim, numpy"], capture_output=True)
    if probe.returncode != 0:
        sys.exit(f"error: {lcs_python} cannot import libcachesim and numpy "
                 "(python3 -m venv V && V/bin/pip install libcachesim; then LCS_PYTHON=V/bin/python)")
    if binary is None:
        print("==> building iocache (release)", file=sys.stderr)
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "iocache", "--bin", "iocache"],
                       cwd=repo, check=True, stdout=sys.stderr)
        binary = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(repo, "target")), "release", "iocache")
    binary = os.path.abspath(binary)
    me = os.path.abspath(__file__)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                            capture_output=True, text=True).stdout.strip()

    work = benchlib.scratch_dir("iocache-lab-sweep.")
    try:
        lis = os.path.join(work, "P2.lis")
        benchlib.decompress(trace_name, lis)
        oracle = os.path.join(work, "P2.oracleGeneral")
        unit_oracle = os.path.join(work, "P2.unit.oracleGeneral")
        started = time.perf_counter()
        converted = json.loads(subprocess.run([lcs_python, me, "convert", lis, oracle, unit_oracle],
                                              stdout=subprocess.PIPE, check=True).stdout)
        convert_seconds = time.perf_counter() - started

        experiment = os.path.join(work, "sweep.toml")
        with open(experiment, "w") as f:
            f.write(f'[[workload]]\nname = "p2"\ntrace = "{lis}"\nformat = "arc"\n\n[grid]\n')
            f.write(f"policy = {json.dumps(POLICIES)}\n")
            f.write(f"cache_size = {json.dumps([str(s) for s in SIZES])}\n")
            f.write('line_size = ["512B"]\n')
        points = [(p, s) for p in POLICIES for s in SIZES]
        cores = os.cpu_count() or 1

        def sim_argv(policy, lines, out):
            return [binary, "sim", "--trace", lis, "--format", "arc", "--policy", policy,
                    "--cache-size", str(lines), "--line-size", "512B", "--threads", "1", "--json", out]

        def lab(threads):
            out = os.path.join(work, f"lab{threads}.jsonl")
            if os.path.exists(out):
                os.remove(out)  # the lab resumes: start from nothing each time
            wall = benchlib.timed([binary, "-q", "lab", "run", experiment, "--out", out,
                                   "--threads", str(threads)])[0]
            rows = [json.loads(l) for l in open(out)]
            return wall, {(r["policy"], int(r["cache_lines"])): (r["hits"], r["accesses"]) for r in rows}

        def sims(parallel):
            outs = os.path.join(work, "sims")
            shutil.rmtree(outs, ignore_errors=True)
            os.makedirs(outs)
            commands = os.path.join(work, "sims.txt")
            with open(commands, "w") as f:
                for p, s in points:
                    f.write(" ".join(sim_argv(p, s, os.path.join(outs, f"{p}-{s}.json"))[1:]) + "\n")
            # One process per input line (its arguments), at most `parallel` at once.
            wall = benchlib.timed(["xargs", "-P", str(parallel), "-L", "1", "-a", commands, binary])[0]
            result = {}
            for p, s in points:
                run = json.load(open(os.path.join(outs, f"{p}-{s}.json")))["runs"][0]
                result[(p, s)] = (run["hits"], run["accesses"])
            return wall, result

        def libcachesim(processes, trace=oracle, policies=POLICIES):
            args = [f"{p}:{s}" for p in policies for s in SIZES]
            started = time.perf_counter()
            children = [subprocess.Popen([lcs_python, me, "lcs", trace] + args[i::processes],
                                         stdout=subprocess.PIPE) for i in range(processes)]
            outputs = [c.communicate()[0] for c in children]
            wall = time.perf_counter() - started
            if any(c.returncode != 0 for c in children):
                sys.exit("error: a libCacheSim run failed")
            result = {}
            for out in outputs:
                for line in out.decode().splitlines():
                    r = json.loads(line)
                    result[(r["policy"], r["lines"])] = (r["hits"], r["requests"], r["cache_name"])
            return wall, result

        variants = [
            ("lab-1", lambda: lab(1)),
            (f"lab-{cores}", lambda: lab(cores)),
            ("sim-1", lambda: sims(1)),
            ("sim-2", lambda: sims(2)),
            ("lcs-1", lambda: libcachesim(1)),
            ("lcs-2", lambda: libcachesim(2)),
        ]
        walls = {name: [] for name, _ in variants}
        loads = []
        results = {}
        for i in range(runs):
            # Rotate the order so that no variant always follows the same one.
            order = variants[i % len(variants):] + variants[:i % len(variants)]
            for name, run in order:
                loads.append(os.getloadavg()[0])
                wall, result = run()
                walls[name].append(wall)
                results.setdefault(name, result)
                print(f"    run {i + 1}: {name} {wall:.2f} s (load {loads[-1]:.2f})", file=sys.stderr)

        lab_result = results["lab-1"]
        for name in [f"lab-{cores}", "sim-1", "sim-2"]:
            if results[name] != lab_result:
                bad = [k for k in points if results[name][k] != lab_result[k]]
                sys.exit(f"error: {name} differs from lab-1 at {bad[:5]}")
        lcs_result = results["lcs-1"]
        if {k: v[:2] for k, v in results["lcs-2"].items()} != {k: v[:2] for k, v in lcs_result.items()}:
            sys.exit("error: libCacheSim's one- and two-process runs differ")
        for s in SIZES:
            if lcs_result[("lru", s)][:2] != lab_result[("lru", s)]:
                sys.exit(f"error: LRU at {s} lines: libCacheSim {lcs_result[('lru', s)][:2]} "
                         f"(hits, requests), iocache {lab_result[('lru', s)]} (hits, accesses)")

        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
        print("## The 100-point sweep\n")
        print(f"- commit {commit} (HEAD at the start); {binary} --version: "
              f"{subprocess.run([binary, '--version'], capture_output=True, text=True).stdout.strip()}")
        lcs_version = subprocess.run([lcs_python, "-c", "import libcachesim; print(libcachesim.__version__)"],
                                     capture_output=True, text=True).stdout.strip()
        print(f"- libCacheSim Python binding {lcs_version} (PyPI `libcachesim`)")
        print(f"- CPU: {cpu}, {cores} cores; load average (1 min) before each timed command: "
              f"{min(loads):.2f} to {max(loads):.2f}, median {statistics.median(loads):.2f}")
        print(f"- trace: {trace_name}: {converted['requests']} requests, {converted['records']} "
              f"512-byte line accesses; oracleGeneral file converted in {convert_seconds:.1f} s (not timed below)")
        print(f"- grid: {len(POLICIES)} policies ({', '.join(POLICIES)}) x {len(SIZES)} sizes "
              f"({SIZES[0]} to {SIZES[-1]} lines of 512 B); {runs} runs of each variant, alternated\n")
        print("| variant | what | wall s (median) | wall s (min..max) | vs lab, all cores |")
        print("|---|---|---:|---:|---:|")
        what = {
            "lab-1": "`iocache lab run --threads 1`: one process, one pass",
            f"lab-{cores}": f"`iocache lab run --threads {cores}`",
            "sim-1": "100 `iocache sim` processes, one at a time",
            "sim-2": "100 `iocache sim` processes, `xargs -P2`",
            "lcs-1": "libCacheSim, 100 `process_trace` calls in one process",
            "lcs-2": "libCacheSim, two processes of 50 calls",
        }
        base = statistics.median(walls[f"lab-{cores}"])
        for name, _ in variants:
            med = statistics.median(walls[name])
            print(f"| {name} | {what[name]} | {med:.2f} | {min(walls[name]):.2f}..{max(walls[name]):.2f} | {med / base:.2f} |")
        print()
        print("Miss ratios (iocache = the lab's, which equal the separate sims' at every point; "
              "difference = libCacheSim - iocache):\n")
        print("| cache lines | " + " | ".join(f"{p} iocache | {p} libCacheSim | {p} diff" for p in POLICIES) + " |")
        print("|---:|" + "---:|---:|---:|" * len(POLICIES))
        for s in SIZES:
            cells = []
            for p in POLICIES:
                hits, accesses = lab_result[(p, s)]
                lhits, lrequests, _ = lcs_result[(p, s)]
                mine, theirs = 1 - hits / accesses, 1 - lhits / lrequests
                cells += [f"{mine:.4f}", f"{theirs:.4f}", f"{theirs - mine:+.4f}"]
            print(f"| {s} | " + " | ".join(cells) + " |")
        names = {p: sorted({lcs_result[(p, s)][2] for s in SIZES}) for p in POLICIES}
        print("\nlibCacheSim's cache names (with their parameters): "
              + "; ".join(f"{p}: {', '.join(n)}" for p, n in names.items()))

        # Not timed: where ARC and S3-FIFO differ, libCacheSim with objects
        # of size 1 (ARC adapts its target p in bytes, by at least one
        # byte) and the authors' earlier S3FIFOv0, against iocache's hits.
        _, unit_arc = libcachesim(2, unit_oracle, ["arc"])
        _, v0 = libcachesim(2, unit_oracle, ["s3fifov0"])
        print("\nNot timed: libCacheSim's ARC on the same trace with objects of size 1 (cache size in lines), "
              "and its S3FIFOv0, against iocache (hits of 12,729,495 accesses):\n")
        print("| cache lines | arc iocache hits | ARC, size-1 objects | equal | s3fifo iocache hits | S3FIFOv0 | equal |")
        print("|---:|---:|---:|---|---:|---:|---|")
        same = {"arc": 0, "s3fifo": 0}
        for s in SIZES:
            a, b = lab_result[("arc", s)][0], unit_arc[("arc", s)][0]
            c, d = lab_result[("s3fifo", s)][0], v0[("s3fifov0", s)][0]
            same["arc"] += a == b
            same["s3fifo"] += c == d
            print(f"| {s} | {a} | {b} | {'yes' if a == b else f'{b - a:+d}'} | {c} | {d} | "
                  f"{'yes' if c == d else f'{d - c:+d}'} |")
        print(f"\nEqual hit counts: ARC {same['arc']}/{len(SIZES)}, S3-FIFO {same['s3fifo']}/{len(SIZES)} "
              "(libCacheSim's hits are (1 - miss ratio) x requests, rounded)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) > 1 and sys.argv[1] == "lcs":
        lcs(sys.argv[2], sys.argv[3:])
    else:
        main()
