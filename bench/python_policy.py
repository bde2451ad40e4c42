#!/usr/bin/env python3
"""The cost of a placement policy through the Python package, next to the CLI's policy time and a
numpy port of the same algorithm (vLLM's style), on DeepSeek-V3's load (58 x 256, `eplb gen-load`
seed 0) for three serving shapes; then 4 Python threads against one at a time. Prints tables.

Columns (milliseconds: median [p10-p90] of the repetitions; each kind of call timed in its own run of
back-to-back calls):
  python      eplb.rebalance_experts(numpy float64 load), warm, call and conversions included
  torch       the same from a float32 torch tensor, torch tensors out
  in-call C++ the C++ policy's own time inside those calls (python / in-call = the binding's cost)
  2 threads   eplb.rebalance_experts(..., threads=2): the layers split over 2 threads
  first call  the first call in a fresh Python process (import excluded), like the CLI's single call
  CLI         `eplb rebalance --format json` policy_seconds: one call in a fresh process each run
  numpy port  bench/numpy_port.py, vLLM's style (exact: its phy2log equals eplb's), timed in paired
              rounds: 50 Python calls, then one numpy-port call. numpy/python is the ratio of the column
              medians; numpy/paired the median of the rounds' ratios (both sides in the same machine state)
Goals (issue 13): python at most 1.2x the C++ policy time; at least 100x faster than the numpy port.

Run on a quiet machine: flock /work/.cpu.lock .venv/bin/python bench/python_policy.py
Env: EPLB_CLI (default build/eplb). Options: --repeat N (warm calls, 300), --processes N (fresh
processes for the first-call and CLI columns, 15), --numpy-repeat N (paired numpy rounds, 7),
--threads-rounds N (7).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

import eplb
from eplb.policy import _place

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [  # name, replicas, groups, nodes, ranks
    ("V3 32 ranks 4 nodes", 288, 8, 4, 32),
    ("V3 32 ranks 1 node", 288, 8, 1, 32),
    ("V3 64 ranks 8 nodes", 320, 8, 8, 64),
]


def spread(seconds) -> str:
    ms = np.array(seconds) * 1e3
    return f"{np.median(ms):7.3f} [{np.percentile(ms, 10):.3f}-{np.percentile(ms, 90):.3f}]"


def warm_times(load, counts, repeat):
    """Seconds per call, each kind in its own run of back-to-back calls (as the numpy port's are timed):
    from numpy (total, and the C++ policy inside), from torch, with 2 threads."""
    import torch

    options = dict(policy="deepseek", current=None, threads=None, budget=None, anti_affinity=False,
                   min_gain=0.0, estimator=None, move_threshold=0.0)
    tensor = torch.from_numpy(load).float()

    def timed(call):
        seconds = []
        for _ in range(repeat):
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
        return seconds

    totals = timed(lambda: eplb.rebalance_experts(load, *counts))
    inner = [_place(load, *counts, **options)[3] for _ in range(repeat)]
    torch_totals = timed(lambda: eplb.rebalance_experts(tensor, *counts))
    two_threads = timed(lambda: eplb.rebalance_experts(load, *counts, threads=2))
    return totals, inner, torch_totals, two_threads


FIRST_CALL = """
import sys, time, numpy as np, eplb
load = np.load(sys.argv[1]); counts = [int(c) for c in sys.argv[2:]]
start = time.perf_counter(); eplb.rebalance_experts(load, *counts); print(time.perf_counter() - start)
"""


def first_call_times(load_path, counts, processes):
    arguments = [sys.executable, "-c", FIRST_CALL, str(load_path), *map(str, counts)]
    return [float(subprocess.run(arguments, capture_output=True, text=True, check=True).stdout)
            for _ in range(processes)]


def cli_times(cli, load_path, counts, processes):
    replicas, groups, nodes, ranks = counts
    arguments = [cli, "rebalance", "--load", str(load_path), "--replicas", str(replicas), "--groups", str(groups),
                 "--nodes", str(nodes), "--ranks", str(ranks), "--format", "json"]
    return [json.loads(subprocess.run(arguments, capture_output=True, text=True, check=True).stdout)
            ["policy_seconds"] for _ in range(processes)]


def numpy_rounds(load, counts, rounds, calls=50):
    """Paired rounds: `calls` Python calls, then one numpy-port call; each round's ratio is the numpy call over
    the median of the Python calls just before it, so both sides see the same machine state."""
    times, ratios, result = [], [], None
    for _ in range(rounds):
        python = []
        for _ in range(calls):
            start = time.perf_counter()
            eplb.rebalance_experts(load, *counts)
            python.append(time.perf_counter() - start)
        start = time.perf_counter()
        result = numpy_port.rebalance_experts(load, *counts)
        times.append(time.perf_counter() - start)
        ratios.append(times[-1] / statistics.median(python))
    exact = np.array_equal(result, eplb.rebalance_experts(load, *counts)[0])
    return times, ratios, exact


def shape_row(name, load, load_path, counts, arguments, cli):
    totals, inner, torch_totals, two_threads = warm_times(load, counts, arguments.repeat)
    first = first_call_times(load_path, counts, arguments.processes)
    by_cli = cli_times(cli, load_path, counts, arguments.processes)
    by_numpy, numpy_ratios, exact = numpy_rounds(load, counts, arguments.numpy_repeat)
    median = statistics.median
    print(f"{name:<20} {spread(totals)} {spread(torch_totals)} {spread(inner)} {spread(two_threads)} "
          f"{spread(first)} {spread(by_cli)} {spread(by_numpy)} {'yes' if exact else 'NO':>5}")
    return {"python/in-call": median(totals) / median(inner), "torch/in-call": median(torch_totals) / median(inner),
            "first call/CLI": median(first) / median(by_cli), "python/CLI": median(totals) / median(by_cli),
            "numpy/python": median(by_numpy) / median(totals), "numpy/paired": median(numpy_ratios),
            "paired rounds": (min(numpy_ratios), max(numpy_ratios)),
            "numpy/2 threads": median(by_numpy) / median(two_threads)}


def thread_rounds(loads, counts, rounds, calls=25):
    """Median and spread of (4 threads at once) / (the same calls one at a time)."""
    ratios = []
    for _ in range(rounds):
        start = time.perf_counter()
        for load in loads:
            for _ in range(calls):
                eplb.rebalance_experts(load, *counts)
        alone = time.perf_counter() - start

        def work(load):
            for _ in range(calls):
                eplb.rebalance_experts(load, *counts)

        threads = [threading.Thread(target=work, args=(load,)) for load in loads]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ratios.append((time.perf_counter() - start) / alone)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--processes", type=int, default=15)
    parser.add_argument("--numpy-repeat", type=int, default=7)
    parser.add_argument("--threads-rounds", type=int, default=7)
    arguments = parser.parse_args()
    cli = os.environ.get("EPLB_CLI", str(ROOT / "build" / "eplb"))
    work = ROOT / "build-python" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    load_path = work / "deepseek_v3_load.npy"
    subprocess.run([cli, "gen-load", "--preset", "deepseek-v3", "--seed", "0", "--out", str(load_path)],
                   check=True, capture_output=True)
    load = np.load(load_path)
    print(f"eplb {eplb.__version__}, load {load.shape[0]} x {load.shape[1]} (gen-load seed 0), "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; ms: median [p10-p90]")
    print(f"{'shape':<20} {'python':>22} {'torch':>22} {'in-call C++':>22} {'2 threads':>22} {'first call':>22} "
          f"{'CLI':>22} {'numpy port':>22} {'exact':>5}")
    ratios = {name: shape_row(name, load, load_path, counts, arguments, cli) for name, *counts in SHAPES}
    print("\nratios of medians")
    keys = [key for key in next(iter(ratios.values())) if key != "paired rounds"]
    print(f"{'shape':<20} " + " ".join(f"{key:>15}" for key in keys))
    for name, row in ratios.items():
        print(f"{name:<20} " + " ".join(f"{row[key]:>15.2f}" for key in keys))
    print(f"numpy/paired: median over {arguments.numpy_repeat} paired rounds (one numpy-port call / the median of "
          f"the 50 Python calls just before it), [range]: " +
          "; ".join(f"{name} {row['numpy/paired']:.1f}x [{row['paired rounds'][0]:.1f}-{row['paired rounds'][1]:.1f}]"
                    for name, row in ratios.items()))
    loads = [np.roll(load, shift, axis=1) for shift in range(4)]
    thread_ratios = thread_rounds(loads, SHAPES[0][1:], arguments.threads_rounds)
    print(f"\n4 threads x 25 calls ({SHAPES[0][0]}) / the same 100 calls one at a time: median "
          f"{statistics.median(thread_ratios):.2f} (speedup {1 / statistics.median(thread_ratios):.2f}x), "
          f"range {min(thread_ratios):.2f}-{max(thread_ratios):.2f} over {len(thread_ratios)} rounds")
    load_path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
