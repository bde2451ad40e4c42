"""Fault injection for eplb's Python data planes (tests; the `inject` option of eplb.Migrator and
EPLB_PLANE_INJECT for eplb.vllm.EplbCommunicator).

Spec: "corrupt=P,stall=P,err=P,seed=S" (each P in [0, 1]; at least one given). Per attempt of a
layer, with its probability and a generator seeded by (seed, rank): `corrupt` flips one byte of one
received row after the transfers landed (the digest must catch it); `stall` makes this rank post
none of its sends (its peers' receives never complete: their deadline must end them); `err` makes
this rank's wait fail with a backend error. Bad specs raise eplb.Error naming the field.
"""
from __future__ import annotations

import random

from eplb.errors import Error

__all__ = ["FaultSpec"]

_FIELDS = ("corrupt", "stall", "err", "seed")


class FaultSpec:
    """A parsed fault spec (see the module's docstring); falsy when empty."""

    def __init__(self, spec: str = "", rank: int = 0):
        self.corrupt = self.stall = self.err = 0.0
        seed = 0
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, value = item.partition("=")
            if name not in _FIELDS:
                raise Error(f"fault spec {spec!r}: unknown field {name!r} (known: {', '.join(_FIELDS)})")
            try:
                number = int(value) if name == "seed" else float(value)
            except ValueError:
                raise Error(f"fault spec {spec!r}: {name} must be a number, got {value!r}") from None
            if name == "seed":
                seed = number
            elif not 0 <= number <= 1:
                raise Error(f"fault spec {spec!r}: {name} must be in [0, 1], got {value}")
            else:
                setattr(self, name, number)
        self._random = random.Random(seed * 1000003 + rank)
        self._spec = spec

    def __bool__(self) -> bool:
        return bool(self.corrupt or self.stall or self.err)

    def draw(self, probability: float) -> bool:
        return probability > 0 and self._random.random() < probability

    def pick(self, count: int) -> int:
        return self._random.randrange(count)

    def __repr__(self) -> str:
        return f"FaultSpec({self._spec!r})"
