"""eplb.nixl: the calls vLLM's NIXL communicator makes, over eplb's transfer agent, on DRAM.

Contract: `nixl_agent(name, nixl_agent_config(...))` offers NIXL's Python surface (register_memory,
get_reg_descs, get_xfer_descs, get_agent_metadata, add_remote_agent, remove_remote_agent,
prep_xfer_dlist, make_prepped_xfer, transfer, check_xfer_state, release_xfer_handle,
release_dlist_handle, deregister_memory) with NIXL's states "DONE" / "PROC" / "ERR". What NIXL
lacks:
- `explain(handle)`: the named error behind "ERR" (operation, peer, descriptors, bytes, elapsed
  time, the backend's status), or the state in words when there is none;
- a deadline per transfer handle (`make_prepped_xfer(..., deadline=seconds)`, or the config's
  `default_deadline`): once it passes, check_xfer_state says "ERR" and explain() says Timeout.
Bad arguments raise eplb.Error (a ValueError); memory is host DRAM only ("VRAM" is refused).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from eplb import _eplb
from eplb.errors import Error
from eplb.memory import TRANSPORTS

__all__ = ["nixl_agent", "nixl_agent_config", "explain", "NIXL_INIT_AGENT"]

NIXL_INIT_AGENT = "NIXL_INIT_AGENT"  # prep_xfer_dlist's name for the local agent


@dataclass
class nixl_agent_config:  # noqa: N801  (NIXL's name)
    """NIXL's agent configuration; eplb adds transport ("auto", "shm", "tcp") and default_deadline (seconds)."""

    enable_prog_thread: bool = True
    enable_listen_thread: bool = False
    listen_port: int = 0
    capture_telemetry: bool = False
    num_threads: int = 0
    backends: list = field(default_factory=lambda: ["UCX"])
    transport: str = "auto"
    default_deadline: float | None = None


class _DescriptorList(list):
    """(address, length, device) tuples of one memory type (what get_reg_descs / get_xfer_descs return)."""

    def __init__(self, items, mem_type: str):
        super().__init__(items)
        self.mem_type = mem_type


class _Transfer:
    """A transfer handle: its request, what it moves, its deadline and its failure."""

    def __init__(self, agent, request: int, op: str, peer: str, count: int, nbytes: int, deadline):
        self.agent, self.request, self.op, self.peer = agent, request, op, peer
        self.count, self.nbytes, self.deadline = count, nbytes, deadline
        self.posted_at = None
        self.state, self.failure = "INIT", ""

    def elapsed(self) -> float:
        return time.monotonic() - self.posted_at if self.posted_at is not None else 0.0

    def describe(self) -> str:
        direction = "from" if self.op == "READ" else "to"
        return f"{self.op} of {self.count} descriptor(s) ({self.nbytes} B) {direction} agent {self.peer}"


def _mem_type(mem_type) -> str:
    kind = (mem_type or "DRAM").upper()
    if kind == "VRAM":
        raise Error("eplb.nixl: VRAM is not supported: device memory needs a CUDA-enabled UCX (Debian's UCX has "
                    "no CUDA); register host (DRAM) memory", "unsupported")
    if kind != "DRAM":
        raise Error(f"eplb.nixl: memory type {mem_type!r} is not supported (DRAM only)", "unsupported")
    return kind


def _tuples(descs) -> list[tuple[int, int, int]]:
    """NIXL's descriptor inputs: (addr, len, dev) tuples, tensors, a list of tensors, or an N x 3 array."""
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] != 3:
            raise Error(f"eplb.nixl: a descriptor array must be N x 3 (addr, len, dev), got shape {descs.shape}")
        return [(int(a), int(n), int(d)) for a, n, d in descs.tolist()]
    if hasattr(descs, "data_ptr"):
        descs = [descs]
    out = []
    for item in descs:
        if hasattr(item, "data_ptr"):
            if item.device.type != "cpu" or not item.is_contiguous():
                raise Error(f"eplb.nixl: tensors must be contiguous CPU tensors, got one on {item.device}")
            out.append((item.data_ptr(), item.numel() * item.element_size(), 0))
        else:
            address, length, device = item
            out.append((int(address), int(length), int(device)))
    for address, length, _ in out:
        if address <= 0 or length <= 0:
            raise Error(f"eplb.nixl: descriptor (addr={address}, len={length}) must have a positive address and length")
    return out


class nixl_agent:  # noqa: N801  (NIXL's name)
    """An agent with NIXL's calls (see the module's docstring)."""

    def __init__(self, agent_name: str, nixl_conf: nixl_agent_config | None = None, instantiate_all: bool = False):
        self.name = str(agent_name)
        self.config = nixl_conf or nixl_agent_config()
        if self.config.transport not in TRANSPORTS:
            raise Error(f"transport must be one of {', '.join(TRANSPORTS)}, got {self.config.transport!r}")
        fault_spec = os.environ.get("EPLB_NIXL_INJECT", "")  # tests: fault injection
        self._agent = _eplb.Agent(self.name, "ucx", TRANSPORTS[self.config.transport], fault_spec)
        self._registered = {}  # (address, length, device) -> region id
        self._lists = {}  # handle -> descriptor tuples

    def get_reg_descs(self, descs, mem_type=None) -> _DescriptorList:
        return _DescriptorList(_tuples(descs), _mem_type(mem_type))

    def get_xfer_descs(self, descs, mem_type=None) -> _DescriptorList:
        return _DescriptorList(_tuples(descs), _mem_type(mem_type))

    def register_memory(self, reg_list, mem_type=None, backends=()) -> _DescriptorList:
        descs = reg_list if isinstance(reg_list, _DescriptorList) else self.get_reg_descs(reg_list, mem_type)
        for desc in descs:
            if desc not in self._registered:
                self._registered[desc] = self._agent.register_memory(*desc)
        return descs

    def deregister_memory(self, dereg_list, backends=()) -> None:
        for desc in (dereg_list if isinstance(dereg_list, _DescriptorList) else _tuples(dereg_list)):
            region = self._registered.pop(desc, None)
            if region is None:
                raise Error(f"eplb.nixl: deregister_memory: {desc} was not registered by agent {self.name}", "not found")
            self._agent.deregister_memory(region)

    def get_agent_metadata(self) -> bytes:
        return self._agent.export_metadata()

    def add_remote_agent(self, metadata: bytes) -> str:
        return self._agent.load_metadata(bytes(metadata))

    def remove_remote_agent(self, agent: str) -> None:
        self._agent.invalidate_peer(agent.decode() if isinstance(agent, bytes) else agent)

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=()) -> int:
        descs = xfer_list if isinstance(xfer_list, _DescriptorList) else self.get_xfer_descs(xfer_list, mem_type)
        name = agent_name.decode() if isinstance(agent_name, bytes) else str(agent_name)
        peer = "" if name in ("", NIXL_INIT_AGENT) else name
        handle = self._agent.prepare(peer, list(descs))
        self._lists[handle] = (peer or self.name, list(descs))
        return handle

    def release_dlist_handle(self, handle: int) -> None:
        self._agent.release_list(handle)
        self._lists.pop(handle, None)

    def make_prepped_xfer(self, operation: str, local_xfer_side: int, local_indices, remote_xfer_side: int,
                          remote_indices, notif_msg: bytes = b"", backends=(), skip_desc_merge: bool = False,
                          deadline: float | None = None) -> _Transfer:
        local_indices, remote_indices = [int(i) for i in local_indices], [int(i) for i in remote_indices]
        request = self._agent.make_request(operation, local_xfer_side, local_indices, remote_xfer_side,
                                           remote_indices, bytes(notif_msg).decode("latin-1"))
        peer, local = self._lists[remote_xfer_side][0], self._lists[local_xfer_side][1]
        picked = [local[i] for i in local_indices] if local_indices else local
        deadline = self.config.default_deadline if deadline is None else deadline
        if deadline is not None and not deadline > 0:
            raise Error(f"eplb.nixl: deadline must be > 0 seconds, got {deadline}")
        return _Transfer(self, request, operation, peer, len(picked), sum(d[1] for d in picked), deadline)

    def transfer(self, handle: _Transfer, notif_msg: bytes = b"") -> str:
        self._agent.post(handle.request)
        handle.posted_at, handle.state, handle.failure = time.monotonic(), "PROC", ""
        return self.check_xfer_state(handle)

    def check_xfer_state(self, handle: _Transfer) -> str:
        if handle.state in ("ERR", "RELEASED") or handle.posted_at is None:
            return "ERR" if handle.state != "INIT" else "PROC"
        state, code, message = self._agent.status(handle.request)
        if state == "ERR":
            handle.state, handle.failure = "ERR", f"{code}: {message}"
        elif state == "PROC" and handle.deadline is not None and handle.elapsed() > handle.deadline:
            self._agent.release(handle.request)  # cancels it: no byte lands after the deadline
            handle.state = "ERR"
            handle.failure = (f"timeout: {handle.describe()} did not complete within its deadline of "
                              f"{handle.deadline:g} s (elapsed {handle.elapsed():.3f} s; canceled)")
        else:
            handle.state = state
        return handle.state

    def release_xfer_handle(self, handle: _Transfer) -> None:
        if handle.state != "RELEASED" and not handle.failure.startswith("timeout"):
            self._agent.release(handle.request)
        handle.state = "RELEASED"

    # NIXL's notification calls are not part of the READ path vLLM uses; not offered.


def explain(handle: _Transfer) -> str:
    """Why a handle is in its state: the named error behind "ERR", or the state in words."""
    if not isinstance(handle, _Transfer):
        raise Error(f"eplb.nixl.explain: {handle!r} is not a transfer handle of eplb.nixl")
    if handle.failure:  # the library's message names operation, peer, descriptors, bytes and elapsed time
        return handle.failure
    if handle.posted_at is None:
        return f"{handle.describe()}: not started (call transfer)"
    return f"{handle.describe()}: {handle.state} after {handle.elapsed():.3f} s"
