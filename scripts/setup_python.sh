#!/usr/bin/env bash
# Creates the project's Python environment, .venv, from PyPI: Debian's
# /usr/bin/python3 (3.11), and exactly the packages of requirements.lock
# (torch, vllm, nixl, sglang, numpy, pytest, matplotlib, prometheus_client
# and their dependencies), installed with --no-deps so that nothing is
# resolved again. Idempotent: the venv records the hash of the lock it was
# made from and is left alone while that matches. pip's cache
# ($PIP_CACHE_DIR, default ~/.cache/pip) makes a re-run cheap.
# Usage: scripts/setup_python.sh [VENV]   (default: .venv in the repository)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv}"
lock="$root/requirements.lock"
stamp="$venv/.eplb-lock-sha256"
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup: Python environment $venv matches requirements.lock"
  exit 0
fi
started=$(date +%s)
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
wheelhouse="${EPLB_WHEELHOUSE:-$HOME/.cache/eplb/wheels}"
mkdir -p "$wheelhouse"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$venv/bin/python" -m pip install --quiet pip==26.3
echo "setup: downloading what $wheelhouse lacks of requirements.lock"
"$venv/bin/python" -m pip download --quiet --no-deps --only-binary=:all: -d "$wheelhouse" -r "$lock"
echo "setup: installing requirements.lock into $venv"
# --no-compile, then compileall on every core: pip compiles the packages'
# byte code on one core (170 of its 262 s here); compileall -j 0 takes 75 s on
# 2 cores. Like pip, it goes past the few files that do not compile (templates,
# examples) and their warnings are not ours: its output is dropped.
"$venv/bin/python" -m pip install --quiet --no-compile --no-deps --no-index --find-links "$wheelhouse" -r "$lock"
"$venv/bin/python" -m compileall -q -q -j 0 "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null 2>&1 || true
# The import the whole suite depends on, checked once here.
"$venv/bin/python" -c 'import torch, numpy, vllm, nixl; print("setup: torch", torch.__version__, "vllm", vllm.__version__)' \
  2> >(grep -v -e '^W[0-9]' -e 'deprecated' >&2)
echo "$want" >"$stamp"
echo "setup: Python environment ready in $(($(date +%s) - started)) s"
