"""What each rank of the eplb.Migrator.start tests runs (spawned by spawned.run_ranks over gloo).

A serving loop calls commit_ready() once per step (a short sleep stands in for the forward pass)
and, after every step's call, checks every slot byte for byte against the mapping in force: the
layers committed so far new, the others old.
"""
from __future__ import annotations

import time

import numpy as np

import eplb
from migration_cases import fill, make_weights, mismatches, random_placement

LAYERS, SLOTS = 6, 4


def in_force(old, new, committed) -> np.ndarray:
    return np.where(np.isin(np.arange(len(old)), list(committed))[:, None], new, old)


def serve(handle, weights, old, new, rank, *, abort_after_first=False, limit_seconds=60.0) -> dict:
    """Serving steps until the round is done; returns commit steps, mismatches and the error."""
    commits, wrong, error = {}, [], None
    deadline = time.monotonic() + limit_seconds
    try:
        while not handle.done:
            assert time.monotonic() < deadline, f"the round did not end within {limit_seconds} s"
            for layer in handle.commit_ready():
                commits[str(layer)] = handle.step
                if abort_after_first:
                    handle.abort()
            wrong += mismatches(weights, in_force(old, new, handle.committed_layers), rank)
            time.sleep(0.002)
        handle.poll()  # the round may have failed after the last commit_ready()
    except eplb.MigrationError as failure:
        error = {"type": type(failure).__name__, "code": failure.code, "message": str(failure),
                 "committed": failure.committed_layers}
    wrong += mismatches(weights, in_force(old, new, handle.committed_layers), rank)
    return {"commits": commits, "wrong": wrong[:5], "error": error, "committed": handle.committed_layers,
            "aborted": handle.aborted, "steps": handle.step + 1}


def placements(world: int, seed: int):
    rng = np.random.default_rng(seed)
    experts = SLOTS * world - 2
    return (random_placement(rng, LAYERS, SLOTS * world, experts),
            random_placement(rng, LAYERS, SLOTS * world, experts))


def case_setup(rank: int, world: int, seed: int, allocate: str = "plain", **migrator_options):
    """(old, new, weights filled for `old`, a Migrator over them) for one case."""
    old, new = placements(world, seed)
    weights = make_weights(LAYERS, SLOTS, allocate)
    fill(weights, old, rank)
    options = {"timeout": 20, **migrator_options}
    return old, new, weights, eplb.Migrator(weights, **options)


def full_round(rank: int, world: int, allocate: str, commit: str = "copy") -> dict:
    old, new, weights, migrator = case_setup(rank, world, 21, allocate, commit=commit)
    handle = migrator.start(old, new)
    outcome = serve(handle, weights, old, new, rank)
    report = handle.report()
    outcome.update(moved=report["totals"]["bytes_moved"], layers_committed=report["totals"]["layers_committed"],
                   final_wrong=mismatches(weights, new, rank)[:5])
    # The Migrator runs a sync round afterwards, back to the old placement.
    migrator.migrate(new, old)
    outcome["back_wrong"] = mismatches(weights, old, rank)[:5]
    return outcome


def aborted_round(rank: int, world: int) -> dict:
    """Every rank aborts right after the first commit (the same step everywhere)."""
    old, new, weights, migrator = case_setup(rank, world, 22)
    with migrator.start(old, new) as handle:
        outcome = serve(handle, weights, old, new, rank, abort_after_first=True)
    outcome["report_committed"] = handle.report()["totals"]["layers_committed"]
    return outcome


def aborted_by_rank_zero(rank: int, world: int) -> dict:
    """Only rank 0 aborts: the other ranks see a MigrationError naming it."""
    old, new, weights, migrator = case_setup(rank, world, 23)
    handle = migrator.start(old, new)
    if rank == 0:
        handle.abort()
    return serve(handle, weights, old, new, rank)


def failed_round(rank: int, world: int) -> dict:
    """Every transfer fails: the sync path's MigrationError from commit_ready, everything old."""
    old, new, weights, migrator = case_setup(rank, world, 24, timeout=10, retries=1, inject=f"err=1.0,seed={rank + 3}")
    handle = migrator.start(old, new)
    outcome = serve(handle, weights, old, new, rank)
    try:
        handle.poll()
        outcome["poll"] = None
    except eplb.MigrationError as failure:
        outcome["poll"] = type(failure).__name__
    return outcome


def misuse(rank: int, world: int) -> dict:
    """Bad arguments and a second round while one runs are refused with eplb.Error."""
    old, new, weights, migrator = case_setup(rank, world, 25)
    refused = {}
    for name, call in [("lead_steps", lambda: migrator.start(old, new, lead_steps=0))]:
        try:
            call()
            refused[name] = None
        except eplb.Error as failure:
            refused[name] = str(failure)
    handle = migrator.start(old, new)
    for name, call in [("max_layers", lambda: handle.commit_ready(max_layers=0)),
                       ("second round", lambda: migrator.migrate(old, new)),
                       ("early report", handle.report)]:
        try:
            call()
            refused[name] = None
        except eplb.Error as failure:
            refused[name] = str(failure)
    outcome = serve(handle, weights, old, new, rank)
    outcome["refused"] = refused
    return outcome


def suite(rank: int, world: int) -> dict:
    """Every async case on one spawned group (spawning is the slow part)."""
    return {"plain": full_round(rank, world, "plain"), "empty": full_round(rank, world, "empty"),
            "plain swap": full_round(rank, world, "plain", "swap"), "empty swap": full_round(rank, world, "empty", "swap"),
            "aborted": aborted_round(rank, world), "aborted_by_zero": aborted_by_rank_zero(rank, world),
            "failed": failed_round(rank, world), "misuse": misuse(rank, world)}
