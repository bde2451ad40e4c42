"""One Python-migrator row of the fault matrix (issue 29, items 1, 2 and 9): 2 ranks on a gloo group.

Usage: python bench/python_fault_case.py stale|stall|exit

  stale  rank 1 passes a stale old placement (layer 0's slots 0 and 1 swapped) to Migrator.migrate();
         must: MigrationError (mismatch) on every rank before anything moves.
  stall  async round, timeout=1; rank 1 stops calling commit_ready() after its first commit for longer
         than the deadline; must: the same layers committed on every rank, each wholly old or new.
  exit   async round; rank 1 leaves with sys.exit(3) after its first commit, without close();
         must: a clean exit (no abort or crash), rank 0 names the lost rank, the ranks agree.

The ranks run the cases of python/tests (consistency_cases.py, exit_case.py). The outcome is printed
in the fault matrix's terms (bench/fault_matrix.sh): a refusal prints each rank's error and exits 1
with no "round ... stopped" line; an abort prints one "eplb: rank N: round 1 stopped; ... slots
verified byte for byte against that mapping" line per rank whose slots all hold what the layers it
committed say, or VERIFICATION FAILED with the wrong slots; exit 1 either way.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "python" / "tests"
sys.path.insert(0, str(TESTS))


def stopped_lines(states: list) -> list[str]:
    """The matrix's per-rank state lines (or VERIFICATION FAILED lines) of an aborted round."""
    lines = []
    for rank, state in enumerate(states):
        if state["wrong"]:
            lines.append(f"eplb: rank {rank}: VERIFICATION FAILED: {state['wrong'][:4]}")
        else:
            lines.append(f"eplb: rank {rank}: round 1 stopped; committed layers {state['committed']}; "
                         f"all slots verified byte for byte against that mapping")
    if len({tuple(state["committed"]) for state in states}) > 1:
        lines.append(f"eplb: VERIFICATION FAILED: the ranks committed different layers: "
                     f"{[state['committed'] for state in states]}")
    return lines


def stale(directory: Path) -> tuple[list[str], list[str]]:
    import consistency_cases
    from spawned import run_ranks

    outcomes = run_ranks(directory, 2, consistency_cases.stale_old_placement, "stale sync", timeout=120)
    errors = [f"eplb: rank {rank}: {o['error']['type']}: {o['error']['message']}" if o["error"] else
              f"eplb: rank {rank}: VERIFICATION FAILED: migrated with a stale placement" for rank, o in enumerate(outcomes)]
    errors += [f"eplb: rank {rank}: VERIFICATION FAILED: bytes moved: {o['wrong'][:4]}"
               for rank, o in enumerate(outcomes) if o["wrong"]]
    return errors, []


def stall(directory: Path) -> tuple[list[str], list[str]]:
    import consistency_cases
    from spawned import run_ranks

    outcomes = run_ranks(directory, 2, consistency_cases.stalled_serving_loop, timeout=120)
    errors = [f"eplb: rank {rank}: {o['error']['type']}: {o['error']['message']}" for rank, o in enumerate(outcomes)
              if o["error"]]
    return errors, stopped_lines(outcomes)


def leave(directory: Path) -> tuple[list[str], list[str]]:
    from spawned import run_exit_case

    ran = run_exit_case(directory, "exit", timeout=90)
    if ran is None:
        return ["eplb: a rank did not finish within 90 s"], []
    returncodes, outputs = ran
    errors = []
    for marker in ("terminate called", "Fatal Python error", "Segmentation fault", "future_error", "Aborted"):
        if marker in outputs[1][1]:
            errors.append(f"eplb: rank 1: crashed at exit ({marker}); VERIFICATION FAILED")
    if returncodes[1] != 3:
        errors.append(f"eplb: rank 1: exited with {returncodes[1]}, not sys.exit's 3; VERIFICATION FAILED")
    states = [json.loads((directory / f"{rank}.json").read_text()) for rank in range(2)]
    if states[0]["error"]:
        errors.insert(0, f"eplb: rank 0: {states[0]['error']['type']}: {states[0]['error']['message']}")
    return errors, stopped_lines(states)


def main() -> int:
    cases = {"stale": stale, "stall": stall, "exit": leave}
    if len(sys.argv) != 2 or sys.argv[1] not in cases:
        print(f"usage: python_fault_case.py {'|'.join(cases)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="eplb-fault-case-") as directory:
        errors, states = cases[sys.argv[1]](Path(directory))
    for line in errors + states:
        print(line, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
