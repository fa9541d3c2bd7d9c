"""Each process a command starts, with the CPU it used, read from /proc while the command runs:
where a test's or a launch's CPU goes when pytest_cpu.py gives only its total.

    python scripts/process_census.py OUT.json -- python -m pytest tests/test_x.py -k name
    python scripts/process_census.py --show OUT.json

Polls /proc every 0.05 s (a process shorter than that may be missed; its CPU is the last value
read, so a process's final tenth of a second may be missed too) and records every process that
was not running before the command started, with its command line and parent. The command's
output goes to OUT.json.log. --show prints the processes grouped by command line (temporary
paths and numbers folded), the most CPU first."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def _read(pid: str) -> tuple[int, str, float, int] | None:
    """(start time in ticks, command line, CPU seconds, parent) of a process, None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline") as f:
            cmd = f.read().replace("\0", " ").strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19]), cmd, (int(fields[11]) + int(fields[12])) / TICK, int(fields[1])


def census(out: str, cmd: list[str]) -> int:
    before = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        found = _read(pid)
        if found:
            before.add((int(pid), found[0]))
    seen: dict[tuple[int, int], list] = {}
    with open(out + ".log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        me = os.getpid()
        while proc.poll() is None:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                found = _read(pid)
                if not found or (int(pid), found[0]) in before or int(pid) == me:
                    continue
                start, command, cpu, parent = found
                entry = seen.setdefault((int(pid), start), [command, 0.0, parent])
                entry[1] = cpu
                entry[0] = command or entry[0]    # a zombie's command line reads empty
            time.sleep(0.05)
    with open(out, "w") as f:
        json.dump([{"pid": k[0], "cmd": v[0], "cpu": v[1], "parent": v[2]}
                   for k, v in seen.items()], f)
    return proc.returncode


def show(path: str) -> None:
    rows = json.load(open(path))
    groups: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        key = re.sub(r"\b\d{2,}\b", "N", re.sub(r"/tmp/\S+", "TMP", r["cmd"]))[:120]
        groups[key][0] += 1
        groups[key][1] += r["cpu"]
    print(f"{sum(r['cpu'] for r in rows):.1f} CPU-s in {len(rows)} processes")
    for key, (n, cpu) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        if cpu >= 0.05:
            print(f"{cpu:7.2f} {n:4d}  {key}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--show":
        show(sys.argv[2])
    elif len(sys.argv) > 3 and sys.argv[2] == "--":
        sys.exit(census(sys.argv[1], sys.argv[3:]))
    else:
        sys.exit(__doc__)
