#!/usr/bin/env python3
"""What eplb.vllm.install_window changes for vLLM's policy: `auto` over a chunked window vs the window sum.

Usage: bench/vllm_window.py [--eplb build/eplb] [--trace t.npy] [--seed 1] [--drift D] [--policy deepseek]

vLLM keeps the last `window` steps of per-expert load and plans from their sum; with install_window the
policy plans from eplb.estimate_load(window cut into `chunks` chunks, "auto") instead (docs/python.md).
This replays that on a trace (default: the standard trace, `eplb gen-load --preset deepseek-v3 --dist
lognormal --steps 400 --seed 1`; `--drift 0`: its popularity does not drift, the control),
DeepSeek-V3's shape on 4 hosts x 8 ranks (288 slots): a rebalance every 20 steps from step 100 on, each
planned from the `window` steps before it, and scored by the balancedness (mean over layers of mean/max
rank load) of its placement on the next 20 steps. Every rebalance plans from scratch with `--policy`
(vLLM's default runs deepseek). Deterministic: one run per trace gives its rows. One row per (window,
chunks): mean next-window balancedness planning from the window's sum (vLLM's own) and from auto over
its chunks, their paired ratio (median, min-max over the rebalances), and what auto chose.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile

import numpy as np

import eplb

SETTINGS = [(20, 20), (20, 5), (40, 8), (100, 20), (100, 5)]  # (window steps, chunks)
FIRST, EVERY, NEXT = 100, 20, 20  # first rebalance step, steps between rebalances, steps scored after one


def plan_score(load, upcoming, policy):
    phy2log = eplb.rebalance_experts(load, 288, 8, 4, 32, policy=policy)[0]
    return eplb.balancedness(upcoming, phy2log, 32).mean


def rows_for(trace, window, chunks, policy):
    sums, autos, chosen = [], [], []
    for step in range(FIRST, trace.shape[0] - NEXT + 1, EVERY):
        steps = trace[step - window:step]
        upcoming = trace[step:step + NEXT].sum(axis=0)
        chunked = steps.reshape(chunks, window // chunks, *steps.shape[1:]).sum(axis=1)
        estimate, applied = eplb.estimate_load(chunked, "auto")
        estimate = np.round(estimate)  # as install_window hands it to vLLM (vLLM's integer dtype)
        sums.append(plan_score(steps.sum(axis=0), upcoming, policy))
        autos.append(plan_score(estimate, upcoming, policy))
        chosen.append(applied)
    return sums, autos, chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eplb", default=os.path.join(os.path.dirname(__file__), "..", "build", "eplb"),
                        help="the eplb CLI, to generate the trace (default build/eplb)")
    parser.add_argument("--trace", help="a [steps][58][256] trace .npy (default: generated with --seed)")
    parser.add_argument("--seed", type=int, default=1, help="gen-load seed when no --trace (default 1: the standard)")
    parser.add_argument("--drift", type=float, help="gen-load's --drift when no --trace (default: gen-load's, 0.001)")
    parser.add_argument("--policy", default="deepseek", help="the policy every rebalance runs (default deepseek)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds like Ctrl-C: the temporary directory goes
    with tempfile.TemporaryDirectory(prefix="eplb-vllm-window-") as workdir:
        path = args.trace or os.path.join(workdir, "t.npy")
        if not args.trace:
            subprocess.run([args.eplb, "gen-load", "--preset", "deepseek-v3", "--dist", "lognormal", "--steps", "400",
                            "--seed", str(args.seed), "--out", path]
                           + ([] if args.drift is None else ["--drift", str(args.drift)]), check=True,
                           stdout=subprocess.DEVNULL)
        trace = np.asarray(eplb.read_load_trace(path), dtype=np.float64)
    what = args.trace or f"gen-load seed {args.seed}" + (f", drift {args.drift}" if args.drift is not None else
                                                         " (the standard trace)" if args.seed == 1 else "")
    print(f"{what}; policy {args.policy}; a rebalance every {EVERY} steps from step {FIRST}, scored on the next "
          f"{NEXT} steps")
    print("| window steps | chunks (steps each) | next-window balancedness: sum | auto over chunks | "
          "auto/sum paired, median (min-max) | auto chose |")
    print("|---|---|---|---|---|---|")
    for window, chunks in SETTINGS:
        sums, autos, chosen = rows_for(trace, window, chunks, args.policy)
        ratios = [a / s for a, s in zip(autos, sums)]
        picks = ", ".join(f"{name} x{chosen.count(name)}" for name in sorted(set(chosen)))
        print(f"| {window} | {chunks} ({window // chunks}) | {statistics.fmean(sums):.4f} | "
              f"{statistics.fmean(autos):.4f} | {statistics.median(ratios):.4f} ({min(ratios):.4f}-"
              f"{max(ratios):.4f}) | {picks} |")


if __name__ == "__main__":
    main()
