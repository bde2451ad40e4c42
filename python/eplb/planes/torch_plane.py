"""TorchPlane ("torch"): rows move over the engine's own torch.distributed data group, one
batch_isend_irecv per layer attempt; NCCL carries CUDA tensors, gloo CPU tensors, with the same code.

Contract (eplb/planes/__init__.py has the plane protocol):
- post() turns the layer's sends and receives, in the canonical order the C++ protocol gives (every
  rank derives it from the same plan, so the order of the s->d pairs is the same on both sides),
  into isend/irecv of uint8 row views (every dtype moves as bytes, FP8 on gloo included), one
  operation per row and tensor, and starts them as one batch_isend_irecv. On CUDA they run on a
  side stream, as do digests and staging copies; every use of the side stream first waits for the
  caller's current stream, and commit() orders the engine's current stream after the side stream,
  copies there, and makes the side stream wait for that copy (the staging rows are shared by every
  layer): CUDA events both ways, no host synchronization but the digests' [rows] results.
- wait(timeout) polls Work.is_completed() against the deadline: NCCL and gloo point-to-point waits
  cannot be cancelled. A failed operation raises eplb.Error naming the layer, the peer (the `peer`
  attribute), the bytes and the elapsed time, code "remote disconnect" when the peer's connection
  closed. Past the deadline it raises code "timeout" and the plane is broken for good (`broken`
  says why): an NCCL communicator with a pending operation must be aborted (done here, best
  effort), and a gloo pair whose deadline passed is closed; the Migrator then refuses further
  rounds until it is given a new data group. abandon() with operations still pending breaks it too.
"""
from __future__ import annotations

import time

from eplb.digest import KIND
from eplb.errors import Error
from eplb.planes.faults import FaultSpec

__all__ = ["TorchPlane"]


def _bytes_text(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


class TorchPlane:
    """Rows over a torch.distributed group (see the module's docstring)."""

    name = "torch"
    digest_kind = KIND
    one_sided = False

    def __init__(self, rows, group, *, rank: int, inject: str = ""):
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self._rows, self._group, self._rank = rows, group, rank
        self._backend = str(dist.get_backend(group))
        self._faults = FaultSpec(inject, rank)
        self._side = torch.cuda.Stream(rows.device) if rows.device.type == "cuda" else None
        self._works, self._meta = [], []
        self._layer, self._started, self._received = None, 0.0, []
        self.broken = None

    # ---------------------------------------------------------------- set-up

    def describe(self) -> bytes:
        return b""  # the data group knows its peers

    def connect(self, blobs, me: int) -> None:
        if self._dist.get_rank(self._group) != me:
            raise Error(f"the data group's rank {self._dist.get_rank(self._group)} is not this rank's control "
                        f"group rank {me}: both groups must hold the same processes in the same order", "mismatch")

    # ---------------------------------------------------------------- rows

    def _on_side(self):
        """The side stream as the current stream, ordered after the caller's current stream (the engine's writes
        to its tensors, a previous layer's commit reading the staging rows); no host synchronization."""
        import contextlib

        if self._side is None:
            return contextlib.nullcontext()
        self._side.wait_stream(self._torch.cuda.current_stream(self._rows.device))
        return self._torch.cuda.stream(self._side)

    def digest(self, rows) -> list[int]:
        with self._on_side():
            return self._rows.digest(rows)

    def copy(self, copies) -> None:
        with self._on_side():
            self._rows.copy(copies)

    def commit(self, copies) -> None:
        """On the engine's current stream, after the side stream's transfers and digests (a CUDA event each way:
        the side stream's later work, e.g. the next layer landing in the shared staging rows, waits for this copy)."""
        if self._side is None:
            return self._rows.copy(copies)
        current = self._torch.cuda.current_stream(self._rows.device)
        current.wait_stream(self._side)
        self._rows.copy(copies)
        self._side.wait_stream(current)

    # ---------------------------------------------------------------- transfers

    def _operations(self, receives, sends):
        """[(op, row view, peer, what)] in the canonical order, sends then receives."""
        out = []
        if not self.broken and not self._faults.draw(self._faults.stall):
            for peer, (layer, slot, buffer), _, expert in sends:
                for t in range(self._rows.tensors(layer)):
                    out.append((self._dist.isend, self._rows.row(layer, slot, buffer, t), peer, f"send of expert {expert}"))
        self._received = []
        for peer, _, _, (layer, slot, buffer), expert in receives:
            self._received.append((layer, slot, buffer))
            for t in range(self._rows.tensors(layer)):
                out.append((self._dist.irecv, self._rows.row(layer, slot, buffer, t), peer,
                            f"receive of expert {expert}"))
        return out

    def post(self, layer: int, receives, sends, timeout: float) -> None:
        if self.broken:
            raise Error(f"the {self.name} data plane cannot be used again: {self.broken}", "not allowed")
        self._layer, self._started = layer, time.monotonic()
        operations = self._operations(receives, sends)
        self._meta = [(peer, what, view.numel()) for _, view, peer, what in operations]
        ops = [self._dist.P2POp(op, view, group=self._group, group_peer=peer) for op, view, peer, _ in operations]
        with self._on_side():
            self._works = self._dist.batch_isend_irecv(ops) if ops else []

    def wait(self, timeout: float) -> None:
        self._wait_works(timeout)
        self._land()
        self._inject_after_landing()

    def _land(self) -> None:
        """After every operation completed: nothing here (the rows are where they belong)."""

    def _wait_works(self, timeout: float) -> None:
        if self._backend == "gloo":
            return self._wait_gloo(time.monotonic() + timeout)
        deadline, pause = time.monotonic() + timeout, 20e-6
        while True:
            pending = [i for i, work in enumerate(self._works) if not work.is_completed()]
            self._raise_failures(set(pending))
            if not pending:
                break
            if time.monotonic() >= deadline:
                raise self._timed_out(pending)
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
        self._works = []

    def _wait_gloo(self, deadline: float) -> None:
        """gloo's point-to-point works complete only inside wait() (is_completed() stays False until then),
        so each is waited on with the time left to the deadline; a wait that runs out of it ends the layer."""
        from datetime import timedelta

        for i, work in enumerate(self._works):
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timed_out(list(range(i, len(self._works))))
            try:
                work.wait(timedelta(seconds=left))
            except Exception as failure:  # noqa: BLE001  (the backend's own error, named below)
                if "timed out" in str(failure).lower() or time.monotonic() >= deadline:
                    raise self._timed_out(list(range(i, len(self._works)))) from None
                self._raise_failure(i, failure)
        self._works = []

    def _raise_failures(self, pending: set) -> None:
        for i, work in enumerate(self._works):
            if i in pending:
                continue
            try:
                work.wait()
            except Exception as failure:  # noqa: BLE001  (the backend's own error, named below)
                self._raise_failure(i, failure)

    def _raise_failure(self, i: int, failure: Exception) -> None:
        peer, what, nbytes = self._meta[i]
        text = str(failure).strip() or type(failure).__name__
        closed = any(word in text.lower() for word in ("closed", "reset", "broken pipe", "connection"))
        self.broken = f"layer {self._layer}: {what} with rank {peer} failed: {text.splitlines()[0]}"
        raise Error(f"layer {self._layer}: {self._backend} {what} with rank {peer} ({_bytes_text(nbytes)}) "
                    f"failed after {time.monotonic() - self._started:.2f} s: {text.splitlines()[0]}",
                    "remote disconnect" if closed else "backend error", peer=peer) from None

    def _timed_out(self, pending) -> Error:
        peers = sorted({self._meta[i][0] for i in pending})
        nbytes = sum(self._meta[i][2] for i in pending)
        self.broken = (f"a {self._backend} point-to-point wait of layer {self._layer} passed its deadline and cannot "
                       "be cancelled")
        self._abort_group()
        return Error(f"layer {self._layer}: {len(pending)} of {len(self._works)} {self._backend} operations with ranks "
                     f"{', '.join(map(str, peers))} ({_bytes_text(nbytes)}) not done after "
                     f"{time.monotonic() - self._started:.2f} s; the data group cannot be used again: give the "
                     "Migrator a new data_group", "timeout", peer=peers[0])

    def _abort_group(self) -> None:
        """NCCL: abort the communicator (its pending operations would hold its streams); best effort."""
        if self._backend == "nccl":
            abort = getattr(self._group, "abort", None)
            try:
                if abort is not None:
                    abort()
            except Exception:  # noqa: BLE001  (already failing; the timeout is what is reported)
                pass

    def _inject_after_landing(self) -> None:
        if self._faults.draw(self._faults.err):
            raise Error(f"layer {self._layer}: injected transfer error on rank {self._rank}", "backend error")
        if self._received and self._faults.draw(self._faults.corrupt):
            layer, slot, buffer = self._received[self._faults.pick(len(self._received))]
            row = self._rows.row(layer, slot, buffer, 0)
            row[0] ^= 0x5A

    def abandon(self) -> None:
        if any(not work.is_completed() for work in self._works) and not self.broken:
            self.broken = f"operations of layer {self._layer} were left in flight"
            self._abort_group()
        self._works, self._meta = [], []
