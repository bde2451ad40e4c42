#!/usr/bin/env python3
"""eplb's policy against vLLM's DefaultEplbPolicy, called the way vLLM's EplbState calls its policy: one
long-lived process, caches flushed before every call (a serving process rebalances once every few thousand
steps, with the model's work in between), paired rounds in alternating order. Prints tables.

Each call is `policy.rebalance_experts(load, num_replicas, num_groups, num_nodes, num_ranks, old)` as
vLLM's EplbState.rearrange makes it: `load` the logical load window summed over its steps (int64 CPU tensor
[layers, experts], Poisson token counts over a 1000-step window with skewed per-expert rates), `old` the
placement in force (int64 [layers, replicas]: the policy's answer to the previous window), so both run
preserve_intragpu_slots. eplb's side is eplb.vllm.EplbPolicy (what eplb's vLLM plugin installs as "default",
the C++ deepseek policy, 1 thread); vLLM's side is vllm.distributed.eplb.policy.DefaultEplbPolicy (numpy).

Columns: milliseconds per call, median [p10-p90] over the rounds; "vLLM / eplb" is the median over the
rounds of each round's ratio (both calls of a round see the same machine state) [min-max]; "same layers"
counts the layers whose placement is identical, "rank loads" those whose ranks carry the same loads (as a
multiset): the two decide ties differently (docs/python.md, Interoperability), and equal loads of different
experts occur in nearly every layer of such a window.
The flush writes a buffer of 4x the last-level cache before each call. The hot-loop rows (back-to-back calls,
caches warm) are an extra, flattering condition, not the figure.

Run on a quiet machine: flock /work/.cpu.lock .venv/bin/python bench/vllm_policy.py [--rounds N] [--hot N]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

SHAPES = [  # name, layers, experts, replicas, groups, nodes, ranks
    ("DeepSeek-V3 EP32 4 nodes", 58, 256, 288, 8, 4, 32),
    ("DeepSeek-V3 EP32 1 node", 58, 256, 288, 8, 1, 32),
    ("DeepSeek-V3 EP64 8 nodes", 58, 256, 320, 8, 8, 64),
    ("Qwen3-30B-A3B EP8", 48, 128, 144, 1, 1, 8),
]


def last_level_cache_bytes() -> int:
    for index in (3, 2):
        path = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size")
        if path.exists():
            text = path.read_text().strip()
            return int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text)
    return 64 << 20


class Flusher:
    """Writes every cache line of a buffer of 4x the last-level cache (evicts data and, through inclusive
    L2s, instructions)."""

    def __init__(self):
        self.buffer = np.zeros(4 * last_level_cache_bytes() // 8, dtype=np.int64)

    def __call__(self):
        self.buffer += 1


def window_load(rng, layers: int, experts: int, steps: int = 1000):
    """Tokens per expert summed over `steps` steps: Poisson counts with skewed per-expert rates."""
    import torch

    rates = rng.random((layers, experts)) ** 4 * 100 + 1
    return torch.from_numpy(rng.poisson(rates * steps).astype(np.int64))


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def paired_rounds(ours, theirs, arguments, rounds: int, flush) -> tuple:
    """Per round: flush, one call of each (the order alternates); seconds and the round's ratio."""
    eplb_times, vllm_times, ratios = [], [], []
    for round_index in range(rounds):
        calls = [(eplb_times, ours), (vllm_times, theirs)]
        for times, policy in (calls if round_index % 2 == 0 else calls[::-1]):
            flush()
            times.append(timed(lambda: policy.rebalance_experts(*arguments)))
        ratios.append(vllm_times[-1] / eplb_times[-1])
    return eplb_times, vllm_times, ratios


def hot_times(policy, arguments, calls: int) -> list:
    return [timed(lambda: policy.rebalance_experts(*arguments)) for _ in range(calls)]


def agreement(ours, theirs, load, ranks: int) -> tuple:
    """(layers with identical placements, layers whose ranks carry the same loads, as a multiset)."""
    import eplb

    same = int((ours == theirs).all(dim=1).sum())
    loads = [np.sort(eplb.rank_loads(load.double(), placement, ranks).numpy(), axis=1) for placement in (ours, theirs)]
    return same, int(np.isclose(loads[0], loads[1], rtol=1e-9, atol=0).all(axis=1).sum())


def spread(seconds) -> str:
    ms = np.array(seconds) * 1e3
    return f"{np.median(ms):8.3f} [{np.percentile(ms, 10):.3f}-{np.percentile(ms, 90):.3f}]"


def ratio_text(ratios) -> str:
    return f"{statistics.median(ratios):7.1f}x [{min(ratios):.1f}-{max(ratios):.1f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=31, help="paired cold-cache rounds per shape (31)")
    parser.add_argument("--hot", type=int, default=30, help="back-to-back calls per policy in the hot rows (30)")
    arguments = parser.parse_args()

    import torch
    import vllm
    from vllm.distributed.eplb.policy import DefaultEplbPolicy

    import eplb
    import eplb.vllm

    ours, theirs = eplb.vllm.EplbPolicy, DefaultEplbPolicy
    flush = Flusher()
    print(f"eplb {eplb.__version__} (EplbPolicy, deepseek, 1 thread) vs vllm {vllm.__version__} DefaultEplbPolicy, "
          f"torch {torch.__version__}, numpy {np.__version__}; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}; flush {flush.buffer.nbytes >> 20} MiB before each call; "
          f"{arguments.rounds} paired rounds; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    header = (f"{'shape':<26} {'L x E':>8} {'R/G/N/P':>14} | {'eplb ms':>22} | {'vLLM ms':>22} | "
              f"{'vLLM / eplb':>20} | same layers, rank loads")
    print(header)
    hot = []
    for name, layers, experts, replicas, groups, nodes, ranks in SHAPES:
        rng = np.random.default_rng(layers * experts + ranks)
        previous = window_load(rng, layers, experts)
        old = theirs.rebalance_experts(previous, replicas, groups, nodes, ranks)
        load = window_load(rng, layers, experts)
        call = (load, replicas, groups, nodes, ranks, old)
        for policy in (ours, theirs):  # first calls (imports, allocations) out of the figures
            policy.rebalance_experts(*call)
        eplb_times, vllm_times, ratios = paired_rounds(ours, theirs, call, arguments.rounds, flush)
        same, balanced = agreement(ours.rebalance_experts(*call), theirs.rebalance_experts(*call), load, ranks)
        print(f"{name:<26} {f'{layers}x{experts}':>8} {f'{replicas}/{groups}/{nodes}/{ranks}':>14} | "
              f"{spread(eplb_times)} | {spread(vllm_times)} | {ratio_text(ratios)} | {same:>2}/{layers} "
              f"{balanced:>8}/{layers}")
        hot_eplb, hot_vllm = hot_times(ours, call, arguments.hot), hot_times(theirs, call, arguments.hot)
        hot.append((name, hot_eplb, hot_vllm))
    print(f"\nextra row, hot loop ({arguments.hot} back-to-back calls each, caches warm; not the figure):")
    for name, hot_eplb, hot_vllm in hot:
        print(f"{name:<26} {'':>8} {'':>14} | {spread(hot_eplb)} | {spread(hot_vllm)} | "
              f"{statistics.median(hot_vllm) / statistics.median(hot_eplb):7.1f}x (ratio of medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
