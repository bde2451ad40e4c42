"""pytest, anywhere in this repository: temporary files go to build-python/pytest, not /tmp.

(Here at the root so that pytest loads it before it sets up tmp_path, however it is started.
The tests themselves are in python/tests; see docs/python.md.)
"""
from pathlib import Path


def pytest_configure(config):
    if config.option.basetemp is None:
        config.option.basetemp = str(Path(__file__).resolve().parent / "build-python" / "pytest")
