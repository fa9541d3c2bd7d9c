"""A description of the machine a benchmark ran on, for the report."""

from __future__ import annotations

import os
import platform
import time


def describe_machine() -> dict:
    cpu = "unknown"
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu == "unknown":
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib,
            "avx512": "avx512f" in flags, "python": platform.python_version(),
            "platform": platform.platform()}
    try:
        import tensorflow as tf
        info["tensorflow"] = tf.__version__
    except ImportError:
        pass
    return info


# Other processes' load during a measured run, in cores, above which the run is flagged
# contended: a tenth of a 2-core machine's work would move a ratio by about that much.
CONTENDED_CORES = 0.2


def _busy_seconds() -> float | None:
    """CPU-seconds the machine has spent busy since boot (/proc/stat), None where unknown."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")    # less idle and iowait


class LoadWindow:
    """The machine's load while a run goes on: `LoadWindow()` as it starts, `.report(cpu_s)`
    when it ends, with the run's own CPU-seconds (its process's). What the machine spent
    beyond that is other processes' (another benchmark, a test suite): a run that shared its
    cores is flagged, not silently counted as this machine's speed."""

    def __init__(self):
        self.t0, self.busy0 = time.monotonic(), _busy_seconds()

    def report(self, cpu_s: float | None) -> dict:
        seconds = time.monotonic() - self.t0
        busy = _busy_seconds()
        if busy is None or self.busy0 is None or cpu_s is None or seconds <= 0:
            return {"seconds": round(seconds, 2)}
        machine = (busy - self.busy0) / seconds
        other = max(0.0, machine - cpu_s / seconds)
        return {"seconds": round(seconds, 2), "machine_cores": round(machine, 2),
                "other_cores": round(other, 2), "contended": other > CONTENDED_CORES}


def process_cpu_s() -> float:
    """This process's CPU-seconds and its reaped children's (a forked run's counts from its
    fork: a fork starts at zero)."""
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
