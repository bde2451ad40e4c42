"""What each rank of the data-plane tests runs (spawned by spawned.run_ranks over gloo): the migration
cases of migration_cases.py on the planes that run on a CPU (ucx, torch on a gloo data group, staged
through its device-copy test hook, nixl on DRAM), with experts of mixed dtypes (FP8 included), and
the torch plane's faults (a corrupted row, a stalled peer, a killed rank).
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import torch

import eplb
from async_cases import in_force
from migration_cases import SHAPES, fill, mismatches, random_placement

# An expert as FP8 weights, float32 block scales, bf16 biases and packed uint8 (issue 30 item 2).
MIXED = [((16, 32), getattr(torch, "float8_e4m3fn", torch.uint8)), ((4,), torch.float32), ((3, 8), torch.bfloat16),
         ((40,), torch.uint8)]


def make_mixed(layers: int, slots: int, allocate: str = "plain"):
    new = eplb.empty if allocate == "empty" else torch.empty
    return [[new((slots, *shape), dtype=dtype) for shape, dtype in MIXED] for _ in range(layers)]


def plane_options(transport: str) -> dict:
    """Migrator keyword arguments for `transport`: a gloo data group of every rank where it needs one."""
    options = {"transport": transport}
    if transport in ("torch", "staged"):
        import torch.distributed as dist

        options["data_group"] = dist.new_group(backend="gloo")
    return options


class CountedCopies:
    """The staged plane's device-copy hook: does each host <-> "device" copy (CPU rows here) and counts them."""

    def __init__(self):
        self.copies = 0

    def __call__(self, target, source):
        if target.data_ptr() == source.data_ptr():
            raise AssertionError("a staged copy onto itself")
        target.copy_(source)
        self.copies += 1


def _serve_async(migrator, weights, old, new, rank) -> dict:
    handle = migrator.start(old, new)
    wrong, deadline = [], time.monotonic() + 60
    while not handle.done and time.monotonic() < deadline:
        handle.commit_ready()
        wrong += mismatches(weights, in_force(old, new, handle.committed_layers), rank)
        time.sleep(0.002)
    report = handle.report()
    return {"wrong": wrong[:5], "plane": report["plane"], "committed": report["totals"]["layers_committed"]}


def shapes_on_plane(rank: int, world: int, transport: str) -> dict:
    """vLLM's 6 shapes of this world size: mixed-dtype experts, plain and eplb.empty tensors, sync
    rounds; and one async round. Every slot byte-exact, every layer's report naming the plane."""
    copies = None
    if transport == "staged":
        from eplb.planes import staged

        copies = staged.TEST_DEVICE_COPY = CountedCopies()
    options = plane_options(transport)
    results = []
    for case, (size, layers, slots, experts) in enumerate(SHAPES):
        if size != world:
            continue
        rng = np.random.default_rng(case)
        old = random_placement(rng, layers, slots * world, experts)
        new = random_placement(rng, layers, slots * world, experts)
        for allocate in ("plain", "empty"):
            weights = make_mixed(layers, slots, allocate)
            fill(weights, old, rank)
            report = eplb.Migrator(weights, timeout=20, **options).migrate(old, new)
            results.append({"shape": [size, layers, slots, experts], "allocate": allocate,
                            "wrong": mismatches(weights, new, rank), "verified": report["verified"],
                            "planes": sorted({item["plane"] for item in report["layers"]}),
                            "moved": report["totals"]["bytes_moved"]})
    old, new = random_placement(np.random.default_rng(9), 6, 4 * world, 4 * world - 2), \
        random_placement(np.random.default_rng(10), 6, 4 * world, 4 * world - 2)
    weights = make_mixed(6, 4)
    fill(weights, old, rank)
    async_result = _serve_async(eplb.Migrator(weights, timeout=20, **options), weights, old, new, rank)
    async_result["final"] = mismatches(weights, new, rank)
    return {"sync": results, "async": async_result, "staged_copies": copies.copies if copies else None}


def _round(rank, world, migrator, weights, old, new) -> dict:
    outcome = {"error": None, "committed": list(range(len(old)))}
    started = time.monotonic()
    try:
        report = migrator.migrate(old, new)
        outcome.update(retries=report["totals"]["retries"], plane=report["plane"],
                       moved=report["totals"]["bytes_moved"], failures=[item["failure"] for item in report["layers"] if item["failure"]][:1])
    except eplb.MigrationError as failure:
        outcome.update(error=str(failure), type=type(failure).__name__, code=failure.code, peer=failure.peer,
                       committed=failure.committed_layers)
    outcome["seconds"] = time.monotonic() - started
    expected = np.where(np.isin(np.arange(len(old)), outcome["committed"])[:, None], new, old)
    outcome["wrong"] = mismatches(weights, expected, rank)
    return outcome


def torch_plane_faults(rank: int, world: int) -> dict:
    """Corrupted rows (retried to a verified round; every attempt corrupt: aborted), and a stalled peer
    (TimeoutError on every rank; the Migrator then refuses rounds until set_data_group gives a new group)."""
    layers, slots, experts = 3, 4, 4 * world - 2
    rng = np.random.default_rng(21)
    old = random_placement(rng, layers, slots * world, experts)
    new = random_placement(rng, layers, slots * world, experts)
    results = {}
    for name, inject, retries in (("corrupt retried", "corrupt=0.5,seed=4", 6), ("corrupt aborted", "corrupt=1", 1)):
        weights = make_mixed(layers, slots)
        fill(weights, old, rank)
        migrator = eplb.Migrator(weights, timeout=10, retries=retries, inject=inject, **plane_options("torch"))
        results[name] = _round(rank, world, migrator, weights, old, new)
    weights = make_mixed(layers, slots)
    fill(weights, old, rank)
    timeout = 1.5
    migrator = eplb.Migrator(weights, timeout=timeout, retries=0, inject="stall=1" if rank == 1 else "",
                             **plane_options("torch"))
    stalled = _round(rank, world, migrator, weights, old, new)
    stalled["timeout"] = timeout
    try:
        migrator.migrate(old, new)
        stalled["refused"] = None
    except eplb.Error as refusal:
        stalled["refused"] = str(refusal)
    results["stall"] = stalled
    results["recovered"] = _recover(rank, world, migrator, weights, stalled["committed"], old, new)
    return results


def _recover(rank: int, world: int, migrator, weights, committed, old, new) -> dict:
    """After the timed-out round: a new gloo data group (the stall is over), then the same round again."""
    import torch.distributed as dist

    started = time.monotonic()
    try:
        migrator.set_data_group(dist.new_group(backend="gloo"), inject="")
    except eplb.Error as failure:
        return {"set_up_error": str(failure)}
    outcome = {"set_up_error": None, "set_up_seconds": time.monotonic() - started}
    current = np.where(np.isin(np.arange(len(old)), committed)[:, None], new, old)
    outcome.update(_round(rank, world, migrator, weights, current, new))
    outcome["wrong_after"] = mismatches(weights, new, rank)
    return outcome


def killed_on_torch_plane(rank: int, world: int, victim: int) -> dict:
    """The victim dies (SIGKILL) after layer 0 of a torch-plane round; the others name it."""
    layers, slots, experts = 4, 2, world
    rng = np.random.default_rng(5)
    old = random_placement(rng, layers, slots * world, experts)
    new = random_placement(rng, layers, slots * world, experts)
    weights = make_mixed(layers, slots)
    fill(weights, old, rank)

    def on_layer(layer_report):
        if rank == victim and layer_report["layer"] == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    timeout = 6.0
    migrator = eplb.Migrator(weights, timeout=timeout, on_layer=on_layer, **plane_options("torch"))
    outcome = _round(rank, world, migrator, weights, old, new)
    outcome["timeout"] = timeout
    from spawned import wait_for_survivors

    wait_for_survivors(rank, [r for r in range(world) if r != victim])
    return outcome
