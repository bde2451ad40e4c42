#!/usr/bin/env python3
"""Balance against moves on the standard trace: cost-aware against the anchors (issue 31, docs/scale.md).

Usage: bench/cost_aware_frontier.py [--eplb build/eplb] [--trace t.npy] [--external NAME=placements.npy] [--seed 1]
                                    [--no-auto] [--json out.json]

The standard trace (`eplb gen-load --preset deepseek-v3 --dist lognormal --steps 400 --seed 1`),
windows of 20 steps, the DeepSeek-V3 shape on 4 hosts (`eplb evaluate --preset deepseek-v3`), 19
rebalances per policy, each chained from the default placement. For every policy setting: mean
next-window balancedness as % of deepseek's, mean slots moved as % of deepseek's (both measured in
the same run), and the simulated net tokens per hour on H100 hosts (sync, the interval the row
names, 600 s where it names none). Settings: incremental at budgets 2-30%, balanced, cost-aware at
intervals 0.5 s - 600 s (the interval sets what a slot of migration is worth), and any --external
placements ([19][58][288] phy2log .npy, e.g. SwiftBalancer run from outside the repository).

Every policy plans from the window's plain sum (`--estimator sum`, what vLLM and SGLang hand their
policy); a second section repeats deepseek, balanced, incremental and cost-aware planning from
`--estimator auto`. Each row's balance is given as % of deepseek's from the sum (the engines' input) and
as % of deepseek's from the same estimator (equal inputs).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

BUDGETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
INTERVALS = (0.5, 0.7, 1, 1.5, 2, 3, 4, 5, 6, 10, 30, 60, 600)
AUTO_BUDGETS = (0.05, 0.1, 0.2)
AUTO_INTERVALS = (1, 1.5, 2, 3, 4, 6, 10, 30, 600)


def simulate(eplb, trace, workdir, name, extra, interval=600, estimator="sum"):
    out = os.path.join(workdir, f"{name} {estimator}.json")
    subprocess.run([eplb, "simulate", "--model", "deepseek-v3", "--ranks", "32", "--trace", trace, "--window", "20",
                    "--interval-s", str(interval), "--estimator", estimator, "--json", out, "--quiet"] + extra,
                   check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        rebalances = json.load(f)["rebalances"]
    n = len(rebalances)
    applied = sorted({r["estimator"] for r in rebalances})
    return {"name": name, "estimator": estimator, "applied": applied,
            "next_window": sum(r["next_window"] for r in rebalances) / n,
            "slots": sum(r["slots_moved"] for r in rebalances) / n,
            "tokens_per_hour": sum(r["tokens"] for r in rebalances) / (n * interval / 3600)}


def policy_rows(args, trace, workdir, estimator, budgets, intervals):
    run = lambda name, extra, interval=600: simulate(args.eplb, trace, workdir, name, extra, interval, estimator)
    rows = [run("balanced", ["--policy", "balanced"])]
    rows += [run(f"incremental {100 * b:g}%", ["--policy", "incremental", "--budget", str(b)]) for b in budgets]
    rows += [run(f"cost-aware {i:g} s", ["--policy", "cost-aware"], i) for i in intervals]
    return rows


def print_rows(title, base, same, rows):
    print(title)
    print(f"{'policy':<34} {'next-window':>11} {'% of deepseek':>14} {'% same input':>13} {'slots/rb':>9} "
          f"{'% of slots':>11}")
    for r in sorted(rows, key=lambda r: r["slots"]):
        print(f"{r['name']:<34} {r['next_window']:>11.4f} {100 * r['next_window'] / base['next_window']:>13.1f}% "
              f"{100 * r['next_window'] / same['next_window']:>12.1f}% {r['slots']:>9.0f} "
              f"{100 * r['slots'] / base['slots']:>10.1f}%")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eplb", default=os.path.join(os.path.dirname(__file__), "..", "build", "eplb"),
                        help="the eplb binary (default: build/eplb)")
    parser.add_argument("--trace", help="a [steps][58][256] trace (default: the standard trace, generated)")
    parser.add_argument("--seed", type=int, default=1, help="gen-load seed when no --trace (default 1: the standard)")
    parser.add_argument("--external", action="append", default=[], help="NAME=placements.npy, priced as given")
    parser.add_argument("--no-auto", action="store_true", help="skip the --estimator auto section")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the temporary directory below is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="eplb-frontier-") as workdir:
        trace = args.trace or os.path.join(workdir, "t.npy")
        if not args.trace:
            subprocess.run([args.eplb, "gen-load", "--preset", "deepseek-v3", "--dist", "lognormal", "--steps", "400",
                            "--seed", str(args.seed), "--out", trace], check=True, stdout=subprocess.DEVNULL)
        base = simulate(args.eplb, trace, workdir, "deepseek", ["--policy", "deepseek"])
        rows = policy_rows(args, trace, workdir, "sum", BUDGETS, INTERVALS)
        for spec in args.external:
            name, path = spec.split("=", 1)
            rows.append(simulate(args.eplb, trace, workdir, name, ["--placements", path]))
        auto_base, auto_rows = None, []
        if not args.no_auto:
            auto_base = simulate(args.eplb, trace, workdir, "deepseek", ["--policy", "deepseek"], estimator="auto")
            auto_rows = [auto_base] + policy_rows(args, trace, workdir, "auto", AUTO_BUDGETS, AUTO_INTERVALS)
    what = args.trace or f"gen-load seed {args.seed}" + (" (the standard trace)" if args.seed == 1 else "")
    print(f"{what}, DeepSeek-V3 on 4 hosts x 8 ranks, window 20, 19 rebalances; % of deepseek (planning from the "
          "window sum, as the engines do) and % of deepseek planning from the same estimator, in the same run")
    print_rows("estimator sum (every policy)", base, base, [base] + rows)
    if auto_rows:
        chosen = sorted({h for r in auto_rows for h in r["applied"]})
        print_rows(f"estimator auto (it chose: {', '.join(chosen)})", base, auto_base, auto_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"deepseek": base, "rows": rows, "auto": auto_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
