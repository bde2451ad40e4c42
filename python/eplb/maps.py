"""Logical maps from a placement, with vLLM's `compute_logical_maps` semantics.

Contract: `compute_logical_maps(phy2log, num_logical_experts)` returns
(log2phy [layers, experts, max replicas], logcnt [layers, experts]): each
expert's slots in ascending order, padded with -1 to the largest replica
count of any layer; slots holding -1 (not yet filled, as in elastic
scale-up) are skipped; the outputs keep phy2log's dtype and kind (torch or
numpy; lists give int64 numpy). A 1-D phy2log is one layer (outputs lose
the layer axis). Out-of-range entries raise eplb.Error.
"""
import numpy as np

from eplb import _arrays, _eplb

__all__ = ["compute_logical_maps"]


def compute_logical_maps(phy2log, num_logical_experts):
    """(log2phy, logcnt) from phy2log [layers, slots] (or one layer [slots]); -1 slots are skipped.

    Args:
        phy2log: logical expert of every slot, integers in [-1, num_logical_experts).
        num_logical_experts: experts per layer.

    Returns:
        log2phy [layers, experts, max replicas] (-1 padded, ascending slots) and logcnt [layers, experts],
        in phy2log's dtype, as torch tensors if phy2log is one, else numpy arrays.
    """
    values = _arrays.indices("phy2log", phy2log)
    one_layer = values.ndim == 1
    if one_layer:
        values = values[np.newaxis, :]
    experts = _arrays.count("num_logical_experts", num_logical_experts)
    log2phy, logcnt = _eplb.logical_maps(values, experts)
    if one_layer:
        log2phy, logcnt = log2phy[0], logcnt[0]
    dtype = _arrays.dtype_of(phy2log)
    return _arrays.output(log2phy, phy2log, dtype), _arrays.output(logcnt, phy2log, dtype)
