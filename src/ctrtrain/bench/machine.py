"""A description of the machine a benchmark ran on, for the report."""

from __future__ import annotations

import os
import platform


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
