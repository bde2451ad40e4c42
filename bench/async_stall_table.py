"""async_stall_table: the table of bench/async_stall.sh from the JSON reports
of three `eplb run` invocations (sync, --async --commit copy, --async
--commit swap) of the same arguments.

Per mode, over the rounds: median [min-max] of the round's migration time
(slowest rank), of the serving stall per round (total and max; a sync round
stalls serving for the whole round), the step p50/p99 next to serving_idle,
and the inconsistent reads; then the ratios against the goals of issue 15.
"""
import json
import statistics
import sys

COPY_GOAL = 0.35      # copy stall per round <= 0.35 x the sync round
SWAP_GOAL_MS = 5.0    # swap stall per round <= 5 ms


def spread(values):
    """'median [min-max]' in ms."""
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):8.1f} [{min(ms):.1f}-{max(ms):.1f}]"


def mode_rows(report, sync):
    """Per-round (migration s, stall total s, stall max s, p50 s, p99 s, inconsistent)."""
    rows = []
    for r in report["rounds"]:
        if sync:
            rows.append((r["seconds"], r["seconds"], r["seconds"], None, None, 0))
        else:
            s = r["serving"]
            rows.append((r["seconds"], s["stall_seconds_total"], s["stall_seconds_max"],
                         s["step_seconds_p50"], s["step_seconds_p99"], s["inconsistent_reads"]))
    return rows


def print_table(named):
    print(f"{'mode':<11} {'rounds':>6}  {'migration ms':<24} {'stall/round ms':<24} {'stall max ms':<24} "
          f"{'step p50/p99 ms (idle)':<26} {'inconsistent':>12}  {'spare/rank':>10}")
    for name, report, rows in named:
        idle = report.get("serving_idle")
        if rows[0][3] is None:
            steps = "- (blocked)"
        else:
            p50 = statistics.median(r[3] for r in rows) * 1000
            p99 = max(r[4] for r in rows) * 1000
            steps = f"{p50:.2f}/{p99:.2f} ({idle['step_seconds_p50'] * 1000:.2f}/{idle['step_seconds_p99'] * 1000:.2f})"
        spare = report.get("serving_options", {}).get("spare_bytes", 0)
        print(f"{name:<11} {len(rows):>6}  {spread([r[0] for r in rows]):<24} {spread([r[1] for r in rows]):<24} "
              f"{spread([r[2] for r in rows]):<24} {steps:<26} {sum(r[5] for r in rows):>12}  "
              f"{spare / 2**20:>7.1f} MiB")


def main(paths):
    reports = [json.load(open(p)) for p in paths]
    named = [(name, rep, mode_rows(rep, name == "sync")) for name, rep in zip(("sync", "async copy", "async swap"), reports)]
    for name, rep, _ in named:
        if rep.get("status") != "ok" or not rep.get("all_verified"):
            print(f"{name}: run failed: {rep.get('status')} (all_verified {rep.get('all_verified')})")
            return 1
    print_table(named)
    sync_stall = statistics.median(r[1] for r in named[0][2])
    copy_stall = statistics.median(r[1] for r in named[1][2])
    swap_stall = [r[1] * 1000 for r in named[2][2]]
    inconsistent = sum(r[5] for _, _, rows in named for r in rows)
    copy_ratio = copy_stall / sync_stall if sync_stall > 0 else float("nan")
    print(f"\ncopy stall / sync stall (medians per round): {copy_ratio:.3f}  goal <= {COPY_GOAL}  "
          f"{'met' if copy_ratio <= COPY_GOAL else 'NOT met'}")
    print(f"swap stall per round: median {statistics.median(swap_stall):.2f} ms, max {max(swap_stall):.2f} ms  "
          f"goal <= {SWAP_GOAL_MS} ms  {'met' if max(swap_stall) <= SWAP_GOAL_MS else 'NOT met (max)'}")
    print(f"swap stall / sync stall: {statistics.median(swap_stall) / 1000 / sync_stall:.4f}; "
          f"swap stall / copy stall: {statistics.median(swap_stall) / 1000 / copy_stall:.3f}")
    print(f"inconsistent reads, all modes: {inconsistent}  goal 0  {'met' if inconsistent == 0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
