"""One place that decides how long work shows progress (a bar on a terminal, quiet in CI logs)."""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def bar(total: int | None = None, desc: str = "", unit: str = "it", disable: bool | None = None):
    if disable is None:
        disable = os.environ.get("CTRTRAIN_NO_PROGRESS") == "1" or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=disable,
                dynamic_ncols=True, leave=False)
