#!/usr/bin/env bash
# Builds and runs the test suite under sanitizers.
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer, whole suite
#   scripts/sanitize.sh tsan   ThreadSanitizer, tests labelled `concurrent`
# Suppressions for UCX/OpenMPI internals live in scripts/sanitizers/ (narrow, commented).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-asan}"
supp="$root/scripts/sanitizers"
case "$mode" in
  asan)
    dir="$root/build-asan"
    bash "$root/scripts/build.sh" "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DEPLB_SANITIZE=address,undefined -DEPLB_BUILD_BENCH=OFF
    # fast_unwind_on_malloc=0: full allocation stacks, so that leak suppressions
    # can match OpenMPI plugin frames (scripts/sanitizers/lsan.supp).
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0:${ASAN_OPTIONS:-}"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    ctest --test-dir "$dir" --output-on-failure --timeout 600 -j "$(nproc)" -LE no_asan
    ;;
  tsan)
    dir="$root/build-tsan"
    # Only the CLI and the test executables of directories labelled concurrent.
    targets="eplb"
    for labels in "$root"/tests/*/LABELS; do
      if grep -qw concurrent "$labels"; then targets+=" test_$(basename "$(dirname "$labels")")"; fi
    done
    EPLB_BUILD_TARGETS="$targets" bash "$root/scripts/build.sh" "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DEPLB_SANITIZE=thread -DEPLB_BUILD_BENCH=OFF
    export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
    # UCX's memory-event hooks (libucm patching malloc/mmap/madvise) crash under
    # TSan's interceptors: at ucp_init, and when a thread exits (libucm's madvise
    # hook takes a rwlock after TSan tore the thread down). Turn them off.
    export UCX_MEM_EVENTS=no
    ctest --test-dir "$dir" --output-on-failure --timeout 600 -j "$(nproc)" -L concurrent -LE no_tsan
    ;;
  *) echo "usage: $0 asan|tsan" >&2; exit 2 ;;
esac
