"""Shared inputs for the SGLang conformance test and bench/sglang_vs_eplb.py.

Contract: SHAPES are (name, steps, layers, experts, slots, slots per rank, groups, nodes), each
valid for every SGLang algorithm (hierarchical constraints included); `window(kind, shape, seed)`
is a reproducible [steps, layers, experts] load of one kind: "int" (int64 0..999), "int-ties"
(int64 0..3: many equal loads), "float32", "float64"; `sglang_call(module, name, tokens, shape,
active_ranks)` runs SGLang's own function for algorithm `name` (elasticity_aware through its
module with the given active ranks, as SGLang's entry passes ElasticEPStateManager's).
"""
import torch

SHAPES = [
    ("small", 4, 3, 16, 24, 3, 4, 2),
    ("local1", 3, 2, 8, 12, 1, 2, 2),
    ("no-redundancy", 2, 2, 16, 16, 4, 4, 4),
    ("mid", 8, 4, 64, 80, 10, 8, 4),
    ("deepseek-v3", 2, 4, 256, 288, 9, 8, 4),  # 256 experts, 288 slots, 32 GPUs, 4 nodes (4 of 58 layers)
]
KINDS = ("int", "int-ties", "float32", "float64")


def window(kind, shape, seed):
    _, steps, layers, experts = shape[:4]
    generator = torch.Generator().manual_seed(seed)
    size = (steps, layers, experts)
    if kind == "int":
        return torch.randint(0, 1000, size, generator=generator)
    if kind == "int-ties":
        return torch.randint(0, 4, size, generator=generator)
    values = torch.rand(size, generator=generator, dtype=torch.float64) * 1000
    return values.float() if kind == "float32" else values


def sglang_call(module, name, tokens, shape, active_ranks=None):
    _, _, _, _, slots, local, groups, nodes = shape
    if name.startswith("elasticity_aware"):
        ranks = slots // local
        active = torch.ones(ranks, dtype=torch.int32) if active_ranks is None else torch.as_tensor(active_ranks)
        return module.elasticity_aware.rebalance_experts(
            weight=tokens.sum(dim=0), num_replicas=slots, num_groups=groups, num_nodes=nodes, num_gpus=ranks,
            enable_hierarchical=name.endswith("_hierarchical"), active_ranks=active)
    return module.rebalance_experts(tokens, slots, local, groups, nodes, module.EplbAlgorithm[name])
