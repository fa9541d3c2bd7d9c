"""Ending a process that ran TensorFlow."""

from __future__ import annotations

import os
import sys

# How long a finished rank waits for the others of its job at the end (see end_process): a
# chief may still be exporting, or writing a test split's predictions, which its peers take no
# part in. Waiting costs nothing and beats (the watchdog sees it alive); the job's time limit
# bounds it.
LEAVE_TIMEOUT_S = 24 * 3600


def end_process(code: int) -> None:
    """Exits with `code`. Once TensorFlow is loaded, its teardown at interpreter exit costs
    0.6-1.7 s here (docs/benchmarks.md: `ctrtrain bench startup`) and writes nothing: every file
    ctrtrain writes is closed by then, so a process of its own ends at once after flushing its
    output.

    A rank of a multi-worker job (TF_CONFIG) that succeeded ends at once too, but together:
    its runtime's coordination service (MultiWorkerMirroredStrategy's; hosted by the chief)
    would take a rank that vanishes for a failed one, so every coordinated rank first meets
    the others at a barrier (beating meanwhile: a peer may still be exporting), then all
    leave: a 2-host all-reduce launch of 30 steps took 13.6 CPU-s and 10.3 s with the normal
    exit, 12.0 and 9.2 so (medians of 5, docs/development.md). A rank that failed, or a
    barrier that does not complete, takes the normal exit (its runtime tells the service it
    is going), as does a Horovod rank (Horovod's own shutdown)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if "tensorflow" not in sys.modules or "HOROVOD_RANK" in os.environ:
        sys.exit(code)
    if os.environ.get("TF_CONFIG") and not (code == 0 and _left_together()):
        sys.exit(code)
    os._exit(code)


def _left_together() -> bool:
    """True once every task of this process's coordination service reached this point (or when
    it has none: a parameter-server job's chief, whose servers the launch ends)."""
    from tensorflow.python.eager import context
    if context.context().coordination_service is None:
        return True
    from .heartbeat import waiting
    try:
        with waiting():
            context.context().wait_at_barrier("ctrtrain-end", LEAVE_TIMEOUT_S * 1000)
    except Exception as e:   # noqa: BLE001 - a peer that failed: the normal exit says so
        print(f"ctrtrain: not every rank reached the job's end ({type(e).__name__}); "
              "leaving through TensorFlow's own shutdown", file=sys.stderr, flush=True)
        return False
    return True
