"""Balance metrics: how evenly a placement spreads a load over the ranks.

Contract: a replica carries load[e] / logcnt[e]; a rank's load is the sum
over its slots (rank r owns slots [r*R/P, (r+1)*R/P)); a layer's
balancedness is mean rank load / max rank load (1.0 is perfect, and a layer
with no load counts as 1.0). `load` is [layers, experts] or a window
[steps, layers, experts] (summed); `phy2log` must give every expert at
least one replica. Pure functions; bad input raises eplb.Error.
"""
from dataclasses import dataclass
from typing import Any

from eplb import _arrays, _eplb

__all__ = ["Balancedness", "balancedness", "rank_loads"]


@dataclass(frozen=True)
class Balancedness:
    """Balancedness of a placement under a load. float(b) is b.mean.

    Attributes:
        mean: mean over layers of the per-layer balancedness.
        sum: sum over layers of the mean rank load / sum of the max rank load (vLLM's logged number).
        per_layer: per-layer balancedness [layers].
        max_rank_load: per-layer max rank load [layers].
        mean_rank_load: per-layer mean rank load [layers].
    """

    mean: float
    sum: float
    per_layer: Any
    max_rank_load: Any
    mean_rank_load: Any

    def __float__(self) -> float:
        return float(self.mean)


def _inputs(load, phy2log, num_ranks):
    return (_arrays.loads("load", load), _arrays.indices("phy2log", phy2log),
            _arrays.count("num_ranks", num_ranks))


def balancedness(load, phy2log, num_ranks) -> Balancedness:
    """Balancedness of phy2log [layers, slots] on `num_ranks` ranks under `load`.

    The per-layer arrays are torch tensors (float64) if `load` is one, else numpy arrays.
    """
    summary = _eplb.balancedness(*_inputs(load, phy2log, num_ranks))
    return Balancedness(mean=summary["mean"], sum=summary["sum"],
                        per_layer=_arrays.output(summary["per_layer"], load),
                        max_rank_load=_arrays.output(summary["max_rank_load"], load),
                        mean_rank_load=_arrays.output(summary["mean_rank_load"], load))


def rank_loads(load, phy2log, num_ranks):
    """The load each rank serves, [layers, num_ranks] float64 (torch if `load` is a tensor)."""
    return _arrays.output(_eplb.rank_loads(*_inputs(load, phy2log, num_ranks)), load)
