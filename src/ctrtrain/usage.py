"""A process's resource use as one tagged log line, for the benchmark: CPU seconds, wall
seconds since the process started, peak RSS. Training processes print it when they end,
servers when they are told to stop (SIGTERM)."""

from __future__ import annotations

import json
import os
import resource

TAG = "ctrtrain-usage"


def usage() -> dict:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    wall = None
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            wall = float(f.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    cpu = ru.ru_utime + ru.ru_stime
    return {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2) if wall else None,
            "cpu_util": round(cpu / wall, 3) if wall else None,
            "max_rss_mb": round(ru.ru_maxrss / 1024, 1)}


def print_usage() -> None:
    print(f"{TAG} {json.dumps(usage())}", flush=True)


def parse_usages(text: str) -> list[dict]:
    """Every usage line in a log (a launcher like horovodrun may prefix and merge its ranks')."""
    out = []
    for line in text.splitlines():
        i = line.find(TAG + " ")
        if i >= 0:
            try:
                out.append(json.loads(line[i + len(TAG) + 1:]))
            except ValueError:
                continue
    return out


def available_memory() -> int | None:
    """Bytes this process can still take: the machine's MemAvailable, or less where a cgroup
    (a container's memory limit) allows less; None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        if limit != "max":
            found.append(max(0, int(limit) - current))
    except (OSError, ValueError):
        pass
    return min(found) if found else None
