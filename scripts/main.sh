#!/usr/bin/env bash
# Sets up, builds and runs eplb's main job with its defaults (README's first
# command): `eplb run` rebalances a simulated MoE model over 4 rank processes
# (2 emulated nodes) for 3 rounds, moving expert weights over UCX shared memory.
# Sets up everything (scripts/setup.sh: Debian packages and the Python
# environment) but builds only what the main job needs: the `eplb` CLI
# (scripts/test.sh builds and runs the rest).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
EPLB_BUILD_TARGETS=eplb bash "$root/scripts/build.sh" "$root/build"
exec "$root/build/eplb" run "$@"
