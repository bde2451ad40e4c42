"""eplb's policies with the shape of SGLang's EPLB algorithm entry (python/sglang/srt/eplb).

Contract: `rebalance_experts(tokens_per_expert, num_physical_experts,
num_local_physical_experts, num_groups, num_nodes, algorithm)` is SGLang's
`eplb_algorithms.rebalance_experts`: tokens_per_expert is the recorder's
window [steps, layers, experts] (a [layers, experts] load is one step);
ranks = num_physical_experts / num_local_physical_experts; it returns
(phy2log, log2phy, logcnt), int64, log2phy padded with -1. Every algorithm
SGLang 0.5.23 offers (its EplbAlgorithm enum) gives SGLang's answer on the
same input, computed by eplb's C++ library (docs/python.md, "SGLang"):
"deepseek" (global), "deepseek_hierarchical" (groups packed onto nodes;
num_groups % num_nodes must be 0), with torch's tie order (ties="eplb":
eplb's deepseek policy, lower index first, with its options), "deepseek_vec" and
"deepseek_vec_hierarchical" (SGLang's vectorised variant: it scores every
step of the window, so the steps are not summed first; log2phy is
R - E + 1 wide), "elasticity_aware" and "elasticity_aware_hierarchical"
(deepseek on the ranks in `active_ranks`, default all; the slots of an
inactive rank hold expert 0 and no log2phy entry), "auto" (as SGLang's
compute_algorithm), and eplb's "relabel", "incremental", "balanced" (which
take `current`, the placement in force). `algorithm` may be a name or an
enum member with that name (SGLang's EplbAlgorithm). `load_recorder_dump`
reads the recorder's dumps: stat mode (one file, logical_count [steps, L, E]
or the running sum [L, E]) and detail mode (one file per rank, per-pass
physical counts); .pt or .json.
"""
import os

import numpy as np

from eplb import _arrays, _eplb
from eplb.errors import Error
from eplb.policy import rebalance_experts as _rebalance_experts

__all__ = ["rebalance_experts", "load_recorder_dump", "ALGORITHMS"]

#: algorithm names accepted by rebalance_experts.
ALGORITHMS = ("deepseek", "deepseek_hierarchical", "deepseek_vec", "deepseek_vec_hierarchical", "elasticity_aware",
              "elasticity_aware_hierarchical", "auto", "relabel", "incremental", "balanced")


def _algorithm_name(algorithm, num_groups, num_nodes) -> str:
    name = getattr(algorithm, "name", algorithm)
    if name not in ALGORITHMS:
        raise Error(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    if name == "auto":
        return "deepseek_hierarchical" if num_groups % num_nodes == 0 else "deepseek"
    return name


def rebalance_experts(tokens_per_expert, num_physical_experts, num_local_physical_experts, num_groups, num_nodes,
                      algorithm, *, current=None, active_ranks=None, ties="sglang", **options):
    """(phy2log, log2phy, logcnt) for SGLang, from the recorder's window of expert token counts.

    Args:
        tokens_per_expert: [steps, layers, experts] (or [layers, experts]); torch, numpy or lists.
        num_physical_experts: slots per layer.
        num_local_physical_experts: slots per rank (GPU).
        num_groups: expert groups, or None (one group).
        num_nodes: nodes.
        algorithm: one of ALGORITHMS (or an enum member named so).
        current: relabel / incremental: the placement in force, phy2log [layers, slots].
        active_ranks: elasticity_aware: which ranks serve, [ranks] bools or 0/1 (default: all).
        ties: deepseek and elasticity_aware: "sglang" (default) breaks ties as SGLang does under torch
            (identical results); "eplb" runs eplb's `deepseek` policy (lower index first, and its
            options: threads, min_gain, anti_affinity, ...).
        **options: keyword arguments of eplb.rebalance_experts for eplb's policies (ties="eplb",
            relabel, incremental, balanced).

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
    if ties not in ("sglang", "eplb"):
        raise Error(f"ties must be 'sglang' or 'eplb', got {ties!r}")
    if active_ranks is not None and not name.startswith("elasticity_aware"):
        raise Error(f"active_ranks applies to elasticity_aware only, not {name!r}")
    hierarchical = name.endswith("_hierarchical")
    if hierarchical and groups % nodes != 0:
        raise Error(f"{name} needs num_groups % num_nodes == 0, got {groups} groups and {nodes} nodes "
                    "(use the global variant or 'auto')")
    shape = (slots, local, groups, nodes, hierarchical)
    sglang_ties = ties == "sglang" and not name.startswith(("relabel", "incremental", "balanced"))
    if sglang_ties and (options or current is not None):
        raise Error(f"{name} takes no options with ties='sglang' (got "
                    f"{sorted(options) + (['current'] if current is not None else [])}); pass ties='eplb'")
    if name.startswith("deepseek_vec"):
        return _outputs(_kernel(_eplb.deepseek_vec, tokens_per_expert, *shape), tokens_per_expert)
    if name.startswith("elasticity_aware"):
        return _outputs(_elasticity_aware(tokens_per_expert, shape, active_ranks, sglang_ties, options),
                        tokens_per_expert)
    if sglang_ties:
        return _outputs(_kernel(_eplb.deepseek_torch, tokens_per_expert, *shape), tokens_per_expert)
    if name in ("deepseek", "deepseek_hierarchical"):
        groups, nodes, name = (groups, nodes, "deepseek") if hierarchical else (1, 1, "deepseek")
    return _rebalance_experts(tokens_per_expert, slots, groups, nodes, slots // local, policy=name, current=current,
                              **options)


def _outputs(arrays, like):
    return tuple(_arrays.output(np.ascontiguousarray(array), like) for array in arrays)


def _precision(tokens) -> str:
    """The dtype class SGLang computes in: "int", "float32" or "float64" (float16 and bfloat16 are
    computed in float32, which SGLang does only in part)."""
    dtype = _arrays.dtype_of(tokens)
    if dtype is None:
        dtype = _arrays._numpy_of("tokens_per_expert", tokens).dtype
    text = str(dtype).replace("torch.", "")
    if text in ("float64", "double"):
        return "float64"
    if text.startswith(("int", "uint")) or text in ("long", "short"):
        return "int"
    return "float32"


def _kernel(function, tokens, slots, local, groups, nodes, hierarchical):
    """(phy2log, log2phy, logcnt) as numpy arrays from one of the C++ SGLang kernels."""
    window = _arrays.loads("tokens_per_expert", tokens)
    if window.ndim == 2:
        window = window[None]
    if window.ndim != 3:
        raise Error(f"tokens_per_expert must be [steps, layers, experts] or [layers, experts], got {window.shape}")
    return function(window, slots, local, groups, nodes, hierarchical, _precision(tokens))[:3]


def _active_mask(active_ranks, ranks: int) -> np.ndarray:
    if active_ranks is None:
        return np.ones(ranks, dtype=bool)
    if _arrays.is_tensor(active_ranks):
        active_ranks = active_ranks.detach().cpu().numpy()  # bool tensors included
    mask = _arrays._numpy_of("active_ranks", active_ranks)
    if mask.shape != (ranks,) or mask.dtype.kind not in "biu" or not np.isin(mask, (0, 1)).all():
        raise Error(f"active_ranks must be {ranks} bools or 0/1 (one per rank), got shape {mask.shape} "
                    f"dtype {mask.dtype}")
    if not mask.any():
        raise Error("active_ranks: no rank is active")
    return mask.astype(bool)


def _elasticity_aware(tokens, shape, active_ranks, sglang_ties, options):
    """SGLang's elasticity_aware: deepseek on the active ranks (global when some are inactive), then
    the slots of each inactive rank inserted holding expert 0, later slots' numbers shifted."""
    slots, local, groups, nodes, hierarchical = shape
    ranks = slots // local
    active = _active_mask(active_ranks, ranks)
    serving = int(active.sum())
    if serving < ranks:
        slots, groups, nodes, hierarchical = local * serving, 1, 1, False
    if sglang_ties:
        phy2log, log2phy, logcnt = _kernel(_eplb.deepseek_torch, tokens, slots, local, groups, nodes, hierarchical)
    else:
        load = _arrays.policy_loads("tokens_per_expert", tokens)
        shape = (groups, nodes) if hierarchical else (1, 1)
        phy2log, log2phy, logcnt = _rebalance_experts(load, slots, *shape, slots // local, policy="deepseek",
                                                      **options)
    if serving == ranks:
        return phy2log, log2phy, logcnt
    layers = phy2log.shape[0]
    pieces = list(phy2log.reshape(layers, serving, local).transpose(1, 0, 2))
    for rank in np.flatnonzero(~active):
        pieces.insert(int(rank), np.zeros((layers, local), dtype=phy2log.dtype))
        log2phy = np.where(log2phy >= rank * local, log2phy + local, log2phy)
    return np.stack(pieces, axis=1).reshape(layers, ranks * local), log2phy, logcnt


# ----------------------------------------------------------------------------------------------
# Recorder dumps (sglang/srt/eplb/expert_distribution.py, SGLang 0.5.23):
#   stat mode: one file from rank 0, dict(rank, logical_count [steps, L, E], ...);
#   a running sum: dict(logical_count [L, E]) (what init_expert_location also takes, .pt or .json);
#   detail mode ("per_pass" / "per_token"): one file per rank, dict(records=[dict(forward_pass_id,
#   rank, gatherer_key, global_physical_count [L, R], ...)], last_physical_to_logical_map [L, R]).


def load_recorder_dump(path, *, num_logical_experts=None):
    """`logical_count` [steps, layers, experts] from SGLang recorder dumps.

    Args:
        path: a stat-mode or running-sum file (`.pt`, or `.json` with nested lists), a detail-mode
            file of one rank, a directory of detail-mode files (`*.pt`, one per rank), or a list
            of such files.
        num_logical_experts: detail mode: E (default: the largest expert in the map + 1).

    Returns:
        A torch tensor [steps, layers, experts]: stat mode as stored, a running sum [L, E] as one step,
        detail mode one step per forward pass (sorted by id), the ranks' physical counts summed and
        turned into logical counts through last_physical_to_logical_map.

    Raises:
        eplb.Error (a ValueError) naming the file: unreadable, not a dump, wrong shapes or types,
        negative or non-finite counts, map entries out of range, a pass recorded twice by one rank.
    """
    paths = _dump_paths(path)
    dumps = [(p, _read_dump(p)) for p in paths]
    detail = [isinstance(d, dict) and "records" in d for _, d in dumps]
    if all(detail):
        return _detail_counts(dumps, num_logical_experts)
    if len(dumps) != 1 or any(detail):
        raise Error(f"{path}: expected one stat-mode file or only detail-mode files, got {len(dumps)} files "
                    f"({sum(detail)} detail-mode)", "parse error")
    return _stat_counts(*dumps[0])


def _dump_paths(path) -> list:
    if isinstance(path, (list, tuple)):
        if not path:
            raise Error("load_recorder_dump: an empty list of files")
        return [os.fspath(p) for p in path]
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(".pt"))
        if not files:
            raise Error(f"{path}: a directory without recorder dumps (*.pt)", "I/O error")
        return files
    return [path]


def _read_dump(path):
    import torch

    try:
        if path.endswith(".json"):
            import json

            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as failure:  # torch.load / json raise many types (OSError, UnpicklingError, ValueError, ...)
        raise Error(f"{path}: cannot read a recorder dump: {failure}", "I/O error") from None
    if not isinstance(data, dict) or not ("logical_count" in data or "records" in data):
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise Error(f"{path}: not a recorder dump: expected a dict with 'logical_count' (stat mode) or "
                    f"'records' (detail mode), got {keys}", "parse error")
    return data


def _counts_tensor(path, name, value, dims):
    """value as a tensor of non-negative finite counts with one of `dims` dimensions."""
    import torch

    if isinstance(value, list):
        try:
            value = torch.tensor(value)
        except (TypeError, ValueError, RuntimeError) as failure:
            raise Error(f"{path}: {name} is not a rectangular array of numbers: {failure}", "parse error") from None
    if not isinstance(value, torch.Tensor) or value.dim() not in dims or value.numel() == 0:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        want = " or ".join(f"{d}-D" for d in dims)
        raise Error(f"{path}: {name} must be a non-empty {want} tensor, got {shape}", "parse error")
    if value.dtype == torch.bool or value.is_complex():
        raise Error(f"{path}: {name} must hold integers or floats, got {value.dtype}", "parse error")
    if (value.is_floating_point() and not bool(torch.isfinite(value).all())) or bool((value < 0).any()):
        raise Error(f"{path}: {name} holds negative or non-finite counts", "parse error")
    return value


def _stat_counts(path, data):
    counts = _counts_tensor(path, "logical_count", data["logical_count"], (2, 3))
    return counts[None] if counts.dim() == 2 else counts


def _physical_map(path, data):
    import torch

    phy2log = data.get("last_physical_to_logical_map")
    if isinstance(phy2log, list):
        phy2log = torch.tensor(phy2log)
    if not isinstance(phy2log, torch.Tensor) or phy2log.dim() != 2 or phy2log.is_floating_point() \
            or phy2log.dtype == torch.bool or phy2log.numel() == 0:
        raise Error(f"{path}: last_physical_to_logical_map must be an integer tensor [layers, slots]", "parse error")
    if bool((phy2log < 0).any()):
        raise Error(f"{path}: last_physical_to_logical_map holds a negative expert", "parse error")
    return phy2log.to(torch.int64)


def _detail_counts(dumps, num_logical_experts):
    """Detail mode: per forward pass, the ranks' global physical counts summed, then mapped to
    logical experts (SGLang's eplb_simulator/reader.py and _convert_global_physical_count_to_logical_count)."""
    import torch

    phy2log, by_pass = None, {}
    for path, data in dumps:
        this_map = _physical_map(path, data)
        if phy2log is not None and this_map.shape != phy2log.shape:
            raise Error(f"{path}: last_physical_to_logical_map is {tuple(this_map.shape)}, another file's "
                        f"{tuple(phy2log.shape)}", "mismatch")
        phy2log = this_map
        records = data["records"]
        if not isinstance(records, list):
            raise Error(f"{path}: records must be a list, got {type(records).__name__}", "parse error")
        for index, record in enumerate(records):
            _add_record(path, index, record, phy2log.shape, by_pass)
    experts = int(phy2log.max()) + 1 if num_logical_experts is None else \
        _arrays.count("num_logical_experts", num_logical_experts)
    if int(phy2log.max()) >= experts:
        raise Error(f"last_physical_to_logical_map names expert {int(phy2log.max())}, beyond {experts} experts",
                    "parse error")
    if not by_pass:
        raise Error(f"{dumps[0][0]}: detail-mode dump without records", "parse error")
    physical = torch.stack([torch.stack(list(ranks.values())).sum(0) for _, ranks in sorted(by_pass.items())])
    logical = torch.zeros((physical.shape[0], phy2log.shape[0], experts), dtype=physical.dtype)
    logical.scatter_add_(2, phy2log[None].expand(physical.shape[0], -1, -1), physical)
    return logical


def _add_record(path, index, record, shape, by_pass):
    where = f"{path}: records[{index}]"
    if not isinstance(record, dict):
        raise Error(f"{where} must be a dict, got {type(record).__name__}", "parse error")
    pass_id, rank = record.get("forward_pass_id"), record.get("rank")
    if not isinstance(pass_id, int) or isinstance(pass_id, bool) or not isinstance(rank, int) \
            or isinstance(rank, bool) or rank < 0:
        raise Error(f"{where}: forward_pass_id and rank must be integers, got {pass_id!r} and {rank!r}",
                    "parse error")
    counts = _counts_tensor(where, "global_physical_count", record.get("global_physical_count"), (2,))
    if tuple(counts.shape) != tuple(shape):
        raise Error(f"{where}: global_physical_count is {tuple(counts.shape)}, the map {tuple(shape)}", "mismatch")
    ranks = by_pass.setdefault(pass_id, {})
    if rank in ranks:
        raise Error(f"{where}: forward pass {pass_id} of rank {rank} recorded twice", "parse error")
    ranks[rank] = counts.to(counts.dtype if counts.is_floating_point() else _int64())


def _int64():
    import torch

    return torch.int64
