"""The cost-aware policy through eplb.rebalance_experts and eplb.vllm (issue 31, docs/scale.md)."""
import numpy as np
import pytest

import eplb
import eplb.vllm

# 4 hosts of 2 ranks, 64 experts in 96 slots.
COUNTS = (96, 1, 4, 8)


def skewed_load(layers=3, experts=64, seed=7):
    rng = np.random.default_rng(seed)
    return rng.lognormal(0.0, 1.0, (layers, experts)) * 1000


def moved(before, after):
    return int((np.asarray(before) != np.asarray(after)).sum())


def test_cost_aware_is_listed_and_runs():
    assert "cost-aware" in eplb.policies()
    load = skewed_load()
    phy2log, log2phy, logcnt = eplb.rebalance_experts(load, *COUNTS, policy="cost-aware")
    assert phy2log.shape == (3, 96) and logcnt.shape == (3, 64)
    assert (logcnt.sum(axis=1) == 96).all()
    default = np.array([[s % 64 for s in range(96)]] * 3)
    assert eplb.balancedness(load, phy2log, 8).mean > eplb.balancedness(load, default, 8).mean


def test_a_short_interval_buys_fewer_moves_than_a_long_one():
    load = skewed_load()
    current = np.array([[s % 64 for s in range(96)]] * 3)
    short, _, _ = eplb.rebalance_experts(load, *COUNTS, policy="cost-aware", current=current, interval_s=1e-3)
    long, _, _ = eplb.rebalance_experts(load, *COUNTS, policy="cost-aware", current=current, interval_s=3600)
    assert moved(current, short) < moved(current, long)
    assert moved(current, short) == 0  # a millisecond of serving does not pay for any migration


def test_options_are_checked():
    load = skewed_load()
    with pytest.raises(eplb.Error, match="unknown cluster preset"):
        eplb.rebalance_experts(load, *COUNTS, policy="cost-aware", cluster="a100")
    with pytest.raises(eplb.Error, match="unknown stall mode"):
        eplb.rebalance_experts(load, *COUNTS, policy="cost-aware", stall_mode="later")
    with pytest.raises(eplb.Error, match="interval"):
        eplb.rebalance_experts(load, *COUNTS, policy="cost-aware", interval_s=0)
    with pytest.raises(eplb.Error, match="bytes.per.expert"):
        eplb.rebalance_experts(load, *COUNTS, policy="cost-aware", bytes_per_expert=-1)
    with pytest.raises(eplb.Error, match="cluster must be a name"):
        eplb.rebalance_experts(load, *COUNTS, policy="cost-aware", cluster=3)


def test_vllm_class_starts_from_the_old_placement():
    torch = pytest.importorskip("torch")
    load = torch.tensor(skewed_load())
    old = torch.tensor([[s % 64 for s in range(96)]] * 3)
    policy = eplb.vllm.make_policy("cost-aware", interval_s=1e-3)
    new = policy.rebalance_experts(load, 96, 1, 4, 8, old_global_expert_indices=old)
    assert bool((new == old).all())  # too short an interval to pay for a move
    busy = eplb.vllm.make_policy("cost-aware", interval_s=3600, stall_mode="async-swap")
    assert moved(old, busy.rebalance_experts(load, 96, 1, 4, 8, old_global_expert_indices=old)) > 0
