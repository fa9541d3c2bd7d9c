"""Progress a supervisor can see without reading a process's output: a process given
CTRTRAIN_HEARTBEAT=<file> touches that file while it makes progress (a training step, an
evaluation batch, a data file read). The launcher's watchdog counts a fresh heartbeat as
progress, so a job that trains for hours without printing is not torn down as stuck, and a
process that stops stepping (hung, SIGSTOPped) is, however chatty its threads."""

from __future__ import annotations

import contextlib
import os
import threading
import time

ENV = "CTRTRAIN_HEARTBEAT"
_INTERVAL_S = 1.0
_last = 0.0


def beat(force: bool = False) -> None:
    """Touches the heartbeat file, at most once a second (a step costs no syscall)."""
    global _last
    path = os.environ.get(ENV)
    if not path:
        return
    now = time.monotonic()
    if not force and now - _last < _INTERVAL_S:
        return
    _last = now
    try:
        with open(path, "a"):
            os.utime(path)
    except OSError:
        pass   # the supervisor's directory went away: it is tearing the job down


def finishing(limit_s: float = 60.0) -> None:
    """Beats once a second, from a daemon thread, for up to `limit_s`: the run's result is
    written, and what is left -- closing its logs and TensorBoard's event files, a recipe
    copying its export, the interpreter's exit -- does no step to beat on. That took over 4 s
    on a loaded CI machine (a 4 s watchdog tore a finished job down). A process still alive
    after `limit_s` is hung in its exit, and the watchdog sees it."""
    if not os.environ.get(ENV):
        return

    def beating():
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            beat(force=True)
            time.sleep(_INTERVAL_S)

    threading.Thread(target=beating, daemon=True, name="ctrtrain-finishing").start()


@contextlib.contextmanager
def waiting():
    """Beats once a second, from a daemon thread, while the block runs: a process waiting on
    its peers (a rank at the job's end, shutdown.py) is alive, not hung, however long a peer
    takes; the block's end stops it."""
    if not os.environ.get(ENV):
        yield
        return
    done = threading.Event()

    def beating():
        beat(force=True)
        while not done.wait(_INTERVAL_S):
            beat(force=True)
    thread = threading.Thread(target=beating, daemon=True, name="ctrtrain-waiting")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()     # no beat after the block: a process hung after it is seen


def age(path: str) -> float | None:
    """Seconds since the heartbeat file was touched, or None if never."""
    try:
        return time.time() - os.stat(path).st_mtime
    except OSError:
        return None
