"""eplb's policy selected the way a vLLM user selects one, against the real vLLM (vllm 0.33.0, torch 2.14.0).

vLLM's EPLBConfig.policy accepts only "default" (its Literal), and async EPLB runs only that one. eplb ships a
vLLM general plugin (entry point `vllm.general_plugins`: eplb = eplb.vllm:plugin, declared in pyproject.toml)
that points vLLM's "default" at an eplb policy, chosen by EPLB_VLLM_POLICY (default deepseek). The checks
that need vLLM run in fresh interpreters (vllm_policy_probe.py): vLLM's plugin loader runs once per process,
and vLLM's imports stay out of the test process. On tie-free integer loads eplb's placement equals
vLLM's DefaultEplbPolicy's exactly; on ties the two differ with the same load on every rank (docs/python.md).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import eplb
import eplb.vllm

PROBE = Path(__file__).resolve().parent / "vllm_policy_probe.py"


def probe(mode: str, **environment) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in ("EPLB_VLLM_POLICY", "EPLB_VLLM_COMMUNICATOR", "VLLM_PLUGINS")}
    env.update(VLLM_TARGET_DEVICE="cpu", **environment)
    done = subprocess.run([sys.executable, str(PROBE), mode], capture_output=True, text=True, timeout=240, env=env,
                          cwd=PROBE.parent)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plugin():
    return probe("plugin")


def test_the_plugin_is_declared_and_vllms_loader_points_default_at_eplb(plugin):
    assert "eplb=eplb.vllm:plugin" in plugin["entry_points"], plugin["entry_points"]
    assert plugin["before"] == "vllm.distributed.eplb.policy.default.DefaultEplbPolicy:vllm"
    assert plugin["after"] == "eplb.vllm.EplbPolicy:deepseek"  # EPLB_VLLM_POLICY unset: deepseek
    assert plugin["registry_names"] == ["default"]  # no names vLLM's config would reject


def test_vllms_config_takes_only_default(plugin):
    config = plugin["config"]
    assert config["default_async"] is True and config["parallel_policy"] == "default"
    for name in ("eplb", "eplb_incremental"):
        assert config[name].startswith("policy Input should be 'default' [type=literal_error"), config[name]


def test_eplb_equals_vllms_default_policy_on_tie_free_integer_loads(plugin):
    compared = plugin["tie_free"]
    assert compared["layers"] == 96 and compared["identical_layers"] == compared["layers"], compared["differing"]


def test_on_ties_placements_may_differ_but_every_rank_carries_the_same_load(plugin):
    ties = plugin["ties"]
    assert ties["rank_loads_equal"], ties
    assert ties["differing_layers"] > 0, ties  # ties do occur, and the two decide them differently


def test_bad_values_are_refused_clearly_and_other_values_select():
    found = probe("bad-values", EPLB_VLLM_POLICY="greedy")
    assert found["loader"] == ("Error: EPLB_VLLM_POLICY='greedy' is not an eplb policy for vLLM: use one of balanced, "
                               "cost-aware, deepseek, incremental, relabel, vllm ('vllm' keeps vLLM's DefaultEplbPolicy; unset "
                               "means deepseek)"), found["loader"]
    assert found["after_bad"].endswith("DefaultEplbPolicy:vllm")
    assert found["vllm|"].endswith("DefaultEplbPolicy:vllm")
    assert found["incremental|"] == "eplb.vllm.IncrementalEplbPolicy:incremental"
    bad = found["deepseek|torch_gloo, eplb"]
    assert bad.startswith("Error: EPLB_VLLM_COMMUNICATOR='torch_gloo, eplb': 'eplb' is not an EPLB communicator "
                          "backend of vLLM: use 'all' or names among torch_nccl, torch_gloo"), bad
    assert found["deepseek|all"] == "eplb.vllm.EplbPolicy:deepseek" and found["installed_by_all"] is True
    assert found["window bogus|"] == ("Error: EPLB_VLLM_ESTIMATOR='bogus': unknown estimator 'bogus' (expected sum, "
                                      "ema:HALF_LIFE, robust:Z or auto) (unset or 'sum' keeps vLLM's window sum)")
    for chunks in ("0", "x", "\u00b2"):  # superscript two: a digit to str.isdigit, not a number
        assert found[f"window auto|{chunks}"] == (f"Error: EPLB_VLLM_WINDOW_CHUNKS='{chunks}' must be a positive "
                                                  "integer (unset means 20)")
    assert found["window sum|"] == "vllm's" and found["uninstalled sum|"] is False
    assert found["window auto|"] == "wrapped" and found["uninstalled auto|"] is True
    assert found["window ema:4|8"] == "wrapped" and found["restored"] is True


def test_register_needs_a_known_policy():
    with pytest.raises(eplb.Error, match="unknown policy 'greedy'"):
        eplb.vllm.register("greedy")


def test_make_policy_checks_names_and_options():
    incremental = eplb.vllm.make_policy("incremental", budget=2)
    assert issubclass(incremental, eplb.vllm.IncrementalEplbPolicy) and incremental.options == {"budget": 2}
    with pytest.raises(eplb.Error, match="unknown policy"):
        eplb.vllm.make_policy("greedy")
    with pytest.raises(eplb.Error, match="unknown option"):
        eplb.vllm.make_policy("incremental", budgt=2)


@pytest.mark.parametrize("policy", [eplb.vllm.RelabelEplbPolicy, eplb.vllm.IncrementalEplbPolicy,
                                    eplb.vllm.BalancedEplbPolicy])
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
