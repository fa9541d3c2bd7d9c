#!/usr/bin/env bash
# The CPU seconds (user + system) of one `ctrtrain ARGS...` process under two checkouts of
# ctrtrain, alternating A, B for N rounds on the same machine, with each round's figures and
# the medians: what a change costs or saves per process, whatever else the machine is doing
# (CPU time moves far less with load than wall time does). Each run gets a fresh
# --model-dir.
#
#   git worktree add /tmp/before <commit>
#   bash scripts/process_cpu_ab.sh 5 /tmp/before/src src -- train --train d/train \
#       --valid d/valid --test d/test --epochs 1 --batch-size 256 --quiet
set -euo pipefail
rounds=$1 a=$2 b=$3; shift 4
source "$(dirname "$0")/env.sh" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq "$rounds"); do
  for side in a b; do
    src=$a; [ "$side" = b ] && src=$b
    /usr/bin/time -f "$side %U %S" -a -o "$work/times" env PYTHONPATH="$(realpath "$src")" \
      python -m ctrtrain.cli "$@" --model-dir "$work/model-$side-$i" >/dev/null 2>&1
  done
done
python3 - "$work/times" "$a" "$b" <<'PY'
import statistics, sys
runs = {"a": [], "b": []}
for line in open(sys.argv[1]):
    side, user, system = line.split()
    runs[side].append(float(user) + float(system))
for side, src in (("a", sys.argv[2]), ("b", sys.argv[3])):
    print(f"{src}: CPU s {' '.join(f'{x:.2f}' for x in runs[side])}  median {statistics.median(runs[side]):.2f}")
print(f"ratio b/a of the medians: {statistics.median(runs['b']) / statistics.median(runs['a']):.2f}")
PY
