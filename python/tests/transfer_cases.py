"""What each rank of the eplb.vllm.EplbCommunicator and eplb.nixl tests runs (spawned ranks).

The communicator harness drives it the way vLLM's rebalance_execute does: move_to_buffer (local
copies into the buffer, set_transfer_context, sends and recvs, execute) then move_from_buffer
(buffer into the weights, duplicate replicas filled). The NIXL script uses only eplb.nixl, in the
order vLLM's NIXL communicator does: register, exchange metadata, prepare lists, READ, poll, release.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch
import torch.distributed as dist

import eplb
import eplb.nixl as nixl
from migration_cases import TENSORS, fill, make_weights, mismatches, random_placement


def move_to_buffer(communicator, weights, buffer, old, new, layer: int, rank: int, world: int) -> list:
    """Returns, per local slot, where its new content comes from: None (kept), or the buffer row."""
    slots = weights[0].shape[0]
    mine = range(rank * slots, (rank + 1) * slots)
    plan, received = [], {}
    for i, slot in enumerate(mine):
        expert = int(new[slot])
        local = [j for j, s in enumerate(mine) if int(old[s]) == expert]
        if int(old[slot]) == expert:
            plan.append(None)
        elif local:
            for w, b in zip(weights, buffer):
                b[i].copy_(w[local[0]])
            plan.append(i)
        elif expert in received:
            plan.append(received[expert])  # a duplicate replica: filled from the first copy
        else:
            received[expert] = i
            plan.append(i)
    communicator.set_transfer_context(old, layer)
    for i, expert in ((row, expert) for expert, row in received.items()):
        src = source_rank(old, expert, slots, world)
        communicator.add_recv([b[i] for b in buffer], src, expert)
    for dst in range(world):
        if dst == rank:
            continue
        for expert in needed_by(old, new, dst, slots):
            if source_rank(old, expert, slots, world) == rank:
                communicator.add_send([w[0] for w in weights], dst, expert)
    communicator.execute()
    return plan


def source_rank(old, expert: int, slots: int, world: int) -> int:
    return min(int(s) // slots for s in np.nonzero(old == expert)[0])


def needed_by(old, new, rank: int, slots: int) -> list[int]:
    mine = range(rank * slots, (rank + 1) * slots)
    held = {int(old[s]) for s in mine}
    return sorted({int(new[s]) for s in mine} - held)


def move_from_buffer(weights, buffer, plan) -> None:
    for i, row in enumerate(plan):
        if row is not None:
            for w, b in zip(weights, buffer):
                w[i].copy_(b[row])


def communicator_harness(rank: int, world: int) -> dict:
    layers, slots, experts = 3, 4, 2 * world + 1
    rng = np.random.default_rng(3)
    old = random_placement(rng, layers, slots * world, experts)
    new = random_placement(rng, layers, slots * world, experts)
    weights = make_weights(layers, slots, "plain")
    fill(weights, old, rank)
    buffer = [torch.empty((slots, *shape), dtype=dtype) for shape, dtype in TENSORS]
    communicator = eplb.vllm.EplbCommunicator(dist.group.WORLD, weights, buffer, timeout=10)
    for layer in range(layers):
        plan = move_to_buffer(communicator, weights[layer], buffer, old[layer], new[layer], layer, rank, world)
        move_from_buffer(weights[layer], buffer, plan)
    outcome = {"wrong": mismatches(weights, new, rank), "reserve": communicator.needs_profile_buffer_reservation}
    # A layer whose source rows are corrupted in flight: every rank raises, naming it.
    os.environ["EPLB_NIXL_INJECT"] = "corrupt=1.0,seed=1"
    faulty = eplb.vllm.EplbCommunicator(dist.group.WORLD, weights, buffer, timeout=5, retries=1)
    del os.environ["EPLB_NIXL_INJECT"]
    before = [w.clone() for w in weights[0]]
    try:
        move_to_buffer(faulty, weights[0], buffer, new[0], old[0], 0, rank, world)
        outcome["fault"] = None
    except eplb.MigrationError as failure:
        outcome["fault"] = {"type": type(failure).__name__, "message": str(failure), "layer": failure.layer}
    outcome["weights_untouched"] = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                                       for a, b in zip(before, weights[0]))
    return outcome


def nixl_script(rank: int, world: int) -> dict:
    """Two agents in vLLM's order: register, exchange metadata, prepare lists, READ, poll, release."""
    assert world == 2
    peer = 1 - rank
    agent = nixl.nixl_agent(f"nixl-test-{rank}", nixl.nixl_agent_config(backends=["UCX"]))
    rows, row_bytes = 4, 256
    weights = torch.arange(rows * row_bytes, dtype=torch.int32).view(rows, -1).to(torch.uint8) + rank * 7
    landing = torch.zeros(rows, row_bytes, dtype=torch.uint8)
    registered = agent.register_memory(agent.get_reg_descs([weights, landing], "DRAM"))
    # Metadata and addresses over the CPU group, as vLLM does with all_gather_object.
    mine = {"md": agent.get_agent_metadata().hex(), "base": weights.data_ptr()}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    name = agent.add_remote_agent(bytes.fromhex(gathered[peer]["md"]))
    base = gathered[peer]["base"]
    # READ the peer's rows in reverse order.
    remote = agent.get_xfer_descs([(base + r * row_bytes, row_bytes, 0) for r in range(rows)], "DRAM")
    local = agent.get_xfer_descs([(landing.data_ptr() + r * row_bytes, row_bytes, 0) for r in range(rows)], "DRAM")
    remote_h = agent.prep_xfer_dlist(name, remote, "DRAM")
    local_h = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, "DRAM")
    handle = agent.make_prepped_xfer("READ", local_h, [0, 1, 2, 3], remote_h, [3, 2, 1, 0], deadline=10)
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    expected = (torch.arange(rows * row_bytes, dtype=torch.int32).view(rows, -1).to(torch.uint8) + peer * 7).flip(0)
    outcome = {"state": state, "exact": torch.equal(landing, expected), "explain_done": nixl.explain(handle)}
    agent.release_xfer_handle(handle)
    # A READ outside the peer's registered memory is refused when the list is prepared.
    try:
        agent.prep_xfer_dlist(name, [(base + rows * row_bytes * 64, row_bytes, 0)], "DRAM")
        outcome["outside"] = None
    except eplb.Error as failure:
        outcome["outside"] = str(failure)
    # Per-handle deadline: the peer stalls every request (fault injection), the state becomes ERR.
    os.environ["EPLB_NIXL_INJECT"] = "stall=1.0,seed=1"
    stalling = nixl.nixl_agent(f"nixl-stall-{rank}", nixl.nixl_agent_config(default_deadline=0.3))
    del os.environ["EPLB_NIXL_INJECT"]
    # The stalling agents pair with each other, and both poll at once (after
    # the barrier): UCX's connection handshake between them completes while
    # they do. Paired with the peer's first agent, which polled nothing then,
    # the handshake's reply could arrive while the endpoint was being closed
    # at teardown, which UCX 1.13 aborts on (seen once in a CI rehearsal).
    stalling.register_memory([weights, landing])
    stall_mds = [None] * world
    dist.all_gather_object(stall_mds, stalling.get_agent_metadata().hex())
    stall_name = stalling.add_remote_agent(bytes.fromhex(stall_mds[peer]))
    stall_remote = stalling.prep_xfer_dlist(stall_name, remote[:1], "DRAM")
    stall_local = stalling.prep_xfer_dlist("NIXL_INIT_AGENT", local[:1], "DRAM")
    stalled = stalling.make_prepped_xfer("READ", stall_local, [0], stall_remote, [0])
    dist.barrier()
    state = stalling.transfer(stalled)
    while state == "PROC":
        state = stalling.check_xfer_state(stalled)
    outcome.update(stall_state=state, stall_explain=nixl.explain(stalled))
    stalling.release_xfer_handle(stalled)
    for h in (stall_remote, stall_local):
        stalling.release_dlist_handle(h)
    dist.barrier()
    for h in (remote_h, local_h):
        agent.release_dlist_handle(h)
    agent.remove_remote_agent(name)
    agent.deregister_memory(registered)
    try:
        agent.check_xfer_state(handle)
        outcome["after_release"] = agent.check_xfer_state(handle)
    except eplb.Error as failure:
        outcome["after_release"] = str(failure)
    return json.loads(json.dumps(outcome))
