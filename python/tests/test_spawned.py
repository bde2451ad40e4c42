"""spawned.run_ranks: ranks that overrun are killed at one deadline for all of them, `timeout` after
the start, so a hung world of N ranks costs about `timeout`, not N x timeout."""
import time

import pytest

from spawned import run_ranks


def sleep_long(rank, world):
    time.sleep(120)


def test_a_hung_world_is_killed_at_one_deadline(tmp_path):
    world, timeout = 3, 6.0
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"ranks \[0, 1, 2\] did not finish within 6.0 s"):
        run_ranks(tmp_path, world, sleep_long, timeout=timeout)
    elapsed = time.monotonic() - started
    # Joined one by one with the full timeout each, three hung ranks took 3 x 6 s.
    assert elapsed < 2 * timeout, f"{elapsed:.1f} s for {world} hung ranks with timeout {timeout} s"
