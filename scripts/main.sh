#!/usr/bin/env bash
# Sets up, builds and runs eplb's main job with its defaults (README's first command).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh" "$root/build"
exec "$root/build/eplb" rebalance "$@"
