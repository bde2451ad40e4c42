#!/usr/bin/env bash
# Installs the Python package `eplb` into the repository's venv (.venv, made
# with Debian's /usr/bin/python3 and its site packages: numpy, torch,
# matplotlib, pytest) and runs its pytest suite (python/tests) on the
# installed package. Offline: pip uses no index. The extension is built by
# setup.py in build-python/ (only its CMake target). The "identical to the
# CLI" tests run $EPLB_CLI, default build/eplb (built by scripts/build.sh).
# Usage: scripts/python_test.sh [pytest arguments...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/pip" install --quiet --no-build-isolation --no-index "$root"
cd "$root"
EPLB_CLI="${EPLB_CLI:-$root/build/eplb}" "$venv/bin/python" -m pytest -q "$@"
