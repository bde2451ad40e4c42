"""eplb.vllm.register() against a stub that mimics vLLM's policy registry (tests/stubs/vllm)."""
import sys
from pathlib import Path

import pytest
import torch

import eplb
import eplb.vllm

STUBS = str(Path(__file__).resolve().parent / "stubs")


@pytest.fixture
def stub_vllm(monkeypatch):
    monkeypatch.syspath_prepend(STUBS)
    yield
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        del sys.modules[name]


def test_register_without_vllm_does_nothing():
    assert "vllm" not in sys.modules
    assert eplb.vllm.register() == []


def test_register_adds_eplb_policies(stub_vllm):
    from vllm.distributed.eplb.policy import EPLB_POLICIES

    added = eplb.vllm.register()
    assert added == ["eplb", "eplb_relabel", "eplb_incremental", "eplb_balanced", "eplb_cost_aware"]
    assert EPLB_POLICIES["eplb"] is eplb.vllm.EplbPolicy
    assert EPLB_POLICIES["eplb_relabel"] is eplb.vllm.RelabelEplbPolicy
    assert EPLB_POLICIES["default"].__name__ == "DefaultEplbPolicy"  # untouched without default=


def test_a_registered_policy_serves_vllms_state(stub_vllm):
    from vllm.distributed.eplb.eplb_state import EplbState

    eplb.vllm.register()
    weight = torch.randint(0, 1000, (4, 64), generator=torch.Generator().manual_seed(3))
    initial = torch.tensor([list(range(64)) + [i % 64 for i in range(8)]] * 4)
    state = EplbState("eplb_incremental", initial)
    new = state.rearrange(weight, 8, 2, 8)
    assert new.dtype == torch.int64 and new.shape == (4, 72)
    changed = (new != initial).sum(dim=1)
    assert bool((changed <= 7).all()), f"incremental's budget (10% of 72 slots) exceeded: {changed.tolist()}"
    before = eplb.balancedness(weight, initial, 8).mean
    assert eplb.balancedness(weight, new, 8).mean > before


def test_register_can_replace_the_default(stub_vllm):
    from vllm.distributed.eplb.eplb_state import EplbState

    names = eplb.vllm.register(default=eplb.vllm.make_policy("relabel", threads=2))
    assert names[-1] == "default"
    weight = torch.tensor([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86]])
    initial = torch.tensor([[i % 12 for i in range(16)]])
    new = EplbState("default", initial).rearrange(weight, 4, 2, 8)
    assert bool((new >= 0).all()), "vLLM's stub default ran instead of eplb's"
    deepseek = eplb.vllm.EplbPolicy.rebalance_experts(weight, 16, 4, 2, 8)
    rank_loads = [sorted(eplb.rank_loads(weight, p, 8)[0].tolist()) for p in (new, deepseek)]
    assert rank_loads[0] == rank_loads[1]  # relabel keeps deepseek's rank loads


def test_make_policy_checks_names_and_options():
    incremental = eplb.vllm.make_policy("incremental", budget=2)
    assert issubclass(incremental, eplb.vllm.IncrementalEplbPolicy) and incremental.options == {"budget": 2}
    with pytest.raises(eplb.Error, match="unknown policy"):
        eplb.vllm.make_policy("greedy")
    with pytest.raises(eplb.Error, match="unknown option"):
        eplb.vllm.make_policy("incremental", budgt=2)


@pytest.mark.parametrize("policy", [eplb.vllm.RelabelEplbPolicy, eplb.vllm.IncrementalEplbPolicy,
                                    eplb.vllm.BalancedEplbPolicy, eplb.vllm.CostAwareEplbPolicy])
def test_every_policy_class_keeps_the_contract(policy):
    generator = torch.Generator().manual_seed(5)
    weight = torch.randint(0, 500, (3, 32), generator=generator)
    old = torch.tensor([[i % 32 for i in range(48)]] * 3)
    phy2log = policy.rebalance_experts(weight, 48, 4, 2, 8, old)
    assert isinstance(phy2log, torch.Tensor) and phy2log.dtype == torch.int64 and phy2log.shape == (3, 48)
    _, logcnt = eplb.compute_logical_maps(phy2log, 32)
    assert bool((logcnt >= 1).all())
    for layer in range(3):  # experts that stay on a rank keep their (first) old slot
        for rank in range(8):
            old_slots, new_slots = old[layer, rank * 6:(rank + 1) * 6].tolist(), phy2log[layer, rank * 6:(rank + 1) * 6]
            for expert in set(old_slots) & set(new_slots.tolist()):
                assert new_slots[old_slots.index(expert)] == expert
    assert policy.rebalance_experts(weight, 48, 4, 2, 8).shape == (3, 48)
