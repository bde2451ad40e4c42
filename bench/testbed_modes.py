#!/usr/bin/env python3
"""Side-by-side table of the transfer-schedule modes measured on the testbed (issue 31).

Reads what `SCHEDULE_MODES="off hosts hosts-fenced" bench/cluster_testbed.sh OUT ...` wrote into each
OUT directory (run-<mode>-<i>.json, `eplb run --json`) and prints, per configuration and mode, the
total migration seconds of the 3 rebalances: median (min-max) over the pairs, and the median of
the paired ratios to mode `off` (pair i of a mode against pair i of off: the same testbed, run
back to back, alternating the order).

    bench/testbed_modes.py OUT_DIR [OUT_DIR ...] [--modes off,hosts,hosts-fenced]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys


def numbered(directory: str, name: str) -> list[tuple[int, str]]:
    """(i, path) of the files <name>-<i>.json in `directory`, by i: one mode's repeats, never those
    of a mode whose name starts with this one's (run-hosts-fenced-1.json is no run-hosts file).
    The one rule the testbed's readers (this script, cluster_validation.py, testbed_migrator.py)
    find their files by."""
    pattern = re.compile(rf"{re.escape(name)}-(\d+)\.json")
    found = [(int(m.group(1)), os.path.join(directory, entry)) for entry in os.listdir(directory)
             if (m := pattern.fullmatch(entry))]
    return sorted(found)


def totals(config_dir: str, mode: str) -> dict[int, float]:
    """Pair number -> total seconds of every rebalance of that pair's `eplb run` in `mode`."""
    out = {}
    for number, path in numbered(config_dir, f"run-{mode}"):
        with open(path) as f:
            report = json.load(f)
        if report.get("status") != "ok" or not report.get("all_verified"):
            raise ValueError(f"{path}: the run did not finish verified (status {report.get('status')!r})")
        out[number] = sum(r["seconds"] for r in report["rounds"])
    return out


def label(config_dir: str) -> str:
    with open(os.path.join(config_dir, "config.json")) as f:
        c = json.load(f)
    return f"{c['hosts']} x {c['ranks_per_host']}, {c['rate']}, queue {c['queue_ms']} ms, {c['policy']}"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def rows(config_dir: str, modes: list[str]) -> list[str]:
    base = totals(config_dir, modes[0])
    out = []
    for mode in modes:
        runs = totals(config_dir, mode)
        if not runs:
            raise ValueError(f"{config_dir}: no run-{mode}-*.json")
        paired = [runs[i] / base[i] for i in sorted(runs) if i in base]
        ratio = f"{statistics.median(paired):.3f} ({min(paired):.3f}-{max(paired):.3f})" if paired else "-"
        out.append(f"| {label(config_dir)} | {mode} | {len(runs)} | {spread(list(runs.values()))} | {ratio} |")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="OUT directories of bench/cluster_testbed.sh")
    parser.add_argument("--modes", default="off,hosts,hosts-fenced",
                        help="modes to compare, the first is the reference of the ratios (default: %(default)s)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    print(f"| configuration | mode | pairs | total seconds, median (min-max) | paired ratio to {modes[0]} |")
    print("| --- | --- | --- | --- | --- |")
    try:
        for config_dir in args.dirs:
            print("\n".join(rows(config_dir, modes)))
    except (OSError, ValueError, KeyError) as failure:
        print(f"testbed_modes: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
