#!/usr/bin/env bash
# The whole test suite. First lints (ruff, layer check), then builds (or reuses) the environments: .venv (TF 2.21, the main
# engine), .venv-hvd (TF 2.15.1 + Horovod, scripts/horovod_env.sh) and .venv-deepctr (DeepCTR,
# the quality benchmark's peer, scripts/deepctr_env.sh). Then runs every test in
# .venv (the Horovod mode's test launches from .venv-hvd), then every test again in .venv-hvd:
# the package runs on the TF version SageMaker's Horovod containers ship.
# With arguments (pytest selections/options): only those, in .venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ $# -gt 0 ]; then
  source "$root/scripts/env.sh"
  exec python -m pytest "$@"
fi
echo "== lint: ruff, and no lower layer importing an upper one"
( source "$root/scripts/env.sh" && ruff check src tests scripts examples && python scripts/check_layers.py )
bash "$root/scripts/horovod_env.sh"
export CTRTRAIN_REQUIRE_HOROVOD=1
# The quality benchmark's peer, DeepCTR 0.9.4 on tf-keras (scripts/deepctr_env.sh), is run by
# its test in both passes.
CTRTRAIN_DEEPCTR_PYTHON="$(bash "$root/scripts/deepctr_env.sh")"
export CTRTRAIN_DEEPCTR_PYTHON CTRTRAIN_REQUIRE_DEEPCTR=1
echo "== tests on TensorFlow 2.21 (.venv)"
( source "$root/scripts/env.sh" && python -m pytest )
echo "== tests on TensorFlow 2.15.1 + Horovod (.venv-hvd)"
"$root/.venv-hvd/bin/python" -m pytest
