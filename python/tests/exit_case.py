"""One rank of the exit test (issue 29, item 9): run as `python exit_case.py RANK WORLD PORT MODE OUT`.

Both ranks start an async round. Rank 0 serves until the round ends and closes it. Rank 1, after its
first commit, leaves without close(): MODE "exit" calls sys.exit(3), MODE "interrupt" raises an
uncaught KeyboardInterrupt. The test checks that rank 1 exits cleanly (no abort, no crash), that rank 0
gets a named error, and that both ranks' slots are consistent. Rank 1 writes its committed layers and
mismatches to OUT from an atexit handler registered before eplb's own, so it runs after eplb closed
the round at exit (atexit runs handlers last in, first out).
"""
import atexit
import json
import sys
import time

STATE = {}


@atexit.register
def _write_state_after_eplb_closed_the_round() -> None:
    if "handle" not in STATE:
        return
    handle, committed = STATE["handle"], STATE["handle"].committed_layers
    state = {"committed": committed, "done": handle.done,
             "wrong": mismatches(STATE["weights"], in_force(STATE["old"], STATE["new"], committed), STATE["rank"])}
    with open(STATE["out"], "w") as file:
        json.dump(state, file)


import numpy as np  # noqa: E402  (after the handler above: see the docstring)
import torch.distributed as dist  # noqa: E402

import eplb  # noqa: E402
from async_cases import in_force  # noqa: E402
from migration_cases import fill, make_weights, mismatches, random_placement  # noqa: E402


def main() -> None:
    rank, world, port, mode, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rng = np.random.default_rng(41)
    layers, slots = 6, 3
    old, new = (random_placement(rng, layers, slots * world, slots * world - 1) for _ in range(2))
    weights = make_weights(layers, slots, "plain")
    fill(weights, old, rank)
    migrator = eplb.Migrator(weights, timeout=5)
    handle = migrator.start(old, new)
    error = None
    deadline = time.monotonic() + 60
    try:
        while not handle.done and time.monotonic() < deadline:
            if handle.commit_ready() and rank == 1:
                STATE.update(handle=handle, weights=weights, old=old, new=new, rank=rank, out=out)
                if mode == "exit":
                    sys.exit(3)
                raise KeyboardInterrupt
            time.sleep(0.002)
        handle.poll()
    except eplb.MigrationError as failure:
        error = {"type": type(failure).__name__, "message": str(failure)}
    handle.close()
    committed = handle.committed_layers
    with open(out, "w") as file:
        json.dump({"error": error, "committed": committed,
                   "wrong": mismatches(weights, in_force(old, new, committed), rank)}, file)


if __name__ == "__main__":
    main()
