#!/usr/bin/env python3
"""eplb's transfer schedule against vLLM's schedule_migration_batches on the same placement changes
(issue 31, docs/scale.md "The schedule").

Usage: bench/schedule_vs_vllm.py [--eplb build/eplb] [--trace t.npy] [--rebalances 3]

Placements: the standard DeepSeek-V3 trace (`eplb gen-load --preset deepseek-v3 --dist lognormal
--steps 400 --seed 1`), windows of 20 steps, each policy chained from the default placement for
--rebalances windows (deepseek rewrites ~94% of the slots, incremental 10%, cost-aware's choice).
Shape: 58 layers, 256 experts, 288 slots on 32 ranks of 8 per host (EP32 on 4 H100 hosts).

Both schedules are priced by one rule: rounds run one after another, and a round takes its busiest
link's bytes over that link's bandwidth (a rank's NVLink 450 GB/s or NIC 50 GB/s each way; 44,040,192
bytes per expert). eplb's rounds come from `eplb simulate` (its schedule_makespan, plan and schedule
in C++); vLLM's batches from vllm.distributed.eplb.migration_scheduler, imported from the installed
vllm, with its own choice of senders. The lower bound is eplb's plan's busiest link. Prints per
policy the makespans summed over layers and rebalances, and their ratio.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import eplb
from vllm.distributed.eplb.migration_scheduler import schedule_migration_batches

LAYERS, EXPERTS, SLOTS, RANKS, PER_HOST = 58, 256, 288, 32, 8
EXPERT_BYTES = 44040192
NVLINK, NIC = 450e9, 50e9


def vllm_makespan(old, new):
    """Sum over vLLM's batches of the busiest link's seconds, for one layer."""
    total = 0.0
    for batch in schedule_migration_batches(SLOTS // RANKS, np.asarray(old), np.asarray(new)):
        links = {}
        for flow in batch:
            size = len(flow.expert_ids) * EXPERT_BYTES
            if flow.src_rank // PER_HOST == flow.dst_rank // PER_HOST:
                keys = (("intra_out", flow.src_rank, NVLINK), ("intra_in", flow.dst_rank, NVLINK))
            else:
                keys = (("nic_out", flow.src_rank, NIC), ("nic_in", flow.dst_rank, NIC))
            for kind, rank, bandwidth in keys:
                links[(kind, rank)] = links.get((kind, rank), 0.0) + size / bandwidth
        total += max(links.values(), default=0.0)
    return total


def chained(trace, policy, rebalances, **options):
    current = np.array([[s % EXPERTS for s in range(SLOTS)]] * LAYERS)
    placements = []
    for index in range(rebalances):
        window = trace[20 * index:20 * (index + 1)].sum(axis=0)
        phy2log, _, _ = eplb.rebalance_experts(window, SLOTS, 8, 4, RANKS, policy=policy, current=current, **options)
        placements.append(phy2log)
        current = phy2log
    return placements


def eplb_makespans(eplb_binary, trace_path, placements, workdir):
    path = os.path.join(workdir, "placements.npy")
    np.save(path, np.stack(placements).astype(np.float64))
    out = os.path.join(workdir, "simulated.json")
    subprocess.run([eplb_binary, "simulate", "--model", "deepseek-v3", "--ranks", str(RANKS), "--trace", trace_path,
                    "--placements", path, "--window", "20", "--layer-overhead-ms", "0", "--json", out, "--quiet"],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)["rebalances"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eplb", default=os.path.join(os.path.dirname(__file__), "..", "build", "eplb"))
    parser.add_argument("--trace", help="the standard trace (.npy); generated when absent")
    parser.add_argument("--rebalances", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eplb-schedule-") as workdir:
        trace_path = args.trace or os.path.join(workdir, "trace.npy")
        if not args.trace:
            subprocess.run([args.eplb, "gen-load", "--preset", "deepseek-v3", "--dist", "lognormal", "--steps", "400",
                            "--seed", "1", "--out", trace_path], check=True, stdout=subprocess.DEVNULL)
        trace = np.load(trace_path)
        print(f"EP{RANKS} on {RANKS // PER_HOST} H100 hosts (NVLink 450 GB/s, NIC 50 GB/s per GPU), DeepSeek-V3 shape, "
              f"{args.rebalances} rebalances per policy; seconds summed over layers and rebalances, no per-layer overhead")
        print(f"{'policy':<13} {'lower bound':>12} {'eplb rounds':>12} {'vLLM batches':>13} {'vLLM / eplb':>12} "
              f"{'eplb / bound':>13}")
        cases = [("deepseek", {}), ("incremental", {"budget": 0.1}), ("cost-aware", {"interval_s": 600})]
        for policy, options in cases:
            placements = chained(trace, policy, args.rebalances, **options)
            simulated = eplb_makespans(args.eplb, trace_path, placements, workdir)
            bound = sum(layer["lower_bound"] for r in simulated for layer in r["layers"])
            ours = sum(layer["schedule_makespan"] for r in simulated for layer in r["layers"])
            previous = [np.array([[s % EXPERTS for s in range(SLOTS)]] * LAYERS)] + placements[:-1]
            theirs = sum(vllm_makespan(old[l], new[l]) for old, new in zip(previous, placements) for l in range(LAYERS))
            print(f"{policy:<13} {bound:>11.3f}s {ours:>11.3f}s {theirs:>12.3f}s {theirs / ours:>12.2f} "
                  f"{ours / bound:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
