"""NixlPlane ("nixl"): one-sided READs through a real NIXL agent (the `nixl` package: DRAM here,
VRAM where NIXL has CUDA), carried by eplb's protocol: the same transfer vLLM's NIXL communicator
makes, but with a deadline, a digest and a vote, and a failure that names the layer, the peer, the
descriptors, the bytes, the elapsed time and NIXL's own state.

Contract (eplb/planes/__init__.py has the plane protocol): describe() registers the rank's buffers
(primary, spare, staging) with its agent and returns its metadata and the base address and row
stride of every tensor of every buffer; connect() adds every peer's agent. post() makes one READ per
source rank (prep_xfer_dlist / make_prepped_xfer / transfer), one descriptor per row and tensor,
from the buffer the source published live; sends are ignored (receivers pull). wait() polls
check_xfer_state against the deadline: "ERR" raises eplb.Error (code "backend error", `peer` the
source) with NIXL's state, the deadline raises code "timeout". abandon() releases every handle;
close() deregisters and removes the peers. The digests, copies and commit are RowSpace's (on the
rows' device).
"""
from __future__ import annotations

import base64
import json
import os
import socket
import time
import uuid
import warnings
from pathlib import Path

from eplb.digest import KIND
from eplb.errors import Error
from eplb.planes.faults import FaultSpec
from eplb.planes.rows import PRIMARY, SPARE, STAGING

__all__ = ["NixlPlane", "real_nixl_agent", "libnl_route_copies"]

# docs/python.md, "### NIXL": measured with nixl 1.5.1 (nixl_cu13) on Debian 12 with rdma-core.
TWO_LIBNL_WARNING = (
    "this process loaded two copies of libnl-route-3: the nixl wheel's own ({wheel}) and the "
    "system's ({system}), pulled in through libibverbs by its UCX's InfiniBand module; with nixl "
    "1.5.1 such a process crashes with SIGSEGV at exit (rtnl_tc_unregister, after everything "
    "else ran). Where no InfiniBand is used, UCX_MODULES=^ib in the environment keeps the system "
    "copy out (docs/python.md, NIXL)")


def libnl_route_copies(maps_text: str | None = None) -> list[str]:
    """The distinct libnl-route-3 files mapped into this process (or into `maps_text`, a
    /proc/<pid>/maps listing), sorted; an empty list where /proc cannot be read."""
    if maps_text is None:
        try:
            maps_text = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    paths = {line.split()[-1] for line in maps_text.splitlines() if "libnl-route-3" in line}
    return sorted(path for path in paths if path.startswith("/"))


def real_nixl_agent(name: str):
    """A real NIXL agent with the UCX backend (ImportError when the nixl package is not installed).
    Warns (RuntimeWarning) when the agent left two libnl-route-3 copies in the process."""
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
    copies = libnl_route_copies()
    if len(copies) > 1:
        wheel = next((path for path in copies if "nixl" in path), copies[0])
        system = next((path for path in copies if path != wheel), copies[-1])
        warnings.warn(TWO_LIBNL_WARNING.format(wheel=wheel, system=system), RuntimeWarning, stacklevel=2)
    return agent


class NixlPlane:
    """One-sided READs through a NIXL agent (see the module's docstring)."""

    name = "nixl"
    digest_kind = KIND
    one_sided = True

    def __init__(self, rows, *, rank: int, inject: str = "", make_agent=real_nixl_agent):
        self._rows, self._rank = rows, rank
        self._faults = FaultSpec(inject, rank)
        self._agent = make_agent(f"eplb-plane-{socket.gethostname()}-{os.getpid()}-{rank}-{uuid.uuid4().hex[:8]}")
        self._memory = "VRAM" if rows.device.type == "cuda" else "DRAM"
        self._device_id = (rows.device.index or 0) if rows.device.type == "cuda" else 0
        self._registered, self._peers = [], {}
        self._posted, self._layer, self._started, self._received = [], None, 0.0, []
        self.broken = None

    # ---------------------------------------------------------------- set-up

    def _buffers(self) -> dict:
        out = {}
        for buffer in (PRIMARY, SPARE, STAGING):
            try:
                out[str(buffer)] = [[[self._rows.view(l, buffer, t).data_ptr(), self._rows.view(l, buffer, t).stride(0)]
                                     for t in range(self._rows.tensors(l))] for l in range(self._rows.num_layers)]
            except Error:
                continue  # no spare buffer
        return out

    def describe(self) -> bytes:
        views = {}
        for layer in range(self._rows.num_layers):
            for buffer in (PRIMARY, SPARE, STAGING):
                for t in range(self._rows.tensors(layer)):
                    try:
                        view = self._rows.view(layer, buffer, t)
                    except Error:
                        continue
                    views[view.data_ptr()] = view  # staging views repeat across layers: once each
        self._registered.append(self._agent.register_memory(list(views.values())))
        return json.dumps({"metadata": base64.b64encode(self._agent.get_agent_metadata()).decode(),
                           "buffers": self._buffers(), "device": self._device_id}).encode()

    def connect(self, blobs, me: int) -> None:
        for rank, blob in enumerate(blobs):
            if rank == me:
                continue
            try:
                peer = json.loads(blob)
                name = self._agent.add_remote_agent(base64.b64decode(peer["metadata"]))
                self._peers[rank] = (name, peer["buffers"], int(peer["device"]))
            except (ValueError, KeyError, TypeError) as failure:
                raise Error(f"rank {rank}'s NIXL set-up blob is malformed: {failure}", "mismatch", peer=rank) from None

    def close(self) -> None:
        self.abandon()
        for name, _, _ in self._peers.values():
            try:
                self._agent.remove_remote_agent(name)
            except Exception:  # noqa: BLE001  (closing: the agent goes away anyway)
                pass
        for descs in self._registered:
            self._agent.deregister_memory(descs)
        self._peers, self._registered = {}, []

    # ---------------------------------------------------------------- rows

    def digest(self, rows) -> list[int]:
        return self._rows.digest(rows)

    def copy(self, copies) -> None:
        self._rows.copy(copies)

    def commit(self, copies) -> None:
        self._rows.copy(copies)

    # ---------------------------------------------------------------- transfers

    def post(self, layer: int, receives, sends, timeout: float) -> None:
        self.abandon()
        self._layer, self._started = layer, time.monotonic()
        self._received = [to for _, _, _, to, _ in receives]
        by_source = {}
        for source, source_slot, source_buffer, to, expert in receives:
            by_source.setdefault(source, []).append((source_slot, source_buffer, to, expert))
        for source, items in by_source.items():
            self._post_source(layer, source, items)

    def _post_source(self, layer: int, source: int, items) -> None:
        name, buffers, device = self._peers[source]
        local, remote, experts, nbytes = [], [], [], 0
        first = source * self._rows.slots
        for source_slot, source_buffer, (to_layer, to_slot, to_buffer), expert in items:
            experts.append(expert)
            for t in range(self._rows.tensors(layer)):
                row = self._rows.row(to_layer, to_slot, to_buffer, t)
                base, stride = buffers[str(source_buffer)][layer][t]
                local.append((row.data_ptr(), row.numel(), self._device_id))
                remote.append((base + (source_slot - first) * stride, row.numel(), device))
                nbytes += row.numel()
        local_handle = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, self._memory)
        remote_handle = self._agent.prep_xfer_dlist(name, remote, self._memory)
        indices = list(range(len(local)))
        handle = self._agent.make_prepped_xfer("READ", local_handle, indices, remote_handle, indices)
        self._posted.append({"source": source, "handle": handle, "lists": (local_handle, remote_handle),
                             "descriptors": len(local), "bytes": nbytes, "experts": experts})
        state = self._agent.transfer(handle)
        if state == "ERR":
            raise self._failed(self._posted[-1], "ERR when posted")

    def _failed(self, read: dict, state: str) -> Error:
        return Error(f"layer {self._layer}: NIXL READ of {read['descriptors']} descriptors ({read['bytes']} B) from "
                     f"rank {read['source']} (experts {', '.join(map(str, read['experts'][:12]))}) failed after "
                     f"{time.monotonic() - self._started:.2f} s: NIXL transfer state {state}", "backend error",
                     peer=read["source"])

    def wait(self, timeout: float) -> None:
        deadline, pause = time.monotonic() + timeout, 20e-6
        pending = list(self._posted)
        while pending:
            states = [self._agent.check_xfer_state(read["handle"]) for read in pending]
            for read, state in zip(pending, states):
                if state not in ("DONE", "PROC"):
                    raise self._failed(read, state)
            pending = [read for read, state in zip(pending, states) if state != "DONE"]
            if pending and time.monotonic() >= deadline:
                read = pending[0]
                raise Error(f"layer {self._layer}: NIXL READ of {read['descriptors']} descriptors ({read['bytes']} B) "
                            f"from rank {read['source']} still in progress after "
                            f"{time.monotonic() - self._started:.2f} s (deadline {timeout:.1f} s)", "timeout",
                            peer=read["source"])
            if pending:
                time.sleep(pause)
                pause = min(2 * pause, 1e-3)
        if self._faults.draw(self._faults.err):
            raise Error(f"layer {self._layer}: injected transfer error on rank {self._rank}", "backend error")
        if self._received and self._faults.draw(self._faults.corrupt):
            layer, slot, buffer = self._received[self._faults.pick(len(self._received))]
            self._rows.row(layer, slot, buffer, 0)[0] ^= 0x5A

    def abandon(self) -> None:
        for read in self._posted:
            for release in (lambda: self._agent.release_xfer_handle(read["handle"]),
                            lambda: self._agent.release_dlist_handle(read["lists"][0]),
                            lambda: self._agent.release_dlist_handle(read["lists"][1])):
                try:
                    release()
                except Exception:  # noqa: BLE001  (a handle NIXL already failed; releasing the rest matters)
                    pass
        self._posted = []
