"""eplb.ProcessGroup: the collectives the migration engine needs, over torch.distributed or eplb's bootstraps.

Contract:
- `ProcessGroup.from_torch(group=None, store=None)`: an engine's own torch.distributed group (gloo, CPU) carries
  every collective: one allgather of bytes per collective, relayed through the group's rank 0 (a gloo
  gather, then a broadcast of them all) as fixed-size records (length + the first 4 KiB) when every
  rank's bytes fit, a second relay for the rest. eplb's deadline bounds each one, whatever gloo's own timeout: every rank first
  checks in under a key of the group's store, the gloo work is waited for with the time left, and
  on a failure the ranks that never checked in are named. The check-in store is `store` (any
  torch.distributed Store every rank of the group reaches), by default the store the default group
  was initialised with (torch has no public accessor for it: `distributed_c10d._get_default_store`,
  the one private name used here). A closed connection (a rank died) raises
  eplb.Error with code "remote disconnect", a deadline "timeout"; the group is unusable afterwards.
  The rank that finds a collective failed (often rank 0, whose gather meets the lost rank) publishes
  its diagnosis in the store, and the ranks still waiting raise it too, "(found by rank N)".
- `ProcessGroup.from_env(timeout=30)`: eplb's own bootstraps, for scripts without torch.distributed:
  the local launcher's environment (EPLB_RANK, EPLB_SIZE, EPLB_BOOTSTRAP_DIR) or mpirun's.
- `rank`, `size`, `backend`, `allgather(data, timeout)`, `barrier(timeout)`; collectives are called
  in the same order on every rank.
"""
from __future__ import annotations

import itertools
import time
import zlib

from eplb import _eplb
from eplb.errors import Error

__all__ = ["ProcessGroup"]


class ProcessGroup:
    """The ranks of one migration and their collectives (see the module's docstring)."""

    def __init__(self, native):
        self._native = native

    @classmethod
    def from_torch(cls, group=None, store=None) -> "ProcessGroup":
        """Wraps a torch.distributed group that works on CPU tensors (gloo); None: the default group.

        store: a torch.distributed Store shared by the group's ranks for eplb's check-in keys (which
        name the ranks that never arrived); None: the default group's store.
        """
        exchange = _TorchExchange(group, store)
        return cls(_eplb.python_group(exchange, exchange.rank, exchange.size, "torch.distributed"))

    @classmethod
    def from_env(cls, timeout: float = 30.0) -> "ProcessGroup":
        """Forms the group of ranks started by eplb's local launcher or by mpirun (eplb.Error otherwise)."""
        if timeout <= 0:
            raise Error(f"timeout must be > 0 seconds, got {timeout}")
        if _eplb.launched_by_mpirun():
            return cls(_eplb.mpi_group(float(timeout)))
        return cls(_eplb.local_group_from_env(float(timeout)))

    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def size(self) -> int:
        return self._native.size

    @property
    def backend(self) -> str:
        return self._native.backend

    def allgather(self, data: bytes, timeout: float) -> list[bytes]:
        """Every rank contributes `data`; returns every rank's, indexed by rank."""
        return self._native.allgather(bytes(data), float(timeout))

    def barrier(self, timeout: float) -> None:
        self._native.barrier(float(timeout))

    def __repr__(self) -> str:
        return f"eplb.ProcessGroup(rank={self.rank}, size={self.size}, backend={self.backend!r})"


_instances = itertools.count()
# Check-in keys are counters (Store.add), one per rank in each of a few slots that collectives use in
# turn (no key to delete afterwards, one store round trip per collective): checking in to collective
# n raises the rank's counter in slot n % _CHECK_IN_SLOTS to (n + 1) * _MARK_STRIDE + the kind's code.
# Ranks are at most one collective apart, so a slot is never needed by two at once.
_KINDS = {"allgather": 1, "barrier": 2, "vote": 3}
_CHECK_IN_SLOTS, _MARK_STRIDE = 4, 8
# Bytes of each rank's data carried by the first relay of a collective (votes, barriers and most
# layers' checksum lists fit); longer data takes a second relay.
_INLINE = 4096
_KIND_NAMES = {code: name for name, code in _KINDS.items()}
# How often a rank waiting for gloo work looks in the store for a failure another rank found.
_POLL_SECONDS = 0.1


def _check_in_mark(number: int, kind: str) -> int:
    return (number + 1) * _MARK_STRIDE + _KINDS[kind]


class _RelayedFailure(Exception):
    """A collective's failure as another rank diagnosed it (published in the store)."""

    def __init__(self, code: str, reporter: str, detail: str, peer=None):
        super().__init__(detail)
        self.code, self.reporter, self.detail, self.peer = code, reporter, detail, peer


class _TorchExchange:
    """exchange(kind, data, timeout) -> list[bytes] over a gloo group, bounded by eplb's deadline."""

    def __init__(self, group, store=None):
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise Error("eplb.ProcessGroup.from_torch: torch.distributed is not initialized "
                        "(call torch.distributed.init_process_group first, or use ProcessGroup.from_env)")
        self._torch, self._dist = torch, dist
        self._group = group if group is not None else dist.group.WORLD
        backend = dist.get_backend(self._group)
        if backend != "gloo":
            raise Error(f"eplb.ProcessGroup.from_torch: the group's backend is {backend!r}; eplb's collectives "
                        "carry CPU bytes and need a gloo group (vLLM's cpu_group, or dist.new_group(backend='gloo'))")
        self.rank = dist.get_rank(self._group)
        self.size = dist.get_world_size(self._group)
        self._store = store if store is not None else dist.distributed_c10d._get_default_store()
        if not isinstance(self._store, dist.Store):
            raise Error(f"eplb.ProcessGroup.from_torch: store must be a torch.distributed.Store, got "
                        f"{type(self._store).__name__}")
        members = sorted(dist.get_process_group_ranks(self._group))
        self._root = members[0]  # the group's rank 0 (torch.distributed.new_group sorts its ranks)
        self._prefix = f"eplb/{zlib.crc32(repr(members).encode()):08x}/{next(_instances)}"
        self._sequence = 0
        self._marks = [0] * _CHECK_IN_SLOTS  # this rank's counter in each check-in slot
        self._broken = ""

    def __call__(self, kind: str, data: bytes, timeout: float) -> list[bytes]:
        if self._broken:
            raise Error(f"torch.distributed group unusable since {self._broken}", "remote disconnect")
        started = time.monotonic()
        deadline = started + timeout
        number = self._sequence
        self._sequence += 1
        key = f"{self._prefix}/{number}"
        what = f"{kind} #{number} of the torch.distributed group (rank {self.rank} of {self.size})"
        try:
            mark = _check_in_mark(number, kind)
            self._store.add(self._check_in_key(number, self.rank), mark - self._marks[number % _CHECK_IN_SLOTS])
            self._marks[number % _CHECK_IN_SLOTS] = mark
        except RuntimeError as failure:
            self._broken = f"its store failed in the {what}"
            raise Error(f"{what}: the group's store (on rank 0's host) is unreachable: {failure}",
                        "remote disconnect", peer=0) from None
        try:
            return self._gather(data, key, deadline)
        except _RelayedFailure as relayed:
            raise Error(f"{what}{relayed.detail} (found by rank {relayed.reporter})", relayed.code,
                        peer=relayed.peer) from None
        except RuntimeError as failure:
            error = self._diagnose(what, number, kind, started, deadline, str(failure))
            self._publish_failure(key, what, error)
            raise error from None

    def _gather(self, data: bytes, key: str, deadline: float) -> list[bytes]:
        """Every rank's data: one relay of [length, first _INLINE bytes] records, a second for what is longer."""
        torch = self._torch
        record = torch.zeros(8 + _INLINE, dtype=torch.uint8)
        record[:8] = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
        head = data[:_INLINE]
        if head:
            record[8:8 + len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        records = self._relay(record, key, deadline)
        sizes = [int(item[:8].view(torch.int64).item()) for item in records]
        heads = [records[r][8:8 + min(sizes[r], _INLINE)].numpy().tobytes() for r in range(self.size)]
        longest = max(sizes)
        if longest <= _INLINE:
            return heads
        tail = torch.zeros(longest - _INLINE, dtype=torch.uint8)
        if len(data) > _INLINE:
            tail[:len(data) - _INLINE] = torch.frombuffer(bytearray(data[_INLINE:]), dtype=torch.uint8)
        tails = self._relay(tail, key, deadline)
        return [heads[r] + tails[r][:max(sizes[r] - _INLINE, 0)].numpy().tobytes() for r in range(self.size)]

    def _relay(self, mine, key: str, deadline: float) -> list:
        """Every rank's `mine` (uint8 tensors of one size), by rank: a gloo gather to the group's rank 0,
        which broadcasts them all. Two steps instead of the ring all_gather's size - 1: with 4 ranks on
        2 cores 0.7 ms against 3.5 ms here (gloo, torch 1.13)."""
        dist = self._dist
        width = mine.numel()
        table = self._torch.empty(self.size * width, dtype=self._torch.uint8)
        parts = list(table.split(width))
        gathered = dist.gather(mine, parts if self.rank == 0 else None, dst=self._root, group=self._group,
                               async_op=True)
        self._wait(gathered, key, deadline)
        self._wait(dist.broadcast(table, self._root, group=self._group, async_op=True), key, deadline)
        return parts

    def _wait(self, work, key: str, deadline: float) -> None:
        """Waits for gloo work until the deadline, in slices: a rank that only waits for rank 0's broadcast
        learns from the store when another rank found the collective failed (rank 0's gather names a
        lost rank at once; gloo would keep the others waiting for its own timeout)."""
        import datetime

        while True:
            left = deadline - time.monotonic()
            try:
                work.wait(timeout=datetime.timedelta(seconds=max(min(left, _POLL_SECONDS), 0.001)))
                return
            except RuntimeError as failure:
                if left <= _POLL_SECONDS or "timed out" not in str(failure).lower():
                    raise
            relayed = self._relayed_failure(key)
            if relayed is not None:
                raise relayed

    def _publish_failure(self, key: str, what: str, error: Error) -> None:
        """Tells the group's other ranks (waiting in _wait) why this collective failed; best effort."""
        detail = str(error)[len(what):] if str(error).startswith(what) else f": {error}"
        try:
            peer = "" if error.peer is None else str(error.peer)
            self._store.set(f"{key}/failure", f"{error.code}\n{self.rank}\n{peer}\n{detail}")
            self._store.add(f"{key}/failed", 1)
        except RuntimeError:
            pass  # the store is gone too; the others find that themselves

    def _relayed_failure(self, key: str):
        """The Error another rank published for this collective, or None."""
        try:
            if self._store.add(f"{key}/failed", 0) == 0:
                return None
            code, reporter, peer, detail = self._store.get(f"{key}/failure").decode().split("\n", 3)
        except (RuntimeError, ValueError):
            return None  # rank 0's store is gone: the gloo work fails or times out on its own
        self._broken = f"rank {reporter} found the collective failed"
        return _RelayedFailure(code, reporter, detail, int(peer) if peer else None)

    def _diagnose(self, what: str, number: int, kind: str, started: float, deadline: float, failure: str) -> Error:
        """The error for a failed gloo collective: which ranks never checked in, and why it failed."""
        elapsed = time.monotonic() - started
        timed_out = time.monotonic() >= deadline - 0.01 or "timed out" in failure.lower()
        # A rank that is alive checks in at once; give the slow ones a moment (within the deadline),
        # and while several are absent wait up to the collective's deadline: a lost rank is rarely
        # more than one, and on a loaded machine (a sanitizer build, 3 ranks on 2 cores) a live rank
        # took over 4 s to reach the collective and was named as lost with the dead one.
        now = time.monotonic()
        grace_end, patient_end = min(deadline, now + 1.0), deadline
        absent, other_kind = self._check_ins(number, kind)
        while absent and (time.monotonic() < grace_end or (len(absent) > 1 and time.monotonic() < patient_end)):
            time.sleep(0.02)
            absent, other_kind = self._check_ins(number, kind)
        self._broken = f"the {what} failed"
        if absent is None:
            return Error(f"{what} failed after {elapsed:.2f} s and the group's store is unreachable: rank 0 lost "
                         f"({failure.strip()})", "remote disconnect", peer=0)
        names = ", ".join(str(r) for r in absent)
        if other_kind:
            return Error(f"{what}: rank {other_kind[0][0]} is in a {other_kind[0][1]} instead", "mismatch",
                         peer=other_kind[0][0])
        if timed_out:
            who = f"ranks {names} did not join it" if len(absent) > 1 else (
                f"rank {names} did not join it" if absent else "every rank joined it, but it did not complete")
            return Error(f"{what} not answered within {elapsed:.1f} s: {who} ({failure.strip()})", "timeout",
                         peer=absent[0] if absent else None)
        who = (f"rank {names} lost: it never joined" if absent
               else "a rank's connection closed during it (every rank had joined)")
        return Error(f"{what} failed after {elapsed:.2f} s: {who} ({failure.strip()})", "remote disconnect",
                     peer=absent[0] if absent else None)

    def _check_ins(self, number: int, kind: str):
        """(ranks that have not checked in to collective `number`, [(rank, kind)] of ranks in another one)."""
        absent, other_kind = [], []
        for r in range(self.size):
            try:
                theirs = self._store.add(self._check_in_key(number, r), 0)  # read: add nothing
            except RuntimeError:
                return None, []  # the store itself is gone (it lives in rank 0's process)
            if theirs < _check_in_mark(number, kind) - _KINDS[kind]:
                absent.append(r)
            elif theirs % _MARK_STRIDE != _KINDS[kind]:
                code = theirs % _MARK_STRIDE
                other_kind.append((r, _KIND_NAMES.get(code, f"collective of code {code}")))
        return absent, other_kind

    def _check_in_key(self, number: int, rank: int) -> str:
        return f"{self._prefix}/check-in/{number % _CHECK_IN_SLOTS}/{rank}"
