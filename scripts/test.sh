#!/usr/bin/env bash
# Sets up, builds and runs the whole eplb test suite (README's second command):
# the C++ suite (ctest), then the Python package installed in .venv and its
# pytest suite (scripts/python_test.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh" "$root/build"
cd "$root/build"
ctest --output-on-failure --timeout 300 -j "$(nproc)"
bash "$root/scripts/python_test.sh"
