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
    """Bytes this process can still take: the machine's MemAvailable, or less where its
    cgroup (a container's or a job's memory limit, v2 or v1) allows less; None where neither
    can be read. A cgroup's usage counts reclaimable file cache, which is left out."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except OSError:
        pass
    left = _cgroup_memory_left()
    if left is not None:
        found.append(left)
    return min(found) if found else None


def _cgroup_memory_left() -> int | None:
    """The limit of this process's memory cgroup minus what it holds (None: no limit read)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if controllers == "":                       # v2: memory.max / memory.current
            files, root = ("memory.max", "memory.current", "inactive_file"), "/sys/fs/cgroup"
        elif "memory" in controllers.split(","):    # v1
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            root = "/sys/fs/cgroup/memory"
        else:
            continue
        # A cgroup namespace shows the process at its root: the path may be "/".
        for d in dict.fromkeys((f"{root}{path.rstrip('/')}", root)):
            try:
                with open(f"{d}/{files[0]}") as f:
                    limit = f.read().strip()
                with open(f"{d}/{files[1]}") as f:
                    current = int(f.read().strip())
                with open(f"{d}/memory.stat") as f:
                    stat = dict(line.split() for line in f if line.strip())
            except (OSError, ValueError):
                continue
            if limit == "max" or int(limit) >= 1 << 60:     # v1 writes "no limit" as ~2^63
                break
            return max(0, int(limit) - current + int(stat.get(files[2], 0)))
    return None
