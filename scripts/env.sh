#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment in .venv and installs the pinned
# dependencies and ctrtrain itself. Sourced by the other scripts; prints the venv's python.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CTRTRAIN_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# Reinstall only when the pins or the package metadata changed.
stamp="$venv/.ctrtrain-installed"
want="$(cat "$root/requirements/main.txt" "$root/requirements/sagemaker-tensorflow.txt" "$root/requirements/keras2.txt" "$root/requirements/serving.txt" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$root/requirements/main.txt"
  "$venv/bin/python" -m pip install --quiet --no-deps -r "$root/requirements/sagemaker-tensorflow.txt" \
    -r "$root/requirements/keras2.txt" -r "$root/requirements/serving.txt"
  "$venv/bin/python" -m pip install --quiet --no-deps -e "$root"
  echo "$want" > "$stamp"
fi
# The fused kernels (src/ctrtrain/kernels), compiled against this venv's
# TensorFlow when their source or the pins changed (a few seconds); without a compiler
# training runs TensorFlow's ops instead and says so.
kernels_want="$(cat "$root/src/ctrtrain/kernels/ctr_kernels.cc" "$root/src/ctrtrain/kernels/build.py" "$stamp" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$venv/.ctrtrain-kernels" 2>/dev/null || true)" != "$kernels_want" ]; then
  if "$venv/bin/python" -m ctrtrain.kernels.build >&2; then
    echo "$kernels_want" > "$venv/.ctrtrain-kernels"
  fi
fi
export PATH="$venv/bin:$PATH"
