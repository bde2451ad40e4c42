#!/usr/bin/env python3
"""A small torch MoE stack served by 4 processes on CPU, rebalanced and migrated with eplb.

Each rank holds 3 of the 12 physical expert slots of every layer (8 logical experts, so 4 redundant
slots). Serving steps route tokens (top-2 router), dispatch each token to a replica through
log2phy (replica = token index modulo the expert's replica count), run the experts on the ranks that
hold the chosen slots and sum the results over the gloo group, counting the load per expert. Then
eplb.vllm.EplbPolicy computes a new placement from the load, eplb.Migrator moves the expert
weights (torch tensors adopted in place), and the same fixed inputs are served again.

It checks (and says) that the model's outputs are bit-identical before and after the migration,
and that rank loads are better balanced (balancedness = mean rank load / max rank load).

Run from the repository root, with the eplb package installed (README):
    .venv/bin/python examples/moe_rebalance.py
"""
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import eplb

RANKS, LAYERS, EXPERTS, SLOTS_PER_RANK, HIDDEN, FFN, TOKENS = 4, 4, 8, 3, 32, 64, 256
SLOTS = RANKS * SLOTS_PER_RANK


def expert_weights(layer: int, expert: int):
    """The weights of logical expert `expert` of `layer` (deterministic)."""
    generator = torch.Generator().manual_seed(1000 * layer + expert)
    return (torch.randn(HIDDEN, FFN, generator=generator) / HIDDEN ** 0.5,
            torch.randn(FFN, HIDDEN, generator=generator) / FFN ** 0.5)


class RankMoE:
    """This rank's share of the MoE stack: routers (replicated) and the expert slots it holds."""

    def __init__(self, rank: int, phy2log: np.ndarray):
        self.rank = rank
        generator = torch.Generator().manual_seed(7)
        # Skewed routers: a bias makes a few experts popular.
        self.routers = [(torch.randn(HIDDEN, EXPERTS, generator=generator),
                         torch.linspace(2.0, 0.0, EXPERTS)[torch.randperm(EXPERTS, generator=generator)])
                        for _ in range(LAYERS)]
        # weights[layer] = [w1 [slots, HIDDEN, FFN], w2 [slots, FFN, HIDDEN]]: what eplb.Migrator adopts.
        self.weights = [[torch.empty(SLOTS_PER_RANK, HIDDEN, FFN), torch.empty(SLOTS_PER_RANK, FFN, HIDDEN)]
                        for _ in range(LAYERS)]
        for layer in range(LAYERS):
            for i in range(SLOTS_PER_RANK):
                w1, w2 = expert_weights(layer, int(phy2log[layer][rank * SLOTS_PER_RANK + i]))
                self.weights[layer][0][i].copy_(w1)
                self.weights[layer][1][i].copy_(w2)
        self.set_placement(phy2log)

    def set_placement(self, phy2log: np.ndarray) -> None:
        self.phy2log = phy2log
        self.log2phy, self.logcnt = eplb.compute_logical_maps(torch.from_numpy(phy2log), EXPERTS)

    def forward(self, hidden: torch.Tensor, load: np.ndarray, rank_load: np.ndarray) -> torch.Tensor:
        for layer in range(LAYERS):
            router, bias = self.routers[layer]
            scores = torch.softmax(hidden @ router + bias, dim=-1)
            gates, chosen = scores.topk(2, dim=-1)
            out = torch.zeros_like(hidden)
            for token in range(hidden.shape[0]):
                for k in range(2):
                    expert = int(chosen[token, k])
                    replica = token % int(self.logcnt[layer, expert])
                    slot = int(self.log2phy[layer, expert, replica])
                    load[layer, expert] += 1
                    rank_load[layer, slot // SLOTS_PER_RANK] += 1
                    if slot // SLOTS_PER_RANK != self.rank:
                        continue
                    w1, w2 = self.weights[layer][0][slot % SLOTS_PER_RANK], self.weights[layer][1][slot % SLOTS_PER_RANK]
                    # One token at a time: the result does not depend on which tokens share a batch.
                    out[token] += gates[token, k] * (torch.relu(hidden[token] @ w1) @ w2)
            dist.all_reduce(out)  # one non-zero contribution per (token, expert): exact in any order
            hidden = hidden + out
        return hidden


def rank_main(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    initial = np.tile(np.arange(SLOTS) % EXPERTS, (LAYERS, 1))  # vLLM's initial placement
    model = RankMoE(rank, initial)
    fixed_inputs = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(42))

    load = np.zeros((LAYERS, EXPERTS))
    rank_load_before = np.zeros((LAYERS, RANKS))
    for step in range(3):  # serving steps: count the load
        batch = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(100 + step))
        model.forward(batch, load, rank_load_before)
    before = model.forward(fixed_inputs, np.zeros_like(load), np.zeros((LAYERS, RANKS)))

    new = eplb.vllm.EplbPolicy.rebalance_experts(torch.from_numpy(load), SLOTS, 1, 1, RANKS,
                                                 old_global_expert_indices=torch.from_numpy(initial)).numpy()
    migrator = eplb.Migrator(model.weights, timeout=30)
    report = migrator.migrate(initial, new)
    model.set_placement(new)

    rank_load_after = np.zeros((LAYERS, RANKS))
    for step in range(3):  # the same serving steps on the new placement
        batch = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(100 + step))
        model.forward(batch, np.zeros_like(load), rank_load_after)
    after = model.forward(fixed_inputs, np.zeros_like(load), np.zeros((LAYERS, RANKS)))

    identical = torch.equal(before.view(torch.int32), after.view(torch.int32))
    if rank == 0:
        balance = lambda loads: float(np.mean(loads.mean(axis=1) / loads.max(axis=1)))  # noqa: E731
        totals = report["totals"]
        print(f"{RANKS} ranks x {SLOTS_PER_RANK} slots, {LAYERS} layers of {EXPERTS} experts, top-2 routing, "
              f"{TOKENS} tokens per step")
        print(f"rank load balancedness: {balance(rank_load_before):.3f} before -> {balance(rank_load_after):.3f} "
              f"after (1.0 is perfect)")
        print(f"migration: {totals['bytes_moved'] / 2**20:.1f} MiB moved (local {totals['bytes_local'] / 2**20:.1f}, "
              f"intra-node {totals['bytes_intra_node'] / 2**20:.1f}) in {totals['seconds'] * 1e3:.0f} ms, "
              f"{totals['layers_committed']}/{LAYERS} layers committed, verified on every rank: {report['verified']}")
        print(f"outputs for the fixed inputs bit-identical before and after: {identical}")
    ok = identical and report["verified"] and balance_improved(rank_load_before, rank_load_after)
    results = [None] * RANKS
    dist.all_gather_object(results, ok)
    if rank == 0 and not all(results):
        print("FAILED: see above", file=sys.stderr)
    os._exit(0 if all(results) else 1)


def balance_improved(before: np.ndarray, after: np.ndarray) -> bool:
    return float(np.mean(after.mean(axis=1) / after.max(axis=1))) > float(np.mean(before.mean(axis=1) /
                                                                              before.max(axis=1)))


def main() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.start_processes(rank_main, args=(port,), nprocs=RANKS, join=False, start_method="spawn")
    codes = []
    for process in context.processes:
        process.join(300)
        if process.is_alive():
            process.kill()
            process.join(10)
        codes.append(process.exitcode)
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
