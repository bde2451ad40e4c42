"""python3 -m eplb.plot timeline: an async run report's serving steps with the commits marked.

Most reports are written by the test in the shape `eplb run --async --json` gives each round
("serving_timeline" and "serving"; "serving_idle" at the top level); one comes from a real
`eplb run --async` (the docs' command, smaller).
"""
import json
import subprocess
import sys

import numpy as np
import pytest

import eplb
import eplb.plot

PNG = b"\x89PNG\r\n\x1a\n"


def async_report(rounds=2, steps=120, layers=4) -> dict:
    rng = np.random.default_rng(3)
    out = []
    for number in range(1, rounds + 1):
        step = 0.002 + rng.random(steps) * 0.0003
        stall = np.zeros(steps)
        commits = [{"layer": layer, "step": 20 + 15 * layer, "seconds": 0.0004} for layer in range(layers)]
        for commit in commits:
            stall[commit["step"]] = commit["seconds"]
            step[commit["step"]] += commit["seconds"]
        out.append({"round": number, "bytes_moved": 1 << 20, "serving": {
            "steps": steps, "step_seconds_p50": float(np.median(step)),
            "step_seconds_p99": float(np.quantile(step, 0.99)), "stall_seconds_total": float(stall.sum()),
            "stall_seconds_max": float(stall.max()), "inconsistent_reads": 0},
            "serving_timeline": {"step_end_seconds": np.cumsum(step).tolist(), "step_seconds": step.tolist(),
                                 "stall_seconds": stall.tolist(), "commits": commits}})
    return {"topology": {"ranks": 4}, "policy": "deepseek", "rounds": out,
            "serving_idle": {"steps": steps, "step_seconds_p50": 0.00215, "step_seconds_p99": 0.0023}}


def shell_plot(*arguments):
    return subprocess.run([sys.executable, "-m", "eplb.plot", *arguments], capture_output=True, text=True,
                          timeout=120)


def test_one_panel_per_round_with_every_commit_marked(tmp_path):
    figure = eplb.plot.timeline(async_report(), out=tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").read_bytes().startswith(PNG)
    axes = figure.axes
    assert len(axes) == 2
    for number, axis in enumerate(axes, start=1):
        title = axis.get_title()
        assert title.startswith(f"round {number}: 120 steps, p50 ") and "0 inconsistent reads" in title
        labels = sorted(text.get_text() for text in axis.texts)
        assert labels == ["L0", "L1", "L2", "L3"]
        legend = [text.get_text() for text in axis.get_legend().get_texts()]
        assert sorted(legend) == ["idle p50 (no migration)", "layer commit", "serving step", "stalled in eplb calls"]


def test_a_real_async_runs_report_is_drawn_with_its_commits(tmp_path, cli):
    report = tmp_path / "run.json"
    run = subprocess.run([cli, "run", "--async", "--ranks", "2", "--rounds", "1", "--layers", "2",
                          "--bytes-per-expert", "64KiB", "--json", str(report)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    done = shell_plot("timeline", str(report), "-o", str(tmp_path / "timeline.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "timeline.png").read_bytes().startswith(PNG)
    figure = eplb.plot.timeline(json.loads(report.read_text()))
    committed = json.loads(report.read_text())["rounds"][0]["serving_timeline"]["commits"]
    assert sorted(text.get_text() for text in figure.axes[0].texts) == sorted(f"L{c['layer']}" for c in committed)
    assert len(committed) == 2


def test_the_shell_command_writes_svg_and_png_of_one_round(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(async_report()))
    done = shell_plot("timeline", str(path), "--round", "2", "-o", str(tmp_path / "timeline.svg"))
    assert done.returncode == 0, done.stderr
    assert b"<svg" in (tmp_path / "timeline.svg").read_bytes()[:400]
    assert eplb.plot.timeline(path, round=2).axes[0].get_title().startswith("round 2:")
    done = shell_plot("timeline", str(path), "-o", str(tmp_path / "timeline.png"))
    assert done.returncode == 0 and (tmp_path / "timeline.png").read_bytes().startswith(PNG)


def test_a_synchronous_runs_report_is_a_clear_error(tmp_path):
    sync = async_report()
    for round_ in sync["rounds"]:
        del round_["serving_timeline"], round_["serving"]
    path = tmp_path / "sync.json"
    path.write_text(json.dumps(sync))
    done = shell_plot("timeline", str(path), "-o", str(tmp_path / "timeline.png"))
    assert done.returncode == 2
    assert "no round has a serving timeline ('serving_timeline'): a synchronous run?" in done.stderr
    assert "eplb run --async" in done.stderr
    assert not (tmp_path / "timeline.png").exists()


@pytest.mark.parametrize("change, message", [
    (lambda r: r["rounds"][0]["serving_timeline"]["stall_seconds"].pop(), "must be non-empty lists of one length"),
    (lambda r: r["rounds"][0]["serving_timeline"]["commits"][0].update(step=500), "layer 0 commits at step 500"),
    (lambda r: r["rounds"][0]["serving_timeline"].pop("step_seconds"), "malformed (KeyError"),
    (lambda r: r.pop("rounds"), "not an `eplb run --json` report"),
])
def test_a_malformed_timeline_is_refused(change, message):
    report = async_report()
    change(report)
    with pytest.raises(eplb.Error, match=message.replace("(", r"\(").replace("`", "`")):
        eplb.plot.timeline(report)


def test_an_absent_round_is_named():
    with pytest.raises(eplb.Error, match="has no round 7"):
        eplb.plot.timeline(async_report(), round=7)
