#!/usr/bin/env bash
# Creates (or reuses) .venv-deepctr: DeepCTR 0.9.4 on tf-keras (Keras 2) and TensorFlow 2.21,
# the peer trainer `ctrtrain bench quality` compares with. Prints the venv's python.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CTRTRAIN_DEEPCTR_VENV:-$root/.venv-deepctr}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv" >&2
stamp="$venv/.ctrtrain-installed"
want="$(sha256sum < "$root/requirements/deepctr.txt" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet -r "$root/requirements/deepctr.txt" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
