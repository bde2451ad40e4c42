"""bench/testbed_migrator.py, the Python Migrator's job on the emulated cluster (issue 31 item 2), run here
without the testbed: 4 ranks on eplb's local bootstrap as 2 emulated hosts, both schedules, every row
checked by the script itself, the same placements as `eplb run` on the same trace (the same bytes cross
the hosts every round); then its `report` over both, laid out as bench/cluster_testbed.sh lays them out
(link counters stood in for: there is no testbed here)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np


def run_job(repo, tmp_path, schedule: str, trace: str) -> dict:
    rendezvous = tmp_path / f"rendezvous-{schedule}"
    rendezvous.mkdir()
    out = tmp_path / f"py-{schedule}-1.json"
    argv = [sys.executable, str(repo / "bench" / "testbed_migrator.py"), "rank", "--trace", trace, "--layers", "2",
            "--experts", "8", "--slots", "12", "--hosts", "2", "--rounds", "2", "--window", "5", "--policy",
            "deepseek", "--bytes-per-expert", "65536", "--schedule", schedule, "--json", str(out)]
    processes = []
    for rank in range(4):
        env = dict(os.environ, EPLB_RANK=str(rank), EPLB_SIZE="4", EPLB_BOOTSTRAP_DIR=str(rendezvous))
        processes.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        errors = [process.communicate(timeout=120)[1] for process in processes]
    finally:
        for process in processes:
            process.kill()
    for process, err in zip(processes, errors):
        assert process.returncode == 0, err
    with open(out) as f:
        return json.load(f)


def run_cli_job(cli, tmp_path, schedule: str, trace: str) -> dict:
    """`eplb run` on the same trace and shape (its local launcher, 4 ranks as 2 nodes)."""
    out = tmp_path / f"run-{schedule}-1.json"
    done = subprocess.run([cli, "run", "--ranks", "4", "--nodes", "2", "--layers", "2", "--experts", "8",
                           "--replicas", "12", "--groups", "1", "--trace", trace, "--rounds", "2", "--window", "5",
                           "--policy", "deepseek", "--bytes-per-expert", "64KiB", "--transfer-schedule", schedule,
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(out) as f:
        return json.load(f)


def test_the_testbed_job_moves_every_row_with_and_without_the_schedule(repo, cli, tmp_path):
    trace = str(tmp_path / "trace.npy")
    np.save(trace, np.random.default_rng(7).lognormal(0, 1.5, (10, 2, 8)).astype(np.float32))
    reports = {schedule: run_job(repo, tmp_path, schedule, trace) for schedule in ("off", "hosts")}
    for schedule, report in reports.items():
        assert report["status"] == "ok" and report["transfer_schedule"] == schedule and report["plane"] == "ucx"
        assert len(report["rounds"]) == 2 and all(r["verified"] for r in report["rounds"])
        assert report["rounds"][0]["bytes_inter_node"] > 0, report  # rows crossed the emulated hosts
    # Same placements as eplb run, with either schedule: the same bytes cross the hosts in every round.
    runs = {schedule: run_cli_job(cli, tmp_path, schedule, trace) for schedule in ("off", "hosts")}
    crossing = {tuple(r["bytes_inter_node"] for r in report["rounds"]) for report in [*reports.values(),
                                                                                      *runs.values()]}
    assert len(crossing) == 1, crossing
    # report: the four runs; link counters stood in for (no testbed here).
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"hosts": 2, "ranks_per_host": 2, "rate": "200mbit",
                                                     "policy": "deepseek"}))
    links = json.dumps({"before": {"hosts": [{"tx_bytes": 0, "rx_bytes": 0}] * 2},
                        "after": {"hosts": [{"tx_bytes": 5, "rx_bytes": 2 ** 20}] * 2}})
    for schedule in ("off", "hosts"):
        for name in (f"py-{schedule}-1.json", f"run-{schedule}-1.json"):
            shutil.copy(tmp_path / name, config / name)
        for name in (f"links-{schedule}-1.json", f"links-py-{schedule}-1.json"):
            (config / name).write_text(links)
    printed = subprocess.run([sys.executable, str(repo / "bench" / "testbed_migrator.py"), "report", str(config)],
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "2x2 200mbit queue 100 ms deepseek" in printed.stdout, printed.stdout
    assert printed.stdout.count("yes  1.0/1.0, 1.0/1.0") == 2, printed.stdout  # same plans, both schedules
