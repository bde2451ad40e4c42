"""bench/gpu_check.py --device cpu: the GPU check's own logic, run on CPU tensors (docs/gpu.md).

The check script is what a machine with a GPU runs (bench/gpu_check.sh); its rows on the CPU prove
nothing about a GPU, but a check that cannot pass on the CPU would fail there too. Every row that is
a check (not a number) must be PASS here, and every row must be present: none is skipped.
"""
import json
import subprocess
import sys

EXPECTED = {"digest parity", "digest GB/s", "staged round byte-exact", "staged corrupted row retried",
            "staged corruption aborted alike", "staged GB/s", "bf16 matmul slowdown",
            "torch plane (gloo) byte-exact", "torch plane (gloo) GB/s"}


def test_gpu_check_passes_on_cpu(repo, tmp_path):
    out = tmp_path / "gpu_check.json"
    ran = subprocess.run([sys.executable, str(repo / "bench" / "gpu_check.py"), "--device", "cpu", "--seconds", "200",
                          "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    rows = {row["check"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == EXPECTED, sorted(rows)
    for name, row in rows.items():
        result = row["result"]
        assert result == "PASS" or isinstance(result, (int, float)), f"{name}: {result} ({row['condition']})"
        if isinstance(result, (int, float)):
            assert result > 0, name
    assert rows["staged round byte-exact"]["result"] == "PASS"
    assert rows["bf16 matmul slowdown"]["steps_during"] > 0
