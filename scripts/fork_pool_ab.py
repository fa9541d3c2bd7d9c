"""Launches with and without a fork pool (launch/forkpool.py), alternated: what a pool saves a
program that launches job after job. Each round runs N launches of SPEC with the jobs'
servers started by themselves, then N with a pool started for them (its TensorFlow import
counted in), and prints each side's wall and CPU seconds a launch (this process's reaped
children: the launchers, their jobs and the pool).

    python scripts/fork_pool_ab.py SPEC [--launches 6] [--rounds 3]

SPEC's output_dir is replaced at each launch."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from ctrtrain.launch.forkpool import ForkPool


def side(spec: str, launches: int, pooled: bool) -> tuple[float, float]:
    before, start = os.times(), time.monotonic()
    with ForkPool() as pool:
        env = dict(os.environ, CTRTRAIN_FORK_POOL="")
        if pooled:
            pool.start_for_jobs()
            env.update(pool.environ())
        for _ in range(launches):
            r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", "launch", "--quiet", spec],
                               env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"launch failed:\n{r.stderr[-3000:]}")
    after = os.times()
    cpu = (after.children_user + after.children_system
           - before.children_user - before.children_system)
    return (time.monotonic() - start) / launches, cpu / launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--launches", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    got: dict[str, list[tuple[float, float]]] = {"own servers": [], "pool": []}
    for r in range(a.rounds):
        for name in got:
            got[name].append(side(a.spec, a.launches, name == "pool"))
            wall, cpu = got[name][-1]
            print(f"round {r + 1} {name:11s} {wall:5.2f} s {cpu:5.2f} CPU-s a launch", flush=True)
    for name, runs in got.items():
        print(f"median {name:11s} {statistics.median(w for w, _ in runs):5.2f} s "
              f"{statistics.median(c for _, c in runs):5.2f} CPU-s a launch")


if __name__ == "__main__":
    main()
