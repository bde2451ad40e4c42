#!/usr/bin/env python3
"""READ bandwidth, DRAM to DRAM between two processes of this machine: real NIXL (nixl._api, UCX backend)
against eplb's transfer agent through eplb.nixl, with ucx_perftest's ucp_get as the reference row. Issue 28
item 3. Prints one table.

Both backends run the same script: an initiator process (pinned to CPU 1) READs one descriptor of SIZE bytes
from a target process (pinned to CPU 0), each with one numpy buffer of 64 MiB, page-touched, registered
with register_memory (heap memory, as vLLM registers its tensors), an agent made with NIXL's default
config (progress thread on) and, for eplb, transport "shm". The initiator prepares one list per side, makes
one request per size, and reposts it ITERS times (transfer, then check_xfer_state until "DONE"); GB/s =
SIZE * ITERS / elapsed (10^9 B/s). One pair = one round of NIXL and one of eplb, each in fresh processes
(an idle NIXL agent's progress thread takes about 0.4 of a core, so the two never run at the same time),
the order alternating from pair to pair. Columns: each backend's median GB/s over the pairs, the median
of the per-pair ratios eplb/NIXL with [min-max]; then ucx_perftest (Debian ucx-utils, UCX 1.13, shm
transports, server on CPU 0, client on CPU 1, buffers its own) in the same run, and eplb/perftest.

Run on a quiet machine: flock /work/.cpu.lock .venv/bin/python bench/nixl_vs_eplb.py [--pairs N]
[--sizes 4K,64K,...] [--no-perftest]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import socket
import statistics
import subprocess
import time

import numpy as np

MIB = 1 << 20
BUFFER = 64 * MIB
SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
TARGET_CPU, INITIATOR_CPU = 0, 1


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def iterations(size: int) -> int:
    return max(8, min(2000, (256 * MIB) // size))  # ~256 MiB per measurement, 8..2000 requests


def _api(backend: str, options: dict):
    if backend == "nixl":
        import nixl._api as api
        return api, api.nixl_agent_config(enable_prog_thread=options["nixl_thread"])
    import eplb.nixl as api
    return api, api.nixl_agent_config(transport="shm", cma=options["cma"])


def _pin(cpu: int, options: dict) -> None:
    if options["pin"] and len(os.sched_getaffinity(0)) > 1 and os.cpu_count() > cpu:
        os.sched_setaffinity(0, {cpu})


def _pattern() -> np.ndarray:
    return np.arange(BUFFER, dtype=np.uint64).astype(np.uint8)


def _agent(backend: str, name: str, options: dict, target: bool):
    api, config = _api(backend, options)
    agent = api.nixl_agent(name, config)
    memory = np.empty(BUFFER, dtype=np.uint8)
    memory[:] = _pattern() if target else 0xAA  # every page touched
    agent.register_memory(np.array([[memory.ctypes.data, BUFFER, 0]], dtype=np.uint64), "DRAM")
    return agent, memory


def _target(backend: str, conn, options: dict) -> None:
    _pin(TARGET_CPU, options)
    agent, memory = _agent(backend, "bench-target", options, True)
    conn.send((agent.get_agent_metadata(), memory.ctypes.data))
    conn.recv()  # "stop": the progress thread served the READs meanwhile
    conn.send("stopped")


def _initiator(backend: str, conn, sizes, metadata, address, options: dict) -> None:
    _pin(INITIATOR_CPU, options)
    agent, memory = _agent(backend, "bench-initiator", options, False)
    expected = _pattern()
    peer = agent.add_remote_agent(metadata)
    results = {}
    for size in sizes:
        local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(memory.ctypes.data, size, 0)], "DRAM")
        remote = agent.prep_xfer_dlist(peer, [(address, size, 0)], "DRAM")
        handle = agent.make_prepped_xfer("READ", local, [0], remote, [0])
        count = iterations(size)
        for timed in (False, True):  # one warm-up run (connection, first touch), then the timed one
            start = time.perf_counter()
            for _ in range(count if timed else 2):
                state = agent.transfer(handle)
                while state == "PROC":
                    state = agent.check_xfer_state(handle)
                if state != "DONE":
                    raise RuntimeError(f"{backend}: READ of {size} B ended in {state}")
            elapsed = time.perf_counter() - start
        results[size] = size * count / elapsed / 1e9
        if not np.array_equal(memory[:size], expected[:size]):
            raise RuntimeError(f"{backend}: READ of {size} B did not land byte-exact")
        memory[:size] = 0xAA
        agent.release_xfer_handle(handle)
        agent.release_dlist_handle(local)
        agent.release_dlist_handle(remote)
    conn.send(results)


def run_backend(backend: str, sizes, options: dict) -> dict[int, float]:
    """One round: fresh target and initiator processes; GB/s by size."""
    context = multiprocessing.get_context("spawn")
    t_parent, t_child = context.Pipe()
    i_parent, i_child = context.Pipe()
    target = context.Process(target=_target, args=(backend, t_child, options), daemon=True)
    target.start()
    if not t_parent.poll(60):
        raise RuntimeError(f"{backend}: the target did not start within 60 s")
    metadata, address = t_parent.recv()
    initiator = context.Process(target=_initiator, args=(backend, i_child, sizes, metadata, address, options),
                                daemon=True)
    initiator.start()
    try:
        if not i_parent.poll(300):
            raise RuntimeError(f"{backend}: the initiator did not finish within 300 s")
        return i_parent.recv()
    finally:
        t_parent.send("stop")
        t_parent.poll(10)
        for proc in (initiator, target):
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def perftest(size: int, pin: bool) -> float:
    """ucx_perftest ucp_get, shm transports, server on CPU 0, client on CPU 1: GB/s (10^9 B/s)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, UCX_TLS="posix,sysv,cma,self")
    count = str(iterations(size))
    server_cpu = ["taskset", "-c", str(TARGET_CPU)] if pin else []
    client_cpu = ["taskset", "-c", str(INITIATOR_CPU)] if pin else []
    server = subprocess.Popen([*server_cpu, "ucx_perftest", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = subprocess.run([*client_cpu, "ucx_perftest", "127.0.0.1", "-p", str(port),
                              "-t", "ucp_get", "-s", str(size), "-n", count, "-w", "2"], env=env,
                             capture_output=True, text=True, timeout=120).stdout
    finally:
        server.kill()
        server.wait()
    final = [line for line in out.splitlines() if re.match(r"^\s*Final:", line)]
    if not final:
        raise RuntimeError(f"ucx_perftest printed no Final line:\n{out}")
    fields = final[0].split()
    return float(fields[-3]) * MIB / 1e9  # its bandwidth column (average MB/s, 2^20 B/s)


def spread(values) -> str:
    return f"[{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--no-perftest", action="store_true")
    parser.add_argument("--no-pin", action="store_true", help="let the scheduler place both processes")
    parser.add_argument("--nixl-no-progress-thread", action="store_true",
                        help="NIXL with enable_prog_thread=False (its initiator progresses in check_xfer_state)")
    parser.add_argument("--no-cma", action="store_true", help="eplb.nixl with cma=False (UCX 1.13 only)")
    args = parser.parse_args()
    options = {"pin": not args.no_pin, "nixl_thread": not args.nixl_no_progress_thread, "cma": not args.no_cma}
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    runs = {"nixl": [], "eplb": []}
    for pair in range(args.pairs):
        for backend in (("nixl", "eplb") if pair % 2 == 0 else ("eplb", "nixl")):
            runs[backend].append(run_backend(backend, sizes, options))
    perf = {size: [] for size in sizes}
    if not args.no_perftest and shutil.which("ucx_perftest"):
        for _ in range(3):
            for size in sizes:
                perf[size].append(perftest(size, options["pin"]))
    pinned = f"initiator CPU {INITIATOR_CPU}, target CPU {TARGET_CPU}" if options["pin"] else "not pinned"
    print(f"READ DRAM->DRAM, two processes ({pinned}), {args.pairs} pairs, nixl {nixl_version()} (progress "
          f"thread {'on' if options['nixl_thread'] else 'off'}), eplb.nixl cma {'on' if options['cma'] else 'off'}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}")
    print("| size | NIXL GB/s | eplb GB/s | eplb / NIXL, median [min-max] | ucx_perftest GB/s | eplb / perftest |")
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        nixl_bw = [run[size] for run in runs["nixl"]]
        eplb_bw = [run[size] for run in runs["eplb"]]
        ratios = [e / n for e, n in zip(eplb_bw, nixl_bw)]
        ref = statistics.median(perf[size]) if perf[size] else None
        label = f"{size >> 20} MiB" if size >= MIB else f"{size >> 10} KiB"
        ref_cells = (f"{ref:.2f} | {statistics.median(eplb_bw) / ref:.2f}x" if ref else "- | -")
        print(f"| {label} | {statistics.median(nixl_bw):.2f} | {statistics.median(eplb_bw):.2f} | "
              f"**{statistics.median(ratios):.2f}x** {spread(ratios)} | {ref_cells} |")


def nixl_version() -> str:
    from importlib.metadata import version
    return version("nixl")


if __name__ == "__main__":
    main()
