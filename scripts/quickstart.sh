#!/usr/bin/env bash
# The main job on embedded defaults, in the project's own virtual environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
exec ctrtrain quickstart "$@"
