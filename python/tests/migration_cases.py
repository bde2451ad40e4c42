"""What each rank of the eplb.Migrator tests runs (in processes spawned by spawned.run_ranks).

Expert content is derived from (expert, layer, tensor, position), so every rank knows what every
slot must hold under any placement. Every layer has two tensors of different dtypes and shapes.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import torch

import eplb

# (world, layers, local slots, logical experts): the six shapes.
SHAPES = [(2, 1, 2, 3), (2, 2, 3, 4), (2, 4, 8, 16), (4, 1, 2, 6), (4, 2, 2, 5), (4, 8, 8, 16)]
TENSORS = [((16, 32), torch.float32), ((3, 8), torch.bfloat16)]  # per-expert shape, dtype


def expert_bytes(expert: int, layer: int, tensor: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng([expert, layer, tensor]).integers(0, 256, nbytes, dtype=np.uint8)


def make_weights(layers: int, slots: int, allocate: str):
    new = eplb.empty if allocate == "empty" else torch.empty
    return [[new((slots, *shape), dtype=dtype) for shape, dtype in TENSORS] for _ in range(layers)]


def fill(weights, phy2log, rank: int) -> None:
    for l, layer in enumerate(weights):
        for t, tensor in enumerate(layer):
            rows = tensor.view(tensor.shape[0], -1).view(torch.uint8)
            for i in range(tensor.shape[0]):
                expert = int(phy2log[l][rank * tensor.shape[0] + i])
                rows[i] = torch.from_numpy(expert_bytes(expert, l, t, rows.shape[1]))


def mismatches(weights, phy2log, rank: int, rewritten=()) -> list[str]:
    """Every (layer, slot, tensor) whose bytes are not its expert's under phy2log.

    rewritten: layers whose rows the engine rewrote (their expert's bytes XOR 0x5A, see rewrite).
    """
    wrong = []
    for l, layer in enumerate(weights):
        for t, tensor in enumerate(layer):
            rows = tensor.view(tensor.shape[0], -1).view(torch.uint8).numpy()
            for i in range(tensor.shape[0]):
                slot = rank * tensor.shape[0] + i
                expected = expert_bytes(int(phy2log[l][slot]), l, t, rows.shape[1])
                if not np.array_equal(rows[i], expected ^ 0x5A if l in rewritten else expected):
                    wrong.append(f"layer {l} slot {slot} tensor {t}")
    return wrong


def random_placement(rng, layers: int, slots: int, experts: int) -> np.ndarray:
    """[layers][slots] with every expert at least once and random replicas."""
    rows = []
    for _ in range(layers):
        row = np.concatenate([rng.permutation(experts), rng.integers(0, experts, slots - experts)])
        rows.append(rng.permutation(row))
    return np.array(rows, dtype=np.int64)


def shapes_round_trip(rank: int, world: int) -> list[dict]:
    """Every shape of this world size, over plain and eplb.empty tensors: byte-exact after migrate."""
    results = []
    for case, (size, layers, slots, experts) in enumerate(SHAPES):
        if size != world:
            continue
        rng = np.random.default_rng(case)
        old = random_placement(rng, layers, slots * world, experts)
        new = random_placement(rng, layers, slots * world, experts)
        for allocate in ("plain", "empty"):
            weights = make_weights(layers, slots, allocate)
            fill(weights, old, rank)
            migrator = eplb.Migrator(weights, timeout=20)
            report = migrator.migrate(old, new)
            results.append({"shape": [size, layers, slots, experts], "allocate": allocate,
                            "wrong": mismatches(weights, new, rank), "verified": report["verified"],
                            "paths": sorted({item["path"] for item in report["layers"]}),
                            "committed": report["totals"]["layers_committed"],
                            "moved": report["totals"]["bytes_moved"]})
    return results


def rewrite(weights, layer: int) -> None:
    """The engine writes a layer's rows itself (a weight reload): every byte XOR 0x5A."""
    for tensor in weights[layer]:
        rows = tensor.view(torch.uint8)
        rows.copy_(rows ^ 0x5A)


def reused_checksums(rank: int, world: int) -> dict:
    """reuse_checksums=True: later rounds reuse checksums; an unannounced rewrite fails loudly, an announced one works.

    Every expert moves to the next rank each round, so every row is read by a peer and checked.
    """
    layers, slots = 2, 3
    home = np.tile(np.arange(slots * world) % (2 * slots), (layers, 1))
    away = np.roll(home, slots, axis=1)
    weights = make_weights(layers, slots, "plain")
    fill(weights, home, rank)
    migrator = eplb.Migrator(weights, timeout=20, retries=1, reuse_checksums=True)
    migrator.migrate(home, away)
    outcome = {"first": mismatches(weights, away, rank)}
    migrator.migrate(away, home)
    outcome["second"] = mismatches(weights, home, rank)
    rewrite(weights, 0)  # not announced: the checksums eplb remembers for layer 0 are stale
    try:
        migrator.migrate(home, away)
        outcome["stale"], committed = None, list(range(layers))
    except eplb.MigrationError as failure:
        outcome["stale"], committed = str(failure), failure.committed_layers
    outcome["stale_committed"] = committed
    current = np.where(np.isin(np.arange(layers), committed)[:, None], away, home)
    outcome["after_stale"] = mismatches(weights, current, rank, rewritten={0})
    migrator.weights_rewritten([0])
    migrator.migrate(current, away)
    outcome["announced"] = mismatches(weights, away, rank, rewritten={0})
    try:
        migrator.weights_rewritten([layers])
        outcome["bad_layer"] = None
    except eplb.Error as failure:
        outcome["bad_layer"] = str(failure)
    # The default hashes sources every round: an unannounced rewrite is simply moved.
    plain = make_weights(layers, slots, "plain")
    fill(plain, home, rank)
    default = eplb.Migrator(plain, timeout=20)
    default.migrate(home, away)
    rewrite(plain, 1)
    default.migrate(away, home)
    outcome["default"] = mismatches(plain, home, rank, rewritten={1})
    return outcome


def no_change(rank: int, world: int) -> dict:
    layers, slots, experts = 2, 3, 4
    placement = random_placement(np.random.default_rng(7), layers, slots * world, experts)
    weights = make_weights(layers, slots, "plain")
    fill(weights, placement, rank)
    report = eplb.Migrator(weights, timeout=20).migrate(placement, placement)
    return {"moved": report["totals"]["bytes_moved"], "changed": [item["changed"] for item in report["layers"]],
            "wrong": mismatches(weights, placement, rank)}


def layout_mismatch(rank: int, world: int) -> dict:
    """The last rank's second tensor of layer 1 is one column short; a CUDA-free local problem on rank 0 too."""
    layers, slots = 2, 2
    weights = make_weights(layers, slots, "plain")
    if rank == world - 1:
        weights[1][1] = torch.zeros((slots, 3, 7), dtype=torch.bfloat16)
    before = [t.clone() for layer in weights for t in layer]
    try:
        eplb.Migrator(weights, timeout=20)
        outcome = {"raised": None}
    except eplb.LayoutError as failure:
        outcome = {"raised": str(failure)}
    outcome["untouched"] = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                               for a, b in zip(before, [t for layer in weights for t in layer]))
    strided = [[torch.zeros((4, slots), dtype=torch.float32).t()]]
    try:
        eplb.Migrator(strided, timeout=20)
        outcome["strided"] = None
    except eplb.LayoutError as failure:
        outcome["strided"] = str(failure)
    return outcome


def faults(rank: int, world: int, spec: str, timeout: float, retries: int) -> dict:
    """A round under injected faults: committed, or aborted with each layer wholly old or wholly new."""
    layers, slots, experts = 4, 4, 4 * world - 2
    rng = np.random.default_rng(11)
    old = random_placement(rng, layers, slots * world, experts)
    new = random_placement(rng, layers, slots * world, experts)
    weights = make_weights(layers, slots, "plain")
    fill(weights, old, rank)
    migrator = eplb.Migrator(weights, timeout=timeout, retries=retries, inject=f"{spec},seed={rank + 3}")
    outcome = {"error": None, "committed": list(range(layers))}
    try:
        report = migrator.migrate(old, new)
        outcome["retries"] = report["totals"]["retries"]
        outcome["failures"] = [item["failure"] for item in report["layers"] if item["failure"]][:1]
    except eplb.MigrationError as failure:
        outcome.update(error=str(failure), type=type(failure).__name__, layer=failure.layer,
                       committed=failure.committed_layers, operation=failure.operation, state=failure.state)
    expected = np.where(np.isin(np.arange(layers), outcome["committed"])[:, None], new, old)
    outcome["wrong"] = mismatches(weights, expected, rank)
    return outcome


def killed_rank(rank: int, world: int, victim: int, store_port: int | None = None) -> dict:
    """The victim dies (SIGKILL) after layer 0; the others must raise PeerLostError naming it.

    store_port: eplb's check-in keys go to a TCPStore served there (by the test process), not to the
    default group's store on rank 0, so that rank 0 itself can be the victim.
    """
    from datetime import timedelta

    import torch.distributed as dist
    layers, slots, experts = 4, 2, world
    rng = np.random.default_rng(5)
    old = random_placement(rng, layers, slots * world, experts)
    new = random_placement(rng, layers, slots * world, experts)
    weights = make_weights(layers, slots, "plain")
    fill(weights, old, rank)

    def on_layer(layer_report):
        if rank == victim and layer_report["layer"] == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    timeout = 8.0
    group = None
    if store_port is not None:
        store = dist.TCPStore("127.0.0.1", store_port, None, False, timedelta(seconds=20))
        group = eplb.ProcessGroup.from_torch(None, store=store)
    migrator = eplb.Migrator(weights, group=group, timeout=timeout, on_layer=on_layer)
    import time
    started = time.monotonic()
    try:
        migrator.migrate(old, new)
        return {"error": None}
    except eplb.MigrationError as failure:
        outcome = {"error": str(failure), "type": type(failure).__name__, "peer": failure.peer,
                   "seconds": time.monotonic() - started, "timeout": timeout, "committed": failure.committed_layers,
                   "layer": failure.layer, "operation": failure.operation}
        from spawned import wait_for_survivors

        wait_for_survivors(rank, [r for r in range(world) if r != victim])
        return outcome


def explicit_store(rank: int, world: int) -> dict:
    """ProcessGroup.from_torch(store=...): eplb's check-in keys in a TCPStore of the test's own."""
    from datetime import timedelta

    import torch.distributed as dist
    from spawned import free_port

    port = [free_port() if rank == 0 else 0]
    dist.broadcast_object_list(port, src=0)
    store = dist.TCPStore("127.0.0.1", port[0], world, rank == 0, timedelta(seconds=20))
    group = eplb.ProcessGroup.from_torch(None, store=store)
    layers, slots, experts = 2, 3, 4
    rng = np.random.default_rng(11)
    old = random_placement(rng, layers, slots * world, experts)
    new = random_placement(rng, layers, slots * world, experts)
    weights = make_weights(layers, slots, "plain")
    fill(weights, old, rank)
    report = eplb.Migrator(weights, group=group, timeout=20).migrate(old, new)
    keys = store.num_keys()  # eplb's check-in counters live here (plus the store's own)
    # Rank 0 serves the store: it must outlive every rank's last use of it (rank 0 leaving first
    # shut it down under a slower rank 1's num_keys(): "Failed to recv ... connection closed").
    dist.barrier()
    try:
        eplb.ProcessGroup.from_torch(None, store="127.0.0.1:29500")
        refused = None
    except eplb.Error as failure:
        refused = str(failure)
    return {"wrong": mismatches(weights, new, rank), "verified": report["verified"], "keys": keys,
            "refused": refused}


# (name, fault spec, timeout, retries): retried to success, or aborted on every rank.
FAULTS = [("err retried", "err=0.3", 10.0, 12), ("corrupt retried", "corrupt=0.3", 10.0, 12),
          ("stall retried", "stall=0.25", 1.0, 12), ("err aborted", "err=1.0", 10.0, 1)]


# Data lengths around the group's inline record (4 KiB): one gloo all_gather or two.
GATHER_LENGTHS = [0, 1, 4095, 4096, 4097, 20011]


def gathered_bytes(rank: int, length: int) -> bytes:
    return bytes((rank * 31 + i * 7 + length) % 251 for i in range(length))


def allgather_lengths(rank: int, world: int) -> list[str]:
    """ProcessGroup.from_torch().allgather with the ranks' lengths mixed; the wrong results, if any."""
    group = eplb.ProcessGroup.from_torch()
    wrong = []
    for i in range(len(GATHER_LENGTHS)):
        lengths = [GATHER_LENGTHS[(i + r) % len(GATHER_LENGTHS)] for r in range(world)]
        got = group.allgather(gathered_bytes(rank, lengths[rank]), 20.0)
        wrong += [f"call {i} rank {r}: {len(got[r])} B" for r in range(world)
                  if got[r] != gathered_bytes(r, lengths[r])]
    return wrong


def lost_in_a_collective(rank: int, world: int, victim: int) -> dict:
    """The victim dies (SIGKILL) between two allgathers; how the second failed on each survivor."""
    import time

    from spawned import wait_for_survivors

    group = eplb.ProcessGroup.from_torch()
    group.allgather(b"everyone", 20.0)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        group.allgather(b"the survivors", 20.0)
        return {"error": None}
    except eplb.Error as failure:
        outcome = {"error": str(failure), "code": failure.code, "seconds": time.monotonic() - started}
    wait_for_survivors(rank, [r for r in range(world) if r != victim])
    return outcome


def make_parameters(layers: int, slots: int):
    """Expert weights as an engine module holds them: nn.Parameters (requires_grad, as loaded)."""
    return [[torch.nn.Parameter(tensor) for tensor in layer] for layer in make_weights(layers, slots, "plain")]


def swap_rounds(rank: int, world: int) -> dict:
    """commit="swap": three rounds byte-exact in the engine's own tensor objects (plain, eplb.empty,
    nn.Parameter), which now sit on the other buffer; then an unrecoverable fault leaves every layer
    old; and a view of a larger tensor is refused on every rank."""
    layers, slots, experts = 3, 4, 4 * world - 1
    rng = np.random.default_rng(31)
    placements = [random_placement(rng, layers, slots * world, experts) for _ in range(4)]
    outcome = {}
    for allocate in ("plain", "empty", "parameter"):
        weights = make_parameters(layers, slots) if allocate == "parameter" else make_weights(layers, slots, allocate)
        objects = [id(tensor) for layer in weights for tensor in layer]
        first = [tensor.data_ptr() for layer in weights for tensor in layer]
        fill(weights, placements[0], rank)
        migrator = eplb.Migrator(weights, timeout=20, commit="swap")
        rounds = []
        for old, new in zip(placements, placements[1:]):
            report = migrator.migrate(old, new)
            rounds.append({"wrong": mismatches(weights, new, rank), "commit": report["commit"],
                           "verified": report["verified"], "moved": report["totals"]["bytes_moved"],
                           "moved_pointers": sum(tensor.data_ptr() not in first for layer in weights
                                                 for tensor in layer)})
        outcome[allocate] = {"rounds": rounds, "same_objects": objects == [id(t) for layer in weights for t in layer],
                             "spare_bytes": migrator.spare_bytes,
                             "bytes": sum(t.numel() * t.element_size() for layer in weights for t in layer),
                             "parameters": all(isinstance(t, torch.nn.Parameter) for layer in weights for t in layer)}
    weights = make_weights(layers, slots, "plain")
    fill(weights, placements[0], rank)
    migrator = eplb.Migrator(weights, timeout=5, retries=1, commit="swap", inject=f"err=1,seed={rank + 3}")
    try:
        migrator.migrate(placements[0], placements[1])
        outcome["fault"] = {"error": None}
    except eplb.MigrationError as failure:
        outcome["fault"] = {"error": str(failure), "committed": failure.committed_layers,
                            "wrong": mismatches(weights, placements[0], rank)}
    # An on_layer callback that raises (on every rank, after layer 0): the round stops at the next vote
    # with a MigrationError caused by it; layer 0 is new, and the engine's tensors must show its new
    # rows (the swap re-points them) and the old rows of the other layers.
    weights = make_weights(layers, slots, "plain")
    fill(weights, placements[0], rank)

    def failing_callback(layer_report):
        raise KeyError(f"engine callback failed at layer {layer_report['layer']}")

    migrator = eplb.Migrator(weights, timeout=20, commit="swap", on_layer=failing_callback)
    try:
        migrator.migrate(placements[0], placements[1])
        outcome["callback"] = {"error": None}
    except eplb.MigrationError as failure:
        committed = failure.committed_layers
        in_force = np.where(np.isin(np.arange(layers), committed)[:, None], placements[1], placements[0])
        outcome["callback"] = {"error": str(failure), "cause": repr(failure.__cause__), "committed": committed,
                               "wrong": mismatches(weights, in_force, rank)}
    big = torch.empty((layers, slots, 8), dtype=torch.float32)
    try:
        eplb.Migrator([[big[l]] for l in range(layers)], timeout=20, commit="swap")
        outcome["view"] = None
    except eplb.LayoutError as failure:
        outcome["view"] = str(failure)
    return outcome


def scheduled_rounds(rank: int, world: int) -> dict:
    """transfer_schedule (issue 31) on 2 emulated hosts: each name (fenced rounds too) moves every row
    exactly; the torch plane, which posts a layer's rows at once, refuses it on every rank (the C++
    set-up's check)."""
    layers, slots, experts = 2, 3, 2 * world
    rng = np.random.default_rng(31)
    outcome = {}
    for name in ("off", "ranks", "hosts", "hosts-fenced"):
        old, new = (random_placement(rng, layers, slots * world, experts) for _ in range(2))
        weights = make_weights(layers, slots, "plain")
        fill(weights, old, rank)
        report = eplb.Migrator(weights, num_nodes=2, timeout=20, transfer_schedule=name).migrate(old, new)
        outcome[name] = {"wrong": mismatches(weights, new, rank), "schedule": report["transfer_schedule"],
                         "inter_node": report["totals"]["bytes_inter_node"]}
    try:
        eplb.Migrator(make_weights(layers, slots, "plain"), transport="torch",
                      data_group=torch.distributed.group.WORLD, timeout=20, transfer_schedule="hosts")
        outcome["torch"] = None
    except eplb.Error as failure:
        outcome["torch"] = str(failure)
    try:  # fenced rounds are collective: every rank must use the same schedule
        eplb.Migrator(make_weights(layers, slots, "plain"), num_nodes=2, timeout=20,
                      transfer_schedule="hosts" if rank == 0 else "hosts-fenced")
        outcome["mixed"] = None
    except eplb.Error as failure:
        outcome["mixed"] = str(failure)
    return outcome


def suite(rank: int, world: int, fault_names: list[str]) -> dict:
    """Several cases on one spawned group (spawning is the slow part)."""
    results = {"shapes": shapes_round_trip(rank, world), "allgather": allgather_lengths(rank, world),
               "swap": swap_rounds(rank, world)}
    if world == 4:
        results["scheduled"] = scheduled_rounds(rank, world)
    if world == 2:
        results["no_change"] = no_change(rank, world)
        results["reused_checksums"] = reused_checksums(rank, world)
        results["layout"] = layout_mismatch(rank, world)
        results["explicit_store"] = explicit_store(rank, world)
    results["faults"] = {name: faults(rank, world, spec, timeout, retries)
                         for name, spec, timeout, retries in FAULTS if name in fault_names}
    return results
