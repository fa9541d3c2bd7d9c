"""Warm fork servers for a program that launches job after job.

Each job starts a fork server (forkserver.py) that imports ctrtrain and TensorFlow once for
all its processes. A program that launches job after job (the test suite; `bench matrix`, a
launch per cell) paid that import for every one. A ForkPool, kept by such a program, starts a
*pool* that imports them once and listens in a folder of its own; the program's launches find
it through CTRTRAIN_FORK_POOL, and each job's server is then a fork of the pool made inside the
job (forkserver._server_for: the launcher's namespaces, affinity, nice value, limits and
umask), which serves the job exactly as a server of its own would and ends with it. A launch
whose import-time environment (PYTHON* variables, TensorFlow's log level:
forkserver._IMPORT_TIME) or control groups differ from the pool's, or that finds no pool,
starts its own server as before. Measured on a 2-host all-reduce launch, six in a row with
the pool's own import counted in: 4.51 -> 2.81 s and 5.40 -> 3.85 CPU-s a launch
(scripts/fork_pool_ab.py; docs/development.md, "Fork pools").

The pools end with the ForkPool (close, or its process's end: PR_SET_PDEATHSIG), and every
server they forked with them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .forkserver import POOL, _die_with_parent, forking_off, pool_socket


class ForkPool:
    """Pools of warm servers in a temporary folder; `environ()` is what a launch needs to use
    them. A context manager: the pools end with the block."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="ctrtrain-pool-"))
        self._procs: list[subprocess.Popen] = []

    def start(self, python: str | None = None, env: dict[str, str] | None = None,
              wait: float = 0.0) -> Path:
        """A pool of `python`'s servers (this interpreter's by default) started in `env`: the
        jobs whose processes have its import-time environment use it. Its socket is there once
        its imports are done: a job that comes earlier starts its own server. `wait`: seconds
        to wait for that; the socket's path is returned either way."""
        python, env = python or sys.executable, dict(os.environ if env is None else env)
        path = pool_socket(str(self.folder), python, None, env)
        self._procs.append(subprocess.Popen(
            [python, "-m", "ctrtrain.launch.forkserver", "--pool", str(path)], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent))
        deadline = time.monotonic() + wait
        while not path.exists() and time.monotonic() < deadline:
            if self._procs[-1].poll() is not None:
                raise RuntimeError(f"the fork pool of {python} ended "
                                   f"({self._procs[-1].returncode})")
            time.sleep(0.05)
        return path

    def start_for_jobs(self, wait: float = 0.0) -> Path:
        """The pool this process's launches use: ctrtrain's own servers, in the import-time
        environment a job's processes get from a launcher run in this process's
        (cluster/process_env.py: unbuffered output, TensorFlow's log level)."""
        from ..tf_start import child_log_env
        return self.start(env={**os.environ, "PYTHONUNBUFFERED": "1", **child_log_env()},
                          wait=wait)

    @property
    def pids(self) -> list[int]:
        """The pools' PIDs (the parents of the servers they fork)."""
        return [p.pid for p in self._procs]

    def environ(self) -> dict[str, str]:
        return {POOL: str(self.folder)}

    def close(self) -> None:
        for proc in self._procs:
            proc.kill()       # its servers, and their children, end with it
            proc.wait()
        self._procs = []
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ForkPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def pooled_launches(wait: float = 120.0):
    """For a block that launches job after job (`bench matrix`, a test worker): a pool for its
    launches, whose environment takes the variables yielded; none (and {}) where a parent's
    pool is in use already (CTRTRAIN_FORK_POOL set; empty: none), forking is off, or coverage
    is measured (it starts every process anew). `wait`: seconds to wait for its import (by
    default, so that every launch of the block uses it)."""
    if POOL in os.environ or forking_off(os.environ):
        yield {}
        return
    with ForkPool() as pool:
        pool.start_for_jobs(wait=wait)
        yield pool.environ()
