"""Running a data tool's tasks in worker processes, in order, with a progress bar."""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

from ..progress import bar


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
        pool = ProcessPoolExecutor(min(processes, len(tasks)), mp_context=mp.get_context("spawn"))
        try:
            futures = [pool.submit(worker, t) for t in tasks]
            for f, n in zip(futures, unit_counts):
                r = f.result()
                pb.update(n)
                yield r
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
