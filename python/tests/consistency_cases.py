"""What each rank runs in the consistency tests of issue 29 (items 1, 2, 3, 16, 17), spawned by
spawned.run_ranks over gloo: ranks that disagree about the placement, a serving loop that stalls
after a commit, an on_layer callback that raises on one rank, weights_rewritten during an async
round, and the metrics of an async round whose report() is never asked for.
"""
from __future__ import annotations

import time

import numpy as np

import eplb
from eplb import _eplb
from async_cases import in_force
from migration_cases import fill, make_weights, mismatches, random_placement

LAYERS, SLOTS = 3, 3


def _placements(world: int, seed: int):
    """(old, new) [LAYERS][SLOTS * world]; layer 0's slots 0 and 1 hold different experts in old."""
    rng = np.random.default_rng(seed)
    experts = SLOTS * world - 1
    old = random_placement(rng, LAYERS, SLOTS * world, experts)
    while old[0][0] == old[0][1]:
        old = random_placement(rng, LAYERS, SLOTS * world, experts)
    new = random_placement(rng, LAYERS, SLOTS * world, experts)
    return old, new


def _error(failure) -> dict:
    cause = failure.__cause__
    return {"type": type(failure).__name__, "code": failure.code, "message": str(failure),
            "committed": list(failure.committed_layers),
            "cause": None if cause is None else f"{type(cause).__name__}: {cause}"}


def stale_old_placement(rank: int, world: int, mode: str) -> dict:
    """Rank 1 passes an old placement with layer 0's slots 0 and 1 swapped (a stale view)."""
    old, new = _placements(world, 31)
    weights = make_weights(LAYERS, SLOTS, "plain")
    fill(weights, old, rank)
    view = old.copy()
    if rank == 1:
        view[0][[0, 1]] = view[0][[1, 0]]
    migrator = eplb.Migrator(weights, timeout=10, commit="swap" if "swap" in mode else "copy")
    started = time.monotonic()
    outcome = {"error": None}
    try:
        if mode.startswith("async"):
            handle = migrator.start(view, new)
            while not handle.done:
                handle.commit_ready()
                time.sleep(0.002)
            handle.poll()
            handle.close()
        else:
            migrator.migrate(view, new)
    except eplb.MigrationError as failure:
        outcome["error"] = _error(failure)
    outcome["seconds"] = time.monotonic() - started
    outcome["wrong"] = mismatches(weights, old, rank)  # nothing may have moved
    return outcome


def stalled_serving_loop(rank: int, world: int) -> dict:
    """Async round, timeout=1: rank 1 stops calling commit_ready() after its first commit for longer than
    the deadline its progress thread waits for it (a collective's: the transfers' 1 s + 10 s)."""
    old, new = _placements(world, 32)
    weights = make_weights(LAYERS, SLOTS, "plain")
    fill(weights, old, rank)
    migrator = eplb.Migrator(weights, timeout=1)
    handle = migrator.start(old, new)
    error, stalled = None, False
    deadline = time.monotonic() + 60
    try:
        while not handle.done and time.monotonic() < deadline:
            if handle.commit_ready() and rank == 1 and not stalled:
                stalled = True
                time.sleep(_eplb.deadlines(1.0)["collective"] + 1.5)
            time.sleep(0.002)
        handle.poll()
    except eplb.MigrationError as failure:
        error = _error(failure)
    handle.close()
    committed = handle.committed_layers
    return {"error": error, "committed": committed, "wrong": mismatches(weights, in_force(old, new, committed), rank)}


def raising_callback(rank: int, world: int, at_layer: int) -> dict:
    """Sync round; rank 1's on_layer callback raises after layer `at_layer`."""
    old, new = _placements(world, 33)
    weights = make_weights(LAYERS, SLOTS, "plain")
    fill(weights, old, rank)

    def on_layer(report):
        if rank == 1 and report["layer"] == at_layer:
            raise RuntimeError(f"engine bookkeeping failed at layer {report['layer']}")

    migrator = eplb.Migrator(weights, timeout=10, on_layer=on_layer)
    started = time.monotonic()
    outcome = {"error": None}
    try:
        migrator.migrate(old, new)
    except eplb.MigrationError as failure:
        outcome["error"] = _error(failure)
    outcome["seconds"] = time.monotonic() - started
    committed = outcome["error"]["committed"] if outcome["error"] else list(range(LAYERS))
    outcome["wrong"] = mismatches(weights, in_force(old, new, committed), rank)
    return outcome


def rewritten_during_async_round(rank: int, world: int) -> dict:
    """weights_rewritten() while an async round runs is refused; afterwards it works."""
    old, new = _placements(world, 34)
    weights = make_weights(LAYERS, SLOTS, "plain")
    fill(weights, old, rank)
    migrator = eplb.Migrator(weights, timeout=10, reuse_checksums=True)
    handle = migrator.start(old, new)
    refused = None
    try:
        migrator.weights_rewritten([0])
    except eplb.Error as failure:
        refused = {"type": type(failure).__name__, "code": failure.code, "message": str(failure)}
    while not handle.done:
        handle.commit_ready()
        time.sleep(0.002)
    handle.poll()
    migrator.weights_rewritten([0])  # the round is over: accepted
    migrator.migrate(new, old)
    return {"refused": refused, "wrong": mismatches(weights, old, rank)}


def metrics_of_an_unreported_async_round(rank: int, world: int) -> dict:
    """A collector counts an async round that ended although report() was never called."""
    from prometheus_client import CollectorRegistry

    import eplb.metrics

    old, new = _placements(world, 35)
    weights = make_weights(LAYERS, SLOTS, "plain")
    fill(weights, old, rank)
    migrator = eplb.Migrator(weights, timeout=10)
    registry = CollectorRegistry()
    eplb.metrics.collector(migrator, registry)
    handle = migrator.start(old, new)
    while not handle.done:
        handle.commit_ready()
        time.sleep(0.002)
    handle.poll()
    return {"rebalances": registry.get_sample_value("eplb_rebalances_total")}


def refused_spares(rank: int, world: int) -> dict:
    """commit="swap" on heap tensors with too little memory (simulated): refused on every rank."""
    import os

    old, _ = _placements(world, 36)
    weights = make_weights(LAYERS, SLOTS, "plain")
    fill(weights, old, rank)
    os.environ["EPLB_TEST_MEMAVAILABLE"] = "16KiB"
    try:
        eplb.Migrator(weights, timeout=10, commit="swap")
        return {"error": None}
    except eplb.Error as failure:
        return {"type": type(failure).__name__, "message": str(failure)}
    finally:
        del os.environ["EPLB_TEST_MEMAVAILABLE"]


def suite(rank: int, world: int) -> dict:
    """Every case on one spawned group (spawning is the slow part), but the stall: a deadline that
    passes inside a gloo collective leaves the group unusable, so that case has a group of its own."""
    return {"stale sync": stale_old_placement(rank, world, "sync"),
            "stale async swap": stale_old_placement(rank, world, "async swap"),
            "callback middle": raising_callback(rank, world, 0),
            "callback last": raising_callback(rank, world, LAYERS - 1),
            "rewritten": rewritten_during_async_round(rank, world),
            "metrics": metrics_of_an_unreported_async_round(rank, world),
            "spares": refused_spares(rank, world)}
