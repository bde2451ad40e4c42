"""eplb.vllm.EplbCommunicator: vLLM's EPLB communicator contract over eplb's migration protocol.

Contract (vllm/distributed/eplb/eplb_communicator.py): add_send(tensors, dst_rank, expert_id),
add_recv(tensors, src_rank, expert_id), execute(), set_transfer_context(old_indices, layer_idx),
needs_profile_buffer_reservation, set_stream(stream).
- A thin adapter: add_send and add_recv record the layer's rows; execute() hands them to the C++
  library's one protocol (include/eplb/migrate.h Migrator::exchange): every rank publishes the
  digest and expert of the rows it sends, its receives and its sends, in one collective; the
  pairing is checked on every rank; then the transfers (with a deadline), the verification of
  every received row, and a unanimous vote, which is the fence (no rank overwrites its weights
  before every peer's rows landed); a failed attempt is retried; after the last one every rank
  raises eplb.MigrationError (TimeoutError, PeerLostError) naming the layer, the peer and what
  failed, and the buffer holds no verified rows. The weights are never written here: vLLM's
  move_from_buffer copies the buffer into them.
- The constructor is collective: the one layout check of the library (dtypes and shapes too)
  refuses a difference on every rank (eplb.LayoutError). Rows move through a data plane: CPU
  tensors through eplb's UCX agent (one-sided READs of the first row of the source that holds the
  expert in old_indices, as vLLM's NIXL communicator does); CUDA tensors over vLLM's device group
  (`data_group`: the torch plane on NCCL) or, without one, staged through host memory over the CPU
  group. `transport` forces one ("ucx", "shm", "tcp", "torch", "staged", "nixl").
- A bad add_send or add_recv (an expert its source does not hold in old_indices, a rank outside
  the group, tensors of the wrong size) is not raised where it is made: it travels in execute()'s
  collective and every rank raises eplb.MigrationError naming the rank, the call and the expert,
  with nothing transferred; the next execute() works. execute() with nothing queued on any rank
  ends after that one collective (a rank cannot skip it alone: the others' would pair with its
  next call).
"""
from __future__ import annotations

import operator
import os

import numpy as np

from eplb import _eplb
from eplb import _migrator_setup as setup
from eplb.errors import Error, LayoutError
from eplb.group import ProcessGroup
from eplb.migrator import migration_error

__all__ = ["EplbCommunicator", "INJECT_VARIABLE"]

#: Fault injection for tests (the data plane's spec, e.g. "corrupt=1.0,seed=1"), read by the constructor.
INJECT_VARIABLE = "EPLB_COMMUNICATOR_INJECT"


class EplbCommunicator:
    """vLLM's EplbCommunicator over eplb (see the module's docstring).

    Args:
        cpu_group: the torch.distributed gloo group of the expert-parallel ranks, or an eplb.ProcessGroup.
        expert_weights: [layers][tensors] tensors [num_local_experts, ...], contiguous, one device.
        expert_buffer: [tensors] tensors shaped like one layer's weights (the receive buffer).
        timeout: seconds for the transfers of one attempt (None: automatic, from the bytes moved).
        retries: extra attempts after a failed one.
        transport: "auto" or a data plane (see the module's docstring).
        data_group: the group CUDA rows move over (vLLM's device group, NCCL), for "torch".
    """

    def __init__(self, cpu_group, expert_weights, expert_buffer, *, timeout: float | None = 30.0, retries: int = 2,
                 transport: str = "auto", data_group=None):
        setup.check_options(1, transport, timeout, retries, "copy", False)
        self._group = cpu_group if isinstance(cpu_group, ProcessGroup) else ProcessGroup.from_torch(cpu_group)
        self._cpu_group = None if isinstance(cpu_group, ProcessGroup) else cpu_group
        self._rank, self._size = self._group.rank, self._group.size
        self._weights = [list(layer) for layer in expert_weights]
        self._buffer = list(expert_buffer)
        self._native = self._set_up(transport, data_group, float(timeout or 0.0), int(retries),
                                    os.environ.get(INJECT_VARIABLE, ""))
        self._sends, self._recvs, self._problems = [], [], []
        self._layer, self._old, self._stream = None, None, None
        self._last_report = None

    def _set_up(self, transport, data_group, timeout, retries, inject):
        problem = setup.local_problem(self._weights) or self._buffer_problem()
        plane, transfer, paths = None, None, []
        if not problem and transport != "auto":
            plane, problem = setup.choose_plane(transport, self._weights, data_group)
        elif not problem:
            plane, problem = setup.choose_plane("auto", self._weights, data_group if data_group is not None
                                                else self._group_for_staging())
        if not problem and plane == "ucx":
            transfer, paths, problem = setup.choose_agent(self._weights, transport, inject)
        elif not problem:
            transfer = self._python_plane(plane, data_group, inject)
        layers = [] if problem else setup.tensor_arguments(self._weights, None, paths, plane)
        staging = [] if problem else [_eplb.TensorArgument(f"buffer {t}", tensor.data_ptr(), setup.row_bytes(tensor))
                                      for t, tensor in enumerate(self._buffer)]
        slots = int(self._weights[0][0].shape[0]) if layers else 1
        try:
            return _eplb.Migrator(self._group._native, transfer, layers, staging if plane == "ucx" else [], slots, 1,
                                  timeout, retries, None, "copy", "off", problem)
        except Error as failure:
            if failure.code in ("mismatch", "aborted", "invalid argument"):
                raise LayoutError(str(failure), failure.code, peer=failure.peer) from None
            raise

    def _buffer_problem(self) -> str:
        if any(len(layer) != len(self._buffer) for layer in self._weights):
            return f"every layer must have as many tensors as the buffer ({len(self._buffer)})"
        for t, (buffer, weight) in enumerate(zip(self._buffer, self._weights[0])):
            if not buffer.is_contiguous() or buffer.shape != weight.shape or buffer.device != weight.device:
                return (f"buffer tensor {t} must be contiguous and shaped like layer 0's tensor {t} "
                        f"{tuple(weight.shape)} on {weight.device}, got {tuple(buffer.shape)} on {buffer.device}")
        return ""

    def _group_for_staging(self):
        """The CPU group the staged plane moves host rows over (vLLM's cpu_group)."""
        return self._cpu_group

    def _python_plane(self, plane, data_group, inject):
        from eplb.planes import NixlPlane, RowSpace, StagedPlane, TorchPlane

        rows = RowSpace(self._weights, staging=self._buffer)
        if plane == "torch":
            return TorchPlane(rows, data_group, rank=self._rank, inject=inject)
        if plane == "staged":
            return StagedPlane(rows, data_group if data_group is not None else self._group_for_staging(),
                               rank=self._rank, inject=inject)
        return NixlPlane(rows, rank=self._rank, inject=inject)

    # ---------------------------------------------------------------- contract

    @property
    def needs_profile_buffer_reservation(self) -> bool:
        """False: transfers land in the given expert_buffer; eplb needs no memory beyond it."""
        return False

    @property
    def plane(self) -> str:
        """The data plane rows move through ("ucx", "torch", "staged", "nixl")."""
        return self._native.plane

    @property
    def last_report(self):
        """The C++ protocol's report of the last execute() (an `eplb._eplb.RoundReport`: ok, code, message,
        retries, and per layer its attempts' retries, vote and commit times, plane), or None before one."""
        return self._last_report

    def set_stream(self, stream) -> None:
        """The stream vLLM runs the layer's copies on (kept; eplb's planes order their own work)."""
        self._stream = stream

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
        """Records that dst_rank receives expert_id from this rank (sent by execute()).

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
        problem = self._rank_problem(src_rank) or self._held_problem(src_rank, expert_id)
        row = None if problem else self._buffer_row(tensors)
        if problem or isinstance(row, str):
            self._problems.append(f"{call}: {problem or row}")
        else:
            self._recvs.append((row, src_rank, expert_id))

    def execute(self) -> None:
        """Collective: runs the recorded sends and recvs of the layer through eplb's protocol."""
        if self._layer is None:
            raise Error("execute: call set_transfer_context(old_indices, layer_idx) first", "not allowed")
        try:
            receives = [(src, self._source_slot(src, expert), row, expert) for row, src, expert in self._recvs]
            # The destination slot of a send is unknown here (the receiver knows it): the pairing
            # check matches (source, destination, source slot, expert) and the receiver's slot is its own.
            sends = [(dst, self._source_slot(self._rank, expert) - self._rank * self._slots, -1, expert)
                     for dst, expert in self._sends]
            result = self._native.exchange(self._layer, receives, sends, "; ".join(self._problems))
        finally:
            self._sends, self._recvs, self._problems = [], [], []
        self._last_report = result
        if not result.ok:
            raise migration_error(result, result.message, self._rank)

    # ---------------------------------------------------------------- inside

    @property
    def _slots(self) -> int:
        return len(self._weights[0][0])

    def _rank_problem(self, rank) -> str:
        """Why `rank` (an int or None) cannot be this rank's peer, or ""."""
        if rank is None or not 0 <= rank < self._size or rank == self._rank:
            return f"the peer is not another rank of the group [0, {self._size})"
        return ""

    def _held_problem(self, rank: int, expert) -> str:
        """Why `rank` cannot be the source of `expert` (an int or None) in the layer's old_indices, or ""."""
        if self._old is None:
            return "no transfer context: call set_transfer_context(old_indices, layer_idx) first"
        if expert is None or not np.any(self._old[rank * self._slots:(rank + 1) * self._slots] == expert):
            return f"rank {rank} does not hold that expert in old_indices of layer {self._layer}"
        return ""

    def _source_slot(self, rank: int, expert: int) -> int:
        """The global slot of the first row of `rank` holding `expert` (as vLLM's NIXL communicator reads)."""
        held = np.nonzero(self._old[rank * self._slots:(rank + 1) * self._slots] == expert)[0]
        return rank * self._slots + int(held[0])

    def _buffer_row(self, tensors):
        """The buffer row `tensors` are (one view per buffer tensor), or why they are not one."""
        if len(tensors) != len(self._buffer):
            return f"{len(tensors)} tensors, the layer has {len(self._buffer)}"
        rows = set()
        for t, (tensor, buffer) in enumerate(zip(tensors, self._buffer)):
            stride = setup.row_bytes(buffer)
            offset = tensor.data_ptr() - buffer.data_ptr()
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes != stride or offset % stride or not 0 <= offset // stride < buffer.shape[0]:
                return (f"tensor {t} ({nbytes} B at offset {offset}) is not one row of the expert buffer's tensor {t} "
                        f"({stride} B rows)")
            rows.add(offset // stride)
        if len(rows) != 1:
            return f"the tensors are rows {sorted(rows)} of the buffer, not one row"
        return rows.pop()


def _index(value):
    """`value` as an int (Python, numpy or torch integers), or None when it is not one."""
    try:
        return operator.index(value)
    except TypeError:
        return None
