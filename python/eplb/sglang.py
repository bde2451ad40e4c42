"""eplb's policies with the shape of SGLang's EPLB algorithm entry (python/sglang/srt/eplb).

Contract: `rebalance_experts(tokens_per_expert, num_physical_experts,
num_local_physical_experts, num_groups, num_nodes, algorithm)` is SGLang's
`eplb_algorithms.rebalance_experts`: tokens_per_expert is the recorder's
window [steps, layers, experts] (summed over steps; a [layers, experts]
load is taken as is); ranks = num_physical_experts /
num_local_physical_experts; it returns (phy2log, log2phy, logcnt) with
log2phy padded with -1. Algorithms: "deepseek" (global: one group, one
node), "deepseek_hierarchical" (groups packed onto nodes; num_groups %
num_nodes must be 0), "auto" (hierarchical when it applies, as SGLang's
compute_algorithm), and eplb's "relabel", "incremental", "balanced" (which
take `current`, the placement in force). `algorithm` may be a name or an
enum member with that name (SGLang's EplbAlgorithm). `load_recorder_dump`
reads the `.pt` file of SGLang's expert distribution recorder.
"""
import os

from eplb import _arrays
from eplb.errors import Error
from eplb.policy import rebalance_experts as _rebalance_experts

__all__ = ["rebalance_experts", "load_recorder_dump", "ALGORITHMS"]

#: algorithm names accepted by rebalance_experts.
ALGORITHMS = ("deepseek", "deepseek_hierarchical", "auto", "relabel", "incremental", "balanced")


def _algorithm_name(algorithm, num_groups, num_nodes) -> str:
    name = getattr(algorithm, "name", algorithm)
    if name not in ALGORITHMS:
        raise Error(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    if name == "auto":
        return "deepseek_hierarchical" if num_groups % num_nodes == 0 else "deepseek"
    return name


def rebalance_experts(tokens_per_expert, num_physical_experts, num_local_physical_experts, num_groups, num_nodes,
                      algorithm, *, current=None, **options):
    """(phy2log, log2phy, logcnt) for SGLang, from the recorder's window of expert token counts.

    Args:
        tokens_per_expert: [steps, layers, experts] (or [layers, experts]); torch, numpy or lists.
        num_physical_experts: slots per layer.
        num_local_physical_experts: slots per rank (GPU).
        num_groups: expert groups, or None (one group).
        num_nodes: nodes.
        algorithm: one of ALGORITHMS (or an enum member named so).
        current: relabel / incremental: the placement in force, phy2log [layers, slots].
        **options: more keyword arguments of eplb.rebalance_experts (threads, budget, estimator, ...).

    Returns:
        int64 (phy2log, log2phy, logcnt), torch tensors if tokens_per_expert is one, else numpy arrays.
    """
    slots = _arrays.count("num_physical_experts", num_physical_experts)
    local = _arrays.count("num_local_physical_experts", num_local_physical_experts)
    if slots % local != 0:
        raise Error(f"num_physical_experts={slots} is not a multiple of num_local_physical_experts={local}")
    groups = 1 if num_groups is None else _arrays.count("num_groups", num_groups)
    nodes = _arrays.count("num_nodes", num_nodes)
    name = _algorithm_name(algorithm, groups, nodes)
    if name == "deepseek":
        groups, nodes = 1, 1
    elif name == "deepseek_hierarchical":
        if groups % nodes != 0:
            raise Error(f"deepseek_hierarchical needs num_groups % num_nodes == 0, got {groups} groups and "
                        f"{nodes} nodes (use 'deepseek' or 'auto')")
        name = "deepseek"
    return _rebalance_experts(tokens_per_expert, slots, groups, nodes, slots // local, policy=name, current=current,
                              **options)


def load_recorder_dump(path):
    """`logical_count` [steps, layers, experts] from a recorder dump (`expert_distribution_recorder_*.pt`).

    The file is read with torch.load(weights_only=True) onto the CPU: a dict holding "logical_count"
    (a 3-D tensor of non-negative counts; other keys such as "rank" are ignored). Anything else
    raises eplb.Error naming the file.
    """
    import torch

    try:
        data = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except Exception as failure:  # torch.load raises many types (OSError, UnpicklingError, RuntimeError, ...)
        raise Error(f"{path}: cannot read a recorder dump: {failure}", "I/O error") from None
    if not isinstance(data, dict) or "logical_count" not in data:
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise Error(f"{path}: not a recorder dump: expected a dict with 'logical_count', got {keys}", "parse error")
    counts = data["logical_count"]
    if not isinstance(counts, torch.Tensor) or counts.dim() != 3:
        shape = tuple(counts.shape) if isinstance(counts, torch.Tensor) else type(counts).__name__
        raise Error(f"{path}: logical_count must be a tensor [steps, layers, experts], got {shape}", "parse error")
    if (counts.is_floating_point() and not bool(torch.isfinite(counts).all())) or bool((counts < 0).any()):
        raise Error(f"{path}: logical_count holds negative or non-finite counts", "parse error")
    return counts
