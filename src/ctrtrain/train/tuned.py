"""Settings that `ctrtrain tune` measured best on this host, where training picks them up:
$CTRTRAIN_TUNED, else ~/.config/ctrtrain/tuned.json. Explicit flags always win; the launcher's
per-process share of a host wins for multi-process jobs (tuned values are single-process)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def tuned_path() -> Path:
    if os.environ.get("CTRTRAIN_TUNED"):
        return Path(os.environ["CTRTRAIN_TUNED"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "ctrtrain" / "tuned.json"


def tuned_settings() -> dict:
    """{"intra_op_threads", "inter_op_threads", "batch_size", ...} or {} when not tuned."""
    p = tuned_path()
    try:
        return json.loads(p.read_text()).get("settings", {})
    except (OSError, ValueError):
        return {}
