#!/usr/bin/env bash
# The test suite, in timed phases:
#   environments  builds (or reuses) .venv (TF 2.21, the main engine), .venv-hvd (TF 2.15.1 +
#                 Horovod, scripts/horovod_env.sh) and .venv-deepctr (DeepCTR, the quality
#                 benchmark's peer, scripts/deepctr_env.sh);
#   lint          ruff, and no lower layer importing an upper one (scripts/check_layers.py);
#   2.21 pass     every test, in .venv;
#   2.15 pass     the tests marked `tf215`, in .venv-hvd: what differs on the TF version
#                 SageMaker's Horovod containers ship (one end-to-end test of each command and
#                 mode run by TF 2.15 itself; Horovod ranks and the Estimator runner always run
#                 in .venv-hvd, so their tests run once, in the 2.21 pass).
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
phase_done() { phases+=("$(printf '%-14s %5d s' "$1" $((SECONDS - began)))"); began=$SECONDS; }
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

# A pass: the selected tests on both workers; then, in the 2.21 pass, those marked `serial`
# alone (their time limits assume no other worker's load). No test is both `serial` and `tf215`
# (tests/conftest.py refuses it), so the 2.15 pass has no serial part: asking pytest first
# whether a part selects anything cost a collection (8-11 s of one core) per pass.
run_pass() {   # python [marker expression]; fails if either part did, after running both
  local within="${2:+($2) and }" rc=0
  "$1" "${run[@]}" -m "${within}not serial" "${parallel[@]}" --durations=10 || rc=$?
  if [ -z "${2:-}" ]; then
    "$1" "${run[@]}" -m serial --durations=5 || rc=$?
  fi
  return $rc
}

# Both passes run whatever the first one's outcome (a failure in the 2.21 pass must not hide
# the 2.15 pass's); the command fails if either did.
failed=()
echo "== tests on TensorFlow 2.21 (.venv): all"
( source "$root/scripts/env.sh" && run_pass python ) || failed+=("2.21 pass")
phase_done "2.21 pass"

echo "== tests on TensorFlow 2.15.1 + Horovod (.venv-hvd): those marked tf215"
run_pass "$root/.venv-hvd/bin/python" tf215 || failed+=("2.15 pass")
phase_done "2.15 pass"

if [ "$coverage" = 1 ]; then
  echo "== line coverage of src/, both passes combined"
  ( source "$root/scripts/env.sh" && cd "$root/.cache/coverage" && python -m coverage combine -q &&
    python -m coverage report | tail -1 )
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "== FAILED: ${failed[*]}"
  exit 1
fi
