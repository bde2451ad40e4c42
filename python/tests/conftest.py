"""Shared fixtures for the tests of the installed `eplb` package.

The tests import the installed package (scripts/test.sh installs it in the
repository's .venv), never python/eplb from the source tree. Temporary files
go under build-python/pytest in the repository, not /tmp (the repository's
root conftest.py sets that, early enough for every way pytest starts). The eplb CLI
(for the "identical to the CLI" tests) is $EPLB_CLI, else build/eplb of
this repository: a missing CLI fails those tests, it does not skip them.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def cli() -> str:
    path = Path(os.environ.get("EPLB_CLI", REPO / "build" / "eplb"))
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"the eplb CLI is not at {path}: build it (bash scripts/build.sh) or set EPLB_CLI")
    return str(path)


@pytest.fixture(scope="session")
def deepseek_example() -> dict:
    """DeepSeek's published worked example (tests/data/reference/deepseek_readme_example.json)."""
    with open(REPO / "tests" / "data" / "reference" / "deepseek_readme_example.json", encoding="utf-8") as file:
        return json.load(file)


def run_cli(cli: str, *arguments: str) -> subprocess.CompletedProcess:
    """Runs the eplb CLI; fails the test with its stderr if it fails."""
    done = subprocess.run([cli, *arguments], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join([cli, *arguments])} failed ({done.returncode}): {done.stderr}"
    return done
