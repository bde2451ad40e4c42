"""eplb.vllm.EplbCommunicator: vLLM's EPLB communicator contract over eplb's transfer agent.

Contract (vllm/distributed/eplb/eplb_communicator.py): add_send(tensors, dst_rank, expert_id),
add_recv(tensors, src_rank, expert_id), execute(), set_transfer_context(old_indices, layer_idx),
needs_profile_buffer_reservation, set_stream. The constructor is collective: every rank registers
all its layers' weights and its buffer, exchanges agent metadata and tensor addresses over the CPU
(gloo) group, and refuses a layout difference (eplb.LayoutError on every rank, naming rank, layer,
tensor and both sizes). Receivers READ, one request per source peer, the first row of the source
that holds the expert in `old_indices` (as vLLM's NIXL communicator does). execute() is collective:
sources publish the checksum (XXH3) of every row a peer reads, the READs run with a deadline, every
received row is verified, and a unanimous vote ends it, which is the fence (no rank overwrites its
weights before every peer's reads have landed). A failed attempt is retried with fresh requests;
after the last one every rank raises eplb.MigrationError (TimeoutError, PeerLostError when the group
itself fails) naming the layer, the ranks and what failed; the buffer then holds no verified rows.
A bad add_send or add_recv (an expert its source does not hold in old_indices, a rank outside the
group, tensors of the wrong size) is not raised where it is made: it travels in execute()'s first
collective, and every rank raises eplb.MigrationError naming the rank, the call and the expert, with
nothing transferred; the collectives stay paired, so the next execute() works. execute() with nothing
queued on any rank ends after that one collective (a rank cannot skip it alone: the others' collective
would pair with its next call).
"""
from __future__ import annotations

import json
import operator
import os
import socket
import threading
import time

import numpy as np

from eplb import _eplb
from eplb.errors import Error, LayoutError, MigrationError, PeerLostError, TimeoutError
from eplb.group import ProcessGroup
from eplb.nixl import NIXL_INIT_AGENT, explain, nixl_agent, nixl_agent_config

__all__ = ["EplbCommunicator"]


def _rows(tensor):
    """(address, bytes per row) of a [rows, ...] contiguous CPU tensor."""
    return tensor.data_ptr(), tensor[0].numel() * tensor.element_size()


class EplbCommunicator:
    """vLLM's EplbCommunicator over eplb (see the module's docstring).

    Args:
        cpu_group: the torch.distributed gloo group of the expert-parallel ranks, or an eplb.ProcessGroup.
        expert_weights: [layers][tensors] CPU tensors [num_local_experts, ...], contiguous.
        expert_buffer: [tensors] CPU tensors shaped like one layer's weights (the receive buffer).
        timeout: seconds for the READs of one attempt and for each collective.
        retries: extra attempts after a failed one.
        transport: "auto", "shm" or "tcp".
    """

    def __init__(self, cpu_group, expert_weights, expert_buffer, *, timeout: float = 30.0, retries: int = 2,
                 transport: str = "auto"):
        if not timeout > 0:
            raise Error(f"timeout must be > 0 seconds, got {timeout!r}")
        self._group = cpu_group if isinstance(cpu_group, ProcessGroup) else ProcessGroup.from_torch(cpu_group)
        self._rank, self._size = self._group.rank, self._group.size
        self._timeout, self._retries = float(timeout), int(retries)
        self._weights = [list(layer) for layer in expert_weights]
        self._buffer = list(expert_buffer)
        name = f"eplb-vllm-{socket.gethostname()}-{os.getpid()}-{self._rank}"
        # No progress thread: the communicator drives its agent's progress itself (_allgather, _wait);
        # no cma: its transfers go through UCX as before (docs/python.md, "vLLM communicator").
        self._agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, transport=transport, cma=False))
        problem = self._register()
        mine = {"agent": name, "metadata": self._agent.get_agent_metadata().hex(), "problem": problem,
                "weights": [[list(_rows(t)) for t in layer] for layer in self._weights] if not problem else []}
        self._peers = [json.loads(item) for item in self._group.allgather(json.dumps(mine).encode(), self._timeout)]
        self._check_layouts()
        for rank, peer in enumerate(self._peers):
            if rank != self._rank:
                self._agent.add_remote_agent(bytes.fromhex(peer["metadata"]))
        self._sends, self._recvs, self._problems = [], [], []
        self._layer, self._old = None, None

    # ---------------------------------------------------------------- contract

    @property
    def needs_profile_buffer_reservation(self) -> bool:
        """False: transfers land in the given expert_buffer; eplb needs no memory beyond it."""
        return False

    def set_stream(self, stream) -> None:
        """No-op: eplb moves host memory, not on a CUDA stream."""

    def set_transfer_context(self, old_indices, layer_idx: int) -> None:
        """The layer the next sends and recvs belong to, and its old phy2log (global slots)."""
        old = np.asarray(old_indices.cpu() if hasattr(old_indices, "cpu") else old_indices, dtype=np.int64)
        slots = len(self._weights[0][0]) * self._size if self._weights else 0
        if old.shape != (slots,):
            raise Error(f"set_transfer_context: old_indices must be [{slots}] (the layer's old phy2log), "
                        f"got shape {old.shape}")
        if not 0 <= int(layer_idx) < len(self._weights):
            raise Error(f"set_transfer_context: layer {layer_idx} is not in [0, {len(self._weights)})")
        self._layer, self._old = int(layer_idx), old

    def add_send(self, tensors, dst_rank: int, expert_id: int) -> None:
        """Records that dst_rank reads expert_id from this rank (receivers READ; nothing is posted).

        A bad call is reported by the next execute(), on every rank (see the module's docstring)."""
        call = f"add_send(expert {expert_id}, dst_rank {dst_rank}) on rank {self._rank}"
        dst_rank, expert_id = _index(dst_rank), _index(expert_id)
        problem = self._rank_problem(dst_rank) or self._held_problem(self._rank, expert_id)
        if problem:
            self._problems.append(f"{call}: {problem}")
        else:
            self._sends.append((dst_rank, expert_id))

    def add_recv(self, tensors, src_rank: int, expert_id: int) -> None:
        """Records that `tensors` (buffer rows, one per weight tensor) receive expert_id from src_rank.

        A bad call is reported by the next execute(), on every rank (see the module's docstring)."""
        tensors = list(tensors)
        call = f"add_recv(expert {expert_id}, src_rank {src_rank}) on rank {self._rank}"
        src_rank, expert_id = _index(src_rank), _index(expert_id)
        problem = (self._rank_problem(src_rank) or self._held_problem(src_rank, expert_id)
                   or self._rows_problem(tensors, src_rank))
        if problem:
            self._problems.append(f"{call}: {problem}")
        else:
            self._recvs.append((tensors, src_rank, expert_id))

    def execute(self) -> None:
        """Collective: runs the recorded sends and recvs of the layer (see the module's docstring)."""
        if self._layer is None:
            raise Error("execute: call set_transfer_context(old_indices, layer_idx) first", "not allowed")
        started = time.monotonic()
        try:
            published = self._publish_checksums()
            if published is None:
                return  # nothing queued on any rank
            failures = []
            for attempt in range(self._retries + 1):
                failure = self._attempt(published)
                reasons = self._vote(failure)
                if not any(reasons):
                    return
                failures = [f"rank {r} voted no: {reason}" for r, reason in enumerate(reasons) if reason]
            raise MigrationError(
                f"layer {self._layer} aborted after {self._retries + 1} attempt(s): {'; '.join(failures)}. The "
                "expert buffer holds no verified rows; the weights were not touched", "aborted", layer=self._layer,
                rank=self._rank, peer=_first_rank(failures, self._rank), operation="READ and verify",
                state=f"layer {self._layer} keeps its old weights on every rank", elapsed_s=time.monotonic() - started)
        except Error as failure:
            if isinstance(failure, MigrationError):
                raise
            kind = {"timeout": TimeoutError, "remote disconnect": PeerLostError}.get(failure.code, MigrationError)
            raise kind(f"layer {self._layer} stopped on rank {self._rank}: {failure}", failure.code, layer=self._layer,
                       rank=self._rank, peer=_first_rank([str(failure)], self._rank), operation="collective",
                       state=f"layer {self._layer} keeps its old weights", elapsed_s=time.monotonic() - started) from None
        finally:
            self._sends, self._recvs, self._problems = [], [], []

    # ---------------------------------------------------------------- inside

    def _rank_problem(self, rank) -> str:
        """Why `rank` (an int or None) cannot be this rank's peer, or ""."""
        if rank is None or not 0 <= rank < self._size or rank == self._rank:
            return f"the peer is not another rank of the group [0, {self._size})"
        return ""

    def _held_problem(self, rank: int, expert) -> str:
        """Why `rank` cannot be the source of `expert` (an int or None) in the layer's old_indices, or ""."""
        if self._old is None:
            return "no transfer context: call set_transfer_context(old_indices, layer_idx) first"
        slots = len(self._weights[0][0])
        if expert is None or not np.any(self._old[rank * slots:(rank + 1) * slots] == expert):
            return f"rank {rank} does not hold that expert in old_indices of layer {self._layer}"
        return ""

    def _rows_problem(self, tensors, src: int) -> str:
        """Why `tensors` cannot receive one row of each of src's tensors of the layer, or ""."""
        rows = self._peers[src]["weights"][self._layer]
        if len(tensors) != len(rows):
            return f"{len(tensors)} tensors, the layer has {len(rows)}"
        for t, (tensor, (_, size)) in enumerate(zip(tensors, rows)):
            nbytes = tensor.numel() * tensor.element_size()
            if not tensor.is_contiguous() or nbytes != size:
                return (f"tensor {t} holds {nbytes} B (contiguous: {tensor.is_contiguous()}); rank {src}'s rows are "
                        f"{size} B")
        return ""

    def _register(self) -> str:
        """Registers every weight tensor and the buffer; the reason this rank cannot take part, or ""."""
        tensors = [t for layer in self._weights for t in layer] + self._buffer
        for tensor in tensors:
            if not hasattr(tensor, "data_ptr") or tensor.device.type != "cpu" or not tensor.is_contiguous():
                return "every weight and buffer tensor must be a contiguous CPU tensor (device memory needs a " \
                       "CUDA-enabled UCX, which Debian's is not)"
        if not self._weights or any(len(layer) != len(self._buffer) for layer in self._weights):
            return "every layer must have as many tensors as the buffer"
        self._agent.register_memory(self._agent.get_reg_descs(tensors))
        return ""

    def _check_layouts(self) -> None:
        for rank, peer in enumerate(self._peers):
            if peer["problem"]:
                raise LayoutError(f"rank {rank} cannot take part: {peer['problem']}")
        reference = self._peers[0]["weights"]
        for rank, peer in enumerate(self._peers):
            if len(peer["weights"]) != len(reference):
                raise LayoutError(f"rank {rank} has {len(peer['weights'])} layers, rank 0 has {len(reference)}")
            for l, (layer, layer0) in enumerate(zip(peer["weights"], reference)):
                for t, ((_, size), (_, size0)) in enumerate(zip(layer, layer0)):
                    if size != size0 or len(layer) != len(layer0):
                        raise LayoutError(f"nbytes_per_expert mismatch: rank {rank} has layer {l} tensor {t} of "
                                          f"{size} B per expert, rank 0 has {size0} B")

    def _source_row(self, rank: int, expert: int) -> int:
        slots = len(self._weights[0][0])
        held = np.nonzero(self._old[rank * slots:(rank + 1) * slots] == expert)[0]
        if not len(held):
            raise Error(f"layer {self._layer}: rank {rank} does not hold expert {expert} in old_indices")
        return int(held[0])

    def _publish_checksums(self) -> list[dict] | None:
        """Every rank's {expert: checksums} of the rows its peers read; None when no rank queued anything.
        The same collective carries each rank's bad calls: any raises on every rank, nothing moved."""
        mine = {}
        for _, expert in self._sends:
            row = self._source_row(self._rank, expert)
            mine[str(expert)] = [_eplb.checksum(address + row * size, size)
                                 for address, size in (_rows(t) for t in self._weights[self._layer])]
        message = {"sums": mine, "recvs": len(self._recvs), "problems": self._problems}
        gathered = [json.loads(item) for item in self._allgather(json.dumps(message).encode())]
        problems = [problem for item in gathered for problem in item["problems"]]
        if problems:
            raise Error(f"{'; '.join(problems)}. Nothing was transferred", "invalid argument")
        if not any(item["sums"] or item["recvs"] for item in gathered):
            return None
        return [item["sums"] for item in gathered]

    def _attempt(self, published) -> str:
        """One round of READs (one per source peer) and checks; "" or why it failed."""
        handles, lists = [], []
        try:
            for src in sorted({src for _, src, _ in self._recvs}):
                recvs = [(tensors, expert) for tensors, peer, expert in self._recvs if peer == src]
                handles.append(self._post_reads(src, recvs, lists))
            failure = self._wait(handles)
            return failure or self._verify(published)
        finally:
            for handle in handles:
                self._agent.release_xfer_handle(handle)
            for handle in lists:
                self._agent.release_dlist_handle(handle)

    def _post_reads(self, src: int, recvs, lists):
        local, remote = [], []
        for tensors, expert in recvs:
            row = self._source_row(src, expert)
            for tensor, (address, size) in zip(tensors, self._peers[src]["weights"][self._layer]):
                local.append((tensor.data_ptr(), size, 0))
                remote.append((address + row * size, size, 0))
        local_handle = self._agent.prep_xfer_dlist(NIXL_INIT_AGENT, local)
        lists.append(local_handle)
        remote_handle = self._agent.prep_xfer_dlist(self._peers[src]["agent"], remote)
        lists.append(remote_handle)
        handle = self._agent.make_prepped_xfer("READ", local_handle, range(len(local)), remote_handle,
                                               range(len(remote)), deadline=self._timeout)
        self._agent.transfer(handle)
        return handle

    def _wait(self, handles) -> str:
        pending = list(handles)
        while pending:
            states = [self._agent.check_xfer_state(handle) for handle in pending]
            for handle, state in zip(pending, states):
                if state == "ERR":
                    return explain(handle)
            pending = [handle for handle, state in zip(pending, states) if state != "DONE"]
            if pending:
                time.sleep(0.0002)
        return ""

    def _verify(self, published) -> str:
        for tensors, src, expert in self._recvs:
            sums = published[src].get(str(expert))
            if sums is None:
                return f"rank {src} published no checksum of expert {expert} (no matching add_send)"
            for t, tensor in enumerate(tensors):
                nbytes = tensor.numel() * tensor.element_size()
                if _eplb.checksum(tensor.data_ptr(), nbytes) != sums[t]:
                    return (f"checksum mismatch: expert {expert} tensor {t} read from rank {src} "
                            f"(layer {self._layer}, {nbytes} B)")
        return ""

    def _vote(self, failure: str) -> list[str]:
        return [item.decode(errors="replace") for item in self._allgather(failure.encode())]

    def _allgather(self, data: bytes) -> list[bytes]:
        """The group's allgather (up to twice the timeout: a slow rank's READs, then the exchange), while
        this rank's agent keeps progressing: peers may be reading its registered heap memory, which UCX
        serves through the owner's progress."""
        outcome = {}

        def gather():
            try:
                outcome["value"] = self._group.allgather(data, 2 * self._timeout)
            except BaseException as failure:  # handed to the caller below
                outcome["error"] = failure

        worker = threading.Thread(target=gather, name="eplb-communicator-collective")
        worker.start()
        while worker.is_alive():
            self._agent._agent.progress()
            worker.join(0.0002)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


def _index(value):
    """`value` as an int (Python, numpy or torch integers), or None when it is not one."""
    try:
        return operator.index(value)
    except TypeError:
        return None


def _first_rank(texts, me: int):
    import re

    for text in texts:
        for match in re.finditer(r"\brank (\d+)", text):
            if int(match.group(1)) != me:
                return int(match.group(1))
    return None
