#!/usr/bin/env python3
"""Migration bandwidth through the Python API (eplb.Migrator) next to `eplb run` and memcpy, in one run.

Shape: 4 ranks on one node, 8 layers, 16 experts in 16 slots (4 per rank), 8 MiB experts as two
tensors (float32 gate_up 2/3, bfloat16 down 1/3), UCX shared memory. Each Python round moves every
expert to the next rank (every byte read intra-node) and back the next round. Measured, each with
its rounds' median and spread:
- Python, plain heap tensors (UCX 1.13 emulates RMA on registered heap memory);
- Python, eplb.empty tensors (agent-allocated shared memory: the zero-copy path);
- the same with reuse_checksums=True (sources not hashed again each round, as `eplb run` does);
- the same with commit="swap" too (a spare per tensor, the engine's tensor objects re-pointed at
  commit instead of the new rows copied into them);
- `eplb run` on the same shape, with its default copy commit and with --commit swap (its policy
  decides what moves; GB/s = bytes moved / round time);
- single-thread memcpy of 8 MiB rows, DRAM to DRAM between distinct buffers (bench/memcpy_bench when
  built, else numpy), same bytes.
GB/s of a Python round = whole-group bytes moved / the slowest rank's migration time.
Every path first runs --warmup rounds (default 1) that the medians leave out and the table shows on
their own ("first"): the first round of a fresh set-up pays one-time costs (the first touch of each
peer's pages through the mapping, gloo's first collectives), and memcpy_bench warms up likewise.
Goals (issue 14): Python within 10% of the CLI; eplb.empty >= 0.5 of memcpy.

--hugepages N (root only) reserves N huge pages of 2 MiB (vm.nr_hugepages) for the run and puts the
previous count back after it: UCX's System V allocation then puts eplb.empty tensors and the CLI's
arenas on them (the run prints the page size of the eplb.empty tensors).

Usage: .venv/bin/python bench/python_migrate.py [--rounds 5] [--warmup 1] [--cli build/eplb] [--hugepages N]
(the eplb package installed, e.g. in .venv: .venv/bin/python bench/python_migrate.py). Wrap it in
flock /work/.cpu.lock.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANKS, LAYERS, EXPERTS, EXPERT_BYTES = 4, 8, 16, 8 << 20
SLOTS = EXPERTS // RANKS


def rank_main(rank: int, port: int, rounds: int, warmup: int, out: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    import eplb

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    home = np.tile(np.arange(EXPERTS), (LAYERS, 1))
    moved = np.roll(home, SLOTS, axis=1)  # every expert to the next rank
    results = {}
    for kind in ("plain", "empty", "reuse", "swap"):
        new = eplb.empty if kind != "plain" else torch.empty
        extra = {"transport": "shm"} if kind != "plain" else {}
        weights = [[new((SLOTS, EXPERT_BYTES * 2 // 3 // 4), dtype=torch.float32, **extra),
                    new((SLOTS, (EXPERT_BYTES - EXPERT_BYTES * 2 // 3 // 4 * 4) // 2), dtype=torch.bfloat16, **extra)]
                   for _ in range(LAYERS)]
        for layer in weights:
            for tensor in layer:
                tensor.view(torch.uint8).fill_(rank + 1)
        results[f"{kind} page bytes"] = page_bytes(weights[0][0].data_ptr())
        migrator = eplb.Migrator(weights, transport="shm", timeout=60, reuse_checksums=kind in ("reuse", "swap"),
                                 commit="swap" if kind == "swap" else "copy")
        speeds, placement = [], home
        for _ in range(warmup + rounds):
            target = moved if placement is home else home
            report = migrator.migrate(placement, target)
            placement = target
            speeds.append(report["totals"]["bytes_moved"] / report["slowest_rank_seconds"] / 1e9)
        results[kind] = {"gbps": speeds[warmup:], "first": speeds[:warmup], "bytes": report["totals"]["bytes_moved"]}
        del migrator, weights
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    os._exit(0)


def page_bytes(address: int) -> int:
    """KernelPageSize of the mapping holding `address` in this process (/proc/self/smaps), 0 if unknown."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                begin, end = (int(part, 16) for part in head.split("-"))
                inside = begin <= address < end
            elif inside and line.startswith("KernelPageSize:"):
                return int(line.split()[1]) * 1024
    return 0


class HugePages:
    """Reserves `count` huge pages (vm.nr_hugepages) while in use, then puts the previous count back."""
    PATH = "/proc/sys/vm/nr_hugepages"

    def __init__(self, count):
        self.count, self.before = count, None

    def __enter__(self):
        if self.count is not None:
            self.before = Path(self.PATH).read_text().strip()
            try:
                Path(self.PATH).write_text(str(self.count))
            except OSError as failure:
                sys.exit(f"--hugepages: cannot write {self.PATH} ({failure}; needs root)")
            print(f"huge pages reserved for the run: {Path(self.PATH).read_text().strip()} of 2 MiB "
                  f"(asked {self.count}; was {self.before})")
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            Path(self.PATH).write_text(self.before)


def python_rounds(rounds: int, warmup: int) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(dir=ROOT / "build-python") as scratch:
        out = os.path.join(scratch, "python.json")
        context = mp.start_processes(rank_main, args=(port, rounds, warmup, out), nprocs=RANKS, join=False,
                                     start_method="spawn")
        for process in context.processes:
            process.join(600)
            if process.is_alive():
                process.kill()
                sys.exit("a rank did not finish within 600 s")
        return json.loads(Path(out).read_text())


def cli_rounds(cli: str, rounds: int, warmup: int, commit: str) -> dict:
    with tempfile.TemporaryDirectory(dir=ROOT / "build-python") as scratch:
        report = os.path.join(scratch, "run.json")
        subprocess.run([cli, "run", "--ranks", str(RANKS), "--nodes", "1", "--layers", str(LAYERS), "--experts",
                        str(EXPERTS), "--replicas", str(EXPERTS), "--groups", "1", "--bytes-per-expert", "8MiB",
                        "--rounds", str(warmup + rounds), "--transport", "shm", "--commit", commit, "--json", report],
                       check=True, capture_output=True, timeout=600)
        data = json.loads(Path(report).read_text())
    def speeds(rounds):
        return [r["bytes_moved"] / r["seconds"] / 1e9 for r in rounds if r["bytes_moved"] and r["seconds"] > 0]

    # The warm-up rounds are the first ones run, whether or not they moved anything.
    return {"gbps": speeds(data["rounds"][warmup:]), "first": speeds(data["rounds"][:warmup])}


def memcpy_rounds(nbytes: int, rounds: int) -> list:
    bench = ROOT / "build" / "bench" / "memcpy_bench"
    if bench.exists():
        speeds = []
        for _ in range(rounds):
            out = subprocess.run([str(bench), f"--bytes={nbytes}", f"--row={EXPERT_BYTES}", "--benchmark_format=json",
                                  "--benchmark_min_time=0.2"], capture_output=True, text=True, check=True).stdout
            speeds.append(json.loads(out)["benchmarks"][0]["bytes_per_second"] / 1e9)
        return speeds
    import numpy as np

    # Fallback without memcpy_bench: two distinct buffers of the round's bytes each (DRAM to DRAM
    # beyond a few hundred MiB), every row a fresh address, faulted in before timing.
    source, target = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    speeds = []
    for _ in range(rounds):
        started = time.perf_counter()
        for row in range(0, len(source), EXPERT_BYTES):
            np.copyto(target[row:row + EXPERT_BYTES], source[row:row + EXPERT_BYTES])
        speeds.append(len(source) / (time.perf_counter() - started) / 1e9)
    return speeds


def row(name: str, measured: dict, peers: dict) -> str:
    """One table row: median, spread and count of the measured rounds, the warm-up rounds, the ratios."""
    speeds = measured["gbps"]
    median = statistics.median(speeds)
    ratios = "  ".join(f"{median / statistics.median(peer['gbps']):6.2f}" for peer in peers.values())
    first = ",".join(f"{speed:.2f}" for speed in measured.get("first", [])) or "-"
    return f"{name:<28} {median:8.2f} {min(speeds):8.2f} {max(speeds):8.2f} {len(speeds):6d} {first:>10}  {ratios}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per measurement (default 5)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="rounds each path runs before the measured ones, shown apart (default 1)")
    parser.add_argument("--cli", default=str(ROOT / "build" / "eplb"), help="the eplb CLI (default build/eplb)")
    parser.add_argument("--hugepages", type=int, default=None,
                        help="reserve this many 2 MiB huge pages for the run (root; default: leave the machine as is)")
    arguments = parser.parse_args()
    if arguments.hugepages is not None and arguments.hugepages < 0:
        parser.error("--hugepages must be >= 0")
    if arguments.rounds < 1 or arguments.warmup < 0:
        parser.error("--rounds must be >= 1 and --warmup >= 0")
    with HugePages(arguments.hugepages):
        python = python_rounds(arguments.rounds, arguments.warmup)
        cli = cli_rounds(arguments.cli, arguments.rounds, arguments.warmup, "copy")
        cli_swap = cli_rounds(arguments.cli, arguments.rounds, arguments.warmup, "swap")
    memcpy = {"gbps": memcpy_rounds(python["plain"]["bytes"], arguments.rounds)}
    peers = {"vs eplb run": cli, "vs eplb run swap": cli_swap, "vs memcpy": memcpy}
    print(f"{RANKS} ranks, 1 node, {LAYERS} layers, {EXPERTS} experts in {EXPERTS} slots, 8 MiB experts, UCX shm; "
          f"Python rounds move {python['plain']['bytes'] / 2**30:.2f} GiB each")
    print(f"{'path':<28} {'median':>8} {'min':>8} {'max':>8} {'rounds':>6} {'first':>10}  {'/ run':>6}  {'/ swap':>6}  "
          f"{'/ memcpy':>6}")
    print(row("Python, plain heap tensors", python["plain"], peers))
    print(row("Python, eplb.empty tensors", python["empty"], peers))
    print(row("  + reuse_checksums=True", python["reuse"], peers))
    print(row("  + commit='swap'", python["swap"], peers))
    print(row("eplb run (CLI)", cli, peers))
    print(row("eplb run --commit swap", cli_swap, peers))
    print(row("memcpy, one thread", memcpy, peers))
    print(f"eplb.empty tensors on {python['empty page bytes'] // 1024} KiB pages, heap tensors on "
          f"{python['plain page bytes'] // 1024} KiB pages (rank 0)")
    print("first: GB/s of the warm-up rounds (--warmup), left out of median, min and max")
    print("/ run, / swap: ratio to eplb run with the copy commit, with --commit swap")
    print("GB/s = 1e9 bytes per second; goals: Python within 10% of eplb run, eplb.empty >= 0.5 of memcpy")


if __name__ == "__main__":
    main()
