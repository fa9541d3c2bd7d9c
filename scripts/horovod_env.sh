#!/usr/bin/env bash
# Creates (or reuses) the Horovod environment in .venv-hvd: TF 2.15.1 + Horovod 0.28.1 built
# with Gloo (no MPI needed), plus ctrtrain. Horovod compiles against the installed TF, about
# 4 minutes on 2 cores; the wheel is kept in .cache/wheels so a rebuild of the venv reuses it.
# Needs g++ and cmake < 4 (gloo's CMakeLists asks for an old minimum; Debian 12 ships 3.25).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CTRTRAIN_HVD_VENV:-$root/.venv-hvd}"
python="${PYTHON:-python3}"
wheels="$root/.cache/wheels"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
stamp="$venv/.ctrtrain-installed"
want="$(cat "$root/requirements/horovod.txt" "$root/requirements/sagemaker-tensorflow.txt" "$root/requirements/pipemode.txt" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  for tool in g++ cmake; do
    command -v "$tool" >/dev/null || { echo "horovod_env: $tool is required to build Horovod" >&2; exit 1; }
  done
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$root/requirements/horovod.txt"
  mkdir -p "$wheels"
  if ! ls "$wheels"/horovod-0.28.1-*.whl >/dev/null 2>&1; then
    echo "horovod_env: building horovod 0.28.1 against TF 2.15.1 (a few minutes)" >&2
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 MAKEFLAGS=-j2 \
      "$venv/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation --no-cache-dir \
      -w "$wheels" horovod==0.28.1
  fi
  "$venv/bin/python" -m pip install --quiet "$wheels"/horovod-0.28.1-*.whl
  "$venv/bin/python" -m pip install --quiet --no-deps -r "$root/requirements/sagemaker-tensorflow.txt"
  # SageMaker's PipeModeDataset: its wheels are tagged cp39/cp310 only, but hold pure Python
  # and a TensorFlow op library (built for TF 2.14, loads in 2.15, not in 2.21) that does not
  # depend on the Python version; pip installs the cp310 wheel's files into this venv.
  "$venv/bin/python" -m pip install --quiet --no-deps --only-binary=:all: --python-version 3.10 \
    --upgrade --target "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    -r "$root/requirements/pipemode.txt"
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
