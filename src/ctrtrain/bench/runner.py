"""One benchmark run in a fresh process (thread pools are fixed when TensorFlow starts, and
peak RSS is per process), in this environment or another one (DeepCTR's, TF 2.15's)."""

from __future__ import annotations

import json
import os
import subprocess


def run_json(cmd: list[str], what: str, timeout: float = 3600) -> list[dict]:
    """Runs `cmd` and returns the JSON objects it printed, one per line, in order."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CTRTRAIN_NO_PROGRESS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{r.stderr[-3000:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
