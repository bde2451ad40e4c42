"""The package gives exactly what the eplb CLI gives, on random shapes, for every policy and option."""
import json
import subprocess

import numpy as np
import pytest

import eplb
from conftest import run_cli


def random_shape(rng):
    """Random valid shapes, 1 in 6 of them DeepSeek-V3's (58 x 256 -> 288 slots, 32 ranks, 1 or 4 nodes)."""
    if rng.random() < 1 / 6:
        return {"layers": 58, "experts": 256, "replicas": 288, "groups": 8, "nodes": int(rng.choice([1, 4])),
                "ranks": 32}
    nodes = int(rng.choice([1, 2, 4]))
    ranks = nodes * int(rng.integers(1, 5))
    replicas = ranks * int(rng.integers(1, 7))
    groups = int(rng.choice([1, 2, 4, 8]))
    experts = groups * int(rng.integers(replicas // (2 * groups) + 1, replicas // groups + 1)) if replicas >= groups else 0
    if experts <= 0:
        groups, experts = 1, max(1, replicas // 2)
    return {"layers": int(rng.integers(1, 6)), "experts": experts, "replicas": replicas, "groups": groups,
            "nodes": nodes, "ranks": ranks}


def random_load(rng, layers, experts):
    if rng.random() < 0.5:
        return rng.integers(0, 50, size=(layers, experts)).astype(np.float64)  # many ties
    return np.round(rng.lognormal(3.0, 1.5, size=(layers, experts)), 3)


def cli_rebalance(cli, directory, name, load, shape, policy, extra=()):
    load_path, out_path = directory / f"{name}.npy", directory / f"{name}.json"
    np.save(load_path, load)
    run_cli(cli, "rebalance", "--load", str(load_path), "--replicas", str(shape["replicas"]), "--groups",
            str(shape["groups"]), "--nodes", str(shape["nodes"]), "--ranks", str(shape["ranks"]), "--policy", policy,
            "--out", str(out_path), "--format", "json", *extra)
    return out_path


OPTIONS = {
    "plain": ({}, []),
    "budget": ({"budget": 0.3}, ["--budget", "0.3"]),
    "min_gain": ({"min_gain": 0.01}, ["--min-gain", "0.01"]),
    "threads": ({"threads": 3}, ["--threads", "3"]),
}


POLICIES = ["deepseek", "relabel", "incremental", "balanced"]


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("policy", POLICIES)
def test_identical_to_the_cli(cli, tmp_path, policy, seed):
    rng = np.random.default_rng(1000 * seed + POLICIES.index(policy))
    shape = random_shape(rng)
    counts = (shape["replicas"], shape["groups"], shape["nodes"], shape["ranks"])
    option_name = sorted(OPTIONS)[seed % len(OPTIONS)]
    options, flags = OPTIONS[option_name]
    current_file = cli_rebalance(cli, tmp_path, "current", random_load(rng, shape["layers"], shape["experts"]),
                                 shape, "deepseek")
    current = eplb.read_placement(current_file)["phy2log"]
    load = random_load(rng, shape["layers"], shape["experts"])
    out = cli_rebalance(cli, tmp_path, "new", load, shape, policy, ["--current", str(current_file), *flags])
    with open(out, encoding="utf-8") as file:
        by_cli = json.load(file)
    by_python = eplb.rebalance_experts(load, *counts, policy=policy, current=current, **options)
    for name, got in zip(("phy2log", "log2phy", "logcnt"), by_python):
        assert got.tolist() == by_cli[name], f"{name} differs for {shape} {policy} {option_name}"


def test_version_matches_the_cli(cli):
    done = run_cli(cli, "--version")
    assert done.stdout.strip() == f"eplb {eplb.__version__}"


def test_files_written_by_the_cli_read_back(cli, tmp_path):
    trace = tmp_path / "trace.npy"
    run_cli(cli, "gen-load", "--preset", "tiny", "--steps", "5", "--out", str(trace))
    window = eplb.read_load_trace(trace)
    assert window.shape == (5, 2, 12) and window.dtype == np.float64
    assert np.array_equal(eplb.read_load(trace), window.sum(axis=0))
    out = tmp_path / "placement.json"
    run_cli(cli, "rebalance", "--load", str(trace), "--preset", "tiny", "--out", str(out))
    placement = eplb.read_placement(out)
    assert placement["num_ranks"] == 8 and placement["phy2log"].shape == (2, 16)
    expected = eplb.rebalance_experts(window, 16, 4, 2, 8)
    assert np.array_equal(placement["phy2log"], expected[0])
    assert np.array_equal(placement["log2phy"], expected[1])


def test_plan_matches_the_cli(cli, tmp_path):
    """plan_migration's byte counts equal `eplb rebalance --current`'s on a DeepSeek-V3 shape."""
    rng = np.random.default_rng(7)
    shape = {"replicas": 288, "groups": 8, "nodes": 4, "ranks": 32}
    old_file = cli_rebalance(cli, tmp_path, "old", rng.integers(0, 1000, (4, 256)).astype(float), shape, "deepseek")
    load = rng.integers(0, 1000, (4, 256)).astype(float)
    np.save(tmp_path / "load.npy", load)
    done = subprocess.run([cli, "rebalance", "--load", str(tmp_path / "load.npy"), "--current", str(old_file),
                           "--format", "json", "--out", str(tmp_path / "new.json"), "--bytes-per-expert", "1000"],
                          capture_output=True, text=True, timeout=120, check=True)
    moved = json.loads(done.stdout)["moved"]
    old = eplb.read_placement(old_file)["phy2log"]
    new = eplb.read_placement(tmp_path / "new.json")["phy2log"]
    plan = eplb.plan_migration(old, new, 32, 4, 1000)
    assert plan["slots_kept"] == moved["slots_kept"]
    assert plan["bytes_local"] == moved["bytes_local_copy"]
    assert plan["bytes_intra_node"] == moved["bytes_intra_node"]
    assert plan["bytes_inter_node"] == moved["bytes_inter_node"]
    assert sum(plan["slots_changed_per_layer"]) == moved["slots"]
