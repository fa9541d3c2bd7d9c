#!/usr/bin/env bash
# The CPU seconds (user + system, every process of the job) and wall seconds of `ctrtrain
# launch SPEC` with the job's processes started as new Pythons (CTRTRAIN_FORK_SERVER=0) and
# forked from the job's fork server (the default), alternating for N rounds, each into a fresh
# output directory; each round's figures and the medians.
#
#   bash scripts/fork_server_ab.sh 3 examples/deepfm-parameter-server.yaml
set -euo pipefail
rounds=$1 spec=$2
source "$(dirname "$0")/env.sh" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq "$rounds"); do
  for fork in 0 1; do
    CTRTRAIN_FORK_SERVER=$fork /usr/bin/time -f "$fork %U %S %e" -a -o "$work/times" \
      ctrtrain launch --quiet --output-dir "$work/run-$fork-$i" "$spec" >/dev/null
  done
done
python3 - "$work/times" <<'PY'
import statistics, sys
runs = {"0": [], "1": []}
for line in open(sys.argv[1]):
    fork, user, system, wall = line.split()
    runs[fork].append((float(user) + float(system), float(wall)))
for fork, name in (("0", "new processes"), ("1", "forked")):
    cpu = [c for c, _ in runs[fork]]
    wall = [w for _, w in runs[fork]]
    print(f"{name:14} CPU s {' '.join(f'{x:.1f}' for x in cpu)}  median {statistics.median(cpu):.1f}"
          f" | wall s {' '.join(f'{x:.1f}' for x in wall)}  median {statistics.median(wall):.1f}")
PY
