"""eplb.plot: pictures from Python and from the shell (python3 -m eplb.plot)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import eplb
import eplb.plot
from conftest import run_cli

PNG = b"\x89PNG\r\n\x1a\n"


def shell_plot(*arguments):
    return subprocess.run([sys.executable, "-m", "eplb.plot", *arguments], capture_output=True, text=True,
                          timeout=120)


def test_rank_loads_png_and_svg(tmp_path, deepseek_example):
    load = deepseek_example["load"]
    after = eplb.rebalance_experts(load, 16, 4, 2, 8)[0]
    figure = eplb.plot.rank_loads(load, after, 8, out=tmp_path / "ranks.png")
    assert (tmp_path / "ranks.png").read_bytes().startswith(PNG)
    default = np.tile(np.arange(16) % 12, (2, 1))  # the default "before": slot s holds expert s mod 12
    before_and_after = [eplb.balancedness(load, p, 8).mean for p in (default, after)]
    assert f"{before_and_after[0]:.3f} -> {before_and_after[1]:.3f}" in figure._suptitle.get_text()
    eplb.plot.rank_loads(load, after, 8, before=np.tile(np.arange(16) % 12, (2, 1)), out=tmp_path / "ranks.svg")
    assert b"<svg" in (tmp_path / "ranks.svg").read_bytes()[:400]


def test_unsupported_format_is_refused(tmp_path, deepseek_example):
    after = eplb.rebalance_experts(deepseek_example["load"], 16, 4, 2, 8)[0]
    with pytest.raises(eplb.Error, match="unsupported picture format 'bmp'"):
        eplb.plot.rank_loads(deepseek_example["load"], after, 8, out=tmp_path / "ranks.bmp")


@pytest.fixture(scope="module")
def evaluate_json(cli, tmp_path_factory):
    directory = tmp_path_factory.mktemp("evaluate")
    trace, results = directory / "trace.npy", directory / "evaluate.json"
    run_cli(cli, "gen-load", "--preset", "tiny", "--steps", "80", "--seed", "2", "--out", str(trace))
    run_cli(cli, "evaluate", "--trace", str(trace), "--window", "10", "--preset", "tiny", "--quiet",
            "--json", str(results))
    return results


def test_evaluate_from_the_clis_json(tmp_path, evaluate_json):
    figure = eplb.plot.evaluate(evaluate_json, out=tmp_path / "evaluate.png")
    assert (tmp_path / "evaluate.png").read_bytes().startswith(PNG)
    policies = json.loads(evaluate_json.read_text())["policies"]
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert len(labels) == len(policies) and all(label.split()[0] == p["policy"] for label, p in zip(labels, policies))


def test_evaluate_refuses_other_json(tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"policies": [{"policy": "x"}]}')
    with pytest.raises(eplb.Error, match="missing 'windows'"):
        eplb.plot.evaluate(other)
    with pytest.raises(eplb.Error, match="no 'policies'"):
        eplb.plot.evaluate({"trace": "t.npy"})


def test_shell_rank_loads(cli, tmp_path):
    load, after = tmp_path / "load.npy", tmp_path / "after.json"
    run_cli(cli, "gen-load", "--preset", "tiny", "--out", str(load))
    run_cli(cli, "rebalance", "--load", str(load), "--preset", "tiny", "--out", str(after))
    done = shell_plot("rank-loads", "--load", str(load), "--after", str(after), "-o", str(tmp_path / "a.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.png").read_bytes().startswith(PNG)
    # without --after: the policy runs on the --before placement's topology
    done = shell_plot("rank-loads", "--load", str(load), "--before", str(after), "--policy", "incremental",
                      "-o", str(tmp_path / "b.svg"))
    assert done.returncode == 0, done.stderr
    # or on the topology given by flags
    done = shell_plot("rank-loads", "--load", str(load), "--replicas", "16", "--groups", "4", "--nodes", "2",
                      "--ranks", "8", "-o", str(tmp_path / "c.png"))
    assert done.returncode == 0, done.stderr


def test_shell_evaluate(tmp_path, evaluate_json):
    done = shell_plot("evaluate", str(evaluate_json), "-o", str(tmp_path / "e.svg"))
    assert done.returncode == 0 and "wrote" in done.stdout, done.stderr
    assert b"<svg" in (tmp_path / "e.svg").read_bytes()[:400]


def test_shell_errors(tmp_path):
    done = shell_plot("evaluate", str(tmp_path / "missing.json"), "-o", str(tmp_path / "e.png"))
    assert done.returncode == 3 and "cannot read" in done.stderr
    done = shell_plot("rank-loads", "--load", str(tmp_path / "missing.npy"), "-o", str(tmp_path / "r.png"))
    assert done.returncode == 3 and "missing.npy" in done.stderr
    np.save(tmp_path / "load.npy", np.ones((2, 12)))
    done = shell_plot("rank-loads", "--load", str(tmp_path / "load.npy"), "-o", str(tmp_path / "r.png"))
    assert done.returncode == 2 and "--replicas is needed" in done.stderr
    done = shell_plot("--help")
    assert done.returncode == 0 and "rank-loads" in done.stdout and "evaluate" in done.stdout
