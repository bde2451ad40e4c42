"""The README's Python example runs as written."""
import re
import subprocess
import sys


def test_readme_python_example(repo):
    readme = (repo / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks, "README.md has no Python example"
    assert len(blocks[0].strip().splitlines()) == 5
    done = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    balancedness, plan = done.stdout.splitlines()
    assert 0.8 < float(balancedness) <= 1.0
    assert "'bytes_over_network'" in plan

