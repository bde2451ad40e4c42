"""StagedPlane ("staged"): device rows through pinned host buffers. The rows a rank sends are copied
to host memory on a side stream, moved between the hosts' buffers by torch.distributed on a CPU
(gloo) group, and the received rows copied back to their device rows on the side stream. It serves
ranks without NCCL between them, and it is the CUDA path one GPU can test with two processes.

Contract (eplb/planes/__init__.py has the plane protocol; TorchPlane the deadline and failure
rules, which hold here too): digests, staging copies and the commit run on the device as in
TorchPlane; only the transfer goes through the host. `device_copy(target, source)` is the one place
a device row meets a host row (default: target.copy_(source, non_blocking=True) on the side stream,
then a synchronize before the host bytes are sent or after the device rows are written): a test
hook takes its place to exercise this logic with CPU tensors (the `device_copy` argument, or
TEST_DEVICE_COPY for planes the Migrator makes). Host buffers are pinned (when CUDA is
there), grown as needed and reused across layers.
"""
from __future__ import annotations

from eplb.planes.torch_plane import TorchPlane

__all__ = ["StagedPlane"]

TEST_DEVICE_COPY = None  # tests: callable(target, source) standing in for every device copy


class StagedPlane(TorchPlane):
    """Device rows staged through pinned host memory (see the module's docstring)."""

    name = "staged"

    def __init__(self, rows, cpu_group, *, rank: int, inject: str = "", device_copy=None):
        super().__init__(rows, cpu_group, rank=rank, inject=inject)
        self._device_copy = device_copy or TEST_DEVICE_COPY or self._copy_on_side_stream
        self._host = None  # flat uint8 host buffer: the sends' rows, then the receives'
        self._landing = []  # [(device row, host row)] of the receives, copied back after the wait

    @staticmethod
    def _copy_on_side_stream(target, source) -> None:
        """One device copy; its callers put the side stream in force once for all of a layer's rows."""
        target.copy_(source, non_blocking=True)

    def _synchronize(self) -> None:
        if self._side is not None:
            self._side.synchronize()

    def _host_rows(self, nbytes: int):
        torch = self._torch
        if self._host is None or self._host.numel() < nbytes:
            pinned = torch.cuda.is_available()
            self._host = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pinned)
        return self._host

    def _operations(self, receives, sends):
        """The TorchPlane operations over host copies of the rows."""
        device_ops = super()._operations(receives, sends)
        host = self._host_rows(sum(view.numel() for _, view, _, _ in device_ops))
        out, offset, self._landing = [], 0, []
        with self._on_side():
            for op, view, peer, what in device_ops:
                host_row = host[offset:offset + view.numel()]
                offset += view.numel()
                if op is self._dist.isend:
                    self._device_copy(host_row, view)
                else:
                    self._landing.append((view, host_row))
                out.append((op, host_row, peer, what))
        self._synchronize()  # the sent rows are on the host before gloo reads them
        return out

    def _land(self) -> None:
        """The received host rows back to their device rows (before digests or injected faults)."""
        with self._on_side():
            for view, host_row in self._landing:
                self._device_copy(view, host_row)
        self._synchronize()
        self._landing = []
