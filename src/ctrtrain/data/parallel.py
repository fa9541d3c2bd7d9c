"""Running a data tool's tasks in worker processes, in order, with a progress bar."""

from __future__ import annotations

import multiprocessing as mp

from ..progress import bar


def _pool(processes: int):
    # spawn, not fork: the parent may have imported TensorFlow, which is not fork-safe.
    return mp.get_context("spawn").Pool(processes)


def run_tasks(worker, tasks, processes: int, desc: str, unit_counts: list[int]):
    """Runs tasks in a pool (or inline for one process), yielding results in task order."""
    with bar(total=sum(unit_counts), desc=desc, unit="rows") as pb:
        if processes <= 1 or len(tasks) <= 1:
            for t, n in zip(tasks, unit_counts):
                r = worker(t)
                pb.update(n)
                yield r
            return
        with _pool(min(processes, len(tasks))) as pool:
            for r, n in zip(pool.imap(worker, tasks), unit_counts):
                pb.update(n)
                yield r
