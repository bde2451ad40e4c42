#!/usr/bin/env python3
"""eplb.sglang.rebalance_experts against SGLang's own eplb_algorithms.rebalance_experts (sglang 0.5.23,
its installed files, loaded by python/tests/real_sglang.py), per algorithm and shape, called as SGLang's
EPLBManager calls it: one long-lived process, caches flushed before every call (a serving process
rebalances once every few thousand steps), paired calls in alternating order on identical inputs.

Input: the recorder's window, int64 [steps, layers, experts] (Poisson counts, skewed per-expert rates).
Columns: milliseconds per call, median [p10-p90]; "SGLang / eplb" is the median over rounds of each
round's ratio [min-max]; "eplb/SGLang" the inverse of that median; "same" whether the three outputs
were identical. elasticity_aware is timed through its module with all ranks active (SGLang's entry
reads ElasticEPStateManager, which needs the serving runtime).

Run: flock /work/.cpu.lock .venv/bin/python bench/sglang_vs_eplb.py [--rounds N]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))

SHAPES = [  # name, steps, layers, experts, slots, slots per rank, groups, nodes
    ("DeepSeek-V3 EP32 4 nodes", 8, 58, 256, 288, 9, 8, 4),
    ("Qwen3-30B-A3B EP8", 8, 48, 128, 144, 18, 4, 2),
]


def flusher():
    size = 64 << 20
    for index in (3, 2):
        path = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size")
        if path.exists():
            text = path.read_text().strip()
            size = int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
            break
    buffer = np.zeros(4 * size // 8, dtype=np.int64)

    def flush():
        buffer.__iadd__(1)
    return flush, buffer.nbytes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    import torch

    import eplb
    import eplb.sglang
    import real_sglang
    import sglang_cases

    torch.set_num_threads(1)
    module = real_sglang.algorithms()
    flush, flush_bytes = flusher()
    print(f"eplb {eplb.__version__} vs sglang {real_sglang.version()} eplb_algorithms, torch {torch.__version__} "
          f"(1 thread); {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; flush {flush_bytes >> 20} MiB "
          f"before each call; {args.rounds} paired rounds; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'algorithm':<30} {'shape':<26} | {'eplb ms':>20} | {'SGLang ms':>22} | {'SGLang / eplb':>18} | "
          f"eplb/SGLang | same")
    for shape in SHAPES:
        _, steps, layers, experts, slots, local, groups, nodes = shape
        rng = np.random.default_rng(experts)
        rates = rng.random((layers, experts)) ** 4 * 100 + 1
        tokens = torch.from_numpy(rng.poisson(rates, size=(steps, layers, experts)).astype(np.int64))
        for name in module.EplbAlgorithm.__members__:
            ours = lambda: eplb.sglang.rebalance_experts(tokens, slots, local, groups, nodes, name)  # noqa: E731
            theirs = lambda: sglang_cases.sglang_call(module, name, tokens, shape)  # noqa: E731
            a, b = ours(), theirs()
            same = all(torch.equal(x, y.long()) for x, y in zip(a, b))
            times = {"eplb": [], "sglang": []}
            ratios = []
            for r in range(args.rounds):
                order = [("eplb", ours), ("sglang", theirs)]
                for key, call in (order if r % 2 == 0 else order[::-1]):
                    flush()
                    start = time.perf_counter()
                    call()
                    times[key].append(time.perf_counter() - start)
                ratios.append(times["sglang"][-1] / times["eplb"][-1])

            def spread(values):
                ms = np.array(values) * 1e3
                return f"{np.median(ms):8.2f} [{np.percentile(ms, 10):.2f}-{np.percentile(ms, 90):.2f}]"
            median = statistics.median(ratios)
            print(f"{name:<30} {shape[0]:<26} | {spread(times['eplb']):>20} | {spread(times['sglang']):>22} | "
                  f"{median:7.1f}x [{min(ratios):.1f}-{max(ratios):.1f}] | {1 / median:11.3f} | {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
