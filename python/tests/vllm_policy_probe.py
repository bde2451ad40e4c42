"""Run in a fresh interpreter by test_vllm_policy.py: vLLM's own plugin loader and config objects with eplb
installed, and eplb's policy against vLLM's DefaultEplbPolicy. Prints one JSON line.

Usage: python vllm_policy_probe.py plugin|bad-values   (the environment selects eplb's policy)
"""
import json
import os
import sys

import numpy as np
import torch

from vllm_cases import tie_free_loads

# (replicas, groups, nodes, ranks, experts): hierarchical (groups % nodes == 0) and global shapes, R <= 2E.
SHAPES = [(16, 4, 2, 8, 12), (24, 8, 4, 8, 16), (80, 8, 2, 16, 64), (96, 8, 1, 8, 64), (288, 8, 4, 32, 256),
          (20, 3, 2, 4, 12), (48, 1, 1, 8, 32), (36, 8, 3, 12, 32)]


def config_checks() -> dict:
    """vLLM's EPLBConfig accepts only its Literal's names; ParallelConfig takes eplb_config as vLLM builds it."""
    from pydantic import ValidationError
    from vllm.config import EPLBConfig, ParallelConfig

    out = {"default_async": EPLBConfig(policy="default").use_async}
    for name in ("eplb", "eplb_incremental"):
        try:
            EPLBConfig(policy=name)
            out[name] = "accepted"
        except ValidationError as failure:
            out[name] = str(failure).splitlines()[1].strip() + " " + str(failure).splitlines()[2].strip()
    parallel = ParallelConfig(eplb_config=EPLBConfig(policy="default", use_async=True))
    out["parallel_policy"] = parallel.eplb_config.policy
    return out


def state_policy() -> str:
    """The policy vLLM's EplbState looks up for its config's name, as add_model does."""
    from vllm.config import EPLBConfig
    from vllm.distributed.eplb.policy import EPLB_POLICIES

    chosen = EPLB_POLICIES[EPLBConfig().policy]
    return f"{chosen.__module__}.{chosen.__qualname__}:{getattr(chosen, 'policy', 'vllm')}"


def compare_tie_free(rng) -> dict:
    """eplb (vLLM's registry default after the plugin) against vLLM's DefaultEplbPolicy on tie-free integer
    loads, with and without old indices, called as vLLM calls it (torch int64 load and placement)."""
    from vllm.distributed.eplb.policy import EPLB_POLICIES, DefaultEplbPolicy

    chosen = EPLB_POLICIES["default"]
    layers = total = 0
    differing = []
    for replicas, groups, nodes, ranks, experts in SHAPES:
        load = torch.from_numpy(tie_free_loads(rng, 6, experts, groups))
        old = torch.from_numpy(np.stack([rng.permutation(np.arange(replicas) % experts) for _ in range(6)]))
        for previous in (None, old):
            ours = chosen.rebalance_experts(load, replicas, groups, nodes, ranks, previous)
            theirs = DefaultEplbPolicy.rebalance_experts(load, replicas, groups, nodes, ranks, previous)
            assert ours.dtype == theirs.dtype == torch.int64 and ours.shape == theirs.shape
            same = (ours == theirs).all(dim=1)
            layers += int(same.sum())
            total += len(same)
            differing += [f"{replicas}/{groups}/{nodes}/{ranks} layer {i} old={previous is not None}"
                          for i in np.nonzero(~same.numpy())[0]]
    return {"identical_layers": layers, "layers": total, "differing": differing[:5]}


def compare_ties(rng) -> dict:
    """Tie-heavy integer loads (many equal loads), global variant with at most 2 replicas per expert (exact
    arithmetic): where vLLM's unstable argsort orders equal loads differently from eplb's stable order, the
    placements differ but every rank carries the same load."""
    import eplb
    from vllm.distributed.eplb.policy import EPLB_POLICIES, DefaultEplbPolicy

    replicas, experts, ranks = 48, 32, 8
    load = torch.from_numpy(rng.integers(50, 60, size=(200, experts)))  # 10 values over 32 experts
    ours = EPLB_POLICIES["default"].rebalance_experts(load, replicas, 1, 1, ranks)
    theirs = DefaultEplbPolicy.rebalance_experts(load, replicas, 1, 1, ranks)
    differ = ~(ours == theirs).all(dim=1)
    rank_loads = [eplb.rank_loads(load.double(), placement, ranks) for placement in (ours, theirs)]
    return {"layers": len(differ), "differing_layers": int(differ.sum()),
            "rank_loads_equal": bool(np.array_equal(rank_loads[0], rank_loads[1]))}


def plugin_mode() -> dict:
    from importlib.metadata import entry_points

    from vllm.distributed.eplb.policy import EPLB_POLICIES
    from vllm.plugins import load_general_plugins

    before = state_policy()
    load_general_plugins()
    rng = np.random.default_rng(2026)
    return {"entry_points": sorted(f"{e.name}={e.value}" for e in entry_points(group="vllm.general_plugins")),
            "before": before, "after": state_policy(), "registry_names": sorted(EPLB_POLICIES),
            "config": config_checks(), "tie_free": compare_tie_free(rng), "ties": compare_ties(rng)}


def bad_values_mode() -> dict:
    """EPLB_VLLM_POLICY is bad in the environment: vLLM's loader raises eplb's error. Then other values,
    through the plugin function itself."""
    import eplb
    import eplb.vllm
    from vllm.plugins import load_general_plugins

    out = {}
    try:
        load_general_plugins()
        out["loader"] = None
    except eplb.Error as failure:
        out["loader"] = f"{type(failure).__name__}: {failure}"
    out["after_bad"] = state_policy()
    for policy, communicator in (("vllm", ""), ("incremental", ""), ("deepseek", "torch_gloo, eplb"),
                                 ("deepseek", "all")):
        os.environ["EPLB_VLLM_POLICY"], os.environ["EPLB_VLLM_COMMUNICATOR"] = policy, communicator
        try:
            eplb.vllm.plugin()
            out[f"{policy}|{communicator}"] = state_policy()
        except eplb.Error as failure:
            out[f"{policy}|{communicator}"] = f"{type(failure).__name__}: {failure}"
    out["installed_by_all"] = eplb.vllm.uninstall()
    out.update(window_values())
    return out


def window_values() -> dict:
    """EPLB_VLLM_ESTIMATOR / EPLB_VLLM_WINDOW_CHUNKS through the plugin: bad values named, 'auto' wraps
    vLLM's EplbState.rearrange, 'sum' leaves it."""
    import eplb
    import eplb.vllm
    from vllm.distributed.eplb.eplb_state import EplbState

    vllms = EplbState.rearrange
    out = {}
    os.environ["EPLB_VLLM_POLICY"], os.environ["EPLB_VLLM_COMMUNICATOR"] = "deepseek", ""
    for estimator, chunks in (("bogus", ""), ("auto", "0"), ("auto", "x"), ("auto", "\u00b2"), ("sum", ""),
                              ("auto", ""), ("ema:4", "8")):
        os.environ["EPLB_VLLM_ESTIMATOR"], os.environ["EPLB_VLLM_WINDOW_CHUNKS"] = estimator, chunks
        try:
            eplb.vllm.plugin()
            out[f"window {estimator}|{chunks}"] = "wrapped" if EplbState.rearrange is not vllms else "vllm's"
        except eplb.Error as failure:
            out[f"window {estimator}|{chunks}"] = f"{type(failure).__name__}: {failure}"
        out[f"uninstalled {estimator}|{chunks}"] = eplb.vllm.uninstall_window()
    out["restored"] = EplbState.rearrange is vllms
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    print(json.dumps({"plugin": plugin_mode, "bad-values": bad_values_mode}[mode]()))
