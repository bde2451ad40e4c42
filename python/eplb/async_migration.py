"""eplb.AsyncMigration: a migration round overlapped with serving (Migrator.start).

Contract:
- `h = migrator.start(old_phy2log, new_phy2log)` is collective and returns at once; a background
  thread of the engine transfers, verifies and votes layer by layer (docs/async.md). It never
  writes a live row.
- The serving loop calls `h.commit_ready(max_layers=1)` once per serving step, before the step, on
  every rank (expert-parallel steps run in lockstep). It returns the layers committed in that
  call: their live rows now hold the new experts. Every rank commits a layer at the same step (the
  step the layer's vote fixed). The call waits (the GIL released) only when this rank reaches a
  step whose commit is still being voted on.
- A failure of the round raises, from the next `poll()` or `commit_ready()`, the sync path's typed
  exception (eplb.MigrationError, eplb.TimeoutError, eplb.PeerLostError) with `committed_layers`;
  committed layers stay new and the others old on every rank.
- A layer the ranks voted to commit is committed by every rank: a serving loop that stalls past the
  deadline after the vote still commits it, at its first commit_ready() from the agreed step on, or
  at close() (its round stops with eplb.TimeoutError, and the others' with the error naming it).
  After close() every rank holds the same layers new.
- A round still running when the interpreter exits (no close(), an uncaught KeyboardInterrupt) is
  closed at exit like close(): aborted, drained, its thread joined.
- `h.abort()` asks the round to stop at its next vote (every rank stops there); keep calling
  `commit_ready()` until `h.done`. A round this rank aborted ends without raising (`h.aborted`).
- `h.report()` once done: the report dict of Migrator.migrate (its "verified" is None: no
  after-round agreement runs in async mode). `h.close()` (or leaving a `with` block) aborts an
  unfinished round, drains it and joins the engine's thread.
- The group the Migrator uses carries the round's votes from the engine's thread while the
  round runs: the serving loop must not run its own collectives on that same group meanwhile
  (use a separate torch.distributed group for serving).
"""
from __future__ import annotations

import atexit
import time
import weakref

from eplb.errors import Error, MigrationError

__all__ = ["AsyncMigration"]

# Rounds not yet finished: closed at interpreter exit (a script that exits, or a KeyboardInterrupt,
# without close() must not leave the engine's thread running into the interpreter's teardown).
_live: "weakref.WeakSet[AsyncMigration]" = weakref.WeakSet()


@atexit.register
def _close_live_rounds() -> None:
    for handle in list(_live):
        try:
            handle.close()
        except Exception:  # noqa: BLE001  (at exit, the round's failure has nobody to go to)
            pass


class AsyncMigration:
    """A running async round (see the module's docstring); made by eplb.Migrator.start."""

    def __init__(self, migrator, native, *, make_error, make_report, drain_seconds: float):
        self._migrator, self._native = migrator, native
        self._make_error, self._make_report = make_error, make_report
        self._drain_seconds = drain_seconds  # close(): how long draining may take (the library's deadline)
        self._step = -1
        self._committed: list[int] = []
        self._abort_requested = False
        self._failure: MigrationError | None = None
        self._stopped_by_abort = False
        self._report = None
        _live.add(self)

    @property
    def step(self) -> int:
        """The number of the last serving step commit_ready() was called for (-1 before the first)."""
        return self._step

    @property
    def committed_layers(self) -> list[int]:
        """Layers this round committed so far, in commit order."""
        return list(self._committed)

    @property
    def ready(self) -> bool:
        """A layer has been voted through and waits for its commit step."""
        return self._report is None and self._native.ready()

    @property
    def done(self) -> bool:
        """The round has ended: every layer committed, or failed, or aborted."""
        self._finish_if_ended()
        return self._report is not None or self._native.done()

    @property
    def aborted(self) -> bool:
        """This rank called abort() and the round ended because of it (before all its layers committed)."""
        if self._report is None and self._native.done():
            self._finish()
        return self._stopped_by_abort

    def poll(self) -> None:
        """Raises the round's failure (the typed exception of the sync path) if it failed; else nothing."""
        if self._failure is not None:
            raise self._failure
        if self._report is not None:
            return
        self._raise_unless_ok(self._native.poll())
        self._finish_if_ended()

    def commit_ready(self, max_layers: int = 1) -> list[int]:
        """Call once per serving step, before the step: commits the layers due at this step.

        Args:
            max_layers: at most this many layers are committed in this call (>= 1; the engine
                stages one layer at a time, so one is committed per call at most today).
        Returns:
            The layers committed by this call (their live rows and mapping are new now).
        Raises:
            ValueError (eplb.Error) for max_layers < 1; the round's typed MigrationError if it failed.
        """
        if not isinstance(max_layers, int) or max_layers < 1:
            raise Error(f"max_layers must be an int >= 1, got {max_layers!r}")
        if self._failure is not None:
            raise self._failure
        if self._report is not None:
            return []
        self._step += 1
        started = time.perf_counter()
        try:
            result = self._native.commit_ready(self._step, max_layers)
        finally:  # also when on_layer raised after a commit
            self._migrator._repoint_swapped()
        self._migrator._observe_stall(time.perf_counter() - started)
        layers = result.layers
        self._committed.extend(layers)
        self._raise_unless_ok(result)
        self._finish_if_ended()
        if self._failure is not None:
            raise self._failure
        return list(layers)

    def abort(self) -> None:
        """Asks the round to stop at its next vote, on every rank; keep calling commit_ready() until done."""
        self._abort_requested = True
        if self._report is None:
            self._native.abort()

    def report(self) -> dict:
        """The round's report (as Migrator.migrate's, "verified" None); only once done."""
        if not self.done:
            raise Error("report(): the async migration is still running (call commit_ready() until done)",
                        "not allowed")
        self._finish()
        return self._report

    def close(self) -> None:
        """Aborts an unfinished round, drains it (commit_ready until done) and joins the engine's thread."""
        if self._report is not None:
            return
        if not self._native.done():
            self.abort()
            deadline = time.monotonic() + self._drain_seconds
            while not self._native.done() and time.monotonic() < deadline:
                try:
                    self.commit_ready()
                except MigrationError:
                    pass
                time.sleep(0.001)
        self._finish()

    def __enter__(self) -> "AsyncMigration":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        native = getattr(self, "_native", None)
        if native is not None and getattr(self, "_report", None) is None:
            native.close()

    def _finish_if_ended(self) -> None:
        """Once the engine's thread has ended (and no voted commit waits for a step): join it now and
        count the round (eplb.metrics), whether or not report() is ever called."""
        if self._report is None and self._native.done() and not self._native.ready():
            self._finish()

    def _raise_unless_ok(self, step) -> None:
        if step.ok:
            return
        self._finish()  # the round has failed: wait for the engine's thread to end, take its report
        if self._failure is not None:
            raise self._failure

    def _finish(self) -> None:
        """Joins the engine's thread and turns its report into the report dict or the typed error."""
        if self._report is not None:
            return
        result = self._native.close()
        _live.discard(self)
        self._migrator._async = None
        self._migrator._observe_round(result.layers)
        self._report = self._make_report(result)
        # A layer owed by a late serving thread commits when the handle closes: the report says so.
        self._committed = [layer.layer for layer in result.layers if layer.committed]
        if result.ok:
            return
        if self._abort_requested and result.code == "aborted" and result.callback_error is None:
            self._stopped_by_abort = True
            return
        self._failure = self._make_error(result)
        self._failure.__cause__ = result.callback_error
