#!/usr/bin/env bash
# Installs the Python package `eplb` into the repository's venv (.venv, made
# by scripts/setup_python.sh from requirements.lock: torch, vllm, nixl,
# sglang, numpy, pytest, matplotlib, prometheus_client) and runs its pytest
# suite (python/tests) on the installed package. Offline: pip uses no index
# and installs no dependency. The extension is built by setup.py in
# build-python/ (only its CMake target). The "identical to the
# CLI" tests run $EPLB_CLI, default build/eplb (built by scripts/build.sh).
# Usage: scripts/python_test.sh [pytest arguments...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
bash "$root/scripts/setup_python.sh" "$venv"
"$venv/bin/pip" install --quiet --no-build-isolation --no-index --no-deps "$root"
cd "$root"
EPLB_CLI="${EPLB_CLI:-$root/build/eplb}" "$venv/bin/python" -m pytest -q --durations=15 "$@"
