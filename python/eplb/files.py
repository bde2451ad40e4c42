"""eplb's files: load files and traces, placement JSON (read by the C++ library's checked readers).

Contract: the readers treat files as untrusted (docs/load-files.md):
.npy (C order, little-endian int32/int64/float32/float64), .csv (one layer
per line) and .json ([L][E], [W][L][E] or {"load": ...}); placement JSON
as written by `eplb rebalance --out`. A missing or malformed file raises
eplb.Error naming the file and the position. Results are numpy arrays.
"""
import os

from eplb import _eplb
from eplb.errors import Error

__all__ = ["read_load", "read_load_trace", "read_placement"]


def _path(path) -> str:
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise Error(f"a path must be a str or os.PathLike, got {type(path).__name__}") from None


def read_load(path) -> "numpy.ndarray":
    """A load matrix [layers, experts] float64 (a [W][L][E] trace is summed over W)."""
    return _eplb.read_load(_path(path))


def read_load_trace(path) -> "numpy.ndarray":
    """A load trace [steps, layers, experts] float64 (a 2-D file is one step)."""
    return _eplb.read_load_trace(_path(path))


def read_placement(path) -> dict:
    """A placement JSON: num_layers, num_logical_experts, num_replicas, num_groups, num_nodes,
    num_ranks, and phy2log, log2phy, logcnt (int64 numpy arrays)."""
    return _eplb.read_placement(_path(path))
