#!/usr/bin/env python3
"""eplb's own PyTorch port of DeepSeek's published EPLB algorithm
(rebalance_experts in deepseek-ai/EPLB), kept structurally the same as the
published code (same tensor operations, same Python loops) so that its speed
is a fair peer for eplb's C++ `deepseek` policy, and its output an
independent check of eplb's exactness.

Run with the project's .venv/bin/python (scripts/setup_python.sh: torch, numpy).

Ties. The published code sorts with torch's default (unstable) sort, so the
order of equal weights, and with it the output, depends on torch's sort
implementation (torch 1.13 on CPU reorders ties in rows longer than 16).
eplb defines the order as stable (equal weights: lower index first), and so
does this port by default; --published-sort uses torch's default sort.

  deepseek_reference.py place LOAD --replicas R --groups G --nodes N --ranks P [--out FILE]
      prints (or writes) {"phy2log", "log2phy", "logcnt"} as JSON.
  deepseek_reference.py time LOAD --replicas R ... [--repeat K]
      prints "median min max" wall seconds and the median CPU seconds of K runs
      (after one warm-up run).
  deepseek_reference.py ties LOAD --replicas R ...
      how the published (unstable) sort changes the output: layers whose
      phy2log differs from the stable-sort result, and whether their rank
      loads differ (one JSON line).
  deepseek_reference.py cases FILE --out FILE
      FILE holds a JSON array of {"load", "replicas", "groups", "nodes",
      "ranks"}; writes the array of their placements (one process, one
      torch import: what eplb's cross-check test uses).
LOAD is .npy ([L][E] or [W][L][E], summed over W) or .json (an array of
arrays, or an object with key "load").
"""
import argparse
import json
import statistics
import sys
import time

import torch

# True: stable sort (eplb's documented tie rule); False: torch's default sort.
STABLE_SORT = True


def pack_balanced(weight, num_packs):
    """Packs the n items of every row into num_packs packs of n / num_packs
    items. Items in descending weight each go to the lightest non-full pack.
    Returns (pack of each item, position of the item inside its pack)."""
    rows, num_items = weight.shape
    assert num_items % num_packs == 0
    per_pack = num_items // num_packs
    if per_pack == 1:
        pack = torch.arange(num_items, dtype=torch.int64).expand(weight.shape)
        return pack, torch.zeros_like(weight, dtype=torch.int64)

    by_weight = weight.float().sort(stable=STABLE_SORT, dim=-1, descending=True).indices.cpu()
    pack = torch.full_like(weight, fill_value=-1, dtype=torch.int64, device="cpu")
    position = torch.full_like(pack, fill_value=-1)
    for row in range(rows):
        load = [0] * num_packs
        filled = [0] * num_packs
        for item in by_weight[row]:
            target = min((p for p in range(num_packs) if filled[p] < per_pack), key=load.__getitem__)
            pack[row, item] = target
            position[row, item] = filled[target]
            load[target] += weight[row, item]
            filled[target] += 1
    return pack, position


def replicate(weight, num_physical):
    """Adds num_physical - n replicas per row, each to the expert with the
    largest load per replica. Returns (expert of each physical replica,
    replica rank, replica count of each expert)."""
    rows, num_experts = weight.shape
    assert num_physical >= num_experts
    phy2expert = torch.arange(num_physical, dtype=torch.int64).repeat(rows, 1)
    replica_rank = torch.zeros(rows, num_physical, dtype=torch.int64)
    count = torch.ones(rows, num_experts, dtype=torch.int64)
    every_row = torch.arange(rows, dtype=torch.int64)
    for p in range(num_experts, num_physical):
        hottest = (weight / count).max(dim=-1).indices
        phy2expert[:, p] = hottest
        replica_rank[:, p] = count[every_row, hottest]
        count[every_row, hottest] += 1
    return phy2expert, replica_rank, count


def invert(permutation):
    inverse = torch.empty_like(permutation)
    inverse.scatter_(1, permutation,
                     torch.arange(permutation.size(1), dtype=torch.int64).expand(permutation.shape))
    return inverse


def place_hierarchical(weight, num_physical, num_groups, num_nodes, num_ranks):
    layers, experts = weight.shape
    assert experts % num_groups == 0 and num_groups % num_nodes == 0
    assert num_ranks % num_nodes == 0 and num_physical % num_ranks == 0
    group_size = experts // num_groups
    groups_per_node = num_groups // num_nodes
    slots_per_rank = num_physical // num_ranks

    # 1. groups onto nodes
    group_load = weight.unflatten(-1, (num_groups, group_size)).sum(-1)
    group_node, group_position = pack_balanced(group_load, num_nodes)
    log2mlog = (((group_node * groups_per_node + group_position) * group_size).unsqueeze(-1)
                + torch.arange(group_size, dtype=torch.int64)).flatten(-2)
    mlog2log = invert(log2mlog)

    # 2. replicas inside each node: rows are (layer, node)
    mlog_load = weight.gather(-1, mlog2log).view(-1, experts // num_nodes)
    phy2mlog, replica_rank, mlog_count = replicate(mlog_load, num_physical // num_nodes)

    # 3. each node's replicas onto its ranks
    replica_load = (mlog_load / mlog_count).gather(-1, phy2mlog)
    rank, position = pack_balanced(replica_load, num_ranks // num_nodes)
    phy2slot = rank * slots_per_rank + position
    slot2phy = invert(phy2slot)

    slot2mlog = phy2mlog.gather(-1, slot2phy)
    slot2mlog = (slot2mlog.view(layers, num_nodes, -1)
                 + torch.arange(0, experts, experts // num_nodes).view(1, -1, 1)).flatten(-2)
    slot2log = mlog2log.gather(-1, slot2mlog)
    slot_rank = replica_rank.gather(-1, slot2phy).view(layers, -1)
    logcnt = mlog_count.view(layers, -1).gather(-1, log2mlog)
    return slot2log, slot_rank, logcnt


def rebalance(weight, num_replicas, num_groups, num_nodes, num_ranks):
    """Returns (phy2log [L][R], log2phy [L][E][max count], logcnt [L][E])."""
    layers, experts = weight.shape
    weight = weight.float().cpu()
    if num_groups % num_nodes == 0:
        phy2log, slot_rank, logcnt = place_hierarchical(weight, num_replicas, num_groups, num_nodes, num_ranks)
    else:
        phy2log, slot_rank, logcnt = place_hierarchical(weight, num_replicas, 1, 1, num_ranks)
    width = logcnt.max().item()
    log2phy = torch.full((layers, experts, width), -1, dtype=torch.int64)
    log2phy.view(layers, -1).scatter_(-1, phy2log * width + slot_rank,
                                      torch.arange(num_replicas, dtype=torch.int64).expand(layers, -1))
    return phy2log, log2phy, logcnt


def read_load(path):
    if path.endswith(".npy"):
        import numpy
        array = numpy.load(path)
        if array.ndim == 3:
            array = array.sum(axis=0)
        return torch.from_numpy(numpy.ascontiguousarray(array, dtype=numpy.float64))
    with open(path) as handle:
        data = json.load(handle)
    if isinstance(data, dict):
        data = data["load"]
    tensor = torch.tensor(data, dtype=torch.float64)
    if tensor.dim() == 3:
        tensor = tensor.sum(0)
    return tensor


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["place", "time", "cases", "ties"])
    parser.add_argument("load")
    parser.add_argument("--replicas", type=int)
    parser.add_argument("--groups", type=int)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--ranks", type=int)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out")
    parser.add_argument("--published-sort", action="store_true",
                        help="torch's default (unstable) sort, as the published code calls it")
    args = parser.parse_args()
    global STABLE_SORT
    STABLE_SORT = not args.published_sort
    torch.set_num_threads(1)
    if args.mode == "cases":
        with open(args.load) as handle:
            cases = json.load(handle)
        results = []
        for case in cases:
            phy2log, log2phy, logcnt = rebalance(torch.tensor(case["load"], dtype=torch.float64), case["replicas"],
                                                 case["groups"], case["nodes"], case["ranks"])
            results.append({"phy2log": phy2log.tolist(), "log2phy": log2phy.tolist(), "logcnt": logcnt.tolist()})
        with open(args.out, "w") as handle:
            json.dump(results, handle)
        return 0
    if None in (args.replicas, args.groups, args.nodes, args.ranks):
        parser.error("--replicas, --groups, --nodes and --ranks are required")
    weight = read_load(args.load)
    shape = (args.replicas, args.groups, args.nodes, args.ranks)
    if args.mode == "ties":
        global_stable = STABLE_SORT
        results = []
        for stable in (True, False):
            STABLE_SORT = stable
            results.append(rebalance(weight, *shape))
        STABLE_SORT = global_stable
        (stable_p2l, _, stable_cnt), (published_p2l, _, published_cnt) = results
        per_rank = args.replicas // args.ranks

        def rank_loads(phy2log, logcnt):
            w = weight.float()
            replica = w.gather(-1, phy2log) / logcnt.gather(-1, phy2log)
            return replica.view(weight.shape[0], args.ranks, per_rank).sum(-1).sort(-1).values

        differ = (stable_p2l != published_p2l).any(-1)
        same_loads = torch.equal(rank_loads(stable_p2l, stable_cnt), rank_loads(published_p2l, published_cnt))
        print(json.dumps({"layers": int(weight.shape[0]), "layers_differing": int(differ.sum()),
                          "same_sorted_rank_loads": bool(same_loads), "torch": torch.__version__}))
        return 0
    if args.mode == "time":
        rebalance(weight, *shape)  # warm-up
        wall, cpu = [], []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            rebalance(weight, *shape)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(f"{statistics.median(wall):.6f} {min(wall):.6f} {max(wall):.6f} {statistics.median(cpu):.6f}")
        return 0
    phy2log, log2phy, logcnt = rebalance(weight, *shape)
    text = json.dumps({"phy2log": phy2log.tolist(), "log2phy": log2phy.tolist(), "logcnt": logcnt.tolist()})
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
