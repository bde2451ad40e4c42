"""eplb.empty / eplb.empty_like: torch tensors in memory the transfer layer allocated.

Contract: one transfer agent per process and transport (created on first use, named after the
host and process) allocates the memory (UCX: shared-memory segments that same-host peers read
directly, the zero-copy path). An allocation is admitted first, as `eplb run` admits its ranks: at
most 90% of MemAvailable and of /dev/shm's free space (eplb.Error otherwise, before anything is
allocated). The tensor is a view of that memory; the memory and the agent live
as long as any tensor over it. eplb.Migrator adopts such tensors without registering them again
and uses their agent. Contents are uninitialized, as with torch.empty.
"""
from __future__ import annotations

import math
import os
import socket

from eplb import _eplb
from eplb.errors import Error

__all__ = ["empty", "empty_like"]

TRANSPORTS = {"auto": "", "shm": "posix,sysv,cma,self", "tcp": "tcp,self"}
# The largest allocation eplb.empty accepts (2**48 B = 256 TiB); below it, memory admission (the
# machine's MemAvailable and /dev/shm free space, as `eplb run` checks them) decides.
MAX_BYTES = 1 << 48
_agents: dict[str, _eplb.Agent] = {}


def transfer_agent(transport: str = "auto", fault_spec: str = "") -> "_eplb.Agent":
    """This process's agent for `transport` ("auto": UCX's choice, "shm", "tcp"); a fault spec makes a new one."""
    if transport not in TRANSPORTS:
        raise Error(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if fault_spec or transport not in _agents:
        name = f"eplb-{socket.gethostname()}-{os.getpid()}-{transport}-{len(_agents)}"
        agent = _eplb.Agent(name, "ucx", TRANSPORTS[transport], fault_spec)
        if fault_spec:
            return agent
        _agents[transport] = agent
    return _agents[transport]


def agent_of(tensor):
    """(transport, agent) of the agent whose memory holds `tensor`, or None."""
    for transport, agent in _agents.items():
        if agent.owns(tensor.data_ptr(), max(tensor.numel() * tensor.element_size(), 1)):
            return transport, agent
    return None


def empty(shape, dtype=None, *, transport: str = "auto"):
    """A new CPU torch tensor of `shape` and `dtype` (default: torch's default dtype) in agent memory."""
    import torch

    shape = (shape,) if isinstance(shape, int) else tuple(int(extent) for extent in shape)
    if any(extent < 0 for extent in shape):
        raise Error(f"eplb.empty: shape {shape} has a negative extent")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not isinstance(dtype, torch.dtype):
        raise Error(f"eplb.empty: dtype must be a torch.dtype, got {dtype!r}")
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        raise Error(f"eplb.empty: shape {shape} holds no bytes; transfer memory must be non-empty")
    if nbytes > MAX_BYTES:
        raise Error(f"eplb.empty: shape {shape} of {dtype} is {nbytes} bytes, more than the {MAX_BYTES} an "
                    "allocation may have")
    buffer = transfer_agent(transport).allocate(nbytes)
    return torch.from_numpy(buffer).view(dtype).reshape(shape)


def empty_like(tensor, *, transport: str = "auto"):
    """eplb.empty with the shape and dtype of `tensor`."""
    return empty(tuple(tensor.shape), tensor.dtype, transport=transport)
