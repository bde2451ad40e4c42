#!/usr/bin/env python3
"""The Python eplb.Migrator on the emulated cluster (issue 31 item 2; docs/scale.md "The testbed").

Two uses:
- As every rank of an MPI job inside the testbed (bench/cluster_testbed.sh runs it when
  WITH_PYTHON=1, next to `eplb run`, in the same testbed):
    python bench/testbed_migrator.py rank --trace T.npy --layers 4 --experts E --slots S --hosts H
        --rounds 3 --window 20 --policy deepseek --bytes-per-expert 1048576 --schedule off --json OUT
  Each rank holds [layers] x [slots/P, bytes] uint8 tensors from eplb.empty (the agent's memory, as
  `eplb run` uses), filled with each expert's own bytes; the placements are those `eplb run` computes
  (eplb.rebalance_experts on each window of the trace, chained from the default placement); the group
  is mpirun's (eplb.ProcessGroup.from_env). Each round is one Migrator.migrate(), timed; afterwards
  every row is checked against its expert's bytes. Rank 0 writes {"status", "rounds": [{"seconds",
  "bytes_inter_node", ...}]}, the fields bench/cluster_validation.py reads from `eplb run --json`.
- To compare, after the testbed ran:
    python bench/testbed_migrator.py report CONFIG_DIR...
  prints, per configuration and schedule, the total migration time of `eplb run` and of the Python
  Migrator (median, min-max over the repeats), their ratio, and the bytes into each host's link.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from testbed_modes import numbered  # bench/, next to this script


def expert_row(expert: int, length: int) -> np.ndarray:
    """The bytes of one expert: a pattern that differs between experts in every 8-byte word."""
    words = (np.arange(length // 8, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(expert + 1)
    return words.view(np.uint8)


def placements(args) -> list[np.ndarray]:
    """The phy2log of the default placement, then of each round, as `eplb run` chains them."""
    import eplb
    trace = np.load(args.trace)
    current = np.tile(np.arange(args.slots) % args.experts, (args.layers, 1)).astype(np.int64)
    chain = [current]
    for r in range(args.rounds):
        window = trace[r * args.window:(r + 1) * args.window].astype(np.float64)
        current, _, _ = eplb.rebalance_experts(window, args.slots, 1, args.hosts, args.ranks, policy=args.policy,
                                               current=current)
        chain.append(np.asarray(current, dtype=np.int64))
    return chain


def fill(weights, phy2log, rank: int, slots_per_rank: int) -> None:
    for layer, tensors in enumerate(weights):
        rows = tensors[0].numpy()
        for i in range(slots_per_rank):
            rows[i] = expert_row(int(phy2log[layer][rank * slots_per_rank + i]), rows.shape[1])


def wrong_rows(weights, phy2log, rank: int, slots_per_rank: int) -> list[str]:
    wrong = []
    for layer, tensors in enumerate(weights):
        rows = tensors[0].numpy()
        for i in range(slots_per_rank):
            slot = rank * slots_per_rank + i
            if not np.array_equal(rows[i], expert_row(int(phy2log[layer][slot]), rows.shape[1])):
                wrong.append(f"layer {layer} slot {slot}")
    return wrong


def run_rank(args) -> int:
    import torch

    import eplb
    group = eplb.ProcessGroup.from_env(timeout=60)
    args.ranks = group.size
    if args.slots % args.ranks:
        raise ValueError(f"--slots {args.slots} is not a multiple of the {args.ranks} ranks")
    per_rank = args.slots // args.ranks
    chain = placements(args)
    weights = [[eplb.empty((per_rank, args.bytes_per_expert), dtype=torch.uint8)] for _ in range(args.layers)]
    fill(weights, chain[0], group.rank, per_rank)
    migrator = eplb.Migrator(weights, group=group, num_nodes=args.hosts, timeout=120,
                             transfer_schedule=args.schedule)
    rounds = []
    for r in range(args.rounds):
        started = time.perf_counter()
        report = migrator.migrate(chain[r], chain[r + 1])
        wall = time.perf_counter() - started
        wrong = wrong_rows(weights, chain[r + 1], group.rank, per_rank)
        if wrong:
            raise RuntimeError(f"rank {group.rank} round {r}: {len(wrong)} rows hold the wrong bytes: {wrong[:4]}")
        totals = report["totals"]
        rounds.append({"seconds": totals["seconds"], "wall_seconds": wall, "bytes_moved": totals["bytes_moved"],
                       "bytes_inter_node": totals["bytes_inter_node"], "verified": report["verified"]})
    if group.rank == 0:
        with open(args.json, "w") as f:
            json.dump({"status": "ok", "transfer_schedule": args.schedule, "plane": migrator.plane,
                       "ranks": args.ranks, "rounds": rounds}, f, indent=1)
    return 0


def reports(config_dir: str, prefix: str, mode: str) -> list[dict]:
    """Every repeat's report of `eplb run` (prefix "run") or of the Python Migrator ("py")."""
    found = []
    for _, path in numbered(config_dir, f"{prefix}-{mode}"):
        with open(path) as f:
            report = json.load(f)
        if report.get("status") != "ok":
            raise RuntimeError(f"{path}: status {report.get('status')}")
        found.append(report)
    return found


def totals(config_dir: str, prefix: str, mode: str) -> list[float]:
    return [sum(r["seconds"] for r in report["rounds"]) for report in reports(config_dir, prefix, mode)]


def same_plans(config_dir: str, mode: str) -> bool:
    """Whether every run moved the same inter-host bytes per round (the same placements)."""
    rounds = {tuple(r["bytes_inter_node"] for r in report["rounds"])
              for prefix in ("run", "py") for report in reports(config_dir, prefix, mode)}
    return len(rounds) == 1


def host_bytes_in(config_dir: str, prefix: str, mode: str) -> list[float]:
    """Per host: the median over the repeats of the bytes its link carried in (links-[py-]MODE-I.json)."""
    per_run = []
    links = f"links-{mode}" if prefix == "run" else f"links-{prefix}-{mode}"
    for _, path in numbered(config_dir, links):
        with open(path) as f:
            counters = json.load(f)
        per_run.append([a["rx_bytes"] - b["rx_bytes"]
                        for b, a in zip(counters["before"]["hosts"], counters["after"]["hosts"])])
    return [statistics.median(column) for column in zip(*per_run)] if per_run else []


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})" if values else "-"


def paired(config_dir: str, prefix: str, mode: str) -> str:
    """Median (min-max) over the pairs of mode's total / off's total, pair i against pair i."""
    def by_pair(m: str) -> dict[int, float]:  # totals() is in numbered()'s order
        return dict(zip((i for i, _ in numbered(config_dir, f"{prefix}-{m}")), totals(config_dir, prefix, m)))
    base = by_pair("off")
    ratios = [total / base[i] for i, total in by_pair(mode).items() if i in base]
    return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else "-"


def report(config_dirs: list[str]) -> int:
    print(f"{'configuration':<40} {'schedule':<12} {'eplb run total s':<22} {'Python Migrator total s':<24} "
          f"{'py/run':>6} {'same plans':>10}  MiB into each host, run / Python")
    for config_dir in config_dirs:
        with open(os.path.join(config_dir, "config.json")) as f:
            config = json.load(f)
        label = (f"{config['hosts']}x{config['ranks_per_host']} {config['rate']} "
                 f"queue {config.get('queue_ms', 100)} ms {config['policy']}")
        modes = [m for m in ("off", "hosts", "hosts-fenced") if m != "hosts-fenced" or totals(config_dir, "py", m)]
        for mode in modes:
            run, py = totals(config_dir, "run", mode), totals(config_dir, "py", mode)
            if not py:
                raise RuntimeError(f"{config_dir}: no py-{mode}-*.json (was the testbed run with WITH_PYTHON=1?)")
            if not run:
                raise RuntimeError(f"{config_dir}: no run-{mode}-*.json (eplb run's reports)")
            ratio = statistics.median(py) / statistics.median(run)
            links = ", ".join(f"{a / 2**20:.1f}/{b / 2**20:.1f}" for a, b in
                              zip(host_bytes_in(config_dir, "run", mode), host_bytes_in(config_dir, "py", mode)))
            same = "yes" if same_plans(config_dir, mode) else "NO"
            print(f"{label:<40} {mode:<12} {spread(run):<22} {spread(py):<24} {ratio:>6.3f} {same:>10}  {links}")
        for mode in modes[1:]:
            print(f"{'':<40} {mode} / all at once, paired: eplb run {paired(config_dir, 'run', mode)}, "
                  f"Python Migrator {paired(config_dir, 'py', mode)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rank = sub.add_parser("rank", help="run as one rank of the MPI job (under the testbed's mpirun)")
    for name, kind, what in [("--trace", str, "load trace .npy [steps][layers][experts]"),
                             ("--layers", int, "MoE layers"), ("--experts", int, "logical experts per layer"),
                             ("--slots", int, "physical slots per layer (a multiple of the ranks)"),
                             ("--hosts", int, "emulated hosts (num_nodes)"),
                             ("--rounds", int, "rebalances, one trace window each"),
                             ("--window", int, "trace steps per round"),
                             ("--bytes-per-expert", int, "bytes of one expert's row")]:
        rank.add_argument(name, type=kind, required=True, help=what)
    rank.add_argument("--policy", default="deepseek", help="placement policy (eplb.policies())")
    rank.add_argument("--schedule", default="off", choices=["off", "ranks", "hosts", "ranks-fenced", "hosts-fenced"],
                      help="Migrator(transfer_schedule=...)")
    rank.add_argument("--json", required=True, help="rank 0 writes the rounds here")
    compare = sub.add_parser("report", help="compare eplb run and the Python Migrator per configuration")
    compare.add_argument("configs", nargs="+", help="directories bench/cluster_testbed.sh wrote (WITH_PYTHON=1)")
    args = parser.parse_args()
    if args.command == "rank" and (args.bytes_per_expert <= 0 or args.bytes_per_expert % 8):
        parser.error(f"--bytes-per-expert must be a positive multiple of 8, got {args.bytes_per_expert}")
    return run_rank(args) if args.command == "rank" else report(args.configs)


if __name__ == "__main__":
    sys.exit(main())
