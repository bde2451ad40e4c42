"""examples/moe_rebalance.py, the README's end-to-end example: 4 processes, bit-identical outputs, better balance."""
import re
import subprocess
import sys


def test_moe_rebalance_example(repo):
    done = subprocess.run([sys.executable, str(repo / "examples" / "moe_rebalance.py")], capture_output=True,
                          text=True, timeout=240, cwd=repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outputs for the fixed inputs bit-identical before and after: True" in done.stdout
    assert "verified on every rank: True" in done.stdout
    before, after = map(float, re.search(r"balancedness: ([0-9.]+) before -> ([0-9.]+) after", done.stdout).groups())
    assert after > before
