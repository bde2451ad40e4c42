#!/usr/bin/env python3
"""Compares `eplb simulate`'s predictions with the testbed's measurements (issue 31, docs/scale.md).

Usage: bench/cluster_validation.py [--eplb build/eplb] [--json out.json] CONFIG_DIR...
where each CONFIG_DIR was written by bench/cluster_testbed.sh.

For every configuration: the calibration runs (the same runs with links at 10gbit, which hardly bind)
give the time a changed layer costs besides the shaped network, CPU work on the moved bytes included
(median over their rounds of the measured round time less the model's network time at 10gbit, per
changed layer; the same with 4 KiB experts is shown as the part that does not grow with bytes); the
link rate becomes the model's goodput, rate x 1448/1514 (a 1500-byte MTU frame with TCP timestamps
carries 1448 payload bytes in 1514 counted by tc); shared memory inside a host is taken at 1 GB/s.
Then `eplb simulate` replays the same trace and policy (same 3 rebalances) and predicts each round's
migration time with the schedule and without; for fenced rounds (`hosts-fenced`, measured when
bench/cluster_testbed.sh ran with SCHEDULE_MODES including it) the schedule's rounds back to back
(schedule_makespan_seconds). Each mode's per-layer cost comes from that mode's own calibration
runs (before 2026-12-07 evening: from the calibration runs of both modes together). Prints, per
configuration and mode, the measured median (min-max over the repeats) and predicted time per
round and in total, and the error of the total; then the bytes each host link carried against the
prediction.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from testbed_modes import numbered  # bench/, next to this script

FRAMING = 1448 / 1514  # TCP payload per byte tc counts, 1500-byte MTU, timestamps on
INTRA_RATE = "1GB"
CALIBRATION_RATE = "10gbit"
MODES = {"off": "unscheduled_seconds", "hosts": "scheduled_seconds", "hosts-fenced": "schedule_makespan_seconds"}


def rate_bits(text):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"unknown rate {text!r}")


def runs_of(directory, mode):
    """The run-<mode>-<i>.json reports in `directory`, by i (testbed_modes.numbered's rule)."""
    return [path for _, path in numbered(directory, f"run-{mode}")]


def rounds_of(path):
    with open(path) as f:
        report = json.load(f)
    if report.get("status") != "ok":
        raise RuntimeError(f"{path}: run status {report.get('status')}")
    return report["rounds"]


def layer_overhead_ms(eplb, config_dir, config, mode, calibration="calibration", bytes_per_expert=None):
    """What a changed layer costs besides the shaped network in `mode`: median over that mode's
    calibration rounds (links at 10gbit) of (measured round seconds - the model's network time at
    10gbit) / changed layers, in ms. `calibration-4k` (4 KiB experts) gives the part that does not
    grow with bytes."""
    calibrated = dict(config, rate=CALIBRATION_RATE)
    if bytes_per_expert:
        calibrated["bytes_per_expert"] = bytes_per_expert
    network = predict(eplb, config_dir, calibrated, 0.0, f"{calibration}-prediction.json")
    values = []
    for path in runs_of(os.path.join(config_dir, calibration), mode):
        mode_field = MODES[mode]
        for r, p in zip(rounds_of(path), network):
            changed = sum(1 for layer in r["layers"] if layer["changed"])
            if changed:
                values.append((r["seconds"] - p[mode_field]) / changed)
    if not values:
        raise RuntimeError(f"{config_dir}: no {calibration} runs in mode {mode}")
    return 1e3 * max(0.0, statistics.median(values))


def predict(eplb, config_dir, config, overhead_ms, name="prediction.json"):
    goodput = rate_bits(config["rate"]) * FRAMING
    out = os.path.join(config_dir, name)
    ranks = config["hosts"] * config["ranks_per_host"]
    command = [eplb, "simulate", "--model", "deepseek-v3", "--layers", str(config["layers"]),
               "--experts", str(config["experts"]), "--replicas", str(config["slots"]), "--groups", "1",
               "--bytes-per-expert", str(config["bytes_per_expert"]), "--ranks", str(ranks),
               "--ranks-per-host", str(config["ranks_per_host"]), "--nic-rate", f"{goodput / 1e6:.6f}mbit",
               "--host-rate", f"{goodput / 1e6:.6f}mbit", "--intra-rate", INTRA_RATE,
               "--layer-overhead-ms", f"{overhead_ms:.6f}", "--trace", os.path.join(config_dir, "trace.npy"),
               "--window", str(config["window"]), "--policy", config["policy"], "--json", out, "--quiet"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)["rebalances"][: config["rounds"]]


def measured(config_dir, mode):
    """Per round: the list of measured seconds over the repeats; and the link bytes per run."""
    per_round, links = None, []
    for path in runs_of(config_dir, mode):
        rounds = rounds_of(path)
        per_round = per_round or [[] for _ in rounds]
        for i, r in enumerate(rounds):
            per_round[i].append(r["seconds"])
        with open(path.replace("run-", "links-")) as f:
            counters = json.load(f)
        links.append([(a["tx_bytes"] - b["tx_bytes"], a["rx_bytes"] - b["rx_bytes"])
                      for b, a in zip(counters["before"]["hosts"], counters["after"]["hosts"])])
    return per_round or [], links


def spread(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def validate(eplb, config_dir):
    with open(os.path.join(config_dir, "config.json")) as f:
        config = json.load(f)
    label = (f"{config['hosts']} hosts x {config['ranks_per_host']} ranks, {config['rate']}, "
             f"queue {config.get('queue_ms', 100)} ms, {config['policy']}")
    rows = []
    for mode, field in MODES.items():
        per_round, links = measured(config_dir, mode)
        if not per_round and mode == "hosts-fenced":
            continue  # not measured in this configuration
        overhead = layer_overhead_ms(eplb, config_dir, config, mode)
        fixed = layer_overhead_ms(eplb, config_dir, config, mode, "calibration-4k", 4096)
        predicted = predict(eplb, config_dir, config, overhead, f"prediction-{mode}.json")
        totals = [sum(run) for run in zip(*per_round)]
        predicted_total = sum(r[field] for r in predicted)
        rows.append({"config": label, "mode": mode, "overhead_ms": overhead, "fixed_ms": fixed,
                     "measured_rounds": [statistics.median(v) for v in per_round],
                     "measured_rounds_spread": [spread(v) for v in per_round],
                     "predicted_rounds": [r[field] for r in predicted],
                     "lower_bound_rounds": [r["lower_bound_seconds"] for r in predicted],
                     "measured_total": statistics.median(totals), "measured_total_spread": spread(totals),
                     "predicted_total": predicted_total,
                     "error": predicted_total / statistics.median(totals) - 1,
                     "links_measured_in": [statistics.median(run[h][1] for run in links) for h in range(config["hosts"])],
                     "links_predicted_in": [sum(r["link_bytes"]["host_in"][h] for r in predicted)
                                            for h in range(config["hosts"])]})
    return rows


def print_rows(rows):
    print(f"{'configuration':<52} {'mode':<12} {'per-layer':>9} {'fixed':>6} "
          f"{'rounds measured (median of repeats)':<40} "
          f"{'rounds predicted':<24} {'total meas.':>11} {'total pred.':>11} {'error':>7}")
    for r in rows:
        measured_rounds = " ".join(f"{v:.3f}" for v in r["measured_rounds"])
        predicted_rounds = " ".join(f"{v:.3f}" for v in r["predicted_rounds"])
        print(f"{r['config']:<52} {r['mode']:<12} {r['overhead_ms']:>7.1f}ms {r['fixed_ms']:>4.1f}ms "
              f"{measured_rounds:<40} {predicted_rounds:<24} "
              f"{r['measured_total']:>10.3f}s {r['predicted_total']:>10.3f}s {100 * r['error']:>+6.1f}%")
    print("\nbytes into each host (MiB), measured median / predicted payload:")
    for r in rows:
        pairs = ", ".join(f"{m / 2**20:.1f}/{p / 2**20:.1f}" for m, p in zip(r["links_measured_in"], r["links_predicted_in"]))
        print(f"  {r['config']:<52} {r['mode']:<12} {pairs}")
    print("\nschedule against all reads at once (total seconds, median of repeats):")
    by_config = {}
    for r in rows:
        by_config.setdefault(r["config"], {})[r["mode"]] = r
    for config, modes in by_config.items():
        off = modes["off"]
        for mode in [m for m in modes if m != "off"]:
            scheduled = modes[mode]
            print(f"  {config:<52} off {off['measured_total_spread']} s, {mode} "
                  f"{scheduled['measured_total_spread']} s: ratio "
                  f"{scheduled['measured_total'] / off['measured_total']:.3f} measured, "
                  f"{scheduled['predicted_total'] / off['predicted_total']:.3f} predicted; lower bound "
                  f"{sum(off['lower_bound_rounds']):.3f} s (overhead included)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eplb", default=os.path.join(os.path.dirname(__file__), "..", "build", "eplb"))
    parser.add_argument("--json", help="write every row as JSON here")
    parser.add_argument("configs", nargs="+")
    args = parser.parse_args()
    rows = []
    for config_dir in args.configs:
        rows.extend(validate(args.eplb, config_dir))
    print_rows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
