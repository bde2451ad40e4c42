"""python3 -m eplb.plot timeline|evaluate on hostile inputs (issue 29 items 13, 14).

Only regular files are read, at most --max-input-bytes of them; /dev/zero, a FIFO, a directory or a
file over the cap is refused at once with exit 3 and one line. A report whose fields have the wrong
type, or whose bytes are not UTF-8, is exit 3 with one line naming the field; never a traceback.
"""
import json
import os
import subprocess
import sys

import pytest

import eplb
from test_plot_timeline import async_report


def evaluate_results() -> dict:
    windows = [{"boundary": 10 * i, "next_window": 0.8 + 0.01 * i, "bytes_moved": 1e9} for i in range(1, 5)]
    return {"trace": "t.npy", "window": 10, "estimator": "sum", "topology": {"layers": 2, "ranks": 4},
            "policies": [{"policy": "deepseek", "windows": windows}]}


def shell_plot(*arguments, timeout=60):
    return subprocess.run([sys.executable, "-m", "eplb.plot", *arguments], capture_output=True, text=True,
                          timeout=timeout)


def one_line_exit_3(done, *words):
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("command", ["timeline", "evaluate"])
def test_dev_zero_is_refused_at_once(command, tmp_path):
    done = shell_plot(command, "/dev/zero", "-o", str(tmp_path / "x.png"), timeout=30)
    one_line_exit_3(done, "/dev/zero", "not a regular file")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("command", ["timeline", "evaluate"])
def test_a_fifo_and_a_directory_are_refused_at_once(command, tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    one_line_exit_3(shell_plot(command, str(fifo), "-o", str(tmp_path / "x.png"), timeout=30), "not a regular file")
    one_line_exit_3(shell_plot(command, str(tmp_path), "-o", str(tmp_path / "x.png"), timeout=30),
                    "not a regular file")


@pytest.mark.parametrize("command, content", [("timeline", async_report), ("evaluate", evaluate_results)])
def test_a_file_over_the_size_cap_is_refused(command, content, tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(content()) + " " * 4096)
    done = shell_plot(command, str(path), "--max-input-bytes", "1KiB", "-o", str(tmp_path / "x.png"))
    one_line_exit_3(done, "--max-input-bytes", "1024")
    done = shell_plot(command, str(path), "--max-input-bytes", "lots", "-o", str(tmp_path / "x.png"))
    assert done.returncode == 2 and "--max-input-bytes" in done.stderr, done.stderr
    done = shell_plot(command, str(path), "--max-input-bytes", "1MiB", "-o", str(tmp_path / "x.png"))
    assert done.returncode == 0, done.stderr


def _set(path, value):
    def change(report):
        target = report
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


TIMELINE_CASES = [
    (_set(["rounds"], {"a": 1}), "rounds"),
    (_set(["rounds", 0], "round one"), "rounds[0]"),
    (_set(["rounds", 0, "serving"], [1, 2]), "rounds[0].serving"),
    (_set(["rounds", 0, "serving", "step_seconds_p50"], "fast"), "rounds[0].serving.step_seconds_p50"),
    (_set(["rounds", 0, "serving_timeline"], "yes"), "rounds[0].serving_timeline"),
    (_set(["rounds", 0, "serving_timeline", "step_seconds"], ["a", "b"]), "rounds[0].serving_timeline.step_seconds"),
    (_set(["rounds", 0, "serving_timeline", "step_seconds"], 7), "rounds[0].serving_timeline.step_seconds"),
    (_set(["rounds", 0, "serving_timeline", "commits"], {"layer": 1}), "rounds[0].serving_timeline.commits"),
    (_set(["rounds", 1, "serving_timeline", "commits", 0, "layer"], "L0"),
     "rounds[1].serving_timeline.commits[0].layer"),
    (_set(["rounds", 0, "serving_timeline", "commits", 1, "step"], 2.5), "rounds[0].serving_timeline.commits[1].step"),
    (_set(["rounds", 0, "round"], [1]), "rounds[0].round"),
    (_set(["serving_idle"], 3), "serving_idle"),
    (_set(["serving_idle", "step_seconds_p50"], None), "serving_idle.step_seconds_p50"),
    (_set(["topology"], "big"), "topology"),
]


@pytest.mark.parametrize("change, field", TIMELINE_CASES)
def test_a_wrongly_typed_timeline_field_is_named(change, field, tmp_path):
    report = async_report()
    change(report)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    one_line_exit_3(shell_plot("timeline", str(path), "-o", str(tmp_path / "x.png")), field)
    assert not (tmp_path / "x.png").exists()


EVALUATE_CASES = [
    (_set(["policies"], "deepseek"), "policies"),
    (_set(["policies", 0], 3), "policies[0]"),
    (_set(["policies", 0, "policy"], {"name": "x"}), "policies[0].policy"),
    (_set(["policies", 0, "windows"], {"a": 1}), "policies[0].windows"),
    (_set(["policies", 0, "windows", 1], "w"), "policies[0].windows[1]"),
    (_set(["policies", 0, "windows", 2, "bytes_moved"], "1GB"), "policies[0].windows[2].bytes_moved"),
    (_set(["policies", 0, "windows", 0, "next_window"], [0.5]), "policies[0].windows[0].next_window"),
    (_set(["policies", 0, "windows", 0, "boundary"], True), "policies[0].windows[0].boundary"),
    (_set(["topology"], [1, 2]), "topology"),
]


@pytest.mark.parametrize("change, field", EVALUATE_CASES)
def test_a_wrongly_typed_evaluate_field_is_named(change, field, tmp_path):
    results = evaluate_results()
    change(results)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    one_line_exit_3(shell_plot("evaluate", str(path), "-o", str(tmp_path / "x.png")), field)


@pytest.mark.parametrize("command, content", [("timeline", async_report), ("evaluate", evaluate_results)])
def test_non_utf8_bytes_and_a_top_level_array_are_one_line(command, content, tmp_path):
    path = tmp_path / "bad.json"
    text = json.dumps(content())
    path.write_bytes(text[:40].encode() + b"\xff\xfe\xc3" + text[40:].encode())
    one_line_exit_3(shell_plot(command, str(path), "-o", str(tmp_path / "x.png")), "UTF-8")
    path.write_text("[1, 2, 3]")
    one_line_exit_3(shell_plot(command, str(path), "-o", str(tmp_path / "x.png")), "object")
    path.write_text('{"rounds": [' * 100000)
    one_line_exit_3(shell_plot(command, str(path), "-o", str(tmp_path / "x.png")), str(path))


def test_max_input_bytes_is_read_by_the_cli_parser(cli, tmp_path):
    """eplb.plot reads --max-input-bytes with the CLI's own C++ parser: same sizes, same messages."""
    from eplb.plot import _inputs
    assert _inputs.parse_byte_size("4096") == 4096
    assert _inputs.parse_byte_size("512KiB") == 512 << 10
    assert _inputs.parse_byte_size("1.5GiB") == 3 << 29
    assert _inputs.parse_byte_size("1T") == 1 << 40
    bad = ("--max-input-bytes: 'lots' is not a byte size (examples: 4096, 4K, 512KiB, 1MiB, 1.5GiB; units B, "
           "K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB are all powers of 1024)")
    out_of_range = "--max-input-bytes: byte size '2TiB' must be a whole number of bytes in [1 B, 1 TiB]"
    for text, message in (("lots", bad), ("2TiB", out_of_range)):
        with pytest.raises(ValueError) as raised:
            _inputs.parse_byte_size(text)
        assert isinstance(raised.value, eplb.Error)
        assert raised.value.code == "invalid argument"
        assert str(raised.value) == message
        refused = subprocess.run([cli, "rebalance", "--max-input-bytes", text, "--load", str(tmp_path / "none.npy")],
                                 capture_output=True, text=True, timeout=30)
        assert refused.returncode == 2 and refused.stderr.strip() == f"eplb: invalid argument: {message}", refused.stderr
    with pytest.raises(eplb.Error, match=r"^byte size '0\.5' must be a whole number of bytes"):  # no option named
        eplb._eplb.parse_byte_size("0.5")
