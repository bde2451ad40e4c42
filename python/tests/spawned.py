"""Running a function on N spawned ranks of a gloo group on 127.0.0.1 (for the migration tests).

run_ranks(world, target, *args) starts `world` processes with torch.multiprocessing (spawn), each
forming a torch.distributed gloo group on a free port of 127.0.0.1 and calling target(rank, world,
*args). Each rank returns a JSON-able value (written to a file in a directory of the test's
tmp_path); run_ranks joins the processes against one deadline, `timeout` from the start (killing
the ranks still running then and failing), and returns the values by rank, or the rank's exit code
when it did not return.
"""
from __future__ import annotations

import json
import os
import socket
import time
import traceback
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_exit_case(directory: Path, mode: str, timeout: float = 120.0):
    """Runs exit_case.py's two ranks (MODE "exit" or "interrupt", state files DIRECTORY/<rank>.json);
    returns (return codes, (stdout, stderr) by rank), or None when a rank overran `timeout` (all killed)."""
    import subprocess
    import sys

    here, port, processes = Path(__file__).resolve().parent, free_port(), []
    for rank in range(2):
        processes.append(subprocess.Popen(
            [sys.executable, str(here / "exit_case.py"), str(rank), "2", str(port), mode, str(directory / f"{rank}.json")],
            cwd=here, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
                other.wait()
            return None
    return [process.returncode for process in processes], outputs


def wait_for_survivors(rank: int, survivors, timeout: float = 30.0) -> None:
    """Stays alive until every rank in `survivors` got here (a file per rank in the run's directory), as
    engine processes stay up after a failed migration: a survivor that left at once would take the
    default group's store (rank 0's) with it, and a slower survivor would rightly name it as lost too."""
    directory = Path(os.environ["EPLB_TEST_RANKS_DIR"])
    Path(directory, f"survived{rank}").touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(Path(directory, f"survived{r}").exists() for r in survivors):
        time.sleep(0.05)


def _main(rank: int, world: int, port: int, out: str, target, args) -> None:
    import faulthandler
    import torch.distributed as dist

    faulthandler.enable()  # a crash in the extension shows its Python stack

    os.environ["EPLB_TEST_RANKS_DIR"] = out  # for wait_for_survivors
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        value = {"ok": target(rank, world, *args)}
    except BaseException as failure:  # reported to the test, which fails with it
        value = {"error": f"{type(failure).__name__}: {failure}", "traceback": traceback.format_exc()}
    Path(out, f"rank{rank}.json").write_text(json.dumps(value))
    # Leave without tearing the group down: a lost peer makes gloo's destructor wait.
    os._exit(0)


def run_ranks(tmp_path: Path, world: int, target, *args, timeout: float = 120.0) -> list:
    import torch.multiprocessing as mp

    out = tmp_path / f"ranks-{target.__name__}"
    out.mkdir()
    context = mp.start_processes(_main, args=(world, free_port(), str(out), target, args), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + timeout  # one for all ranks: a hung world costs `timeout`, not world x timeout
    for process in context.processes:
        process.join(max(0.0, deadline - time.monotonic()))
    overran = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
    for rank in overran:
        context.processes[rank].kill()
        context.processes[rank].join(10)
    assert not overran, f"ranks {overran} did not finish within {timeout} s"
    results, failures, silent = [], [], []
    for rank, process in enumerate(context.processes):
        path = out / f"rank{rank}.json"
        if not path.exists():
            results.append(process.exitcode)
            silent.append(f"rank {rank} exited with {process.exitcode} and wrote no result")
            continue
        value = json.loads(path.read_text())
        assert "error" in value or "ok" in value
        if "error" in value:
            failures.append(f"rank {rank} failed: {value['traceback']}")
        results.append(value.get("ok"))
    if failures:  # every rank's: the first cause is often on another rank than rank 0
        raise AssertionError("\n".join(failures + silent))
    return results
