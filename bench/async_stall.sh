#!/usr/bin/env bash
# What serving sees during a migration round: sync (serving blocked for the
# whole round) against async copy commits (stall = time inside commit_ready),
# the same topology and bytes in one run, medians and min-max, and the ratio.
# Usage: bench/async_stall.sh [BUILD_DIR] [REPETITIONS]
# Goal (issue 15): async copy stall <= 35% of the sync round.
# Not yet: async swap commits and `eplb run --async` (this drives the engine
# directly, ranks as threads over the loopback backend).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
exec "$build/bench/async_stall_bench" "${2:-7}"
