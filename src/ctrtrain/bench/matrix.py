"""`ctrtrain bench matrix`: DeepFM over a matrix of settings, each cell a real `ctrtrain launch`
of the DeepFM recipe on the same synthesized data, then a ranking with costs and a
recommendation (report.py).

A matrix file (YAML) has `data` (rows, feature_size), `budget` (training examples per cell: every
cell sees as many, so their test AUCs compare), `repeats`, `defaults` (the settings of a cell),
and `cells` (a list of overrides, each with a `name`) and/or `axes` (setting -> values: their
cross product). Settings:

  mode: single | mirrored | allreduce | horovod | parameter_server
  data_service: false | true (a separate one-host data group; allreduce / parameter_server)
  hosts, processes_per_host, parameter_servers_per_host, devices (mirrored)
  instance_type (for the cost; data_instance_type for the data-service group)
  batch_size (per process / replica), intra_op_threads, inter_op_threads, data_threads
  format: tfrecord | libsvm, parse: vectorized | scalar, input_mode: File | Pipe
  distribution: FullyReplicated | ShardedByS3Key (the training channel's, over the hosts)
  cache, mixed_precision, xla: true | false;  learning_rate, optimizer
  sparse_reduce: gather | dense (table gradients across replicas)

Per cell: examples/s (global, the median over repeats of the median of the step windows after
the first), step time, input-bound share, CPU utilisation and peak RSS of every process, test
AUC after the budget. A failing cell is recorded with its error and the matrix goes on.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from ..errors import ConfigError
from ..launch.forkpool import pooled_launches
from ..progress import bar
from ..usage import TAG as USAGE_TAG
from ..usage import parse_usages
from .machine import describe_machine

ROOT = Path(__file__).resolve().parents[3]
HVD_PYTHON = ROOT / ".venv-hvd" / "bin" / "python"
EXAMPLES = ROOT / "examples"
SPEC_OF_MODE = {"single": "deepfm-single", "mirrored": "deepfm-mirrored",
                "allreduce": "deepfm-allreduce", "horovod": "horovod",
                "parameter_server": "deepfm-parameter-server"}
DEFAULTS = {"mode": "single", "data_service": False, "hosts": 1, "processes_per_host": 1,
            "parameter_servers_per_host": 1, "devices": 2, "instance_type": "ml.c5.xlarge",
            "data_instance_type": "ml.c5.xlarge", "batch_size": 1024, "intra_op_threads": 0,
            "inter_op_threads": 0, "data_threads": 0, "format": "tfrecord", "parse": "vectorized",
            "input_mode": "File", "distribution": "FullyReplicated", "cache": False,
            "mixed_precision": False, "xla": False,
            "learning_rate": 0.001, "optimizer": "adam", "sparse_reduce": "gather",
            "table_updates": "auto"}
HYPERPARAMETERS = ("batch_size", "intra_op_threads", "inter_op_threads", "data_threads", "parse",
                   "cache", "mixed_precision", "xla", "learning_rate", "optimizer", "devices",
                   "sparse_reduce", "table_updates")


def mode_cells(specs: list[str]) -> list[dict]:
    """`allreduce+data_service:sparse_reduce=dense` -> a cell of that mode (2 hosts for the
    multi-process modes), with a data-service group, and those settings (parsed as YAML)."""
    cells = []
    for spec in specs:
        head, _, extra = spec.partition(":")
        mode, _, ds = head.partition("+")
        # Multi-process modes on 2 hosts, as their example specs (1 would be a single process).
        cell = {"name": spec, "mode": mode, "data_service": ds == "data_service",
                "hosts": 2 if mode in ("allreduce", "horovod", "parameter_server") else 1}
        cell.update({k: yaml.safe_load(v) for k, v in
                     (kv.split("=", 1) for kv in extra.split(",") if kv)})
        cells.append(cell)
    return cells


def load_matrix(path: str | None = None, text: str | None = None) -> dict:
    raw = yaml.safe_load(text if text is not None else Path(path).read_text()) or {}
    unknown = set(raw) - {"data", "budget", "repeats", "defaults", "cells", "axes", "prices",
                          "train_examples"}
    if unknown:
        raise ConfigError(f"matrix: unknown keys {sorted(unknown)}")
    return raw


def expand_cells(matrix: dict) -> list[dict]:
    """Every cell's full settings: defaults, then the matrix's defaults, then the cell's."""
    base = {**DEFAULTS, **(matrix.get("defaults") or {})}
    cells = [dict(c) for c in matrix.get("cells") or []]
    axes = matrix.get("axes") or {}
    if axes:
        keys = list(axes)
        for values in itertools.product(*(axes[k] for k in keys)):
            c = dict(zip(keys, values))
            c.setdefault("name", ",".join(f"{k}={v}" for k, v in c.items()))
            cells.append(c)
    if not cells:
        cells = [{"name": "defaults"}]
    out = []
    for c in cells:
        if "name" not in c:
            raise ConfigError(f"matrix: a cell without a name: {c}")
        unknown = set(c) - set(DEFAULTS) - {"name"}
        if unknown:
            raise ConfigError(f"matrix cell {c['name']}: unknown settings {sorted(unknown)}")
        full = {**base, **c}
        if full["mode"] not in SPEC_OF_MODE:
            raise ConfigError(f"matrix cell {c['name']}: unknown mode {full['mode']!r}")
        out.append(full)
    return out


def prepare_data(work: Path, rows: int, feature_size: int) -> dict[str, Path]:
    """Synthesized train/test splits as TFRecord and libsvm data directories, made once."""
    from ..data.manifest import MANIFEST_NAME
    from ..data.synth import SynthConfig, synthesize_tfrecord
    out = work / f"data-{rows}-{feature_size}"
    dirs = {"libsvm": out / "raw" / "train", "tfrecord": out / "tf" / "train",
            "test": out / "tf" / "test"}
    if all((d / MANIFEST_NAME).exists() for d in dirs.values()):
        return dirs
    synthesize_tfrecord(out, SynthConfig(rows=rows, feature_size=feature_size, valid_fraction=0.0,
                                         test_fraction=0.1, files_per_split=4), overwrite=True)
    return dirs


def cell_spec(cell: dict, data: dict[str, Path], steps: int, out: Path) -> dict:
    """The job spec of a cell: its mode's example spec with the cell's settings."""
    spec = yaml.safe_load((EXAMPLES / f"{SPEC_OF_MODE[cell['mode']]}.yaml").read_text())
    spec["name"] = "bench"
    spec["output_dir"] = str(out)
    spec["hyperparameters"] = {**{k: cell[k] for k in HYPERPARAMETERS}, "steps": steps,
                               "log_every": max(5, steps // 8), "export": False,
                               "checkpoint_every": 0}
    spec["instance_groups"] = [{"name": "train", "hosts": cell["hosts"],
                                "processes_per_host": cell["processes_per_host"],
                                "instance_type": cell["instance_type"]}]
    dist = {"mode": cell["mode"]}
    if cell["mode"] == "parameter_server":
        dist["parameter_servers_per_host"] = cell["parameter_servers_per_host"]
    if cell["data_service"]:
        spec["instance_groups"].append({"name": "data", "hosts": 1,
                                        "instance_type": cell["data_instance_type"]})
        dist["data_service"] = {"group": "data", "processing_mode": "distributed_epoch"}
    spec["distribution"] = dist
    spec["channels"] = {"training": {"path": str(data[cell["format"]]),
                                     "input_mode": cell["input_mode"],
                                     "distribution": cell["distribution"]},
                        "test": {"path": str(data["test"])}}
    if cell["input_mode"] == "Pipe":
        # A stream carries no manifest: the job says what it holds. The recipe, given steps,
        # reads as many epochs' FIFOs as they take.
        from ..data.manifest import read_manifest
        m = read_manifest(data[cell["format"]])
        spec["hyperparameters"].update(field_size=m.field_size, feature_size=m.feature_size,
                                       data_format=m.format)
    spec["time_limit"] = 1800
    return spec


def _replicas(cell: dict) -> int:
    """Model replicas of a cell (1 for parameter servers: each step is one worker's batch)."""
    if cell["mode"] in ("allreduce", "horovod"):
        return cell["hosts"] * cell["processes_per_host"]
    return cell["devices"] if cell["mode"] == "mirrored" else 1


def run_cell(cell: dict, data: dict[str, Path], budget: int, work: Path,
             env: dict[str, str] | None = None) -> dict:
    """One launch of a cell; its measurements, or {"error": ...}. `env`: set in the launch's
    environment besides this process's."""
    global_batch = cell["batch_size"] * _replicas(cell)
    steps = max(10, budget // global_batch)
    out = work / "cells" / cell["name"].replace("/", "_")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec_path = out.with_suffix(".yaml")
    spec_path.write_text(yaml.safe_dump(cell_spec(cell, data, steps, out)))
    python = str(HVD_PYTHON) if cell["mode"] == "horovod" else sys.executable
    if cell["mode"] == "horovod" and not HVD_PYTHON.exists():
        return {"error": "no Horovod environment (scripts/horovod_env.sh)"}
    r = subprocess.run([python, "-m", "ctrtrain.cli", "launch", "--quiet", str(spec_path)],
                       capture_output=True, text=True, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        # The launcher's reason, and the failing process's last line (its own message).
        lines = [ln.strip() for ln in r.stderr.strip().splitlines() if ln.strip()]
        tail = [ln for ln in lines[1:] if not ln.startswith(("---", USAGE_TAG))]
        return {"error": " | ".join(x[:300] for x in lines[:1] + tail[-1:]) or f"exit {r.returncode}"}
    res = json.loads((out / "checkpoints" / "result.json").read_text())
    windows = res["windows"][1:] or res["windows"]
    eps = statistics.median(w["examples_per_s"] for w in windows)
    gb = res.get("global_batch", global_batch)
    procs = {}
    for log in sorted((out / "logs").glob("*.log")):
        found = parse_usages(log.read_text(errors="replace"))
        for i, u in enumerate(found):
            procs[log.stem if len(found) == 1 else f"{log.stem}[{i}]"] = u
    return {"examples_per_s": eps, "step_ms": 1000 * gb / eps, "global_batch": gb,
            "steps": res["step"], "examples": res["step"] * gb,
            "input_bound": res.get("input_bound"), "auc": (res.get("test") or {}).get("auc"),
            "processes": procs,
            "peak_rss_mb": max((u["max_rss_mb"] for u in procs.values()), default=None),
            "cpu_util": {k: u["cpu_util"] for k, u in procs.items()}}


def run_matrix(matrix: dict, work_dir: str, out_dir: str | None = None, progress=True) -> dict:
    from .cost import load_prices
    from .report import write_report
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    d = matrix.get("data") or {}
    budget = int(matrix.get("budget", 200_000))
    repeats = int(matrix.get("repeats", 1))
    cells = expand_cells(matrix)
    results = []
    # The cells' jobs fork their servers from one warm pool (launch/forkpool.py) instead of
    # each importing TensorFlow for its own: a cell's start-up is shorter.
    with pooled_launches() as pooled, bar(total=len(cells) * repeats, desc="bench matrix",
                                          unit="run", disable=None if progress else True) as pb:
        data = prepare_data(work, int(d.get("rows", 200_000)), int(d.get("feature_size", 100_000)))
        # Repeats go round the cells, so a drift of the machine's speed (these machines move
        # by several percent within minutes) falls on every cell alike.
        runs: list[list[dict]] = [[] for _ in cells]
        for _ in range(repeats):
            for i, cell in enumerate(cells):
                runs[i].append(run_cell(cell, data, budget, work, pooled))
                pb.update(1)
        for cell, cell_runs in zip(cells, runs):
            ok = [r for r in cell_runs if "error" not in r]
            if ok:
                best = sorted(ok, key=lambda r: r["examples_per_s"])[len(ok) // 2]  # the median run
                res = {**best, "runs": [r["examples_per_s"] for r in ok]}
            else:
                res = {"error": cell_runs[0]["error"]}
            results.append({"cell": cell, **res})
            shown = f"{res['examples_per_s']:,.0f} ex/s" if "examples_per_s" in res else \
                f"failed: {res['error']}"
            print(f"{cell['name']:32s} {shown}", flush=True)
    report = {"machine": describe_machine(), "data": d, "budget": budget, "repeats": repeats,
              "train_examples": matrix.get("train_examples", 45_840_617),
              "cells": results}
    prices = load_prices(matrix.get("prices"))
    if out_dir:
        write_report(copy.deepcopy(report), prices, Path(out_dir))
    return report
