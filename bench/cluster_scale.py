#!/usr/bin/env python3
"""Rebalances at cluster scale, predicted by `eplb simulate` (issue 31, docs/scale.md).

Usage: bench/cluster_scale.py [--eplb build/eplb] [--steps 100] [--interval 600] [--cluster h100] [--estimator sum]
                              [--external NAME=COMMAND] [--json out.json] [--plot out.png]

For every model preset (deepseek-v3, kimi-k2, qwen3-235b) at EP32, EP64, EP144 and EP320 (hosts of 8
GPUs; slots: the smallest multiple of the ranks >= experts x 9/8), a lognormal trace of the model's
shape (`eplb gen-load --dist lognormal --seed 1 --steps STEPS`), rebalanced every 20 steps by each
policy: deepseek, incremental (budget 10%), cost-aware (this interval and cluster), and any
--external policy: COMMAND is a shell template that writes the placements it chooses as phy2log
[N][L][R] (.npy) to {out}, given {trace} {window} {layers} {experts} {slots} {ranks} {per_host}
(e.g. a SwiftBalancer runner kept outside the repository). Prints per case the means per rebalance:
slots moved, migration time (lower bound, with the schedule, all reads at once), the serving stall
(sync, async copy, async swap), next-window balancedness, tokens per hour (sync serving; the stall
and the tokens with all reads at once, the executor's default), the simulation's own time per
rebalance (policy time apart) and the policy's. --plot draws tokens per hour relative to deepseek's.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

MODELS = {"deepseek-v3": (58, 256), "kimi-k2": (60, 384), "qwen3-235b": (94, 128)}
RANKS = (32, 64, 144, 320)
PER_HOST = 8


def slots_for(experts, ranks):
    wanted = (experts * 9 + 7) // 8
    return (wanted + ranks - 1) // ranks * ranks


def simulate(args, model, ranks, trace, workdir, policy, extra):
    out = os.path.join(workdir, f"{model}-{ranks}-{policy}.json")
    command = [args.eplb, "simulate", "--model", model, "--ranks", str(ranks), "--cluster", args.cluster,
               "--trace", trace, "--window", "20", "--interval-s", str(args.interval), "--estimator", args.estimator,
               "--json", out, "--quiet"] + extra
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    with open(out) as f:
        result = json.load(f)
    return result, wall


def external_placements(template, model, ranks, trace, workdir, name):
    layers, experts = MODELS[model]
    out = os.path.join(workdir, f"{model}-{ranks}-{name}.npy")
    command = template.format(trace=shlex.quote(trace), window=20, layers=layers, experts=experts,
                              slots=slots_for(experts, ranks), ranks=ranks, per_host=PER_HOST, out=shlex.quote(out))
    subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL)
    return out


def summary(result, wall):
    r = result["rebalances"]
    n = max(1, len(r))
    mean = lambda key: sum(x[key] for x in r) / n
    hours = n * result["serving"]["interval_seconds"] / 3600
    return {"rebalances": len(r), "slots": mean("slots_moved"), "bound": mean("lower_bound_seconds"),
            "scheduled": mean("scheduled_seconds"), "unscheduled": mean("unscheduled_seconds"),
            "stall_sync": mean("stall_unscheduled_sync"), "stall_sync_scheduled": sum(x["stall"]["sync"] for x in r) / n, "stall_copy": sum(x["stall"]["async_copy"] for x in r) / n,
            "stall_swap": sum(x["stall"]["async_swap"] for x in r) / n, "next_window": mean("next_window"),
            "tokens_per_hour": sum(x["tokens_unscheduled"] for x in r) / hours,
            "tokens_per_hour_scheduled": sum(x["tokens"] for x in r) / hours,
            "policy_seconds": mean("policy_seconds"),
            "simulation_seconds": (result["simulation_seconds"] - sum(x["policy_seconds"] for x in r)) / n,
            "wall_seconds": wall,
            "slots_total": result["topology"]["slots"] * result["topology"]["layers"]}


def run_all(args, workdir):
    rows = []
    policies = [("deepseek", []), ("incremental", ["--budget", "0.1"]), ("cost-aware", [])]
    for model, (layers, experts) in MODELS.items():
        trace = os.path.join(workdir, f"{model}.npy")
        subprocess.run([args.eplb, "gen-load", "--layers", str(layers), "--experts", str(experts), "--dist", "lognormal",
                        "--steps", str(args.steps), "--seed", "1", "--out", trace], check=True, stdout=subprocess.DEVNULL)
        for ranks in RANKS:
            cases = [(name, ["--policy", name] + extra) for name, extra in policies]
            for spec in args.external:
                name, template = spec.split("=", 1)
                cases.append((name, ["--placements", external_placements(template, model, ranks, trace, workdir, name)]))
            for name, extra in cases:
                result, wall = simulate(args, model, ranks, trace, workdir, name, extra)
                rows.append(dict(summary(result, wall), model=model, ranks=ranks, policy=name))
                print(f"  {model} EP{ranks} {name}: done in {wall:.1f} s", file=sys.stderr)
    return rows


def print_rows(rows):
    print(f"{'model':<12} {'EP':>4} {'policy':<12} {'slots/rb':>9} {'bound':>8} {'sched':>8} {'unsched':>8} "
          f"{'stall sync':>10} {'copy':>8} {'swap':>8} {'next-win':>8} {'tokens/h':>11} {'vs deepseek':>11} {'sim/rb':>7} "
          f"{'policy':>7}")
    for r in rows:
        base = next(x for x in rows if x["model"] == r["model"] and x["ranks"] == r["ranks"] and x["policy"] == "deepseek")
        print(f"{r['model']:<12} {r['ranks']:>4} {r['policy']:<12} {r['slots']:>9.0f} {r['bound']:>7.3f}s "
              f"{r['scheduled']:>7.3f}s {r['unscheduled']:>7.3f}s {r['stall_sync']:>9.3f}s {1e3 * r['stall_copy']:>6.1f}ms "
              f"{1e3 * r['stall_swap']:>6.2f}ms {r['next_window']:>8.4f} {r['tokens_per_hour']:>11.4g} "
              f"{100 * r['tokens_per_hour'] / base['tokens_per_hour']:>10.2f}% "
              f"{r['simulation_seconds']:>6.2f}s {r['policy_seconds']:>6.2f}s")


def plot(rows, path, interval):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    policies = [p for p in dict.fromkeys(r["policy"] for r in rows) if p != "deepseek"]
    fig, axes = plt.subplots(1, len(MODELS), figsize=(4.2 * len(MODELS), 3.6), sharey=True)
    for axis, model in zip(axes, MODELS):
        for policy in policies:
            xs, ys = [], []
            for index, ranks in enumerate(RANKS):
                mine = next(r for r in rows if r["model"] == model and r["ranks"] == ranks and r["policy"] == policy)
                base = next(r for r in rows if r["model"] == model and r["ranks"] == ranks and r["policy"] == "deepseek")
                xs.append(index)
                ys.append(100 * (mine["tokens_per_hour"] / base["tokens_per_hour"] - 1))
            axis.plot(xs, ys, marker="o", label=policy)
        axis.axhline(0, color="grey", linewidth=0.8)
        axis.set_xticks(range(len(RANKS)), [f"EP{r}" for r in RANKS])
        axis.set_title(model)
        axis.set_xlabel("expert-parallel ranks (H100 hosts of 8)")
    axes[0].set_ylabel("net tokens per hour vs deepseek (%)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"Simulated net tokens served, sync rebalance every {interval:g} s (eplb simulate)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eplb", default=os.path.join(os.path.dirname(__file__), "..", "build", "eplb"))
    parser.add_argument("--steps", type=int, default=100, help="trace steps (windows of 20: steps/20 - 1 rebalances)")
    parser.add_argument("--interval", type=float, default=600)
    parser.add_argument("--cluster", default="h100")
    parser.add_argument("--estimator", default="sum",
                        help="load estimator every policy plans from (default sum, the engines' input; e.g. auto)")
    parser.add_argument("--external", action="append", default=[], help="NAME=COMMAND template (see above)")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    parser.add_argument("--replot", help="only draw --plot from this --json of an earlier run")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the temporary directory below is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), args.plot, args.interval)
        return 0
    with tempfile.TemporaryDirectory(prefix="eplb-scale-") as workdir:
        rows = run_all(args, workdir)
    print(f"cluster {args.cluster}, sync serving, a rebalance every {args.interval:g} s (one trace window of 20 steps), "
          f"step 50 ms, 4096 tokens per step, estimator {args.estimator}; means per rebalance")
    print_rows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(rows, args.plot, args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
