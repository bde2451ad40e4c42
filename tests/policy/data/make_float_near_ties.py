#!/usr/bin/env python3
"""Writes float_near_ties.json, the two float near-tie cases of
tests/policy/deepseek_near_tie_test.cpp (run with the project's .venv/bin/python,
which has torch and numpy, from the repository root):

rank_tie: layer 23 of the tie-free float load of issue 16
  (torch.manual_seed(1); x = torch.rand(58, 256); x ** 4 * 1000 + 0.001, in
  float32), the one layer of 58 where a float64-accumulating port (numpy, in
  the style of vLLM's DefaultEplbPolicy) places differently from the float32
  reference: two ranks of node 3 reach exactly the same float32 load.
  Expected: the float32 reference's phy2log (bench/deepseek_reference.py).

group_sum_order: 4 groups of 32 experts on 2 nodes; groups 0 and 1 hold the
  same 32 values in different orders, so their exact sums are equal and
  their float32 sums differ only by the order of addition. Summed in index
  order (eplb) group 1 is heavier; summed in 8 lanes (torch 1.13's CPU sum
  with AVX2 on this machine) group 0 is. Recorded: the reference's phy2log
  on this machine, which differs from eplb's.
"""
import json
import sys

import numpy
import torch

sys.path.insert(0, "bench")
import deepseek_reference  # noqa: E402


def rank_tie():
    torch.manual_seed(1)
    x = torch.rand(58, 256)
    load = (x ** 4 * 1000 + 0.001).double()[23:24]
    phy2log, _, _ = deepseek_reference.rebalance(load, 288, 8, 4, 32)
    return {"topology": [1, 256, 288, 8, 4, 32], "load": load[0].tolist(), "phy2log_float32_reference": phy2log[0].tolist()}


def group_sum_order():
    rng = numpy.random.default_rng(3)
    while True:  # two permutations whose float32 sums order differently in index order and in 8 lanes
        g0 = (rng.random(32) * 100 + 1).astype(numpy.float32)
        g1 = rng.permutation(g0)
        seq = [numpy.float32(numpy.add.accumulate(g, dtype=numpy.float32)[-1]) for g in (g0, g1)]
        lanes = [torch.from_numpy(g).sum().item() for g in (g0, g1)]
        if seq[1] > seq[0] and lanes[0] > lanes[1]:
            break
    g2 = (rng.random(32) * 10 + 1).astype(numpy.float32)
    g3 = (rng.random(32) * 10 + 1).astype(numpy.float32)
    load = torch.from_numpy(numpy.concatenate([g0, g1, g2, g3]).astype(numpy.float64))[None, :]
    phy2log, _, _ = deepseek_reference.rebalance(load, 144, 4, 2, 8)
    return {"topology": [1, 128, 144, 4, 2, 8], "load": load[0].tolist(),
            "phy2log_torch_reference_here": phy2log[0].tolist(), "torch": torch.__version__}


if __name__ == "__main__":
    torch.set_num_threads(1)
    with open("tests/policy/data/float_near_ties.json", "w") as out:
        json.dump({"rank_tie": rank_tie(), "group_sum_order": group_sum_order()}, out)
