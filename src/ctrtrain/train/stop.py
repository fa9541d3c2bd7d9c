"""Stopping a training run on request: SIGTERM (preemption, `timeout`, a scheduler) and SIGINT
(Ctrl-C) are caught while the step loop runs, the loop finishes its step, saves a checkpoint
and raises Interrupted, so a re-run resumes there instead of at the last periodic checkpoint."""

from __future__ import annotations

import signal
import threading

from ..errors import CtrError


class Interrupted(CtrError):
    """Training stopped on a signal after saving a checkpoint; exits 128 + the signal."""

    def __init__(self, signum: int, step: int, saved: bool):
        self.signum, self.step = signum, step
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} at step {step}; "
                         + ("checkpoint saved: re-run the same command to resume"
                            if saved else "no checkpoint written (this process does not write them)"))


class StopRequests:
    """Context manager: while inside, SIGTERM/SIGINT set `signum` instead of killing."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:        # a second request: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False
