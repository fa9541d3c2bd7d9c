#!/usr/bin/env bash
# The test suite, in timed phases:
#   environments  builds (or reuses) .venv (TF 2.21, the main engine), .venv-hvd (TF 2.15.1 +
#                 Horovod, scripts/horovod_env.sh) and .venv-deepctr (DeepCTR, the quality
#                 benchmark's peer, scripts/deepctr_env.sh);
#   lint          ruff, and no lower layer importing an upper one (scripts/check_layers.py);
#   2.21 pass     every test, in .venv (those marked `serial` last, alone);
#   2.15 pass     the tests marked `tf215`, in .venv-hvd, beside the 2.21 pass at nice 19: what
#                 differs on the TF version SageMaker's Horovod containers ship (one end-to-end
#                 test of each command and mode run by TF 2.15 itself); and those marked
#                 `tf215_only`, whose processes run .venv-hvd whichever pass runs them (Horovod
#                 ranks, the 2.15 framework image): they run in this pass only.
# Each pass ends with its 10 slowest tests; the script ends with the seconds of each phase.
#
#   bash scripts/test.sh                  the whole suite (what CI runs)
#   bash scripts/test.sh --coverage       the same, measuring line coverage of src/ over both
#                                         passes and every process the tests start
#   bash scripts/test.sh --quick          lint and the tests not marked `slow` (a few minutes):
#                                         the check before each commit
#   bash scripts/test.sh ARGS...          pytest ARGS (a file, -k NAME, -m tf215) in .venv only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Bytecode written and kept (__pycache__, git-ignored): where PYTHONDONTWRITEBYTECODE is set, as
# on this project's machines, each of the suite's hundreds of processes compiled what it
# imported of src/ again (about 0.2 CPU-s a training run), and each of a run's five test
# collections rewrote every test module's assertions (14 -> 9 CPU-s a collection: pytest keeps
# its own). The whole suite compiles src/ once first, before two workers would both do it; not
# tests/, whose SageMaker scripts are packed as a job's code (no cache beside them).
unset PYTHONDONTWRITEBYTECODE

# Two pytest-xdist workers: the suite leaves about half of 2 cores idle when run in one
# process (its jobs wait on sockets, subprocesses and time limits). Tests go to whichever
# worker is free (load), so a file's module fixtures may be made on both. Keeping a file on
# one worker (loadscope) measured slower: 1,386 s for the 2.21 pass against 1,210 (0103eb0,
# docs/development.md), its heavy multi-process files meeting at the end. (The suite ran as
# `load` before too: pytest 9 ignores loadgroup's groups, which xdist 3.8 writes to a node id
# field pytest no longer reads.)
parallel=(-n 2 --dist load)

lint() {
  ruff check src tests scripts examples && python scripts/check_layers.py
}

case "${1:-}" in
  --quick)
    source "$root/scripts/env.sh"
    lint
    exec python -m pytest -m "not slow" "${parallel[@]}" --durations=10 "${@:2}" ;;
  --coverage) coverage=1; shift ;;
  *) coverage=0 ;;
esac
if [ $# -gt 0 ]; then
  source "$root/scripts/env.sh"
  exec python -m pytest "$@"
fi

phases=()
began=$SECONDS
phase_done() { phases+=("$(printf '%-27s %5d s' "$1" $((SECONDS - began)))"); began=$SECONDS; }
report() {
  echo "== seconds by phase"
  printf '%s\n' "${phases[@]}"
}
trap report EXIT

echo "== environments"
( source "$root/scripts/env.sh" && python -m compileall -q src )   # (see above)
bash "$root/scripts/horovod_env.sh"
export CTRTRAIN_REQUIRE_HOROVOD=1
# DeepCTR 0.9.4 on tf-keras (scripts/deepctr_env.sh), run by the quality benchmark's test.
CTRTRAIN_DEEPCTR_PYTHON="$(bash "$root/scripts/deepctr_env.sh")"
export CTRTRAIN_DEEPCTR_PYTHON CTRTRAIN_REQUIRE_DEEPCTR=1
phase_done environments

echo "== lint: ruff, and no lower layer importing an upper one"
( source "$root/scripts/env.sh" && lint )
phase_done lint

run=(-m pytest)
if [ "$coverage" = 1 ]; then
  # Every Python process the tests start (CLI subprocesses, simulated hosts, both venvs) records
  # a data file here ([tool.coverage.run] in pyproject.toml); combined after both passes.
  export COVERAGE_FILE="$root/.cache/coverage/.coverage" COVERAGE_RCFILE="$root/pyproject.toml"
  rm -rf "$root/.cache/coverage" && mkdir -p "$root/.cache/coverage"
  run=(-m coverage run -m pytest)
fi

# The 2.21 pass: every test but those marked `serial` on both workers, then those alone (their
# time limits assume no other worker's load). The 2.15 pass (the tests marked `tf215` or
# `tf215_only`; none is also `serial`, tests/conftest.py refuses it) runs *beside* the 2.21
# pass's parallel part, at nice 19: the two workers leave about a seventh of the cores idle
# while their tests wait on sockets, watchdogs and peers, and at nice 19 the 2.15 pass takes
# little more than that (4% of a core beside two busy loops at nice 0, measured). Run after it, the 2.15 pass added 130-190 s
# to the command; three workers of one priority gained nothing (docs/development.md). Its
# output is kept in a file and shown after the 2.21 pass's, and both run whatever the other's
# outcome: a failure in one must not hide the other's; the command fails if either did.
failed=()
log215="$root/.cache/test-2.15.log"
mkdir -p "$root/.cache"
echo "== tests on TensorFlow 2.21 (.venv): all but those marked tf215_only; beside them, at"
echo "   nice 19, those marked tf215 or tf215_only on TensorFlow 2.15.1 + Horovod (.venv-hvd),"
echo "   shown after ($log215)"
# setsid: the pass is a process group of its own, ended with the script (trap below). It is
# also a session, and where the kernel groups a session's processes for the scheduler
# (autogroup, /proc/sys/kernel/sched_autogroup_enabled) a nice value counts only inside its
# group, the groups sharing the cores equally: the first run so made the 2.15 pass take half
# the machine. So the new group itself is given nice 19 (/proc/self/autogroup).
( exec setsid sh -c '[ ! -w /proc/self/autogroup ] || echo 19 > /proc/self/autogroup
                     exec nice -n 19 "$@"' sh \
    "$root/.venv-hvd/bin/python" "${run[@]}" -m "(tf215 or tf215_only) and not serial" \
    "${parallel[@]}" --durations=10 >"$log215" 2>&1 ) &
pass215=$!
trap 'kill -TERM -- -$pass215 2>/dev/null || true; report' EXIT
( source "$root/scripts/env.sh" &&
  python "${run[@]}" -m "not serial and not tf215_only" "${parallel[@]}" --durations=10 ) ||
  failed+=("2.21 pass")
phase_done "2.21 pass (parallel part)"

echo "== the 2.15 pass, beside the part above and after it"
rc215=0
wait $pass215 || rc215=$?
cat "$log215"
[ "$rc215" = 0 ] || failed+=("2.15 pass")
phase_done "2.15 pass (the rest of it)"

echo "== tests on TensorFlow 2.21 (.venv): those marked serial, alone"
# Only the files that mark a test serial are collected (the whole suite's collection cost
# 5-8 s of this part's wall, nothing else running beside it).
mapfile -t serial_files < <(grep -l "mark.serial" tests/test_*.py)
if [ ${#serial_files[@]} -gt 0 ]; then
  ( source "$root/scripts/env.sh" && python "${run[@]}" -m serial --durations=5 "${serial_files[@]}" ) ||
    failed+=("2.21 pass (serial)")
fi
phase_done "2.21 serial"

if [ "$coverage" = 1 ]; then
  echo "== line coverage of src/, both passes combined"
  ( source "$root/scripts/env.sh" && cd "$root/.cache/coverage" && python -m coverage combine -q &&
    python -m coverage report | tail -1 )
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "== FAILED: ${failed[*]}"
  exit 1
fi
