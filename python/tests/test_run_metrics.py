"""`eplb run --metrics FILE` (the CLI, not the package): the file parses with
prometheus_client's text parser, its values match the run's JSON report, it
is replaced atomically while the run goes, and a failed run leaves a complete
file and no temporary one."""
import json
import subprocess
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

SMALL = ["--layers", "3", "--experts", "16", "--replicas", "24", "--groups", "4",
         "--bytes-per-expert", "64KiB", "--window", "10"]
FAMILIES = {
    "eplb_rebalances": "counter", "eplb_bytes_moved": "counter", "eplb_layer_retries": "counter",
    "eplb_layer_failures": "counter", "eplb_balancedness": "gauge", "eplb_layer_commit_seconds": "histogram",
    "eplb_serving_stall_seconds": "histogram", "eplb_transfer_seconds": "histogram",
}


def run(cli, tmp_path, *extra, rounds=3):
    """Runs 4 ranks over shared memory with --json and --metrics; returns (process, json, metrics text)."""
    report, metrics = tmp_path / "run.json", tmp_path / "eplb.prom"
    done = subprocess.run([cli, "run", "--ranks", "4", "--nodes", "2", "--rounds", str(rounds), *SMALL,
                           "--json", str(report), "--metrics", str(metrics), *extra],
                          capture_output=True, text=True, timeout=120)
    return done, json.loads(report.read_text()), metrics.read_text()


def parse(text):
    """{family name: family}, every family checked for its HELP text and type."""
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert set(families) == set(FAMILIES), sorted(families)
    for name, family in families.items():
        assert family.type == FAMILIES[name], name
        assert family.documentation, name
    return families


def value(families, family, sample, **labels):
    found = [s.value for s in families[family].samples if s.name == sample and s.labels == labels]
    assert len(found) == 1, (sample, labels, families[family].samples)
    return found[0]


def changed_layers(report):
    return [layer for round_ in report["rounds"] for layer in round_["layers"] if layer["changed"]]


def check_against_report(families, report):
    rounds = report["rounds"]
    assert value(families, "eplb_rebalances", "eplb_rebalances_total") == len(rounds)
    for locality in ("local", "intra_node", "inter_node"):
        expected = sum(round_[f"bytes_{locality}"] for round_ in rounds)
        assert value(families, "eplb_bytes_moved", "eplb_bytes_moved_total", locality=locality) == expected
    assert value(families, "eplb_layer_retries", "eplb_layer_retries_total") == sum(r["retries"] for r in rounds)
    failures = {}
    for round_ in rounds:
        for layer in round_["layers"]:
            if layer["failure"]:
                failures[layer["failure_code"]] = failures.get(layer["failure_code"], 0) + 1
    assert {s.labels["code"]: s.value for s in families["eplb_layer_failures"].samples} == failures
    assert sum(failures.values()) == sum(r["failures"] for r in rounds)
    assert value(families, "eplb_balancedness", "eplb_balancedness", when="before") == rounds[-1]["balancedness_before"]
    assert value(families, "eplb_balancedness", "eplb_balancedness", when="after") == rounds[-1]["balancedness_after"]
    layers = changed_layers(report)
    committed = [layer for layer in layers if layer["committed"]]
    assert value(families, "eplb_layer_commit_seconds", "eplb_layer_commit_seconds_count") == len(committed)
    assert value(families, "eplb_layer_commit_seconds", "eplb_layer_commit_seconds_sum") == pytest.approx(
        sum(layer["seconds_commit"] for layer in committed), rel=1e-9, abs=1e-12)
    assert value(families, "eplb_transfer_seconds", "eplb_transfer_seconds_count") == len(layers)
    assert value(families, "eplb_transfer_seconds", "eplb_transfer_seconds_sum") == pytest.approx(
        sum(layer["seconds_transfer"] for layer in layers), rel=1e-9, abs=1e-12)
    # One stall observation per serving step of rank 0 (whose report this is);
    # a synchronous run has none: the histogram is there, empty.
    stalls = [s for r in rounds if "serving_timeline" in r for s in r["serving_timeline"]["stall_seconds"]]
    assert len(stalls) == sum(r["serving"]["steps"] for r in rounds if "serving" in r)
    assert value(families, "eplb_serving_stall_seconds", "eplb_serving_stall_seconds_count") == len(stalls)
    assert value(families, "eplb_serving_stall_seconds", "eplb_serving_stall_seconds_bucket", le="+Inf") == len(stalls)
    assert value(families, "eplb_serving_stall_seconds", "eplb_serving_stall_seconds_sum") == pytest.approx(
        sum(stalls), rel=1e-6, abs=1e-9)


def test_a_run_metrics_file_parses_and_matches_its_json_report(cli, tmp_path):
    done, report, text = run(cli, tmp_path)
    assert done.returncode == 0, done.stderr
    families = parse(text)
    check_against_report(families, report)
    assert value(families, "eplb_rebalances", "eplb_rebalances_total") == 3
    assert len(changed_layers(report)) > 0
    assert sum(report["rounds"][i]["bytes_moved"] for i in range(3)) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eplb.prom", "run.json"]


def test_a_failed_run_leaves_complete_metrics_naming_the_failure(cli, tmp_path):
    done, report, text = run(cli, tmp_path, "--inject", "err=0.5,seed=3", "--retries", "1")
    assert done.returncode != 0
    families = parse(text)
    check_against_report(families, report)
    assert value(families, "eplb_layer_failures", "eplb_layer_failures_total", code="backend_error") >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eplb.prom", "run.json"]


def test_the_metrics_file_is_replaced_atomically_while_the_run_goes(cli, tmp_path):
    """A reader polling the file during a run always sees a complete file (every family, ending in a newline)."""
    metrics = tmp_path / "eplb.prom"
    seen, stop = [], threading.Event()

    def read_while_running():
        while not stop.is_set():
            try:
                seen.append(metrics.read_text())
            except FileNotFoundError:
                pass

    reader = threading.Thread(target=read_while_running)
    reader.start()
    try:
        done, report, text = run(cli, tmp_path, "--inject", "delay_ms=2,seed=1", rounds=6)
    finally:
        stop.set()
        reader.join()
    assert done.returncode == 0, done.stderr
    counts = set()
    for snapshot in seen:
        assert snapshot.endswith("eplb_transfer_seconds_count " + snapshot.rsplit(" ", 1)[-1])
        families = parse(snapshot)
        counts.add(value(families, "eplb_rebalances", "eplb_rebalances_total"))
    assert len(seen) > 10 and len(counts) >= 3, (len(seen), counts)  # the reader saw the file being rewritten
    check_against_report(parse(text), report)


def test_an_unwritable_metrics_path_fails_before_any_rank_starts(cli, tmp_path):
    missing = tmp_path / "no-such-directory" / "eplb.prom"
    done = subprocess.run([cli, "run", "--ranks", "2", "--nodes", "2", *SMALL, "--metrics", str(missing)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--metrics" in done.stderr and str(missing) in done.stderr, done.stderr
    assert "round" not in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_an_async_run_feeds_the_serving_stall_histogram(cli, tmp_path):
    done, report, text = run(cli, tmp_path, "--async", "--step-ms", "2", rounds=2)
    assert done.returncode == 0, done.stderr
    assert all(round_["serving"]["steps"] > 0 for round_ in report["rounds"])
    families = parse(text)
    check_against_report(families, report)
    assert value(families, "eplb_serving_stall_seconds", "eplb_serving_stall_seconds_count") > 0
