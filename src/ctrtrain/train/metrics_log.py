"""The run's log: metrics.jsonl (one JSON object per event), TensorBoard scalars and console
lines. Only the chief of a job writes."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

METRICS = "metrics.jsonl"


class MetricsLog:
    """metrics.jsonl (one JSON object per event), TensorBoard scalars, and console lines."""

    def __init__(self, model_dir: Path, console: bool, enabled: bool = True):
        import tensorflow as tf
        self.enabled = enabled    # only the chief of a job writes
        self.console = console and enabled
        if enabled:
            self.f = open(model_dir / METRICS, "a")
            self.writer = tf.summary.create_file_writer(str(model_dir / "logs"))

    def event(self, kind: str, step: int, **fields):
        import tensorflow as tf
        if not self.enabled:
            return
        rec = {"event": kind, "step": step, "time": time.time(), **fields}
        self.f.write(json.dumps(rec, default=_jsonable) + "\n")
        self.f.flush()
        with self.writer.as_default(step=step):
            for k, v in fields.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    tf.summary.scalar(f"{fields.get('split', kind)}/{k}", v)
        if self.console:
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items() if not isinstance(v, dict))
            print(f"[{kind}] step {step} {shown}", flush=True)

    def close(self):
        if self.enabled:
            self.f.close()
            self.writer.close()


def _fmt(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return str(v)
