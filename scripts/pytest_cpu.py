"""A pytest plugin that says what each test costs in CPU, where --durations says only wall time.

On 2 cores both pytest-xdist workers are busy through the suite, so its wall time is about the
CPU its tests and their processes need over the two cores: CPU is the figure to cut (issue 28).
Each test's CPU is this process's (tests that run the CLI in-process) plus that of the child
processes it started and reaped (launches, CLI subprocesses), from getrusage around the test,
and that of the worker's fork pools (whose forks run its launches' processes), from /proc.

    CTRTRAIN_CPU_LOG=cpu.jsonl PYTHONPATH=scripts bash scripts/test.sh -p pytest_cpu -n 2 --dist load

appends one JSON line per test (id, the environment that ran it, wall, self and children CPU
seconds) to the file and ends the run with the total and the 15 tests and files that cost most
(of its own environment: scripts/test.sh runs the 2.15 pass beside the 2.21 pass)."""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time

import pytest

LOG = "CTRTRAIN_CPU_LOG"
TICK = os.sysconf("SC_CLK_TCK")
ENV = os.path.basename(sys.prefix)      # .venv (TF 2.21) or .venv-hvd (2.15)


def _pools() -> float:
    """CPU seconds so far of this process's fork pools (tests/conftest.py, launch/forkpool.py)
    and of what they reaped: the jobs whose servers they forked, which are not this process's
    children."""
    total, me = 0.0, str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[1] != me:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--pool" not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15]) / TICK    # utime stime cutime cstime
    return total


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime + _pools()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get(LOG)
    wall, (own, kids) = time.monotonic(), _cpu()
    yield
    if path:
        own2, kids2 = _cpu()
        with open(path, "a") as f:     # one short line per write: workers append safely
            f.write(json.dumps({"id": item.nodeid, "env": ENV,
                                "wall": round(time.monotonic() - wall, 2),
                                "self": round(own2 - own, 2),
                                "children": round(kids2 - kids, 2)}) + "\n")


def pytest_terminal_summary(terminalreporter):
    path = os.environ.get(LOG)
    if not path or not os.path.exists(path) or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rows = [r for r in map(json.loads, open(path)) if r.get("env", ENV) == ENV]
    for r in rows:
        r["cpu"] = r["self"] + r["children"]
    files = collections.Counter()
    for r in rows:
        files[r["id"].split("::")[0]] += r["cpu"]
    w = terminalreporter.write_line
    w(f"== CPU seconds: {sum(r['cpu'] for r in rows):,.0f} over {len(rows)} tests ({path})")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:15]:
        w(f"{r['cpu']:7.1f} s CPU {r['wall']:7.1f} s wall  {r['id']}")
    w("-- by file")
    for name, cpu in files.most_common(15):
        w(f"{cpu:7.1f} s CPU  {name}")
