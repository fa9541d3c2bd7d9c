#!/usr/bin/env bash
# The whole test suite, in the project's own virtual environment (created on first use).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
exec python -m pytest "$@"
