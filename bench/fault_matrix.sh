#!/usr/bin/env bash
# Fault matrix (issue 6): runs `eplb run` with 4 ranks (small shapes, default
# transport: UCX over shared memory) under each failure scenario and prints
# one table: scenario, outcome, time to detect, hang, slots consistent, and
# the first line of stderr the user sees.
#
# Usage: bench/fault_matrix.sh [BUILD_DIR] [SCENARIO...]
#   BUILD_DIR defaults to build/ (needs build/eplb); SCENARIO ids: 1 2 3 4a 4b
#   5 6 7 8a 8b 8c 9a 9b 10a 10b 10c, and the rows of issue 17 (what a
#   careless user or an attacker gives): 11a-11d input files, 12a-12c
#   durations, 13a-13c what listens, 14a-14b reports, 15a-15c one validation
#   and Ctrl-C, 16 a long run, 17 memory admission, 18 a killed rank with
#   posix shared memory only, 19 a forged hello, 20a-20b a killed launcher
#   and the next launch's sweep, and the rows of issue 15: 21a-21e errors,
#   stalls, corruption, a killed and a stopped rank under --async, and of
#   issue 29: 29a a SIGTERM'd run's report, 29b-29d report paths, 29e an
#   unknown command, 29f-29h the Python Migrator (a stale old placement, a
#   stalled serving loop, an exit in an async round) (default: all).
# Every case runs with its own TMPDIR; the `left` column lists what the run
# left there and the new entries of /dev/shm (a row fails unless "nothing").
# Exit status: 0 when every row meets the requirement of issue 6 (no hang,
# no inconsistent slot, expected outcome), 1 otherwise.
#
# Limits (timeout -s KILL): the scenario's own deadlines plus a margin: 20 s for
# bad input, 30 s for a run with 1-2 s transfer deadlines (a frozen rank: 12 s
# vote deadline + 5 s launcher grace), 60 s for retried runs and mpirun.
# Columns:
#   outcome     completed | retried+completed | aborted cleanly | refused before moving |
#               interrupted (exit 130) | HANG | UNEXPECTED
#   detect      seconds from start to the first line on stderr; "-" when none
#   error       the first line of stderr that is not a rank's state line (the error the user reads)
#   total       wall time of the whole run (launcher included: it kills a frozen rank after its grace)
#   hang        yes when `timeout` had to kill the run (limit = scenario deadline + margin)
#   consistent  yes: eplb's own final verification passed on every (surviving) rank
#               (--json all_verified, or every survivor's "... slots verified byte for byte
#               against that mapping" line); n/a: refused before any byte moved
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
shift || true
eplb="$build/eplb"
[[ -x "$eplb" ]] || { echo "fault_matrix: $eplb not built (cmake --build build --target eplb)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# shape LAYERS ROUNDS: the small model every scenario uses.
shape() { echo "--layers $1 --experts 16 --replicas 24 --groups 4 --bytes-per-expert 64KiB --rounds $2 --window 10"; }
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe)

# Inputs of scenario 11: a FIFO and /dev/zero behind load-file names.
mkfifo "$work/fifo_trace.npy" "$work/fifo_load.json"
ln -s /dev/zero "$work/zero_trace.npy"
ln -s /dev/zero "$work/zero_trace.json"
# Malformed inputs for scenario 10.
printf '0,0,0,12\n0,0,1,1e999x\n' >"$work/bad_trace.csv"
printf '\x93NUMPY\x01\x00\xff\xff{garbage' >"$work/bad_trace.npy"
# A placement file (as `eplb rebalance --out` writes it) with one slot naming expert 999.
"$eplb" rebalance --preset tiny --out "$work/placement.json" >/dev/null 2>&1
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["phy2log"][1][3]=999; json.dump(d,open(sys.argv[2],"w"))' \
  "$work/placement.json" "$work/bad_placement.json"

# leftovers TMP: "nothing", or what a run left in its TMPDIR and /dev/shm
# (new /dev/shm entries; another user's run at the same time would show here
# too, except Python multiprocessing's sem.mp-*, which eplb never creates).
leftovers() {
  local found
  found=$( (ls -A "$1"; ls -A /dev/shm | sort | comm -13 "$work/shm-before" - | grep -v '^sem\.mp-') | tr '\n' ' ')
  [[ -z "$found" ]] && echo nothing || echo "$found"
}

# forge_hello TMP: as soon as a run's hub socket appears under TMP, connects
# and sends a version-2 hello claiming rank 1 with a made-up secret (a
# process of the same user that the launcher did not start).
forge_hello() {
  python3 - "$1" <<'PY'
import glob, socket, struct, sys, time
end = time.time() + 20
while time.time() < end:
    socks = glob.glob(sys.argv[1] + "/eplb-*/hub.sock")
    if socks:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(socks[0])
            payload = struct.pack("<ii", 4, 4242) + b"F" * 32
            s.sendall(struct.pack("<IHHQiIQ", 0x53425045, 2, 1, 0, 1, 0, len(payload)) + payload)
            s.settimeout(10)
            s.recv(1)
        except OSError:
            pass
        break
    time.sleep(0.002)
PY
}

rows=()
details=()
failures=0

# run_case ID NAME EXPECT LIMIT ENV COMMAND...
#   EXPECT: complete (completed, possibly after retries) | abort (non-zero exit, clean) |
#           refuse (non-zero exit before any byte moved)
run_case() {
  local id="$1" name="$2" expect="$3" limit="$4" environment="$5"
  shift 5
  if ((${#wanted[@]})) && [[ ! " ${wanted[*]} " =~ " $id " && ! " ${wanted[*]} " =~ " ${id%b} " ]]; then return; fi
  local json="$work/$id.json" out="$work/$id.out" err="$work/$id.err"
  rm -f "$json"
  local start end rc
  # What the run leaves behind: its own TMPDIR, and new entries of /dev/shm.
  local tmp="${CASE_TMP:-$work/tmp-$id}"
  mkdir -p "$tmp"
  ls -A /dev/shm | sort >"$work/shm-before"
  environment="TMPDIR=$tmp $environment"
  if [[ -n "${FORGER:-}" ]]; then forge_hello "$tmp" & fi
  start=$(date +%s.%N)
  # stderr lines get a timestamp so the first one tells when the error was detected.
  local json_flag=(--json "$json")
  # only `eplb run` writes --json; a scenario may give its own
  [[ " $* " != *" run "* || " $* " == *" --json "* ]] && json_flag=()
  env $environment timeout -s KILL "$limit" "$@" "${json_flag[@]}" >"$out" \
    2> >(while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$err")
  rc=$?
  end=$(date +%s.%N)
  sleep 0.2  # let the stderr stamper drain
  wait  # the forger, if any
  local left
  left=$(leftovers "$tmp")
  local total detect first hang=no consistent outcome verdict=ok
  total=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')
  if [[ -s "$err" ]]; then
    detect=$(head -n1 "$err" | awk -v a="$start" '{printf "%.1f s", $1-a}')
    # The error itself: the first stderr line that is not a rank's state
    # line ("eplb: rank N: round K stopped; ..."), which the survivors print
    # first; the state lines feed the `consistent` column.
    first=$( (grep -v -e '^[0-9.]* eplb: rank [0-9]*: round [0-9]* stopped' -e '^[0-9.]* xfer-bench: target listening' "$err" ||
      true) | head -n1 | cut -d' ' -f2-)
    [[ -n "$first" ]] || first=$(head -n1 "$err" | cut -d' ' -f2-)
  else
    detect="-"
    first="(nothing on stderr)"
  fi
  if ((rc == 137)); then hang=yes; fi
  local all_verified="" retries=0
  if [[ -s "$json" ]]; then
    all_verified=$(python3 -c 'import json,sys; print(str(json.load(open(sys.argv[1]))["all_verified"]).lower())' "$json" 2>/dev/null)
    retries=$(python3 -c 'import json,sys; print(sum(r.get("retries",0) for r in json.load(open(sys.argv[1]))["rounds"]))' "$json" 2>/dev/null || echo 0)
  fi
  if ((rc == 0)); then
    [[ "$all_verified" == true ]] && consistent=yes || consistent=NO
    if ((retries > 0)); then outcome="retried+completed ($retries)"; else outcome=completed; fi
  elif [[ $hang == yes ]]; then
    outcome=HANG
    consistent=unknown
  else
    local stopped verified_lines
    stopped=$(grep -c 'round [0-9]* stopped' "$err" || true)
    verified_lines=$(grep -c 'slots verified byte for byte against that mapping' "$err" || true)
    if grep -q 'VERIFICATION FAILED' "$err"; then
      consistent=NO
    elif ((stopped > 0)) && ((verified_lines == stopped)); then
      consistent="yes ($verified_lines ranks)"
    elif ((stopped == 0)); then
      consistent="n/a"
    else
      consistent=NO
    fi
    if ((stopped == 0)); then outcome="refused before moving"; else outcome="aborted cleanly"; fi
    if ((rc == 130)); then outcome="interrupted (exit 130)"; fi
  fi
  case "$expect" in
    complete) [[ $rc == 0 ]] || verdict=FAIL ;;
    abort) [[ $rc != 0 && $hang == no && "$outcome" == "aborted cleanly" ]] || verdict=FAIL ;;
    refuse) [[ $rc != 0 && $hang == no && "$outcome" == "refused before moving" ]] || verdict=FAIL ;;
    interrupt) [[ $rc == 130 && $hang == no ]] || verdict=FAIL ;;
  esac
  [[ "$consistent" == NO || "$consistent" == unknown ]] && verdict=FAIL
  [[ "$left" == nothing ]] || verdict=FAIL
  if [[ -n "${EXPECT_STDERR:-}" ]] && ! grep -q "$EXPECT_STDERR" "$err"; then verdict=FAIL; fi
  # With a sanitizer build (bench/fault_matrix.sh build-asan) any report fails the row.
  if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|ThreadSanitizer)|runtime error:|WARNING: ThreadSanitizer' "$err" "$out"; then
    verdict=FAIL
    outcome="$outcome +SANITIZER"
  fi
  [[ $verdict == ok ]] || failures=$((failures + 1))
  details+=("== $id $name (exit $rc, ${total} s):" "$(cut -d' ' -f2- "$err" | head -n 6 | cut -c1-600)")
  rows+=("$(printf '%-4s|%-42s|%-24s|%-8s|%-7s|%-5s|%-15s|%-10s|%-6s|%s' "$id" "$name" "$outcome" "$detect" "${total} s" "$hang" "$consistent" "$left" "$verdict" "${first:0:400}")")
  printf 'fault_matrix: %-4s %-42s rc=%d %ss %s\n' "$id" "$name" "$rc" "$total" "$outcome" >&2
}

# Issue 17 row 12: SIGKILL of the launcher 1 s into a run. Its ranks die
# with it (PR_SET_PDEATHSIG); its directories stay until the next launch,
# which sweeps them (owner pid gone). Row 20a: what is left right after the
# kill; 20b: the next launch completes and nothing is left.
killed_launcher_case() {
  if ((${#wanted[@]})) && [[ ! " ${wanted[*]} " =~ " 20 " ]]; then return; fi
  local tmp="$work/tmp-14" start end
  mkdir -p "$tmp"
  ls -A /dev/shm | sort >"$work/shm-before"
  start=$(date +%s.%N)
  TMPDIR="$tmp" "${base[@]}" $(shape 8 50) --inject delay_ms=50 >/dev/null 2>&1 &
  local launcher=$!
  sleep 1
  kill -9 "$launcher"
  wait "$launcher" 2>/dev/null
  sleep 0.5
  local ranks_left left_after verdict=ok
  ranks_left=$(pgrep -P "$launcher" | wc -l)
  left_after=$(leftovers "$tmp")
  [[ "$ranks_left" == 0 && "$left_after" != nothing ]] || verdict=FAIL
  end=$(date +%s.%N)
  rows+=("$(printf '%-4s|%-42s|%-24s|%-8s|%-7s|%-5s|%-15s|%-10s|%-6s|%s' 20a "launcher SIGKILL 1 s in" \
    "ranks gone: $ranks_left left" - "$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}') s" no n/a \
    "2 dirs" "$verdict" "left until the next launch: $left_after")")
  [[ $verdict == ok ]] || failures=$((failures + 1))
  CASE_TMP="$tmp" run_case 20b "next launch sweeps the killed launcher's dirs" complete 60 "" "${base[@]}" $(shape 4 2)
  local stale
  for stale in $left_after; do
    if [[ -e "$tmp/$stale" || -e "/dev/shm/$stale" ]]; then
      failures=$((failures + 1))
      rows+=("20b  | NOT SWEPT: $stale")
    fi
  done
}

wanted=("$@")
base=("$eplb" run --ranks 4 --nodes 2)

run_case 1 "errors 1% (err=0.01)" complete 60 "" \
  "${base[@]}" $(shape 16 4) --retries 5 --timeout 2 --inject err=0.01,seed=1
run_case 2 "stalls 0.5% (stall=0.005)" complete 60 "" \
  "${base[@]}" $(shape 16 4) --retries 5 --timeout 1 --inject stall=0.005,seed=2
run_case 3 "corruption 0.5% (corrupt=0.005)" complete 60 "" \
  "${base[@]}" $(shape 16 4) --retries 5 --timeout 2 --inject corrupt=0.005,seed=3
run_case 4a "delay 200 ms < deadline 2 s" complete 30 "" \
  "${base[@]}" $(shape 4 2) --retries 3 --timeout 2 --inject delay_ms=200
run_case 4b "delay 3 s > deadline 1 s" abort 30 "" \
  "${base[@]}" $(shape 4 2) --retries 1 --timeout 1 --inject delay_ms=3000
run_case 5 "peer disconnects (disconnect_after=20)" abort 30 "" \
  "${base[@]}" $(shape 8 3) --retries 3 --timeout 2 --inject disconnect_after=20
run_case 6 "rank 2 SIGKILL mid layer 1" abort 30 "EPLB_TEST_SIGNAL=2:1:KILL" \
  "${base[@]}" $(shape 4 2) --retries 3 --timeout 2
run_case 7 "rank 2 SIGSTOP mid layer 1" abort 30 "EPLB_TEST_SIGNAL=2:1:STOP" \
  "${base[@]}" $(shape 4 2) --retries 3 --timeout 2
# Issue 15: the same faults while the ranks serve (--async, 1 ms steps): the
# migration runs on a progress thread and commits at agreed serving steps.
async=(--async --step-ms 1)
run_case 21a "--async, errors 1% (err=0.01)" complete 60 "" \
  "${base[@]}" "${async[@]}" $(shape 16 4) --retries 5 --timeout 2 --inject err=0.01,seed=1
run_case 21b "--async, stalls 0.5% (stall=0.005)" complete 60 "" \
  "${base[@]}" "${async[@]}" $(shape 16 4) --retries 5 --timeout 1 --inject stall=0.005,seed=2
run_case 21c "--async, corruption 1% (corrupt=0.01)" complete 60 "" \
  "${base[@]}" "${async[@]}" $(shape 16 4) --retries 5 --timeout 2 --inject corrupt=0.01,seed=3
run_case 21d "--async, rank 2 SIGKILL mid layer 1" abort 30 "EPLB_TEST_SIGNAL=2:1:KILL" \
  "${base[@]}" "${async[@]}" $(shape 4 2) --retries 3 --timeout 2
run_case 21e "--async, rank 2 SIGSTOP mid layer 1" abort 30 "EPLB_TEST_SIGNAL=2:1:STOP" \
  "${base[@]}" "${async[@]}" $(shape 4 2) --retries 3 --timeout 1
if command -v mpirun >/dev/null; then
  common=("$eplb" run --bootstrap mpi --nodes 2 --experts 16 --replicas 24 --rounds 2 --window 10)
  run_case 8a "layouts differ: bytes per expert" refuse 60 "" \
    "${mpirun_cmd[@]}" -np 2 "${common[@]}" --layers 4 --groups 4 --bytes-per-expert 64KiB : -np 2 "${common[@]}" --layers 4 --groups 4 --bytes-per-expert 32KiB
  run_case 8b "layouts differ: tensors" refuse 60 "" \
    "${mpirun_cmd[@]}" -np 2 "${common[@]}" --layers 4 --groups 4 --bytes-per-expert 64KiB : -np 2 "${common[@]}" --layers 4 --groups 4 --bytes-per-expert 64KiB --tensors a:40000,b:25536
  run_case 8c "layouts differ: layers" refuse 60 "" \
    "${mpirun_cmd[@]}" -np 2 "${common[@]}" --layers 4 --groups 4 --bytes-per-expert 64KiB : -np 2 "${common[@]}" --layers 3 --groups 4 --bytes-per-expert 64KiB
  run_case 9a "topologies differ: groups" refuse 60 "" \
    "${mpirun_cmd[@]}" -np 2 "${common[@]}" --layers 4 --groups 4 --bytes-per-expert 64KiB : -np 2 "${common[@]}" --layers 4 --groups 2 --bytes-per-expert 64KiB
  run_case 9b "policies differ" refuse 60 "" \
    "${mpirun_cmd[@]}" -np 2 "${common[@]}" --layers 4 --groups 4 --bytes-per-expert 64KiB : -np 2 "${common[@]}" --layers 4 --groups 4 --bytes-per-expert 64KiB --policy relabel
fi
run_case 10a "malformed trace (CSV)" refuse 20 "" "${base[@]}" $(shape 4 2) --trace "$work/bad_trace.csv"
run_case 10b "malformed trace (.npy)" refuse 20 "" "${base[@]}" $(shape 4 2) --trace "$work/bad_trace.npy"
# `eplb run` takes no placement file; the placement reader is `eplb rebalance --current`.
run_case 10c "malformed placement (rebalance --current)" refuse 20 "" "$eplb" rebalance --preset tiny --current "$work/bad_placement.json"

# Issue 17: inputs, durations, listeners, reports, one validation.
run_case 11a "trace is a FIFO (run --trace)" refuse 20 "" "${base[@]}" $(shape 4 2) --trace "$work/fifo_trace.npy"
run_case 11b "/dev/zero behind trace.npy" refuse 20 "" "${base[@]}" $(shape 4 2) --trace "$work/zero_trace.npy"
run_case 11c "/dev/zero behind trace.json (evaluate)" refuse 20 "" "$eplb" evaluate --trace "$work/zero_trace.json"
run_case 11d "load is a FIFO (rebalance --load)" refuse 20 "" "$eplb" rebalance --load "$work/fifo_load.json"
run_case 12a "--timeout 1e10" refuse 20 "" "${base[@]}" $(shape 4 2) --timeout 1e10
run_case 12b "--timeout nan" refuse 20 "" "${base[@]}" $(shape 4 2) --timeout nan
run_case 12c "xfer-bench --timeout inf" refuse 20 "" "$eplb" xfer-bench --block-sizes 4K --timeout inf
run_case 13a "xfer-bench --listen 70000" refuse 20 "" "$eplb" xfer-bench --listen 70000
run_case 13b "xfer-bench target, malformed message" refuse 20 "EPLB_XFER_BENCH_SECRET=abababababababababababababababababababababababababababababababab" bash -c \
  "$eplb xfer-bench --listen 47111 --timeout 5 & t=\$!; sleep 0.7; exec 3<>/dev/tcp/127.0.0.1/47111; printf 'Z\\0\\0\\0\\0\\0\\0\\0\\0' >&3; wait \$t"
run_case 13c "xfer-bench target, silent client (--timeout 1)" refuse 20 "EPLB_XFER_BENCH_SECRET=abababababababababababababababababababababababababababababababab" bash -c \
  "$eplb xfer-bench --listen 47112 --timeout 1 & t=\$!; sleep 0.7; exec 3<>/dev/tcp/127.0.0.1/47112; wait \$t"
run_case 14a "--json /proc/x.json" refuse 20 "" "${base[@]}" $(shape 4 2) --json /proc/x.json
run_case 14b "aborted run (corrupt=1, --retries 0) writes --json" abort 30 "" \
  "${base[@]}" $(shape 4 2) --retries 0 --inject corrupt=1
run_case 15a "--rounds 0 (checked once, by the launcher)" refuse 20 "" "${base[@]}" $(shape 4 2 | sed 's/--rounds 2/--rounds 0/')
run_case 15b "--inject seed=abc" refuse 20 "" "${base[@]}" $(shape 4 2) --inject seed=abc
run_case 15c "Ctrl-C: SIGINT to the launcher after 1.5 s" interrupt 30 "" bash -c \
  "$eplb run --ranks 4 --nodes 2 $(shape 4 50) --inject delay_ms=50 & t=\$!; sleep 1.5; kill -INT \$t; wait \$t"
run_case 16 "--rounds 300 (reports streamed to --json)" complete 120 "" \
  "${base[@]}" --layers 2 --experts 16 --replicas 24 --groups 4 --bytes-per-expert 16KiB --rounds 300 --window 1

# Issue 17: memory, shared memory, who may join.
run_case 17 "64 GiB experts (memory admission, 24 GiB)" refuse 20 "EPLB_TEST_MEMAVAILABLE=24GiB" \
  "$eplb" run --bytes-per-expert 64GiB
run_case 18 "posix only, rank 1 SIGKILL mid layer 1" abort 30 "UCX_TLS=posix,cma,self EPLB_TEST_SIGNAL=1:1:KILL" \
  "${base[@]}" --layers 4 --experts 16 --replicas 24 --groups 4 --bytes-per-expert 16MiB --rounds 2 --window 10 \
  --retries 3 --timeout 2
FORGER=1 EXPECT_STDERR="dropped a connection from pid" run_case 19 "forged hello claiming rank 1 at start-up" \
  complete 60 "EPLB_TEST_JOIN_DELAY=1:1500" "${base[@]}" $(shape 4 2)
killed_launcher_case

# Issue 29: reports and files. 29a: SIGTERM to the launcher mid-run: the
# rounds so far are renamed into place marked interrupted (exit 143 becomes
# the row's 130 only when the report is whole and no .tmp is left).
"$eplb" gen-load --layers 4 --experts 16 --steps 40 --out "$work/trace29.npy" >/dev/null 2>&1
run_case 29a "SIGTERM to the launcher: --json of rounds so far" interrupt 40 "" bash -c \
  "$eplb run --ranks 4 --nodes 2 $(shape 4 200) --inject delay_ms=20 --json $work/29a-report.json & t=\$!; sleep 2.5;
   kill -TERM \$t; wait \$t; [ \$? = 143 ] || exit 1; ls $work/29a-report.json.tmp.* 2>/dev/null && exit 1;
   python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r[\"interrupted\"] and r[\"rounds\"] else 1)' \
     $work/29a-report.json || exit 1; exit 130"
run_case 29b "--json naming the input --trace" refuse 20 "" \
  "${base[@]}" $(shape 4 2) --trace "$work/trace29.npy" --json "$work/trace29.npy"
run_case 29c "--metrics X --json X" refuse 20 "" "${base[@]}" $(shape 4 2) --metrics "$work/x29" --json "$work/x29"
run_case 29d "--metrics ''" refuse 20 "" "${base[@]}" $(shape 4 2) --metrics ""
EXPECT_STDERR="unknown command 'frobnicate'" run_case 29e "unknown command (eplb frobnicate --help)" refuse 20 "" \
  "$eplb" frobnicate --help

# Issue 29, items 1, 2 and 9: the Python Migrator (2 ranks on gloo, the cases
# of python/tests; bench/python_fault_case.py prints them in this table's terms).
py="$root/.venv/bin/python"
run_case 29f "Python: a rank with a stale old placement" refuse 120 "" "$py" "$root/bench/python_fault_case.py" stale
run_case 29g "Python: serving loop stalled after a commit" abort 120 "" "$py" "$root/bench/python_fault_case.py" stall
run_case 29h "Python: sys.exit in an async round, no close" abort 120 "" "$py" "$root/bench/python_fault_case.py" exit

echo
printf '%-4s|%-42s|%-24s|%-8s|%-7s|%-5s|%-15s|%-10s|%-6s|%s\n' id scenario outcome detect total hang consistent left req "error (first stderr line after the ranks' state lines)"
for row in "${rows[@]}"; do echo "$row"; done
echo
if [[ -n "${FAULT_MATRIX_DETAILS:-}" ]]; then
  echo "stderr of each scenario (first 6 lines):"
  for line in "${details[@]}"; do echo "$line"; done
  echo
fi
if ((failures)); then
  echo "fault_matrix: $failures row(s) do not meet the requirement"
  exit 1
fi
echo "fault_matrix: every row meets the requirement (no hang, no inconsistent slot, expected outcome)"
