#!/usr/bin/env python3
"""The torch data plane on gloo (CPU) against a bare batch_isend_irecv of the same rows, in one run.

Shape: 2 ranks on one machine, 8 layers, 8 local slots per rank, experts of 4 MiB as two tensors
(float32 3 MiB, bfloat16 1 MiB); each round every rank sends half its slots to the other rank
(every layer moves 16 MiB per rank, 256 MiB per round in all) and the next round moves them back.
Per round, alternating (bare, eplb, bare, eplb, ...) in the same two processes:
- bare: per layer, one batch_isend_irecv of the same rows in the same order (receives into a
  separate buffer, as the plane's staging), then wait: no digest, no vote, no commit copy;
- eplb: eplb.Migrator(transport="torch", data_group=gloo group).migrate(old, new): the C++ protocol
  (publication, digests of the source and landed rows, vote, copy commit) over the same rows.
- floor: the bare round, then the digest of the landed rows (eplb's dev64, as the plane computes it):
  the least a verified move must add (no source digest, vote or commit copy).
Time of a round = the slower rank's. Condition: a long-lived process, the rows were touched by the
previous round (warm, as a serving process's weights); --warmup rounds of each are left out.
Printed: median and spread (min-max) of each, GB/s, the ratio bare/eplb time (goal >= 0.9), and
eplb's own phases (digest, vote, commit) as a share of its round time (goal <= 10%), the same ratio
for the floor, and the CPU the bare round keeps busy (both ranks' user + system time over its wall
time, in cores): where that is the machine's every core, nothing eplb adds can overlap the transfer.

Usage: .venv/bin/python bench/torch_plane.py [--rounds 7] [--warmup 1] (wrap in flock /work/.cpu.lock)
"""
import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

LAYERS, SLOTS, WORLD = 8, 8, 2
TENSORS = [((768, 1024), "float32"), ((512, 1024), "bfloat16")]  # 3 MiB + 1 MiB per expert
PHASES = ("checksum", "transfer", "verify", "vote", "commit")  # LayerReport's seconds_<phase>
OWN = ("checksum", "verify", "vote", "commit")  # what eplb adds to the transfer


def placements():
    import numpy as np

    old = np.tile(np.arange(SLOTS * WORLD), (LAYERS, 1))
    new = old.copy()
    half = SLOTS // 2
    new[:, :half], new[:, SLOTS:SLOTS + half] = old[:, SLOTS:SLOTS + half], old[:, :half]
    return old, new


def cpu_seconds() -> float:
    """User + system CPU time of this process, all its threads (gloo's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bare_round(dist, group, weights, staging, rank, digest: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one bare round; with `digest`, each layer's landed rows are
    digested once they are in."""
    import torch

    from eplb.digest import digest_rows

    peer = 1 - rank
    start, cpu = time.perf_counter(), cpu_seconds()
    for layer, stage in zip(weights, staging):
        ops = []
        for tensor, landing in zip(layer, stage):
            rows, land = tensor.view(SLOTS, -1).view(dtype=torch.uint8), landing
            for slot in range(SLOTS // 2):
                ops.append(dist.P2POp(dist.isend, rows[slot], group=group, group_peer=peer))
            for slot in range(SLOTS // 2):
                ops.append(dist.P2POp(dist.irecv, land[slot], group=group, group_peer=peer))
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if digest:
            for landing in stage:
                digest_rows(landing)
    return time.perf_counter() - start, cpu_seconds() - cpu


def rank_main(rank: int, port: int, rounds: int, warmup: int, out: str, threads: int) -> None:
    import torch
    import torch.distributed as dist

    import eplb

    torch.set_num_threads(threads)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    data = dist.new_group(backend="gloo")
    weights = [[torch.randn((SLOTS, *shape)).to(getattr(torch, dtype)) for shape, dtype in TENSORS]
               for _ in range(LAYERS)]
    staging = [[torch.empty((SLOTS // 2, tensor[0].numel() * tensor.element_size()), dtype=torch.uint8)
                for tensor in layer] for layer in weights]
    migrator = eplb.Migrator(weights, transport="torch", data_group=data, timeout=60)
    old, new = placements()
    rows = []
    for index in range(warmup + rounds):
        bare, bare_cpu = bare_round(dist, data, weights, staging, rank, digest=False)
        floor, _ = bare_round(dist, data, weights, staging, rank, digest=True)
        report = migrator.migrate(old, new) if index % 2 == 0 else migrator.migrate(new, old)
        layers = report["layers"]
        phases = {name: sum(item[f"seconds_{name}"] for item in layers) for name in PHASES}
        rows.append({"bare": bare, "bare_cpu": bare_cpu, "floor": floor, "eplb": report["totals"]["seconds"],
                     "bytes": report["totals"]["bytes_moved"], **phases, "warmup": index < warmup})
    Path(out, f"rank{rank}.json").write_text(json.dumps(rows))
    dist.barrier()
    os._exit(0)


def summarize(per_rank, warmup, threads) -> None:
    rounds = []
    for index in range(len(per_rank[0])):
        both = [ranks[index] for ranks in per_rank]
        slowest = max(both, key=lambda row: row["eplb"])
        rounds.append({"bare": max(row["bare"] for row in both), "floor": max(row["floor"] for row in both),
                       "bare_cores": sum(row["bare_cpu"] for row in both) / max(row["bare"] for row in both),
                       "eplb": slowest["eplb"], "bytes": slowest["bytes"],
                       "own": sum(slowest[name] for name in OWN), **{name: slowest[name] for name in PHASES},
                       "warmup": both[0]["warmup"]})
    kept = [row for row in rounds if not row["warmup"]]

    def spread(values):
        return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"

    moved = kept[0]["bytes"]
    bare = [row["bare"] for row in kept]
    ours = [row["eplb"] for row in kept]
    ratios = [row["bare"] / row["eplb"] for row in kept]
    shares = [row["own"] / row["eplb"] for row in kept]
    print(f"torch plane on gloo, {WORLD} ranks, {LAYERS} layers, {moved / 2**20:.0f} MiB moved per round, "
          f"{len(kept)} paired rounds (+{warmup} warm-up each, left out), {threads} torch thread(s) per rank")
    print(f"{'path':<34}{'round time median (min-max)':<32}{'GB/s':>7}")
    print(f"{'bare batch_isend_irecv':<34}{spread(bare):<32}{moved / statistics.median(bare) / 1e9:>7.2f}")
    floor = [row["floor"] for row in kept]
    print(f"{'floor: bare + landed-row digest':<34}{spread(floor):<32}{moved / statistics.median(floor) / 1e9:>7.2f}")
    print(f"{'eplb Migrator, transport=torch':<34}{spread(ours):<32}{moved / statistics.median(ours) / 1e9:>7.2f}")
    print(f"ratio bare/eplb time (eplb's GB/s over bare's): median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f}); goal >= 0.9")
    print("eplb's phases (slower rank, summed over layers), median: " +
          ", ".join(f"{name} {statistics.median(row[name] for row in kept) * 1e3:.1f} ms" for name in PHASES))
    print(f"eplb's digest + vote + commit share of its round: median {statistics.median(shares) * 100:.1f}% "
          f"({min(shares) * 100:.1f}-{max(shares) * 100:.1f}%); goal <= 10%")
    floors = [row["bare"] / row["floor"] for row in kept]
    cores = [row["bare_cores"] for row in kept]
    print(f"ratio bare/floor time: median {statistics.median(floors):.3f} ({min(floors):.3f}-{max(floors):.3f}): "
          "the most any verified move could reach here")
    print(f"CPU busy during the bare round (both ranks): median {statistics.median(cores):.2f} "
          f"({min(cores):.2f}-{max(cores):.2f}) of {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds of each path (default 7)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds of each path left out first (default 1)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // WORLD),
                        help="torch threads per rank (default: the cores shared out among the ranks; more "
                             "oversubscribes them: torch's parallel copies then wait on each other)")
    args = parser.parse_args()
    if args.rounds < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--rounds and --threads must be >= 1, --warmup >= 0")
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="eplb-torch-plane-") as out:
        mp.start_processes(rank_main, args=(port, args.rounds, args.warmup, out, args.threads), nprocs=WORLD,
                           start_method="spawn", join=True)
        per_rank = [json.loads(Path(out, f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    summarize(per_rank, args.warmup, args.threads)


if __name__ == "__main__":
    sys.exit(main())
