#!/usr/bin/env python3
"""A numpy port of DeepSeek's EPLB algorithm in the style of vLLM's
DefaultEplbPolicy (vllm/distributed/eplb/policy/default.py): the same steps
as bench/deepseek_reference.py, on numpy arrays instead of torch tensors,
with a per-layer Python loop for the packing (np.argmin over float64 pack
loads, full packs masked with +inf) and vectorized replication over all
rows (np.argmax of weight / count). It is the second speed peer of
bench/deepseek.sh.

Its output is not eplb's bit for bit, by design of the style it copies:
np.argsort is not stable (ties between equal loads may go either way) and
pack loads are float64. On loads without ties it agrees with the float32
reference except on near-ties of pack loads (docs/policies.md).

  deepseek_numpy.py time LOAD --replicas R --groups G --nodes N --ranks P [--repeat K]
      prints "median min max" wall seconds of K runs
  deepseek_numpy.py place LOAD ... [--out FILE]
      prints (or writes) {"phy2log", "logcnt"} as JSON
LOAD: .npy ([L][E]) or .json (an array of arrays). Run with .venv/bin/python.
"""
import argparse
import contextlib
import json
import statistics
import sys
import time

import numpy as np


def balanced_packing(weight, num_packs):
    """Rows of n items into num_packs packs of n / num_packs items each:
    items in descending weight, each to the lightest pack with room.
    Returns (pack of each item, its position inside the pack)."""
    rows, num_items = weight.shape
    per_pack = num_items // num_packs
    if per_pack == 1:
        pack = np.tile(np.arange(num_items, dtype=np.int64), (rows, 1))
        return pack, np.zeros_like(pack)
    order = np.argsort(-weight, axis=-1)
    pack = np.full((rows, num_items), -1, dtype=np.int64)
    position = np.full((rows, num_items), -1, dtype=np.int64)
    load = np.zeros((rows, num_packs), dtype=np.float64)
    filled = np.zeros((rows, num_packs), dtype=np.int64)
    for row in range(rows):
        row_load, row_filled = load[row], filled[row]
        for item in order[row]:
            target = int(np.argmin(row_load))
            pack[row, item] = target
            position[row, item] = row_filled[target]
            row_load[target] += weight[row, item]
            row_filled[target] += 1
            if row_filled[target] == per_pack:
                row_load[target] = np.inf
    return pack, position


def replicate(weight, num_physical):
    """Adds num_physical - n replicas to every row, each to the expert with
    the largest load per replica. Returns (expert of each replica, counts)."""
    rows, num_experts = weight.shape
    phy2expert = np.tile(np.arange(num_physical, dtype=np.int64), (rows, 1))
    count = np.ones((rows, num_experts), dtype=np.int64)
    every_row = np.arange(rows, dtype=np.int64)
    for p in range(num_experts, num_physical):
        hottest = np.argmax(weight / count, axis=-1)
        phy2expert[:, p] = hottest
        count[every_row, hottest] += 1
    return phy2expert, count


def invert(permutation):
    inverse = np.empty_like(permutation)
    np.put_along_axis(inverse, permutation,
                      np.broadcast_to(np.arange(permutation.shape[1], dtype=np.int64), permutation.shape), axis=1)
    return inverse


def place_hierarchical(weight, num_physical, num_groups, num_nodes, num_ranks):
    layers, experts = weight.shape
    group_size = experts // num_groups
    groups_per_node = num_groups // num_nodes
    slots_per_rank = num_physical // num_ranks
    group_load = weight.reshape(layers, num_groups, group_size).sum(axis=-1)
    group_node, group_position = balanced_packing(group_load, num_nodes)
    log2mlog = (((group_node * groups_per_node + group_position) * group_size)[..., None]
                + np.arange(group_size, dtype=np.int64)).reshape(layers, experts)
    mlog2log = invert(log2mlog)
    mlog_load = np.take_along_axis(weight, mlog2log, axis=1).reshape(-1, experts // num_nodes)
    phy2mlog, mlog_count = replicate(mlog_load, num_physical // num_nodes)
    replica_load = np.take_along_axis(mlog_load / mlog_count, phy2mlog, axis=1)
    rank, position = balanced_packing(replica_load, num_ranks // num_nodes)
    slot2phy = invert(rank * slots_per_rank + position)
    slot2mlog = np.take_along_axis(phy2mlog, slot2phy, axis=1)
    slot2mlog = (slot2mlog.reshape(layers, num_nodes, -1)
                 + np.arange(0, experts, experts // num_nodes, dtype=np.int64)[None, :, None]).reshape(layers, -1)
    phy2log = np.take_along_axis(mlog2log, slot2mlog, axis=1)
    logcnt = np.take_along_axis(mlog_count.reshape(layers, -1), log2mlog, axis=1)
    return phy2log, logcnt


def rebalance(weight, num_replicas, num_groups, num_nodes, num_ranks):
    weight = np.asarray(weight, dtype=np.float32)
    if num_groups % num_nodes == 0:
        return place_hierarchical(weight, num_replicas, num_groups, num_nodes, num_ranks)
    return place_hierarchical(weight, num_replicas, 1, 1, num_ranks)


def read_load(path):
    if path.endswith(".npy"):
        return np.load(path).astype(np.float64)
    with open(path) as handle:
        return np.asarray(json.load(handle), dtype=np.float64)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["time", "place"])
    parser.add_argument("load")
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    weight = read_load(args.load)
    shape = (args.replicas, args.groups, args.nodes, args.ranks)
    if args.mode == "time":
        rebalance(weight, *shape)  # warm-up
        wall = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            rebalance(weight, *shape)
            wall.append(time.perf_counter() - start)
        print(f"{statistics.median(wall):.6f} {min(wall):.6f} {max(wall):.6f}")
        return 0
    phy2log, logcnt = rebalance(weight, *shape)
    placement = {"phy2log": phy2log.tolist(), "logcnt": logcnt.tolist()}
    with open(args.out, "w") if args.out else contextlib.nullcontext(sys.stdout) as out:
        json.dump(placement, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
