"""What each rank of the eplb.nixl test runs (spawned ranks).

The NIXL script uses only eplb.nixl, in the order vLLM's NIXL communicator does: register, exchange
metadata, prepare lists, READ, poll, release. (eplb.vllm.EplbCommunicator is driven by the real vLLM's
rebalance_execute in test_vllm_communicator.py.)
"""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

import eplb
import eplb.nixl as nixl


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
