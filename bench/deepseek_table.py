#!/usr/bin/env python3
"""Prints the table of bench/deepseek.sh from its work directory: Google
Benchmark JSON per shape (bench_<i>.json), the Python peers' timings
(peers.txt) and the placements of eplb (<name>.json) and of the torch
reference (<name>.py.json). Exits 1 when eplb's placement differs from the
reference's. Not meant to be run by hand."""
import json
import os
import sys

NAMES = ["v3_4_nodes", "v3_1_node", "v3_36_ranks", "v3_64_ranks"]
SHAPES = ["R=288 N=4 P=32", "R=288 N=1 P=32", "R=288 N=3 P=36", "R=320 N=8 P=64"]
GOALS = {"torch": 1000.0, "numpy": 100.0}


def eplb_times(path):
    """{threads: {"median", "min", "max", "cpu_median"}} in seconds, and the counters."""
    out, counters = {}, {}
    for b in json.load(open(path))["benchmarks"]:
        stat = b.get("aggregate_name")
        threads = int(b["run_name"].split("threads:")[1].split("/")[0])
        unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
        out.setdefault(threads, {})[stat] = b["real_time"] * unit
        if stat == "median":
            out[threads]["cpu_median"] = b["cpu_time"] * unit
            counters[threads] = b
    return out, counters


def read_peers(path):
    peers = {}
    for line in open(path):
        name, rest = line.split(" ", 1)
        fields = rest.split(" ", 7)
        torch = [float(x) for x in fields[0:3]]
        numpy = [float(x) for x in fields[4:7]]
        peers[name] = {"torch": torch, "numpy": numpy, "ties": json.loads(fields[7])}
    return peers


def exact(work, name):
    theirs = os.path.join(work, name + ".py.json")
    if not os.path.exists(theirs):
        return None
    mine, theirs = json.load(open(os.path.join(work, name + ".json"))), json.load(open(theirs))
    return all(mine[k] == theirs[k] for k in ("phy2log", "log2phy", "logcnt"))


def us(seconds):
    return f"{seconds * 1e6:.0f}"


def ms(seconds):
    return f"{seconds * 1e3:.1f}"


def ratio(peer, mine):
    """(median ratio, low, high) of peer time / eplb time."""
    return peer[0] / mine["median"], peer[1] / mine["max"], peer[2] / mine["min"]


def main():
    work = sys.argv[1]
    peers = read_peers(os.path.join(work, "peers.txt")) if os.path.getsize(os.path.join(work, "peers.txt")) else {}
    print("deepseek policy, 58 layers x 256 experts, 8 groups, loads round(rand^4 * 1000) + 1; medians [min-max]\n")
    print(f"{'case':<12} {'shape':<15} | {'eplb 1 thread us':>20} {'2 threads us':>13} {'2/1':>5} | "
          f"{'torch ms':>18} {'torch/eplb':>17} | {'numpy ms':>16} {'numpy/eplb':>15} | exact")
    weakest, all_exact = {"torch": None, "numpy": None}, True
    for i, name in enumerate(NAMES):
        times, _ = eplb_times(os.path.join(work, f"bench_{i}.json"))
        one, two = times[1], times[2]
        row = (f"{name:<12} {SHAPES[i]:<15} | {us(one['median']):>6} [{us(one['min'])}-{us(one['max'])}]".ljust(52) +
               f" {us(two['median']):>13} {one['median'] / two['median']:>4.2f}x |")
        peer = peers.get(name)
        if peer:
            for kind in ("torch", "numpy"):
                r = ratio(peer[kind], one)
                if weakest[kind] is None or r[0] < weakest[kind][1][0]:
                    weakest[kind] = (name, r)
                row += (f" {ms(peer[kind][0]):>6} [{ms(peer[kind][1])}-{ms(peer[kind][2])}]".rjust(19) +
                        f" {r[0]:>5.0f}x [{r[1]:.0f}-{r[2]:.0f}] |")
        same = exact(work, name)
        all_exact &= same is not False
        print(row + (" -" if same is None else " yes" if same else " NO"))
    print()
    for kind, goal in GOALS.items():
        if weakest[kind]:
            name, r = weakest[kind]
            verdict = "met" if r[0] >= goal else "NOT met"
            print(f"weakest shape vs {kind}: {name} {r[0]:.0f}x (range {r[1]:.0f}-{r[2]:.0f}x); goal >= {goal:.0f}x: {verdict}")
    _, counters = eplb_times(os.path.join(work, "bench_0.json"))
    c = counters[1]
    print(f"memory per call (v3_4_nodes, 1 thread): {int(c['allocs_per_call'])} allocations, "
          f"{c['alloc_bytes_per_call'] / 1024:.0f} KiB allocated, peak {c['peak_extra_bytes'] / 1024:.0f} KiB live "
          f"(input {c['input_bytes'] / 1024:.0f} KiB)")
    for name in NAMES:
        t = peers.get(name, {}).get("ties")
        if t:
            print(f"  published (unstable) torch {t['torch']} sort on {name}: phy2log differs in "
                  f"{t['layers_differing']} of {t['layers']} layers; sorted rank loads identical: "
                  f"{'yes' if t['same_sorted_rank_loads'] else 'NO'}")
    print("eplb: Google Benchmark repetitions, wall time; torch and numpy: one process each, one thread, after a "
          "warm-up run.")
    return 0 if all_exact else 1


if __name__ == "__main__":
    sys.exit(main())
