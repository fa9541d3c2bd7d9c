"""`ctrtrain bench startup`: where a small run's wall time goes. Runs `ctrtrain train` on a
data set in fresh processes, median over repeats, and reads each run's phases from its
result.json (start-up, training, final checkpoint, evaluation, export) plus the process's
exit. The reference, measured in the same run and alternating with it, is the same command
ended by the interpreter's normal exit (TensorFlow's teardown), which `ctrtrain` skips."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .machine import describe_machine

NORMAL_EXIT = ("import sys; from ctrtrain.cli import main; sys.exit(main(sys.argv[1:]))")


def _run(argv: list[str], normal_exit: bool, model_dir: Path) -> dict:
    cmd = [sys.executable] + (["-c", NORMAL_EXIT] if normal_exit else ["-m", "ctrtrain.cli"])
    t0 = time.perf_counter()
    r = subprocess.run(cmd + argv + ["--model-dir", str(model_dir), "--fresh", "--quiet"],
                       capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"ctrtrain train failed:\n{r.stderr[-2000:]}")
    phases = json.loads((model_dir / "result.json").read_text())["phases_s"]
    return {"wall_s": wall, **phases, "exit_s": wall - sum(phases.values())}


def run_startup_bench(train: str, valid: str | None, test: str | None, work_dir: str,
                      repeats: int = 3, extra: list[str] | None = None, json_path=None) -> dict:
    argv = ["train", "--train", train] + (["--valid", valid] if valid else []) + \
        (["--test", test] if test else []) + (extra or [])
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    runs = {"ctrtrain": [], "normal exit": []}
    for _ in range(repeats):
        runs["ctrtrain"].append(_run(argv, False, work / "m"))
        runs["normal exit"].append(_run(argv, True, work / "m"))
    out = {"machine": describe_machine(), "command": ["ctrtrain", *argv], "repeats": repeats,
           "median": {k: {p: statistics.median(r[p] for r in rs) for p in rs[0]}
                      for k, rs in runs.items()}, "runs": runs}
    med = out["median"]
    out["ratio_wall"] = med["ctrtrain"]["wall_s"] / med["normal exit"]["wall_s"]
    for name, m in med.items():
        print(f"{name:12s} wall {m['wall_s']:6.2f} s = " + ", ".join(
            f"{p} {v:.2f}" for p, v in m.items() if p != "wall_s"), flush=True)
    print(f"ratio of wall times: {out['ratio_wall']:.2f}")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
    return out
