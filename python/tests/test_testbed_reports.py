"""The testbed's report readers (issue 31): bench/testbed_modes.py, bench/cluster_validation.py and
bench/testbed_migrator.py each read one schedule mode's run-<mode>-<i>.json files (by
testbed_modes.numbered), and none of them takes another mode's files whose name starts with this
one's (hosts-fenced for hosts: a glob on run-hosts-*.json took them, and the hosts row showed fenced
times)."""
import importlib.util
import json
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def load(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import testbed_modes from next to them
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(directory: pathlib.Path, name: str, seconds: list, status: str = "ok") -> None:
    report = {"status": status, "all_verified": status == "ok",
              "rounds": [{"seconds": s, "bytes_inter_node": 7} for s in seconds]}
    (directory / f"{name}.json").write_text(json.dumps(report))


@pytest.fixture
def config_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"hosts": 4, "ranks_per_host": 2, "rate": "200mbit", "queue_ms": 3, "policy": "deepseek"}))
    for pair in (1, 2, 3):
        write_run(tmp_path, f"run-off-{pair}", [1.0, 1.0 * pair])
        write_run(tmp_path, f"run-hosts-{pair}", [0.5, 0.5 * pair])
        write_run(tmp_path, f"run-hosts-fenced-{pair}", [0.25, 0.25])
    return tmp_path


def test_testbed_modes_keeps_each_mode_to_its_own_runs(config_dir, capsys, monkeypatch):
    modes = load("testbed_modes", monkeypatch)
    assert modes.totals(str(config_dir), "hosts") == {1: 1.0, 2: 1.5, 3: 2.0}
    assert modes.totals(str(config_dir), "hosts-fenced") == {1: 0.5, 2: 0.5, 3: 0.5}
    assert modes.main([str(config_dir)]) == 0
    table = capsys.readouterr().out
    assert "| 4 x 2, 200mbit, queue 3 ms, deepseek | hosts | 3 | 1.500 s (1.000-2.000) | 0.500 (0.500-0.500) |" in table
    assert "| hosts-fenced | 3 | 0.500 s (0.500-0.500) | 0.167 (0.125-0.250) |" in table


def test_testbed_modes_refuses_a_run_that_did_not_verify(config_dir, capsys, monkeypatch):
    write_run(config_dir, "run-hosts-2", [0.5], status="failed")
    assert load("testbed_modes", monkeypatch).main([str(config_dir)]) == 1
    assert "run-hosts-2.json: the run did not finish verified" in capsys.readouterr().err


def test_validation_and_migrator_reports_read_one_mode_each(config_dir, monkeypatch):
    validation = load("cluster_validation", monkeypatch)
    names = [pathlib.Path(path).name for path in validation.runs_of(str(config_dir), "hosts")]
    assert names == ["run-hosts-1.json", "run-hosts-2.json", "run-hosts-3.json"]
    migrator = load("testbed_migrator", monkeypatch)
    assert migrator.totals(str(config_dir), "run", "hosts") == [1.0, 1.5, 2.0]
    assert migrator.totals(str(config_dir), "run", "hosts-fenced") == [0.5, 0.5, 0.5]
