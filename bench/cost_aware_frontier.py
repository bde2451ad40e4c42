#!/usr/bin/env python3
"""Balance against moves on the standard trace: cost-aware against the anchors (issue 31, docs/scale.md).

Usage: bench/cost_aware_frontier.py [--eplb build/eplb] [--trace t.npy] [--external NAME=placements.npy]

The standard trace (`eplb gen-load --preset deepseek-v3 --dist lognormal --steps 400 --seed 1`),
windows of 20 steps, the DeepSeek-V3 shape on 4 hosts (`eplb evaluate --preset deepseek-v3`), 19
rebalances per policy, each chained from the default placement. For every policy setting: mean
next-window balancedness as % of deepseek's, mean slots moved as % of deepseek's (both measured in
the same run), and the simulated net tokens per hour on H100 hosts (sync, the interval the row
names, 600 s where it names none). Settings: incremental at budgets 2-30%, balanced, cost-aware at
intervals 0.5 s - 600 s (the interval sets what a slot of migration is worth), and any --external
placements ([19][58][288] phy2log .npy, e.g. SwiftBalancer run from outside the repository).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

BUDGETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
INTERVALS = (0.5, 0.7, 1, 1.5, 2, 3, 4, 5, 6, 10, 30, 60, 600)


def simulate(eplb, trace, workdir, name, extra, interval=600):
    out = os.path.join(workdir, f"{name}.json")
    subprocess.run([eplb, "simulate", "--model", "deepseek-v3", "--ranks", "32", "--trace", trace, "--window", "20",
                    "--interval-s", str(interval), "--json", out, "--quiet"] + extra, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        rebalances = json.load(f)["rebalances"]
    n = len(rebalances)
    return {"name": name, "next_window": sum(r["next_window"] for r in rebalances) / n,
            "slots": sum(r["slots_moved"] for r in rebalances) / n,
            "tokens_per_hour": sum(r["tokens"] for r in rebalances) / (n * interval / 3600)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eplb", default=os.path.join(os.path.dirname(__file__), "..", "build", "eplb"))
    parser.add_argument("--trace")
    parser.add_argument("--external", action="append", default=[], help="NAME=placements.npy")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="eplb-frontier-") as workdir:
        trace = args.trace or os.path.join(workdir, "t.npy")
        if not args.trace:
            subprocess.run([args.eplb, "gen-load", "--preset", "deepseek-v3", "--dist", "lognormal", "--steps", "400",
                            "--seed", "1", "--out", trace], check=True, stdout=subprocess.DEVNULL)
        base = simulate(args.eplb, trace, workdir, "deepseek", ["--policy", "deepseek"])
        rows.append(simulate(args.eplb, trace, workdir, "balanced", ["--policy", "balanced"]))
        for budget in BUDGETS:
            rows.append(simulate(args.eplb, trace, workdir, f"incremental {100 * budget:g}%",
                                 ["--policy", "incremental", "--budget", str(budget)]))
        for spec in args.external:
            name, path = spec.split("=", 1)
            rows.append(simulate(args.eplb, trace, workdir, name, ["--placements", path]))
        for interval in INTERVALS:
            row = simulate(args.eplb, trace, workdir, f"cost-aware {interval:g} s", ["--policy", "cost-aware"], interval)
            # Tokens at the 600 s interval of the other rows, for the same placements' balance.
            rows.append(row)
    print("standard trace, DeepSeek-V3 on 4 hosts x 8 ranks, window 20, 19 rebalances; % of deepseek in the same run")
    print(f"{'policy':<20} {'next-window':>11} {'% of deepseek':>14} {'slots/rb':>9} {'% of deepseek':>14}")
    for r in [base] + sorted(rows, key=lambda r: r["slots"]):
        print(f"{r['name']:<20} {r['next_window']:>11.4f} {100 * r['next_window'] / base['next_window']:>13.1f}% "
              f"{r['slots']:>9.0f} {100 * r['slots'] / base['slots']:>13.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"deepseek": base, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
