#!/usr/bin/env bash
# Builds and runs the test suite under sanitizers.
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer, whole suite
#   scripts/sanitize.sh tsan   ThreadSanitizer, tests labelled `concurrent`
#   scripts/sanitize.sh python-asan [pytest args]   the Python package's suite, extension under ASan+UBSan
#   scripts/sanitize.sh python-tsan [pytest args]   its threads and Migrator tests, extension under TSan
# Suppressions for UCX/OpenMPI internals live in scripts/sanitizers/ (narrow, commented).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-asan}"
shift || true
supp="$root/scripts/sanitizers"

# The CMake arguments of a sanitizer tree (build-asan, build-tsan): the C++
# tests and the Python extension in one tree, so both suites share its
# instrumented libraries (the extension needs position-independent code,
# which EPLB_BUILD_PYTHON turns on for the whole tree).
tree_args() {
  echo "-DCMAKE_BUILD_TYPE=RelWithDebInfo -DEPLB_SANITIZE=$1 -DEPLB_BUILD_BENCH=OFF -DEPLB_BUILD_TESTS=ON" \
    "-DEPLB_BUILD_PYTHON=ON -DPython_EXECUTABLE=/usr/bin/python3"
}
case "$mode" in
  asan)
    dir="$root/build-asan"
    bash "$root/scripts/build.sh" "$dir" $(tree_args address,undefined)
    # fast_unwind_on_malloc=0: full allocation stacks, so that leak suppressions
    # can match OpenMPI plugin frames (scripts/sanitizers/lsan.supp).
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0:${ASAN_OPTIONS:-}"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    # `eplb run` ranks launched by mpirun run without leak detection: on the CI
    # machine (not on the 2-core dev machine) LeakSanitizer's stop-the-world
    # tracer crashes at their exit ("Tracer caught signal 11" inside libasan,
    # after the run verified every slot). Leaks of a whole `eplb run` are
    # checked by ci-full.sh's leaks stage; ASan and UBSan stay on here.
    mpirun_runs='^RunCommand\.Mpirun'
    ctest --test-dir "$dir" --output-on-failure --timeout 600 -j "$(nproc)" -LE no_asan -E "$mpirun_runs"
    ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" \
      ctest --test-dir "$dir" --output-on-failure --timeout 600 -LE no_asan -R "$mpirun_runs"
    ;;
  tsan)
    dir="$root/build-tsan"
    # Only the CLI and the test executables of directories labelled concurrent.
    targets="eplb"
    for labels in "$root"/tests/*/LABELS; do
      if grep -qw concurrent "$labels"; then targets+=" test_$(basename "$(dirname "$labels")")"; fi
    done
    EPLB_BUILD_TARGETS="$targets" bash "$root/scripts/build.sh" "$dir" $(tree_args thread)
    export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
    # UCX's memory-event hooks (libucm patching malloc/mmap/madvise) crash under
    # TSan's interceptors: at ucp_init, and when a thread exits (libucm's madvise
    # hook takes a rwlock after TSan tore the thread down). Turn them off.
    export UCX_MEM_EVENTS=no
    ctest --test-dir "$dir" --output-on-failure --timeout 600 -j "$(nproc)" -L concurrent -LE no_tsan
    ;;
  python-asan | python-tsan)
    # The extension and its libraries built with the sanitizer into their own
    # venv (build-python-asan|tsan/); the runtime is preloaded into Debian's
    # (uninstrumented) interpreter, with libstdc++ (the interpreter does not
    # link it, and ASan's __cxa_throw interceptor needs it at start-up).
    # Leak detection is off: CPython and torch keep process-lifetime
    # allocations by design.
    kind="${mode#python-}"
    sanitizer=thread
    # The sanitizers check memory and threads, not speed: the 4-thread speedup
    # test is left to the plain run (scripts/python_test.sh).
    # TSan also runs the Migrator's tests (its collectives run on C++ threads
    # that call back into Python); ASan runs the whole suite.
    tests=("$root/python/tests/test_threads.py" "$root/python/tests/test_migrator.py"
      "$root/python/tests/test_async_migration.py" --deselect
      "python/tests/test_threads.py::test_four_threads_run_faster_than_one_at_a_time")
    if [[ $kind == asan ]]; then sanitizer=address,undefined; tests=("${tests[@]:3}"); fi
    # UCX's memory hooks trip TSan's interceptors (see the tsan mode above).
    if [[ $kind == tsan ]]; then export UCX_MEM_EVENTS=no; fi
    # The extension is built in the C++ suite's sanitizer tree (build-asan or
    # build-tsan, configured alike by tree_args), so the libraries it links
    # are compiled once for both suites.
    # The venv sees the project's environment (.venv: torch, numpy, pytest, ...)
    # through a .pth file, after its own site-packages, so that its own
    # (instrumented) eplb is the one imported.
    dir="$root/build-python-$kind"
    bash "$root/scripts/setup_python.sh"
    if [[ ! -x "$dir/venv/bin/python" ]]; then /usr/bin/python3 -m venv "$dir/venv"; fi
    site="$("$dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/eplb-project-venv.pth"
    EPLB_PYTHON_BUILD_DIR="$root/build-$kind" EPLB_CMAKE_ARGS="$(tree_args "$sanitizer")" \
      "$dir/venv/bin/python" -m pip install --quiet --no-build-isolation --no-index --no-deps "$root"
    export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:${ASAN_OPTIONS:-}"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=1"
    cd "$root"
    # --capture=sys: pytest leaves file descriptor 2 alone, so a sanitizer
    # report that ends the interpreter in the middle of a test is printed
    # (with fd capture it went to pytest's temporary file and was lost).
    EPLB_CLI="${EPLB_CLI:-$root/build/eplb}" LD_PRELOAD="$(gcc -print-file-name="lib$kind.so"):$(gcc -print-file-name=libstdc++.so.6)" \
      "$dir/venv/bin/python" -m pytest -q --durations=15 -p no:cacheprovider --capture=sys "${tests[@]}" "$@"
    ;;
  *) echo "usage: $0 asan|tsan|python-asan|python-tsan" >&2; exit 2 ;;
esac
