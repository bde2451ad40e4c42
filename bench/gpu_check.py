"""The GPU check of issue 30 (run by bench/gpu_check.sh; docs/gpu.md "The GPU check").

Contract: `python3 bench/gpu_check.py --out FILE [--device auto|cuda|cpu] [--seconds S]
[--no-extension WHY]` runs the rows below, prints them as a table and writes them, with the
machine's description, to FILE (JSON). Every row: name, result (PASS, FAIL, SKIP or a number),
the ratio to its peer measured in the same run where there is one, and the condition. With
--device cpu (or no CUDA) the same code runs on CPU tensors: that is how its logic is tested on a
machine without a GPU; the numbers then say nothing about a GPU.
- digest parity: eplb-dev64 (python/eplb/digest.py) of the known-answer vectors (tests/common/
  text_bytes_test.cpp) and of random rows (one past the 4 MiB chunk), plain Python reference vs
  torch ops on the CPU vs torch ops on the device vs the extension's C++ loop (when built).
- digest GB/s vs a device-to-device copy of the same bytes (paired, alternating, median, spread).
- staged round on one device, two processes (gloo control group and gloo data_group on 127.0.0.1):
  byte-exact; a corrupted row retried to a verified round; corruption on every attempt aborted with
  the same outcome on both ranks, every layer wholly old or wholly new.
- staged GB/s vs pinned D2H + H2D copies of the same bytes (paired, alternating).
- torch plane: on CUDA an NCCL data_group with one GPU per rank (needs 2 GPUs, else SKIP); on the
  CPU a gloo one. Byte-exact, and GB/s vs a bare batch_isend_irecv of the same rows.
- a bf16 matmul's step time while an async staged round runs on the side stream, vs without.
Needs only torch for the digest rows: without the extension (--no-extension, or `import eplb`
failing) digest.py is loaded from its file and the other rows are SKIP with the reason. Every
spawned process is joined with a timeout (killed past it); temporary files are removed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
KATS = [(b"", 0x0), (b"abc", 0xB1F9597D70F30D6A), (bytes(range(256)), 0x3A837ACDEFD578D5)]
ROWS: list[dict] = []


def add(name: str, result, condition: str, ratio=None, **extra) -> None:
    ROWS.append({"check": name, "result": result, "ratio": ratio, "condition": condition, **extra})


def load_digest():
    """eplb.digest, or the same file loaded alone when the extension is not there (it needs only torch)."""
    try:
        import eplb.digest

        return eplb.digest, True
    except Exception:  # noqa: BLE001  (no extension: digest.py stands alone)
        spec = importlib.util.spec_from_file_location("eplb_digest", ROOT / "python" / "eplb" / "digest.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, False


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def size_text(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.1f} KiB"


def spread(times, nbytes) -> dict:
    rates = sorted(nbytes / t / 1e9 for t in times)
    return {"gb_s": round(nbytes / statistics.median(times) / 1e9, 3), "min": round(rates[0], 3),
            "max": round(rates[-1], 3), "runs": len(times)}


# ---------------------------------------------------------------- digest rows (one process)

def digest_parity(digest, device, with_extension: bool) -> None:
    failures, compared = [], 0
    for data, known in KATS:
        row = torch.tensor(list(data), dtype=torch.uint8).reshape(1, len(data))
        got = {"reference": digest.reference_digest(data), "cpu torch": digest.digest_rows_with_torch(row)[0],
               f"{device.type} torch": digest.digest_rows_with_torch(row.to(device))[0]}
        if with_extension:
            got["cpu C++"] = digest.digest_rows(row)[0]
        failures += [f"{len(data)} B {how}: {value:#x} != {known:#x}" for how, value in got.items() if value != known]
        compared += 1
    generator = torch.Generator().manual_seed(30)
    for length in (1, 3, 4, 1023, 4096, (1 << 22) + 3):
        rows = torch.randint(0, 256, (4, length), dtype=torch.uint8, generator=generator)
        cpu = digest.digest_rows_with_torch(rows)
        others = {f"{device.type} torch": digest.digest_rows_with_torch(rows.to(device))}
        if with_extension:
            others["cpu C++"] = digest.digest_rows(rows)
        if length <= 4096:
            others["reference"] = [digest.reference_digest(bytes(r.tolist())) for r in rows]
        failures += [f"{length} B rows: {how} differs from cpu torch" for how, got in others.items() if got != cpu]
        compared += 1
    add("digest parity", "FAIL" if failures else "PASS",
        f"{compared} vectors (3 known answers, 6 random lengths up to 4 MiB + 3 B): reference, CPU torch, "
        f"{'no device: CPU only' if device.type == 'cpu' else device.type + ' torch'}"
        f"{', CPU C++' if with_extension else ' (no extension: C++ loop not compared)'}",
        failures=failures[:5])


def digest_speed(digest, device, rows: int, length: int, runs: int) -> None:
    data = torch.randint(0, 256, (rows, length), dtype=torch.uint8, device=device)
    target = torch.empty_like(data)
    digest.digest_rows_with_torch(data)  # warm-up: multipliers, kernels
    copies, digests = [], []
    for _ in range(runs):  # paired, alternating
        sync(device)
        started = time.perf_counter()
        target.copy_(data)
        sync(device)
        copies.append(time.perf_counter() - started)
        started = time.perf_counter()
        digest.digest_rows_with_torch(data)  # ends with the [rows] results on the host
        digests.append(time.perf_counter() - started)
    nbytes = rows * length
    mine, peer = spread(digests, nbytes), spread(copies, nbytes)
    add("digest GB/s", mine["gb_s"], f"{rows} rows x {length >> 20} MiB on {device}, eplb-dev64 torch ops incl. the "
        f"digests' copy to the host; peer: {device} copy_ of the same bytes ({peer['gb_s']} GB/s); "
        f"median of {runs} paired runs", ratio=round(mine["gb_s"] / peer["gb_s"], 3), spread=mine, peer=peer)


# ---------------------------------------------------------------- spawned ranks

def spawn(world: int, task: str, options: dict, timeout: float) -> list:
    """task(rank, world, options) on `world` spawned ranks of a gloo group on 127.0.0.1: their results."""
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tempfile.mkdtemp(prefix="eplb-gpu-check-")
    try:
        context = mp.start_processes(_rank_main, args=(world, port, out, task, options), nprocs=world, join=False,
                                     start_method="spawn")
        deadline = time.monotonic() + timeout
        for process in context.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        overran = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
        for rank in overran:
            context.processes[rank].kill()
            context.processes[rank].join(10)
        results = []
        for rank, process in enumerate(context.processes):
            path = Path(out, f"rank{rank}.json")
            results.append(json.loads(path.read_text()) if path.exists() else
                           {"error": f"rank {rank} {'overran ' + str(int(timeout)) + ' s' if rank in overran else 'exited with ' + str(process.exitcode)}"})
        return results
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _rank_main(rank: int, world: int, port: int, out: str, task: str, options: dict) -> None:
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        value = {"ok": TASKS[task](rank, world, options)}
    except BaseException as failure:  # noqa: BLE001  (reported as the row's FAIL)
        value = {"error": f"{type(failure).__name__}: {failure}", "traceback": traceback.format_exc()[-3000:]}
    Path(out, f"rank{rank}.json").write_text(json.dumps(value))
    os._exit(0)  # no group teardown: a lost peer would make gloo's destructor wait


def expert_tables(layers: int, experts: int, shapes, device):
    """[layer][tensor] = [experts, bytes] uint8: the bytes every expert's tensor must hold, on `device`."""
    generator = torch.Generator().manual_seed(7)
    tables = []
    for _ in range(layers):
        tables.append([torch.randint(0, 256, (experts, n_bytes(shape, dtype)), dtype=torch.uint8,
                                     generator=generator).to(device) for shape, dtype in shapes])
    return tables


def n_bytes(shape, dtype) -> int:
    count = 1
    for extent in shape:
        count *= extent
    return count * torch.empty(0, dtype=dtype).element_size()


def rows_of(tensor):
    return tensor.view(tensor.shape[0], -1).view(torch.uint8)


def fill(weights, tables, phy2log, rank: int) -> None:
    for l, layer in enumerate(weights):
        slots = layer[0].shape[0]
        index = torch.as_tensor(phy2log[l][rank * slots:(rank + 1) * slots], device=tables[l][0].device)
        for t, tensor in enumerate(layer):
            rows_of(tensor).copy_(tables[l][t].index_select(0, index))


def wrong_rows(weights, tables, phy2log, rank: int) -> list:
    wrong = []
    for l, layer in enumerate(weights):
        slots = layer[0].shape[0]
        index = torch.as_tensor(phy2log[l][rank * slots:(rank + 1) * slots], device=tables[l][0].device)
        for t, tensor in enumerate(layer):
            if not torch.equal(rows_of(tensor), tables[l][t].index_select(0, index)):
                wrong.append([l, t])
    return wrong


def placements(layers: int, slots: int, world: int, seed: int):
    """(random, swap, identity) over slots * world experts: random permutations; `swap` moves every slot to the next rank."""
    import numpy as np

    rng = np.random.default_rng(seed)
    total = slots * world
    random_rows = [rng.permutation(total) for _ in range(layers)]
    identity = np.tile(np.arange(total), (layers, 1))
    swap = np.tile(np.roll(np.arange(total), slots), (layers, 1))
    return np.array(random_rows, dtype=np.int64), swap, identity


def rank_setup(rank: int, options: dict):
    """(device, weights, tables): this rank's expert tensors, filled for the identity placement."""
    device = torch.device(options["device"].replace("RANK", str(rank)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    import torch.distributed as dist

    BARRIER_GROUP[0] = dist.new_group(backend="gloo")
    shapes = [(tuple(shape), getattr(torch, dtype, torch.uint8)) for shape, dtype in options["shapes"]]
    layers, slots, world = options["layers"], options["slots"], 2
    weights = [[torch.empty((slots, *shape), dtype=dtype, device=device) for shape, dtype in shapes]
               for _ in range(layers)]
    tables = expert_tables(layers, slots * world, shapes, device)
    return device, weights, tables


def migrator(weights, transport: str, backend: str, **options):
    import eplb
    import torch.distributed as dist

    return eplb.Migrator(weights, transport=transport, data_group=dist.new_group(backend=backend), **options)


def exact_rounds(rank, weights, tables, transport, backend) -> dict:
    """A random placement, then every slot to the other rank and back: byte-exact, verified, plane named."""
    random_new, swap, identity = placements(len(weights), weights[0][0].shape[0], 2, 11)
    fill(weights, tables, identity, rank)
    moving = migrator(weights, transport, backend, timeout=60)
    out = []
    for old, new in ((identity, random_new), (random_new, swap), (swap, identity)):
        report = moving.migrate(old, new)
        sync(weights[0][0].device)
        out.append({"wrong": wrong_rows(weights, tables, new, rank), "verified": report["verified"],
                    "planes": sorted({item["plane"] for item in report["layers"]}),
                    "read": report["totals"]["bytes_read_here"]})
    return {"rounds": out}


def fault_rounds(rank, weights, tables, transport, backend) -> dict:
    """Corrupted rows: retried to a verified round; corrupt on every attempt: aborted the same way everywhere."""
    import numpy as np

    import eplb

    _, swap, identity = placements(len(weights), weights[0][0].shape[0], 2, 11)
    out = {}
    for name, inject, retries in (("retried", "corrupt=0.5,seed=4", 6), ("aborted", "corrupt=1", 1)):
        fill(weights, tables, identity, rank)
        outcome = {"error": None, "committed": list(range(len(weights))), "retries": 0}
        try:
            report = migrator(weights, transport, backend, timeout=60, retries=retries, inject=inject).migrate(
                identity, swap)
            outcome["retries"] = report["totals"]["retries"]
        except eplb.MigrationError as failure:
            outcome.update(error=str(failure)[:300], type=type(failure).__name__, code=failure.code,
                           committed=list(failure.committed_layers))
        sync(weights[0][0].device)
        expected = np.where(np.isin(np.arange(len(weights)), outcome["committed"])[:, None], swap, identity)
        outcome["wrong"] = wrong_rows(weights, tables, expected, rank)
        out[name] = outcome
    return out


def round_speed(rank, weights, tables, transport, backend, runs: int, peer) -> dict:
    """Paired, alternating: an eplb round moving every slot to the other rank, then `peer` moving the same bytes."""
    _, swap, identity = placements(len(weights), weights[0][0].shape[0], 2, 11)
    fill(weights, tables, identity, rank)
    moving, device = migrator(weights, transport, backend, timeout=60), weights[0][0].device
    rounds, peers, nbytes, old, new = [], [], 0, identity, swap
    moving.migrate(old, new)  # warm-up (connections, pinned buffers)
    old, new = new, old
    for _ in range(runs):
        barrier()
        started = time.perf_counter()
        report = moving.migrate(old, new)
        sync(device)
        rounds.append(time.perf_counter() - started)
        nbytes = report["totals"]["bytes_read_here"]
        old, new = new, old
        barrier()
        peers.append(peer(rank, weights, nbytes))
    return {"round": spread(rounds, nbytes), "peer": spread(peers, nbytes), "bytes": nbytes,
            "wrong": wrong_rows(weights, tables, old, rank)}


def pinned_copies(device, nbytes: int):
    """The staged plane's peer: D2H into pinned memory and H2D back, of `nbytes`, timed on rank 0."""
    source = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")

    def peer(rank, weights, moved):
        took = 0.0
        if rank == 0:
            sync(device)
            started = time.perf_counter()
            host.copy_(source[:moved], non_blocking=True)
            target[:moved].copy_(host[:moved], non_blocking=True)
            sync(device)
            took = time.perf_counter() - started
        barrier()
        return took or 1e-9
    return peer


def bare_exchange(rank, weights, moved):
    """The torch plane's peer: every row of every layer to the other rank, one batch_isend_irecv per layer."""
    import torch.distributed as dist

    other, device = 1 - rank, weights[0][0].device
    received = [[torch.empty_like(rows_of(t)) for t in layer] for layer in weights]
    barrier()
    sync(device)
    started = time.perf_counter()
    for layer, into in zip(weights, received):
        ops = [dist.P2POp(dist.isend, rows_of(t)[s], other, group=BARE_GROUP[0]) for s in range(layer[0].shape[0])
               for t in layer]
        ops += [dist.P2POp(dist.irecv, rows[s], other, group=BARE_GROUP[0]) for s in range(layer[0].shape[0])
                for rows in into]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    sync(device)
    return time.perf_counter() - started


BARE_GROUP: list = [None]  # the torch task's group for the bare exchange
BARRIER_GROUP: list = [None]  # gloo: the check's own barriers, never on the Migrator's (default) group


def barrier() -> None:
    """A barrier on the check's own group: an async round's engine thread may still be voting on the
    default group on a rank whose round is not done yet (async_migration.py: no serving collectives there)."""
    import torch.distributed as dist

    dist.barrier(group=BARRIER_GROUP[0])


def all_ranks(flag: bool) -> bool:
    """Whether `flag` holds on every rank: one all_reduce on the check's own group."""
    import torch.distributed as dist

    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=BARRIER_GROUP[0])
    return bool(value.item())


def matmul_slowdown(rank, weights, tables, options) -> dict:
    """Rank 0's bf16 matmul step time alone, then while an async staged round runs (commit_ready each step).

    Both ranks step in lockstep (an all_reduce per step, on the check's own group, stands in for the
    engine's all-to-all): the round agrees each commit on the ranks' serving steps, and a rank that
    ran thousands of empty steps ahead would set a commit step the other reaches only much later."""
    device, n = weights[0][0].device, options["matmul"]
    a, b = (torch.randn(n, n, device=device).to(torch.bfloat16) for _ in range(2))

    def step() -> float:
        started = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return time.perf_counter() - started

    for _ in range(5):
        step()
    _, swap, identity = placements(len(weights), weights[0][0].shape[0], 2, 11)
    fill(weights, tables, identity, rank)
    moving, alone, during, old, new = migrator(weights, "staged", "gloo", timeout=60), [], [], identity, swap
    for _ in range(options["matmul_rounds"]):
        barrier()
        if rank == 0:
            alone += [step() for _ in range(options["matmul_steps"])]
        barrier()
        handle, deadline = moving.start(old, new), time.monotonic() + 60
        while time.monotonic() < deadline:  # serving steps in lockstep, as expert-parallel steps are
            handle.commit_ready()
            if rank == 0:
                during.append(step())
            if all_ranks(handle.done):  # the step's collective (an all-to-all in an engine)
                break
        handle.report()
        old, new = new, old
    return {"alone": statistics.median(alone) if alone else None, "during": statistics.median(during) if during else None,
            "steps_during": len(during), "wrong": wrong_rows(weights, tables, old, rank)}


def staged_task(rank: int, world: int, options: dict) -> dict:
    device, weights, tables = rank_setup(rank, options)
    out = {"exact": exact_rounds(rank, weights, tables, "staged", "gloo"),
           "faults": fault_rounds(rank, weights, tables, "staged", "gloo")}
    nbytes = sum(rows_of(t).numel() for layer in weights for t in layer)
    out["speed"] = round_speed(rank, weights, tables, "staged", "gloo", options["runs"], pinned_copies(device, nbytes))
    out["matmul"] = matmul_slowdown(rank, weights, tables, options)
    return out


def torch_task(rank: int, world: int, options: dict) -> dict:
    import torch.distributed as dist

    device, weights, tables = rank_setup(rank, options)
    backend = "nccl" if device.type == "cuda" else "gloo"
    BARE_GROUP[0] = dist.new_group(backend=backend)
    return {"backend": backend, "exact": exact_rounds(rank, weights, tables, "torch", backend),
            "speed": round_speed(rank, weights, tables, "torch", backend, options["runs"], bare_exchange)}


TASKS = {"staged": staged_task, "torch": torch_task}


# ---------------------------------------------------------------- rows from the ranks' results

def failed_ranks(name: str, results) -> bool:
    errors = [f"rank {rank}: {result['error']}" for rank, result in enumerate(results) if "error" in result]
    if errors:
        add(name, "FAIL", "; ".join(errors)[:400], traceback=[r.get("traceback", "") for r in results])
    return bool(errors)


def exact_row(name: str, results, plane: str, condition: str) -> None:
    rounds = [round_ for result in results for round_ in result["ok"]["exact"]["rounds"]]
    good = all(not r["wrong"] and r["verified"] is True and r["planes"] == [plane] for r in rounds)
    add(name, "PASS" if good and any(r["read"] for r in rounds) else "FAIL", condition,
        rounds=[{k: r[k] for k in ("wrong", "verified", "planes", "read")} for r in rounds][:6])


def staged_rows(results, condition: str) -> None:
    if failed_ranks("staged round byte-exact", results):
        return
    exact_row("staged round byte-exact", results, "staged", f"3 rounds (random, all slots moved, back); {condition}")
    faults = [result["ok"]["faults"] for result in results]
    retried, aborted = [f["retried"] for f in faults], [f["aborted"] for f in faults]
    good = all(o["error"] is None and not o["wrong"] for o in retried) and sum(o["retries"] for o in retried) > 0
    add("staged corrupted row retried", "PASS" if good else "FAIL",
        "inject corrupt=0.5,seed=4, retries=6: the digest catches it, the retry commits, byte-exact", outcomes=retried)
    same = len({(o.get("type"), o.get("code"), tuple(o["committed"])) for o in aborted}) == 1
    good = same and all(o.get("type") == "MigrationError" and not o["wrong"] for o in aborted)
    add("staged corruption aborted alike", "PASS" if good else "FAIL",
        "inject corrupt=1, retries=1: MigrationError with the same code and committed layers on both ranks, every "
        "layer wholly old or wholly new", outcomes=aborted)
    speed = results[0]["ok"]["speed"]
    mine, peer = speed["round"], speed["peer"]
    add("staged GB/s", mine["gb_s"], f"rank 0 receives {size_text(speed['bytes'])} per round (every slot moves), "
        f"round incl. digests, vote, commit; peer: D2H into pinned + H2D of the same bytes on one rank "
        f"({peer['gb_s']} GB/s); median of {mine['runs']} paired runs; {condition}",
        ratio=round(mine["gb_s"] / peer["gb_s"], 3), spread=mine, peer=peer,
        wrong=[result["ok"]["speed"]["wrong"] for result in results])
    matmul = results[0]["ok"]["matmul"]
    if matmul["during"] and matmul["alone"]:
        add("bf16 matmul slowdown", round(matmul["during"] / matmul["alone"], 3),
            f"median step time during async staged rounds / alone ({matmul['during'] * 1e3:.2f} / "
            f"{matmul['alone'] * 1e3:.2f} ms, {matmul['steps_during']} steps during); {condition}", **matmul)
    else:
        add("bf16 matmul slowdown", "FAIL", "no step ran during a round", **matmul)


def torch_rows(results, condition: str) -> None:
    if failed_ranks("torch plane round byte-exact", results):
        return
    backend = results[0]["ok"]["backend"]
    exact_row(f"torch plane ({backend}) byte-exact", results, "torch", f"3 rounds; {condition}")
    speed = results[0]["ok"]["speed"]
    mine, peer = speed["round"], speed["peer"]
    add(f"torch plane ({backend}) GB/s", mine["gb_s"], f"rank 0 receives {size_text(speed['bytes'])} per round; "
        f"peer: bare batch_isend_irecv of the same rows, one op per row and tensor, one batch per layer "
        f"({peer['gb_s']} GB/s); median of {mine['runs']} paired runs; {condition}",
        ratio=round(mine["gb_s"] / peer["gb_s"], 3), spread=mine, peer=peer)


# ---------------------------------------------------------------- main

SIZES = {  # per device kind: what each row moves and how often
    "cuda": {"digest": (64, 4 << 20, 9), "layers": 4, "slots": 8, "runs": 7, "matmul": 8192, "matmul_steps": 50,
             "matmul_rounds": 3, "shapes": [([1024, 1024], "bfloat16"), ([512, 512], "float8_e4m3fn"),
                                            ([8, 128], "float32"), ([3, 8], "bfloat16")]},
    "cpu": {"digest": (16, 1 << 20, 5), "layers": 3, "slots": 4, "runs": 5, "matmul": 256, "matmul_steps": 20,
            "matmul_rounds": 2, "shapes": [([64, 64], "bfloat16"), ([16, 32], "float8_e4m3fn"), ([4], "float32"),
                                           ([40], "uint8")]},
}


def machine(device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "glibc": os.confstr("CS_GNU_LIBC_VERSION"), "device": str(device), "gpus": torch.cuda.device_count()}
    try:
        import eplb

        info["eplb"] = f"{eplb.__version__} from {Path(eplb.__file__).parent}"
    except Exception as failure:  # noqa: BLE001  (the rows say what that skipped)
        info["eplb"] = f"not importable: {failure}"
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def multi_process_rows(device, sizes: dict, left) -> None:
    """The staged rows (two processes on one device) and the torch plane's (NCCL on 2 GPUs, gloo on the CPU)."""
    rank_options = {key: sizes[key] for key in ("layers", "slots", "runs", "matmul", "matmul_steps", "matmul_rounds",
                                                "shapes")}
    where = "cuda:0 (both ranks)" if device.type == "cuda" else "cpu"
    condition = (f"2 processes on {where}, {sizes['layers']} layers x {sizes['slots']} slots per rank, experts of "
                 f"{len(sizes['shapes'])} tensors (bf16, fp8, fp32...), gloo control group on 127.0.0.1")
    staged = spawn(2, "staged", {**rank_options, "device": str(device) if device.type == "cpu" else "cuda:0"},
                   timeout=max(30.0, left() * 0.6))
    staged_rows(staged, condition)
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        add("torch plane (nccl)", "SKIP", f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
        return
    results = spawn(2, "torch", {**rank_options, "device": "cuda:RANK" if device.type == "cuda" else "cpu"},
                    timeout=max(30.0, left() - 10))
    torch_rows(results, condition.replace(f"on {where}", "one device each" if device.type == "cuda" else "on cpu"))


def print_table() -> None:
    print(f"\n{'check':<34} {'result':>8} {'ratio':>7}  condition")
    for row in ROWS:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{row['check']:<34} {str(row['result']):>8} {ratio:>7}  {row['condition']}")
        for failure in row.get("failures") or []:
            print(f"{'':<52}{failure}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check-out/gpu_check.json")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--seconds", type=float, default=400.0, help="time for everything (spawned ranks bounded)")
    parser.add_argument("--no-extension", default="", metavar="WHY", help="the extension was not built: why")
    args = parser.parse_args()
    started = time.monotonic()
    left = lambda: args.seconds - (time.monotonic() - started)  # noqa: E731
    kind = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    device, sizes = torch.device(kind, 0) if kind == "cuda" else torch.device("cpu"), SIZES[kind]
    digest, with_extension = load_digest()
    why = args.no_extension or ("" if with_extension else "import eplb failed")
    for name, run in (("digest parity", lambda: digest_parity(digest, device, with_extension)),
                      ("digest GB/s", lambda: digest_speed(digest, device, *sizes["digest"]))):
        try:
            run()
        except Exception as failure:  # noqa: BLE001  (a row that fails says how; the others still run)
            add(name, "FAIL", f"{type(failure).__name__}: {failure}"[:400], traceback=traceback.format_exc()[-2000:])
    if why:
        for name in ("staged rounds", "torch plane", "bf16 matmul slowdown"):
            add(name, "SKIP", f"extension not built: {why}")
    else:
        multi_process_rows(device, sizes, left)
    print_table()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine(device), "seconds": round(time.monotonic() - started, 1),
                                          "rows": ROWS}, indent=1, default=str))
    print(f"\nwritten: {args.out} ({time.monotonic() - started:.0f} s)")
    return 1 if any(row["result"] == "FAIL" for row in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
