"""eplb.nixl: NIXL's Python API (nixl 1.5.1's `nixl._api`) over eplb's transfer agent, on DRAM.

Contract: `nixl_agent(name, nixl_agent_config(...))` offers NIXL's calls with NIXL's argument names,
result types and states (tests/nixl_cases.py runs one script on both and compares): get_reg_descs /
get_xfer_descs (-> nixlRegDList / nixlXferDList), register_memory, deregister_memory,
get_agent_metadata (bytes), add_remote_agent (-> the peer's name as bytes), remove_remote_agent,
prep_xfer_dlist (-> nixl_prepped_dlist_handle), make_prepped_xfer (-> nixl_xfer_handle), transfer,
check_xfer_state ("DONE" / "PROC" / "ERR"; NIXL's nixlNotPostedError before the first transfer),
release_xfer_handle, release_dlist_handle (and each handle's release()), send_notif, get_new_notifs,
update_notifs, check_remote_xfer_done, get_plugin_list, get_backend_mem_types. Failures raise the
NIXL-named eplb.Error subclasses of eplb._nixl_types (ValueError, eplb's message). With
enable_prog_thread (NIXL's default) a thread drives the agent's progress, so peers reading this
process's registered memory and notifications need no call from its owner; every agent call holds
the agent's lock. What NIXL lacks:
- `explain(handle)`: the named error behind "ERR" (operation, peer, descriptors, bytes, elapsed
  time, the backend's status), or the state in words when there is none;
- a deadline per transfer handle (`make_prepped_xfer(..., deadline=seconds)`, or the config's
  `default_deadline`): once it passes, check_xfer_state says "ERR" and explain() says Timeout;
- `nixl_agent_config(transport=..., cma=True)`: "auto", "shm" or "tcp" (UCX transports); cma: READ and
  WRITE of a peer on this host are one process_vm_readv / process_vm_writev in transfer() (on by default;
  both sides must agree, the backend is then "ucx+cma").
Memory is host DRAM only ("VRAM" raises nixlNotFoundError, as NIXL without a VRAM backend); UCX is the only backend; there is
no listener thread (enable_listen_thread=True raises nixlNotSupportedError).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from eplb import _eplb
from eplb._nixl_types import (DEFAULT_COMM_PORT, error_for, nixl_mem_t, nixl_prepped_dlist_handle,
                              nixl_thread_sync_t, nixl_xfer_handle, nixlInvalidParamError, nixlNotFoundError,
                              nixlNotPostedError, nixlNotSupportedError, nixlRegDList, nixlXferDList)
from eplb.errors import Error
from eplb.memory import TRANSPORTS

__all__ = ["nixl_agent", "nixl_agent_config", "explain", "NIXL_INIT_AGENT", "DEFAULT_COMM_PORT",
           "nixl_prepped_dlist_handle", "nixl_xfer_handle", "nixl_thread_sync_t"]

NIXL_INIT_AGENT = "NIXL_INIT_AGENT"  # prep_xfer_dlist's name for the local agent
_IDLE_S = 50e-6  # the progress thread's pause when nothing happened


class nixl_agent_config:  # noqa: N801  (NIXL's name)
    """NIXL's agent configuration (same arguments, same attribute names); eplb adds, keyword-only,
    transport ("auto", "shm", "tcp"), default_deadline (seconds) and cma (peers on this host are read
    and written by cross-memory attach, AgentConfig::cma_local_peers; every agent of a job must set it
    alike)."""

    def __init__(self, enable_prog_thread: bool = True, enable_listen_thread: bool = False,
                 listen_port: int = DEFAULT_COMM_PORT, capture_telemetry: bool = False, num_threads: int = 0,
                 backends: list[str] = ("UCX",), sync_mode: nixl_thread_sync_t | None = None, *,
                 transport: str = "auto", default_deadline: float | None = None, cma: bool = True):
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})")
        self.backends = list(backends)
        self.enable_pthread = bool(enable_prog_thread)
        self.enable_listen = bool(enable_listen_thread)
        self.port = int(listen_port)
        self.capture_telemetry = bool(capture_telemetry)
        self.num_threads = int(num_threads)
        self.sync_mode = sync_mode
        self.transport = transport
        self.default_deadline = default_deadline
        self.cma = bool(cma)


def _mem_type(mem_type) -> nixl_mem_t:
    kind = str(mem_type or "DRAM").upper()
    if kind in ("VRAM", "CUDA"):
        raise nixlNotFoundError("eplb.nixl: VRAM is not supported (no backend for VRAM_SEG): device memory needs "
                                "a CUDA-enabled UCX (Debian's UCX has no CUDA); register host (DRAM) memory",
                                "unsupported")
    if kind not in ("DRAM", "CPU"):
        raise nixlNotSupportedError(f"eplb.nixl: memory type {mem_type!r} is not supported (DRAM only)",
                                    "unsupported")
    return nixl_mem_t.DRAM_SEG


def _tensor_tuple(item) -> tuple[int, int, int]:
    if item.device.type != "cpu" or not item.is_contiguous():
        if item.device.type != "cpu":
            _mem_type("VRAM")
        raise Error(f"eplb.nixl: tensors must be contiguous CPU tensors, got one on {item.device}")
    return item.data_ptr(), item.numel() * item.element_size(), 0


def _tuples(descs) -> list[tuple[int, int, int]]:
    """NIXL's descriptor inputs: (addr, len, dev[, meta]) tuples, tensors, a list of tensors, an N x 3 array."""
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] != 3:
            raise Error(f"eplb.nixl: a descriptor array must be N x 3 (addr, len, dev), got shape {descs.shape}")
        out = [(int(a), int(n), int(d)) for a, n, d in descs.tolist()]
    elif hasattr(descs, "data_ptr"):
        out = [_tensor_tuple(descs)]
    else:
        out = [_tensor_tuple(item) if hasattr(item, "data_ptr") else tuple(int(x) for x in item[:3])
               for item in descs]
    for address, length, _ in out:
        if address <= 0 or length <= 0:
            raise Error(f"eplb.nixl: descriptor (addr={address}, len={length}) must have a positive address and length")
    return out


def _name(agent) -> str:
    return agent.decode() if isinstance(agent, bytes) else str(agent)


class nixl_agent:  # noqa: N801  (NIXL's name)
    """An agent with NIXL's calls (see the module's docstring)."""

    def __init__(self, agent_name: str, nixl_conf: nixl_agent_config | None = None, instantiate_all: bool = False):
        self.name = str(agent_name)
        self.config = nixl_conf or nixl_agent_config()
        if self.config.transport not in TRANSPORTS:
            raise Error(f"transport must be one of {', '.join(TRANSPORTS)}, got {self.config.transport!r}")
        if self.config.enable_listen:
            raise nixlNotSupportedError("eplb.nixl: no listener thread: exchange get_agent_metadata() bytes "
                                        "yourself (add_remote_agent)", "unsupported")
        if [b for b in self.config.backends if b != "UCX"]:
            raise nixlNotSupportedError(f"eplb.nixl: backends {self.config.backends}: only UCX is offered",
                                        "unsupported")
        fault_spec = os.environ.get("EPLB_NIXL_INJECT", "")  # tests: fault injection
        self._agent = _eplb.Agent(self.name, "ucx", TRANSPORTS[self.config.transport], fault_spec,
                                  getattr(self.config, "cma", True))
        self._lock = threading.RLock()
        self._registered = {}  # (address, length, device) -> region id
        self.backends = {"UCX": 0}
        self.notifs: dict[str, list[bytes]] = {}
        self._stop = threading.Event()
        self._thread = None
        if self.config.enable_pthread:
            self._thread = threading.Thread(target=self._progress_loop, name=f"eplb-nixl-{self.name}", daemon=True)
            self._thread.start()

    def _call(self, method, *args):
        """One call of the transfer agent, under the agent's lock; eplb.Error -> its NIXL-named class."""
        try:
            with self._lock:
                return getattr(self._agent, method)(*args)
        except Error as failure:
            raise error_for(failure) from None

    def _progress_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                busy = self._agent.progress()
            if not busy:
                time.sleep(_IDLE_S)

    def close(self) -> None:
        """Stops the progress thread (also done when the agent is garbage-collected)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def __del__(self):
        try:
            self.close()
        except Exception:  # best effort at interpreter exit
            pass

    def get_plugin_list(self) -> list[str]:
        return ["UCX"]

    def get_backend_mem_types(self, backend: str) -> list[str]:
        return ["DRAM_SEG"] if backend == "UCX" else []

    def get_reg_descs(self, descs, mem_type=None) -> nixlRegDList:
        if isinstance(descs, nixlRegDList):
            return descs
        return nixlRegDList(_mem_type(mem_type), _tuples(descs))

    def get_xfer_descs(self, descs, mem_type=None) -> nixlXferDList:
        if isinstance(descs, nixlXferDList):
            return descs
        return nixlXferDList(_mem_type(mem_type), _tuples(descs))

    def register_memory(self, reg_list, mem_type=None, backends=()) -> nixlRegDList:
        descs = self.get_reg_descs(reg_list, mem_type)
        for desc in descs:
            if desc not in self._registered:
                self._registered[desc] = self._call("register_memory", *desc)
        return descs

    def deregister_memory(self, dereg_list, backends=()) -> None:
        for desc in self.get_reg_descs(dereg_list):
            region = self._registered.pop(desc, None)
            if region is None:
                raise error_for(Error(f"eplb.nixl: deregister_memory: {desc} was not registered by agent "
                                      f"{self.name}", "not found"))
            self._call("deregister_memory", region)

    def get_agent_metadata(self) -> bytes:
        return self._call("export_metadata")

    def add_remote_agent(self, metadata: bytes) -> bytes:
        return self._call("load_metadata", bytes(metadata)).encode()

    def remove_remote_agent(self, agent) -> None:
        self._call("invalidate_peer", _name(agent))

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=()) -> nixl_prepped_dlist_handle:
        descs = self.get_xfer_descs(xfer_list, mem_type)
        name = _name(agent_name)
        peer = "" if name in ("", NIXL_INIT_AGENT) else name
        handle = self._call("prepare", peer, list(descs))
        return nixl_prepped_dlist_handle(self, handle, peer or self.name, list(descs))

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle) -> None:
        handle.release()

    def _release_list(self, list_id: int) -> None:
        self._call("release_list", list_id)

    def make_prepped_xfer(self, operation: str, local_xfer_side: nixl_prepped_dlist_handle, local_indices,
                          remote_xfer_side: nixl_prepped_dlist_handle, remote_indices, notif_msg: bytes = b"",
                          backends=(), skip_desc_merge: bool = False, deadline: float | None = None) -> nixl_xfer_handle:
        if operation not in ("READ", "WRITE"):  # NIXL: KeyError from its table of operations
            raise nixlInvalidParamError(f'eplb.nixl: operation must be "READ" or "WRITE", got {operation!r}')
        local_indices, remote_indices = [int(i) for i in local_indices], [int(i) for i in remote_indices]
        deadline = self.config.default_deadline if deadline is None else deadline
        if deadline is not None and not deadline > 0:
            raise Error(f"eplb.nixl: deadline must be > 0 seconds, got {deadline}")
        args = (operation, local_xfer_side._handle, local_indices, remote_xfer_side._handle, remote_indices)
        notif = _bytes(notif_msg)
        request = self._call("make_request", *args, notif)
        local = local_xfer_side.descs
        picked = [local[i] for i in local_indices] if local_indices else local
        return nixl_xfer_handle(self, request, args, remote_xfer_side.peer, len(picked),
                                sum(d[1] for d in picked), deadline, notif)

    def transfer(self, handle: nixl_xfer_handle, notif_msg: bytes = b"") -> str:
        notif = _bytes(notif_msg)
        if notif and notif != handle.notif:  # NIXL: a transfer may carry a new notification
            with self._lock:
                fresh = self._call("make_request", *handle.args, notif)
                self._call("release", handle._handle)
            handle._handle, handle.notif = fresh, notif
        self._call("post", handle._handle)
        handle.posted_at, handle.state, handle.failure = time.monotonic(), "PROC", ""
        return self.check_xfer_state(handle)

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        if handle.posted_at is None:
            raise nixlNotPostedError(f"eplb.nixl: {handle.describe()}: not posted (call transfer)", "not allowed")
        if handle.state in ("ERR", "RELEASED"):
            return "ERR"
        state, code, message = self._call("status", handle._handle)
        if state == "ERR":
            handle.state, handle.failure = "ERR", f"{code}: {message}"
        elif state == "PROC" and handle.deadline is not None and handle.elapsed() > handle.deadline:
            self._call("release", handle._handle)  # cancels it: no byte lands after the deadline
            handle._released = True
            handle.state = "ERR"
            handle.failure = (f"timeout: {handle.describe()} did not complete within its deadline of "
                              f"{handle.deadline:g} s (elapsed {handle.elapsed():.3f} s; canceled)")
        else:
            handle.state = state
        return handle.state

    def release_xfer_handle(self, handle: nixl_xfer_handle) -> None:
        handle.release()

    def _release_request(self, handle: nixl_xfer_handle) -> None:
        self._call("release", handle._handle)

    def send_notif(self, remote_agent_name, notif_msg: bytes, backend: str | None = None) -> None:
        self._call("send_notification", _name(remote_agent_name), _bytes(notif_msg))

    def _take(self, into: dict[str, list[bytes]]) -> dict[str, list[bytes]]:
        with self._lock:
            self._agent.progress()
            arrived = self._call("take_notifications")
        for peer, message in arrived:
            into.setdefault(peer, []).append(message)
        return into

    def get_new_notifs(self, backends=()) -> dict[str, list[bytes]]:
        return self._take({})

    def update_notifs(self, backends=()) -> dict[str, list[bytes]]:
        return self._take(self.notifs)

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag: bytes, backends=(), tag_is_prefix=True) -> bool:
        self._take(self.notifs)
        tag = _bytes(lookup_tag)
        messages = self.notifs.get(_name(remote_agent_name), [])
        for message in messages:
            if (tag_is_prefix and message.startswith(tag)) or (not tag_is_prefix and tag in message):
                messages.remove(message)
                return True
        return False


def _bytes(message) -> bytes:
    return message.encode() if isinstance(message, str) else bytes(message)


def explain(handle: nixl_xfer_handle) -> str:
    """Why a handle is in its state: the named error behind "ERR", or the state in words."""
    if not isinstance(handle, nixl_xfer_handle):
        raise Error(f"eplb.nixl.explain: {handle!r} is not a transfer handle of eplb.nixl")
    if handle.failure:  # the library's message names operation, peer, descriptors, bytes and elapsed time
        return handle.failure
    if handle.posted_at is None:
        return f"{handle.describe()}: not started (call transfer)"
    if handle.state == "RELEASED":
        return f"{handle.describe()}: the handle was released"
    return f"{handle.describe()}: {handle.state} after {handle.elapsed():.3f} s"
