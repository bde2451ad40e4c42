"""Balance metrics and migration plan statistics."""
import numpy as np
import pytest
import torch

import eplb


def test_balancedness_by_hand():
    load = np.array([[10.0, 30.0, 20.0, 40.0]])
    phy2log = np.array([[0, 1, 2, 3]])  # ranks: {0, 1} = 40, {2, 3} = 60
    result = eplb.balancedness(load, phy2log, 2)
    assert result.per_layer.tolist() == [50 / 60]
    assert result.max_rank_load.tolist() == [60.0] and result.mean_rank_load.tolist() == [50.0]
    assert float(result) == result.mean == pytest.approx(50 / 60)
    assert eplb.rank_loads(load, phy2log, 2).tolist() == [[40.0, 60.0]]


def test_replicas_share_their_expert_load():
    load = np.array([[90.0, 10.0]])
    phy2log = np.array([[0, 1, 0, 0]])  # expert 0 in 3 slots: 30 each
    assert eplb.rank_loads(load, phy2log, 2).tolist() == [[40.0, 60.0]]
    assert eplb.rank_loads(load, phy2log, 4).tolist() == [[30.0, 10.0, 30.0, 30.0]]


def test_balancedness_sum_weighs_layers_by_load():
    load = np.array([[10.0, 10.0], [100.0, 0.0]])
    phy2log = np.array([[0, 1], [0, 1]])
    result = eplb.balancedness(load, phy2log, 2)
    assert result.per_layer.tolist() == [1.0, 0.5]
    assert result.mean == 0.75 and result.sum == pytest.approx((10 + 50) / (10 + 100))


def test_metrics_follow_the_input_kind(deepseek_example):
    load = torch.tensor(deepseek_example["load"])
    result = eplb.balancedness(load, torch.tensor(deepseek_example["phy2log"]), 8)
    assert isinstance(result.per_layer, torch.Tensor) and result.per_layer.dtype == torch.float64
    loads = eplb.rank_loads(load, deepseek_example["phy2log"], 8)
    assert isinstance(loads, torch.Tensor) and loads.shape == (2, 8)
    window = np.stack([np.array(deepseek_example["load"])] * 3)
    assert eplb.balancedness(window, deepseek_example["phy2log"], 8).mean == pytest.approx(result.mean)


def test_rebalance_improves_the_published_example(deepseek_example):
    load, counts = deepseek_example["load"], (16, 4, 2, 8)
    default = np.tile(np.arange(16) % 12, (2, 1))
    before = eplb.balancedness(load, default, 8).mean
    after = eplb.balancedness(load, eplb.rebalance_experts(load, *counts)[0], 8).mean
    assert after > before


def test_plan_of_no_change_moves_nothing():
    phy2log = np.tile(np.arange(8), (3, 1))
    plan = eplb.plan_migration(phy2log, phy2log, 4, 2, 1 << 20)
    assert plan["slots_kept"] == 24 and plan["bytes_kept"] == 24 << 20
    assert plan["bytes_local"] == plan["bytes_intra_node"] == plan["bytes_inter_node"] == 0
    assert plan["requests"] == 0 and plan["requests_per_rank"] == [0, 0, 0, 0]
    assert plan["slots_changed_per_layer"] == [0, 0, 0]


def test_plan_by_hand():
    # 4 ranks x 2 slots, 2 nodes (ranks 0-1, 2-3). Old: rank r holds experts 2r, 2r+1.
    old = np.array([[0, 1, 2, 3, 4, 5, 6, 7]])
    new = np.array([[4, 0, 3, 2, 1, 5, 6, 7]])
    # rank 0 reads 4 from rank 2 (other node) and copies its own 0; rank 1 swaps its slots (2 local
    # copies); rank 2 reads 1 from rank 0 (other node) and keeps 5; rank 3 keeps both.
    plan = eplb.plan_migration(old, new, 4, 2, 100)
    assert (plan["slots_kept"], plan["slots_local"], plan["slots_intra_node"], plan["slots_inter_node"]) == (3, 3, 0, 2)
    assert (plan["bytes_kept"], plan["bytes_local"], plan["bytes_inter_node"]) == (300, 300, 200)
    assert plan["bytes_over_network"] == 200
    assert plan["requests_per_rank"] == [1, 0, 1, 0] and plan["bytes_read_per_rank"] == [100, 0, 100, 0]
    assert plan["requests"] == 2 and plan["slots_changed_per_layer"] == [5]
    one_node = eplb.plan_migration(old, new, 4, 1, 100)
    assert (one_node["slots_intra_node"], one_node["slots_inter_node"]) == (2, 0)


def test_plan_totals_add_up():
    rng = np.random.default_rng(2)
    load = rng.integers(0, 1000, (6, 64))
    old = eplb.rebalance_experts(rng.integers(0, 1000, (6, 64)), 80, 8, 2, 16)[0]
    new = eplb.rebalance_experts(load, 80, 8, 2, 16)[0]
    plan = eplb.plan_migration(torch.from_numpy(old), new.tolist(), 16, 2, 7)
    slots = plan["slots_kept"] + plan["slots_local"] + plan["slots_intra_node"] + plan["slots_inter_node"]
    assert slots == 6 * 80
    assert sum(plan["slots_changed_per_layer"]) == slots - plan["slots_kept"]
    assert sum(plan["requests_per_rank"]) == plan["requests"]
    assert sum(plan["bytes_read_per_rank"]) == plan["bytes_over_network"]
    assert plan["bytes_over_network"] == 7 * (plan["slots_intra_node"] + plan["slots_inter_node"])
