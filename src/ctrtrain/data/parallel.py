"""Running a data tool's tasks in worker processes, in order, with a progress bar."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from ..progress import bar

# Starting a worker (spawn, then its imports) costs about 0.5 CPU-seconds, what converting or
# synthesizing about 60,000 rows costs in one process; a second worker gains no wall time on
# 20,000 rows and breaks even near 100,000 (docs/development.md, "Data tools' processes").
ROWS_PER_PROCESS = 100_000


def processes_for(rows: int, asked: int | None) -> int:
    """The processes a data tool uses: those asked for, or else one per ROWS_PER_PROCESS rows,
    at least one and at most the CPU count."""
    if asked:
        return asked
    return max(1, min(os.cpu_count() or 1, rows // ROWS_PER_PROCESS))


def run_tasks(worker, tasks, processes: int, desc: str, unit_counts: list[int]):
    """Runs tasks in worker processes (or inline for one process), yielding results in task
    order. A task's exception is raised here; tasks not yet started are then cancelled."""
    with bar(total=sum(unit_counts), desc=desc, unit="rows") as pb:
        if processes <= 1 or len(tasks) <= 1:
            for t, n in zip(tasks, unit_counts):
                r = worker(t)
                pb.update(n)
                yield r
            return
        # spawn, not fork: the parent may have imported TensorFlow, which is not fork-safe.
        # An executor, not multiprocessing.Pool: leaving a Pool terminates its workers, and a
        # worker killed while it holds one of the Pool's queue locks hangs the parent forever
        # (seen in CI); the executor lets started tasks finish and reports a dead worker as an
        # error (BrokenProcessPool) instead of waiting on it.
        pool = ProcessPoolExecutor(min(processes, len(tasks)), mp_context=mp.get_context("spawn"),
                                   initializer=die_with_parent, initargs=(os.getpid(),))
        try:
            futures = [pool.submit(worker, t) for t in tasks]
            for f, n in zip(futures, unit_counts):
                r = f.result()
                pb.update(n)
                yield r
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def die_with_parent(parent: int) -> None:
    """A worker's first act. A tool killed by a signal it cannot catch (SIGKILL) cannot stop
    its workers, and an orphaned worker would hold the caller's stdout (a pipe the caller
    reads to its end) for as long as it lives: so the kernel kills the worker when its parent
    dies (Linux's PR_SET_PDEATHSIG; elsewhere a thread polls for the parent), and the
    worker's stdout is /dev/null (its errors travel back to the parent as exceptions)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:     # 1: PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:          # it died before the signal was armed
        os._exit(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)
