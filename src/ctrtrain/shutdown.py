"""Ending a process that ran TensorFlow."""

from __future__ import annotations

import os
import sys


def end_process(code: int) -> None:
    """Exits with `code`. Once TensorFlow is loaded, its teardown at interpreter exit costs
    0.6-1.7 s here (docs/benchmarks.md: `ctrtrain bench startup`) and writes nothing: every file ctrtrain
    writes is closed by then, so a process of its own ends at once after flushing its output.
    A member of a TensorFlow cluster (TF_CONFIG, Horovod) takes the normal exit: its runtime
    says goodbye to the others (the coordination service's shutdown barrier)."""
    sys.stdout.flush()
    sys.stderr.flush()
    clustered = os.environ.get("TF_CONFIG") or "HOROVOD_RANK" in os.environ
    if "tensorflow" in sys.modules and not clustered:
        os._exit(code)
    sys.exit(code)
