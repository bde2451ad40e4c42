"""Huge expert ids and counts are refused at once, naming the bound (issue 29 item 6).

Expert ids of 2^28 or 2^40 in a placement, or 2^26 replicas in the policy, once sized tables by the
largest id (MemoryError after 7-14 s, or a TypeError); every entry point now checks the ids against
the experts the layout implies (below the slots per layer) and the sizes against the documented caps
(eplb/placement.h: kMaxExpertsPerLayer, kMaxSlotsPerLayer, kMaxTableEntries) before any allocation.
"""
import time

import numpy as np
import pytest

import eplb


def quick(call, *words):
    start = time.monotonic()
    with pytest.raises(eplb.Error) as raised:
        call()
    assert time.monotonic() - start < 1.0
    for word in words:
        assert word in str(raised.value), str(raised.value)
    return raised.value


@pytest.mark.parametrize("expert", [2 ** 28, 2 ** 40])
def test_plan_migration_refuses_an_id_beyond_the_slots(expert):
    old = np.tile(np.arange(8) % 4, (2, 1))
    new = old.copy()
    new[1, 3] = expert
    quick(lambda: eplb.plan_migration(old, new, 2, 1, 1024), "new_phy2log", str(expert), "8")
    quick(lambda: eplb.plan_migration(old, new, 2, 1, 1024, num_logical_experts=expert), "num_logical_experts")


@pytest.mark.parametrize("experts", [2 ** 28, 2 ** 40])
def test_compute_logical_maps_refuses_a_huge_expert_count(experts):
    phy2log = np.tile(np.arange(8) % 4, (2, 1))
    quick(lambda: eplb.compute_logical_maps(phy2log, experts), "num_logical_experts")
    with pytest.raises(eplb.Error, match="out of range"):
        eplb.compute_logical_maps(np.array([[0, 1, 9, 2]]), 4)


def test_the_policy_refuses_a_huge_replica_count():
    load = np.ones((4, 8))
    quick(lambda: eplb.rebalance_experts(load, 2 ** 26, 1, 1, 1), "at most", str(1 << 20))
    quick(lambda: eplb.rebalance_experts(load, 16, 1, 1, 1, policy="relabel", current=np.full((4, 16), 2 ** 28)), "current")
