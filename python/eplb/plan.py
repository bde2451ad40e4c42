"""What a change of placement costs: eplb's migration planner from Python.

Contract: `plan_migration(old, new, num_ranks, num_nodes, bytes_per_expert)`
runs the library's planner (every rank computes the same plan) and returns
its statistics as a dict of Python ints: for every slot of every layer it
is kept (same expert), a local copy (the expert is already on the rank), or
a READ from another rank of the same node or of another node; one READ per
(expert, receiving rank); reads from one source rank of one layer form one
request. Pure; bad input raises eplb.Error.
"""
from eplb import _arrays, _eplb

__all__ = ["plan_migration"]


def plan_migration(old_phy2log, new_phy2log, num_ranks, num_nodes, bytes_per_expert, *, num_logical_experts=None):
    """Statistics of the migration from old_phy2log to new_phy2log ([layers, slots] each).

    Args:
        old_phy2log, new_phy2log: placements of one shape; each must give every expert a replica.
        num_ranks: ranks (a divisor of the slots per layer, a multiple of num_nodes).
        num_nodes: nodes (reads inside a node are intra-node, across nodes inter-node).
        bytes_per_expert: bytes of one expert's weights (all tensors of one slot).
        num_logical_experts: experts per layer (default: the largest expert index + 1).

    Returns:
        dict: slots_kept, slots_local, slots_intra_node, slots_inter_node; bytes_kept, bytes_local,
        bytes_intra_node, bytes_inter_node, bytes_over_network (intra + inter), bytes_per_expert;
        requests (READ requests, one per layer, receiving rank and source rank), descriptors (runs of
        adjacent rows after merging); requests_per_rank and bytes_read_per_rank (lists over receiving
        ranks, all layers); slots_changed_per_layer (list over layers).
    """
    experts = 0 if num_logical_experts is None else _arrays.count("num_logical_experts", num_logical_experts)
    return _eplb.plan_migration(_arrays.indices("old_phy2log", old_phy2log),
                                _arrays.indices("new_phy2log", new_phy2log),
                                _arrays.count("num_ranks", num_ranks), _arrays.count("num_nodes", num_nodes),
                                _arrays.count("bytes_per_expert", bytes_per_expert, maximum=1 << 50), experts)
