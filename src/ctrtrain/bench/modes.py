"""`ctrtrain bench modes`: DeepFM in each distribution mode through `ctrtrain launch`, on the same
data, against single-process training: examples/s (global examples per second, median of the
logged step windows after the first), step time, input-bound share and test AUC per mode.
On a 2-core machine every extra process competes for the same cores, so the figures are the
modes' overheads, not their speed-ups.

Each mode runs its example spec (examples/deepfm-*.yaml) with the data and hyperparameters
given here; Horovod runs from .venv-hvd when it exists."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from .machine import describe_machine
from .train_bench import prepare_reference_data

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
MODES = {"single": "deepfm-single", "mirrored": "deepfm-mirrored", "allreduce": "deepfm-allreduce",
         "horovod": "horovod", "parameter_server": "deepfm-parameter-server",
         "allreduce+data_service": "deepfm-data-service"}


def parse_cell(cell: str) -> tuple[str, dict]:
    """`allreduce:sparse_reduce=dense` -> ("allreduce", {"sparse_reduce": "dense"})."""
    mode, _, extra = cell.partition(":")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (allowed: {', '.join(MODES)})")
    hp = dict(kv.split("=", 1) for kv in extra.split(",") if kv)
    return mode, {k: yaml.safe_load(v) for k, v in hp.items()}


def _spec(work: Path, cell: str, data: Path, hp: dict) -> Path:
    mode, extra = parse_cell(cell)
    hp = {**hp, **extra}
    raw = yaml.safe_load((EXAMPLES / f"{MODES[mode]}.yaml").read_text())
    raw["channels"] = {"training": {"path": str(data)}}
    raw["hyperparameters"] = dict(hp)
    raw["output_dir"] = str(work / cell)
    path = work / f"{cell}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run_modes(modes: list[str], rows: int, feature_size: int, batch_size: int, steps: int,
              work_dir: str, json_path: str | None = None) -> dict:
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = prepare_reference_data(work, rows, feature_size)
    hvd = ROOT / ".venv-hvd" / "bin" / "python"
    results = {}
    for mode in modes:
        # `mode` is a cell: a mode, optionally with hyperparameters (allreduce:sparse_reduce=dense).
        # The same per-process batch everywhere; log windows of 20 steps, the first one dropped.
        hp = {"batch_size": batch_size, "steps": steps, "log_every": 20, "export": False,
              "checkpoint_every": 0}
        spec = _spec(work, mode, data, hp)
        python = str(hvd) if parse_cell(mode)[0] == "horovod" else sys.executable
        if python == str(hvd) and not hvd.exists():
            results[mode] = {"error": "no .venv-hvd (scripts/horovod_env.sh)"}
            continue
        shutil.rmtree(work / mode, ignore_errors=True)
        r = subprocess.run([python, "-m", "ctrtrain.cli", "launch", str(spec)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            results[mode] = {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
            print(f"{mode:34s} failed: {results[mode]['error']}", flush=True)
            continue
        res = json.loads((work / mode / "checkpoints" / "result.json").read_text())
        windows = res["windows"][1:] or res["windows"]
        eps = statistics.median(w["examples_per_s"] for w in windows)
        global_batch = res.get("global_batch", batch_size)
        cell = {"examples_per_s": eps, "step_ms": 1000 * global_batch / eps,
                "global_batch": global_batch, "replicas": res.get("replicas", 1),
                "input_bound": res.get("input_bound"), "steps": res["step"]}
        results[mode] = cell
        print(f"{mode:34s} {eps:10,.0f} ex/s  step {cell['step_ms']:6.1f} ms  "
              f"global batch {global_batch}", flush=True)
    base = results.get("single", {}).get("examples_per_s")
    if base:
        for cell in results.values():
            if "examples_per_s" in cell:
                cell["vs_single"] = cell["examples_per_s"] / base
    report = {"machine": describe_machine(), "rows": rows, "feature_size": feature_size,
              "batch_size_per_process": batch_size, "steps": steps, "modes": results}
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return report
