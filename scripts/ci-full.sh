#!/usr/bin/env bash
# The full check (issue 6): on a clean clone, stages in order (each must pass):
#   1. test   bash scripts/test.sh            the README's test command (setup, build, whole suite)
#   2. asan   bash scripts/sanitize.sh asan   whole suite under AddressSanitizer + UBSan (+ LeakSanitizer)
#   3. tsan   bash scripts/sanitize.sh tsan   tests labelled `concurrent` under ThreadSanitizer
#      python-asan, python-tsan: the Python package's suite with the extension under
#      ASan+UBSan, its thread tests under TSan (docs/python.md)
#   4. fuzz   bash scripts/fuzz.sh 5          every libFuzzer target for ~5 s from its seed corpus
#   5. leaks  a full default `eplb run` of the ASan build with detect_leaks=1
#   6. faults bench/fault_matrix.sh           the 4-rank fault matrix (docs/operations.md)
#   7. leftovers  nothing eplb- or UCX-made left in /dev/shm or /tmp: the
#      listing at the end is compared with the one taken at the start
# The elapsed time of every stage is printed; the whole run must stay well
# under 60 minutes on 2 cores (measured: docs/operations.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$(pwd)"
start=$(date +%s)
times=()

# What eplb, its tests and UCX create in /dev/shm and /tmp (rendezvous
# directories, test scratch directories, report temporaries, UCX shared
# memory segments), one path a line, sorted.
scratch_listing() {
  find /dev/shm /tmp -maxdepth 1 -mindepth 1 \( -name 'eplb*' -o -name 'ucx*' -o -name 'sem.eplb*' \
    -o -name '*.json.tmp.*' -o -name '*.npy.tmp.*' -o -name '*.prom.tmp.*' \) 2>/dev/null | sort
}
scratch_at_start="$(mktemp)"
trap 'rm -f "$scratch_at_start"' EXIT  # removed however the run ends (leftover_check removes it too)
scratch_listing >"$scratch_at_start"

leftover_check() {
  local left
  left="$(comm -13 "$scratch_at_start" <(scratch_listing))"
  rm -f "$scratch_at_start"
  if [[ -n "$left" ]]; then
    echo "ci: left behind in /dev/shm or /tmp by this run:" >&2
    echo "$left" | sed 's/^/  /' >&2
    return 1
  fi
  echo "ci: nothing left in /dev/shm or /tmp"
}

stage() {
  local name="$1"
  shift
  local t0
  t0=$(date +%s)
  echo "ci: stage $name: $*"
  "$@"
  local elapsed=$(($(date +%s) - t0))
  times+=("$name ${elapsed}s")
  echo "ci: stage $name passed in ${elapsed} s"
}

leak_check() {
  # A full default `eplb run` (4 rank processes over UCX shared memory) from
  # the ASan build: every rank exits through LeakSanitizer with detect_leaks=1;
  # OpenMPI/PMIx/UCX process-lifetime allocations are suppressed narrowly in
  # scripts/sanitizers/lsan.supp (not eplb's code).
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0" \
    LSAN_OPTIONS="suppressions=$root/scripts/sanitizers/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    timeout -s KILL 900 "$root/build-asan/eplb" run
}

stage test bash scripts/test.sh
stage asan bash scripts/sanitize.sh asan
stage tsan bash scripts/sanitize.sh tsan
stage python-asan bash scripts/sanitize.sh python-asan
stage python-tsan bash scripts/sanitize.sh python-tsan
stage fuzz bash scripts/fuzz.sh 5
stage leaks leak_check
stage faults bash bench/fault_matrix.sh "$root/build"
stage leftovers leftover_check

echo "ci: stage times: ${times[*]}"
echo "ci: finished in $(($(date +%s) - start)) s"
