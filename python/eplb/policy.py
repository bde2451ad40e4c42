"""Placement policies: DeepSeek's `rebalance_experts` signature over eplb's C++ policies.

Contract: `rebalance_experts` is pure and deterministic (same inputs, same
output, whatever `threads`), releases the GIL while the policy runs, and
returns (phy2log, log2phy, logcnt) as int64 arrays of the caller's kind
(torch in, CPU torch out; numpy or lists in, numpy out). With
policy="deepseek" the result is DeepSeek's published algorithm exactly
(docs/policies.md). `estimate_load` runs only the estimator a policy
plans from. Every bad input raises eplb.Error.
"""
from eplb import _arrays, _eplb
from eplb.errors import Error

__all__ = ["rebalance_experts", "policies", "estimate_load"]


def policies() -> list:
    """Names of eplb's placement policies: deepseek, relabel, incremental, balanced, cost-aware."""
    return list(_eplb.policy_names())


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, *, policy="deepseek", current=None,
                      threads=None, budget=None, anti_affinity=False, min_gain=0.0, estimator=None,
                      move_threshold=0.0, cluster=None, interval_s=None, bytes_per_expert=None, stall_mode=None):
    """Places `num_replicas` expert replicas per layer on `num_gpus` ranks.

    DeepSeek's `eplb.rebalance_experts` signature and result, computed by eplb's C++ library.

    Args:
        weight: expert loads, [layers, experts], or a window [steps, layers, experts] that goes through
            `estimator`. torch (any dtype, any device), numpy (any int or float dtype) or nested lists.
            Loads must be finite and >= 0.
        num_replicas: physical slots per layer (>= experts, a multiple of num_gpus).
        num_groups: expert groups (experts a multiple of groups when the hierarchical variant applies).
        num_nodes: nodes. When num_groups % num_nodes == 0 the hierarchical variant keeps each group's
            replicas on one node; otherwise the policy runs with one group and one node, as DeepSeek's does.
        num_gpus: ranks (a multiple of num_nodes in the hierarchical variant).
        policy: "deepseek" (DeepSeek's algorithm, exactly), "relabel" (deepseek's balance, fewest slots
            moved from `current`), "incremental" (improves `current` within `budget`), "balanced"
            (never less balanced than deepseek on the planning load) or "cost-aware" (the moves from
            `current` that serve the most tokens until the next rebalance, net of the migration's stall,
            on `cluster`; docs/scale.md). See eplb.policies().
        current: the placement in force, phy2log [layers, num_replicas]; relabel and incremental start
            from it (and min_gain > 0 keeps its layers). Default: slot s holds expert s mod experts.
        threads: worker threads for independent layers (default 1; the result does not depend on it).
        budget: incremental: slots rewritten per layer, < 1 a fraction of num_replicas, >= 1 a count
            (default 0.1).
        anti_affinity: never two replicas of one expert on one rank (an eplb.Error when impossible).
        min_gain: hysteresis: keep a layer of `current` if balancedness would gain less than this.
        estimator: for a window: "sum" (default), "ema:H" (half-life H steps), "robust:Z"
            (mean + Z standard deviations per expert) or "auto" (the ema half-life, or the sum, that
            best predicts the window's newer half from its older half).
        move_threshold: incremental: stop when the best move improves the max rank load by <= this.
        cluster: cost-aware: the hosts and network that price a migration, "h100" (default) or "h200";
            num_nodes are its hosts.
        interval_s: cost-aware: seconds until the next rebalance (default 600).
        bytes_per_expert: cost-aware: bytes of one expert's weights (default 44040192, DeepSeek-V3 FP8).
        stall_mode: cost-aware: how serving waits for the migration: "sync" (default), "async-copy" or
            "async-swap".

    Returns:
        (phy2log [layers, num_replicas], log2phy [layers, experts, max replicas] padded with -1,
        logcnt [layers, experts]), int64, torch tensors if `weight` is one, else numpy arrays.

    Raises:
        eplb.Error: bad shapes or counts, negative or NaN loads, out-of-range indices, unknown names.
    """
    phy2log, log2phy, logcnt, _ = _place(weight, num_replicas, num_groups, num_nodes, num_gpus, policy=policy,
                                         current=current, threads=threads, budget=budget,
                                         anti_affinity=anti_affinity, min_gain=min_gain, estimator=estimator,
                                         move_threshold=move_threshold, cluster=cluster, interval_s=interval_s,
                                         bytes_per_expert=bytes_per_expert, stall_mode=stall_mode)
    return _arrays.output(phy2log, weight), _arrays.output(log2phy, weight), _arrays.output(logcnt, weight)


def estimate_load(window, estimator="auto"):
    """The load a policy would plan for, from a window of per-step loads (rebalance_experts' `estimator`).

    Args:
        window: per-step expert loads [steps, layers, experts] (oldest step first), or one step
            [layers, experts]. torch (any dtype, any device), numpy (any int or float dtype) or nested
            lists; finite and >= 0.
        estimator: "sum", "ema:H" (half-life H steps), "robust:Z" or "auto" (default: the ema half-life
            of 1, 2, 4, 8 or 16 steps, or the sum, that best predicts the window's newer half from its
            older half; fewer than 4 steps take the sum).

    Returns:
        (load [layers, experts] float64, scaled like the sum of the steps, as the caller's kind (torch
        in, CPU torch out); the estimator applied, e.g. "ema:2" or "sum" when `auto` was asked).

    Raises:
        eplb.Error: a bad shape, a negative or NaN load, an unknown estimator.
    """
    if not isinstance(estimator, str):
        raise Error(f"estimator must be 'sum', 'ema:H', 'robust:Z' or 'auto', got {estimator!r}")
    load, applied = _eplb.estimate(_arrays.policy_loads("window", window), estimator)
    return _arrays.output(load, window), applied


def _place(weight, num_replicas, num_groups, num_nodes, num_gpus, *, policy, current, threads, budget,
           anti_affinity, min_gain, estimator, move_threshold, cluster=None, interval_s=None, bytes_per_expert=None,
           stall_mode=None):
    """rebalance_experts as numpy arrays, plus the C++ policy's own time in seconds (for benchmarks)."""
    load = _arrays.policy_loads("weight", weight)
    replicas = _arrays.count("num_replicas", num_replicas)
    groups = _arrays.count("num_groups", num_groups)
    nodes = _arrays.count("num_nodes", num_nodes)
    ranks = _arrays.count("num_gpus", num_gpus)
    if groups % nodes != 0:
        # DeepSeek's global variant; cost-aware keeps the hosts, which price its moves.
        groups, nodes = 1, (nodes if policy == "cost-aware" else 1)
    if not isinstance(policy, str):
        raise Error(f"policy must be a name (one of {', '.join(policies())}), got {policy!r}")
    if estimator is not None and not isinstance(estimator, str):
        raise Error(f"estimator must be 'sum', 'ema:H', 'robust:Z' or 'auto', got {estimator!r}")
    for name, value in (("cluster", cluster), ("stall_mode", stall_mode)):
        if value is not None and not isinstance(value, str):
            raise Error(f"{name} must be a name, got {value!r}")
    in_force = None if current is None else _arrays.indices("current", current)
    return _eplb.place(load, replicas, groups, nodes, ranks, policy, in_force,
                       1 if threads is None else _arrays.count("threads", threads, maximum=1024),
                       0.1 if budget is None else _arrays.real("budget", budget),
                       bool(anti_affinity), _arrays.real("min_gain", min_gain),
                       _arrays.real("move_threshold", move_threshold), estimator or "sum",
                       cluster or "h100", 600.0 if interval_s is None else _arrays.real("interval_s", interval_s),
                       44040192.0 if bytes_per_expert is None else _arrays.real("bytes_per_expert", bytes_per_expert),
                       stall_mode or "sync")
