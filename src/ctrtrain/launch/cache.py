"""Where the launcher keeps what it downloads and builds once for many jobs (framework
images, requirements wheelhouses): $CTRTRAIN_CACHE, else $XDG_CACHE_HOME/ctrtrain, else
~/.cache/ctrtrain."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    root = os.environ.get("CTRTRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ctrtrain")
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
