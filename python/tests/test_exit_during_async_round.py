"""Issue 29, item 9: a process that leaves during an async round without close() (sys.exit, an
uncaught KeyboardInterrupt) exits cleanly: no abort or crash at interpreter exit, the round is
abandoned like abort() at exit, its thread joined, nothing left in /dev/shm; the peer gets a named
error and both ranks end with the same layers new.
"""
import json
import os
import signal

import pytest

from spawned import run_exit_case


def shm_entries() -> set:
    """UCX's shared-memory segments (what a Migrator's agent creates; `eplb run`'s eplb-* launch
    directories, which other runs on the machine may create meanwhile, are not the Migrator's)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("ucx")}


@pytest.mark.parametrize("mode, exit_code", [("exit", 3), ("interrupt", -signal.SIGINT)])
def test_leaving_an_async_round_without_close_exits_cleanly_and_consistently(tmp_path, mode, exit_code):
    before = shm_entries()
    ran = run_exit_case(tmp_path, mode)
    if ran is None:
        pytest.fail(f"a rank did not finish within 120 s ({mode})")
    returncodes, outputs = ran
    stderr = outputs[1][1]
    assert returncodes[1] == exit_code, f"rank 1 exited with {returncodes[1]}: {stderr[-3000:]}"
    for marker in ("terminate called", "Fatal Python error", "Segmentation fault", "future_error", "Aborted"):
        assert marker not in stderr, stderr[-3000:]
    assert returncodes[0] == 0, outputs[0][1][-3000:]
    states = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert states[1]["done"], "the round was not closed at exit"
    assert states[0]["error"] is not None and "rank 1" in states[0]["error"]["message"], states[0]
    for state in states:
        assert state["wrong"] == [], state
    assert states[0]["committed"] == states[1]["committed"], states
    assert shm_entries() <= before, f"left in /dev/shm: {shm_entries() - before}"
