"""One benchmark run in a fresh process (thread pools are fixed when TensorFlow starts, and
peak RSS is per process), in this environment or another one (DeepCTR's, TF 2.15's).

A run whose figures are AUC and loss only (`fork=True`: bench quality's) of ctrtrain's own
modules with this Python is forked from a process that imported TensorFlow once for the whole
benchmark (launch/forkserver.py, as a job's processes are): no TensorFlow runtime started
before the fork, ~3.5 CPU-seconds of import less a run. Runs measured for speed and memory stay
new processes, as a user's `ctrtrain train` is: a fork's peak RSS counts only the pages it
touched of the server's (measured: 434 against 695 MB for bench train's reference run), which
would flatter ctrtrain beside a peer's new process. The server ends with the command that
started it (`forked_runs`, around every CLI command).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
from pathlib import Path

from ..launch.forkserver import ForkServer

_forks: ForkServer | None = None

# glibc's allocator told to keep the memory a process frees (in its heap, for its next
# allocation) instead of giving it back to the kernel. By default a block above 32 MB is a
# mapping of its own, unmapped when freed, so a step that makes table-sized temporaries (a
# 1M x 16 table's dense gradient and Adam moments: 64 MB each) takes every page of them anew,
# zeroed by the kernel: measured here, DeepCTR's DeepFM step spent 53 of its 89 CPU-s in the
# kernel (2,488 ex/s; 7,368 with this), the SageMaker sample's Estimator 102 of 223 (6,194;
# 11,705). ctrtrain's sparse step makes no such temporaries (docs/benchmarks.md).
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "2000000000", "MALLOC_TRIM_THRESHOLD_": "4000000000"}


@contextlib.contextmanager
def forked_runs():
    """The runs of the block fork from a server of their own, which ends with the block."""
    global _forks
    outer, _forks = _forks, None
    try:
        yield
    finally:
        if _forks is not None:
            _forks.close()
        _forks = outer


def run_json(cmd: list[str], what: str, timeout: float = 3600, fork: bool = False,
             env: dict[str, str] | None = None) -> list[dict]:
    """Runs `cmd` (forked where `fork` and it can be) and returns the JSON objects it printed,
    one per line, in order. `env`: set in its environment besides this process's."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CTRTRAIN_NO_PROGRESS="1", **(env or {}))
    code, out, err = _run(cmd, env, timeout) if fork else _new_process(cmd, env, timeout)
    if code != 0:
        raise RuntimeError(f"{what} failed:\n{err[-3000:]}")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _run(cmd: list[str], env: dict, timeout: float) -> tuple[int, str, str]:
    global _forks
    if _forks is None:                            # outside forked_runs: ends with Python
        _forks = ForkServer(Path(os.devnull))     # the server's own output: none to keep
        atexit.register(_forks.close)
    module = _forks.can_fork(cmd, env)
    if module is not None:
        try:
            proc = _forks.spawn(module, cmd[3:], env, None, None, stderr=True)
        except OSError:
            pass                                  # a new process instead
        else:
            out, err = proc.communicate(timeout)
            return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    return _new_process(cmd, env, timeout)


def _new_process(cmd: list[str], env: dict, timeout: float) -> tuple[int, str, str]:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return r.returncode, r.stdout, r.stderr
