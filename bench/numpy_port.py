"""A numpy port of DeepSeek's EPLB algorithm in the style of vLLM's
(vllm/distributed/eplb/policy/default.py): loads as a float32 numpy array,
balanced packing as Python loops over rows with np.argmin over the packs,
replication vectorized over rows with np.argmax, index bookkeeping with
np.take_along_axis. Written for bench/python_policy.py as the speed peer
(vLLM's own takes about 25-35 ms on DeepSeek-V3's shape); the tie rules are
eplb's (stable descending sort, float32 arithmetic, first index on ties), so
its output can be checked against eplb's exactly.
"""
import numpy as np


def balanced_packing(weight: np.ndarray, num_packs: int):
    """Items of every row onto num_packs packs of equal item count, heaviest first onto the lightest pack."""
    rows, items = weight.shape
    per_pack = items // num_packs
    if per_pack == 1:
        return np.tile(np.arange(items, dtype=np.int64), (rows, 1)), np.zeros((rows, items), dtype=np.int64)
    order = np.argsort(-weight, axis=1, kind="stable")
    pack_index = np.empty((rows, items), dtype=np.int64)
    rank_in_pack = np.empty((rows, items), dtype=np.int64)
    for row in range(rows):
        pack_loads = np.zeros(num_packs, dtype=np.float32)
        pack_items = np.zeros(num_packs, dtype=np.int64)
        for item in order[row]:
            pack = int(np.argmin(pack_loads))
            pack_index[row, item] = pack
            rank_in_pack[row, item] = pack_items[pack]
            pack_loads[pack] += weight[row, item]
            pack_items[pack] += 1
            if pack_items[pack] == per_pack:
                pack_loads[pack] = np.inf
    return pack_index, rank_in_pack


def replicate_experts(weight: np.ndarray, num_physical: int):
    """Each redundant replica to the expert with the largest load per replica."""
    rows, num_logical = weight.shape
    phy2log = np.tile(np.arange(num_physical, dtype=np.int64), (rows, 1))
    logcnt = np.ones((rows, num_logical), dtype=np.int64)
    every_row = np.arange(rows)
    for slot in range(num_logical, num_physical):
        hottest = np.argmax(weight / logcnt.astype(np.float32), axis=1)
        phy2log[:, slot] = hottest
        logcnt[every_row, hottest] += 1
    return phy2log, logcnt


def inverse(permutation: np.ndarray) -> np.ndarray:
    result = np.empty_like(permutation)
    np.put_along_axis(result, permutation, np.arange(permutation.shape[1], dtype=np.int64)[None, :], axis=1)
    return result


def rebalance_hierarchical(weight, num_replicas, num_groups, num_nodes, num_ranks):
    layers, experts = weight.shape
    group_size, groups_per_node = experts // num_groups, num_groups // num_nodes
    per_rank = num_replicas // num_ranks
    group_pack, group_rank = balanced_packing(weight.reshape(layers, num_groups, group_size).sum(-1), num_nodes)
    log2mlog = (((group_pack * groups_per_node + group_rank) * group_size)[..., None]
                + np.arange(group_size, dtype=np.int64)).reshape(layers, experts)
    mlog2log = inverse(log2mlog)
    tokens_per_mlog = np.take_along_axis(weight, mlog2log, axis=1).reshape(-1, experts // num_nodes)
    phy2mlog, mlogcnt = replicate_experts(tokens_per_mlog, num_replicas // num_nodes)
    tokens_per_phy = np.take_along_axis(tokens_per_mlog / mlogcnt.astype(np.float32), phy2mlog, axis=1)
    pack_index, rank_in_pack = balanced_packing(tokens_per_phy, num_ranks // num_nodes)
    pphy2phy = inverse(pack_index * per_rank + rank_in_pack)
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1)
    offsets = np.arange(0, experts, experts // num_nodes, dtype=np.int64)[None, :, None]
    pphy2mlog = (pphy2mlog.reshape(layers, num_nodes, -1) + offsets).reshape(layers, -1)
    return np.take_along_axis(mlog2log, pphy2mlog, axis=1)


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks) -> np.ndarray:
    """phy2log [layers, num_replicas], int64."""
    weight = np.asarray(weight, dtype=np.float32)
    if num_groups % num_nodes != 0:
        num_groups, num_nodes = 1, 1
    return rebalance_hierarchical(weight, num_replicas, num_groups, num_nodes, num_ranks)
