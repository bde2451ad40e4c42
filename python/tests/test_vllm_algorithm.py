"""vLLM's published EPLB algorithm cases (tests/distributed/test_eplb_algo.py), ported to eplb.vllm.

The inputs and expected numbers are vLLM's; the tests are written here.
"""
import numpy as np
import pytest
import torch

import eplb
from eplb.vllm import EplbPolicy


def place(weight, replicas, groups, nodes, ranks, old=None):
    phy2log = EplbPolicy.rebalance_experts(torch.tensor(weight), replicas, groups, nodes, ranks, old)
    assert isinstance(phy2log, torch.Tensor) and phy2log.dtype == torch.int64
    return phy2log


def test_basic_case_exactly():
    weight = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
              [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
    phy2log = place(weight, 16, 4, 2, 8)
    log2phy, logcnt = eplb.compute_logical_maps(phy2log, 12)
    assert phy2log.shape == (2, 16) and logcnt.shape == (2, 12)
    assert log2phy.shape[:2] == (2, 12)
    assert phy2log.tolist() == [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                                [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]
    assert logcnt.tolist() == [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1], [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1]]
    assert int(logcnt.sum()) == 32 and bool((logcnt >= 1).all())


def test_single_gpu():
    phy2log = place([[10, 20, 30, 40]], 4, 1, 1, 1)
    log2phy, logcnt = eplb.compute_logical_maps(phy2log, 4)
    assert phy2log.shape == (1, 4) and log2phy.shape[:2] == (1, 4) and logcnt.shape == (1, 4)
    assert sorted(phy2log[0].tolist()) == [0, 1, 2, 3]


def test_equal_weights_give_one_replica_each():
    phy2log = place([[50] * 8], 8, 2, 2, 4)
    _, logcnt = eplb.compute_logical_maps(phy2log, 8)
    assert phy2log.shape == (1, 8) and bool((logcnt == 1).all())


def test_extreme_imbalance_replicates_the_hot_expert():
    phy2log = place([[1000, 1, 1, 1, 1, 1, 1, 1]], 12, 2, 2, 4)
    _, logcnt = eplb.compute_logical_maps(phy2log, 8)
    assert phy2log.shape == (1, 12) and logcnt.shape == (1, 8)
    assert logcnt[0, 0] > logcnt[0, 1]


def test_multiple_layers():
    weight = [[10, 20, 30, 40, 50, 60], [60, 50, 40, 30, 20, 10], [25, 25, 25, 25, 25, 25]]
    phy2log = place(weight, 8, 2, 2, 4)
    _, logcnt = eplb.compute_logical_maps(phy2log, 6)
    assert phy2log.shape == (3, 8) and logcnt.shape == (3, 6)
    assert bool(((phy2log >= 0) & (phy2log < 6)).all())
    assert logcnt.sum(dim=1).tolist() == [8, 8, 8]


def test_groups_not_divisible_by_nodes_fall_back_to_global():
    # 4 experts, 3 groups, 2 nodes: 3 % 2 != 0, so (1 group, 1 node); 4 % 3 != 0 does not matter then.
    phy2log = place([[10, 20, 30, 40]], 8, 3, 2, 4)
    _, logcnt = eplb.compute_logical_maps(phy2log, 4)
    assert phy2log.shape == (1, 8) and logcnt.shape == (1, 4)
    phy2log = place([[10, 20, 30, 40, 50, 60]], 8, 3, 2, 4)
    _, logcnt = eplb.compute_logical_maps(phy2log, 6)
    assert phy2log.shape == (1, 8) and int(logcnt.sum()) == 8
    global_result = place([[10, 20, 30, 40, 50, 60]], 8, 1, 1, 4)
    assert phy2log.tolist() == global_result.tolist()


def test_replicas_not_a_multiple_of_ranks_is_refused():
    with pytest.raises(eplb.Error, match="multiple of ranks"):
        place([[10, 20, 30, 40]], 7, 2, 2, 4)


def test_small_hierarchical():
    weight = [[100, 50, 200, 75, 150, 25, 300, 80]]
    phy2log = place(weight, 12, 4, 2, 4)
    _, logcnt = eplb.compute_logical_maps(phy2log, 8)
    assert phy2log.shape == (1, 12) and logcnt.shape == (1, 8)
    assert int(logcnt.sum()) == 12 and bool((logcnt >= 1).all())
    assert logcnt[0, 6] >= 2  # expert 6 carries the largest load


def test_more_shapes():
    phy2log = place([[50, 100, 75, 120, 90, 60, 80, 110, 40, 70, 95, 85, 65, 55, 45, 35]], 24, 8, 4, 8)
    _, logcnt = eplb.compute_logical_maps(phy2log, 16)
    assert phy2log.shape == (1, 24) and int(logcnt.sum()) == 24
    weight = [[200, 150, 100, 50, 25, 12], [12, 25, 50, 100, 150, 200]]
    phy2log = place(weight, 10, 3, 1, 2)
    _, logcnt = eplb.compute_logical_maps(phy2log, 6)
    assert phy2log.shape == (2, 10) and logcnt.shape == (2, 6)
    for layer in range(2):
        assert logcnt[layer, int(np.argmax(weight[layer]))] >= 2


def test_compute_logical_maps_skips_unfilled_slots():
    phy2log = torch.tensor([[0, 1, -1, 2, 3, -1], [3, -1, 2, 1, 0, -1]])
    log2phy, logcnt = eplb.compute_logical_maps(phy2log, 4)
    assert logcnt.shape == (2, 4) and log2phy.shape == (2, 4, 1)
    assert logcnt.dtype == phy2log.dtype and log2phy.dtype == phy2log.dtype
    assert bool((logcnt == 1).all()) and bool((log2phy >= 0).all())
    assert log2phy[0, :, 0].tolist() == [0, 1, 3, 4]
    assert log2phy[1, :, 0].tolist() == [4, 3, 2, 0]


def test_compute_logical_maps_orders_slots_and_keeps_dtype():
    phy2log = np.array([[2, 0, 2, 1, 2, 0]], dtype=np.int32)
    log2phy, logcnt = eplb.compute_logical_maps(phy2log, 4)
    assert log2phy.dtype == np.int32 and logcnt.dtype == np.int32
    assert log2phy.tolist() == [[[1, 5, -1], [3, -1, -1], [0, 2, 4], [-1, -1, -1]]]
    assert logcnt.tolist() == [[2, 1, 3, 0]]
    one_layer_maps, one_layer_counts = eplb.compute_logical_maps(torch.tensor([2, 0, 2, 1, 2, 0]), 4)
    assert one_layer_maps.shape == (4, 3) and one_layer_counts.tolist() == [2, 1, 3, 0]


def replica_index(phy2log):
    """For every slot, which replica of its expert it is (counted left to right in its layer)."""
    index = np.zeros_like(phy2log)
    for layer, row in enumerate(phy2log.tolist()):
        seen = {}
        for slot, expert in enumerate(row):
            index[layer, slot] = seen.get(expert, 0)
            seen[expert] = index[layer, slot] + 1
    return index


PRESERVE_CASES = {
    # ranks, old phy2log, new phy2log (one layer each), from vLLM's test
    "simple": (2, [[0, 1, 2, 3, 4, 5, 6, 7]], [[1, 5, 0, 4, 6, 2, 7, 3]]),
    "duplicates": (2, [[0, 1, 0, 2, 3, 4, 5, 6, 1, 2]], [[0, 5, 4, 0, 1, 6, 2, 3, 2, 1]]),
    "skewed_expert": (3, [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]], [[0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 0]]),
}


@pytest.mark.parametrize("case", sorted(PRESERVE_CASES))
def test_preserve_intragpu_slots(case):
    ranks, old, new = (PRESERVE_CASES[case][0], np.array(PRESERVE_CASES[case][1]), np.array(PRESERVE_CASES[case][2]))
    post = EplbPolicy.preserve_intragpu_slots(new, ranks, old)
    assert post.shape == new.shape and post.dtype == new.dtype
    per_rank = new.shape[1] // ranks
    new_index, post_index = replica_index(new), replica_index(post)
    for rank in range(ranks):
        ranks_slots = slice(rank * per_rank, (rank + 1) * per_rank)
        old_seg, new_seg, post_seg = old[0, ranks_slots], new[0, ranks_slots], post[0, ranks_slots]
        # nothing lost or added on the rank: the same (expert, replica) pairs
        assert sorted(zip(post_seg, post_index[0, ranks_slots])) == sorted(zip(new_seg, new_index[0, ranks_slots]))
        for expert in set(old_seg.tolist()) & set(new_seg.tolist()):
            first_old_slot = old_seg.tolist().index(expert)
            assert post_seg[first_old_slot] == expert, f"rank {rank}: expert {expert} left its old slot"


def test_preserve_intragpu_slots_exact_result():
    post = EplbPolicy.preserve_intragpu_slots(np.array([[1, 5, 0, 4, 6, 2, 7, 3]]), 2,
                                              np.array([[0, 1, 2, 3, 4, 5, 6, 7]]))
    # rank 0: 0 and 1 stay in slots 0 and 1, then 5 and 4 in new order; rank 1: 6, 7 stay, 2 and 3 fill.
    assert post.tolist() == [[0, 1, 5, 4, 2, 3, 6, 7]]


def test_old_indices_keep_slots_of_experts_that_stay():
    weight = torch.tensor([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86]])
    fresh = EplbPolicy.rebalance_experts(weight, 16, 4, 2, 8)
    old = torch.roll(fresh, shifts=1, dims=1)  # every rank's experts shuffled by one slot
    kept = EplbPolicy.rebalance_experts(weight, 16, 4, 2, 8, old)
    per_rank = 2
    for rank in range(8):
        rank_slots = slice(rank * per_rank, (rank + 1) * per_rank)
        assert sorted(kept[0, rank_slots].tolist()) == sorted(fresh[0, rank_slots].tolist())
    same = (kept == old).sum().item()
    assert same >= (fresh == old).sum().item()
    assert same > 0
