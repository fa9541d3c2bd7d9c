"""`ctrtrain tune`: finds the thread settings and batch size that train fastest on this host,
each candidate a fresh training process on the same data (thread pools are fixed when
TensorFlow starts), and writes them where `ctrtrain train` and `ctrtrain launch` pick them up
(train/tuned.py). A coordinate search: intra-op x inter-op threads at the default batch size,
then the batch size with the best threads; each candidate's figure is the median of `repeats`
fresh runs (a shared VM varies by several percent from run to run). Larger batches change the
optimisation as well as the speed: the tuned batch size is a default, and the learning rate is
the user's to adjust."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..train.tuned import tuned_path
from .machine import describe_machine
from .train_bench import _run_worker, prepare_reference_data, reference_run


def candidates(cores: int) -> list[tuple[int, int]]:
    intra = sorted({cores, max(1, cores // 2)}, reverse=True)
    inter = [1, 2, 4]
    return [(a, b) for a in intra for b in inter]


def tune(data_dir: str | None = None, rows: int = 200_000, feature_size: int = 100_000,
         out: str | None = None, steps: int = 60, work_dir: str = "runs/tune",
         batch_sizes=(512, 1024, 2048), repeats: int = 3) -> dict:
    data = data_dir or str(prepare_reference_data(Path(work_dir), rows, feature_size))
    cores = len(os.sched_getaffinity(0))
    base = reference_run()
    base.update(data=data, steps=steps, warmup=10, window=10)
    tried = []

    def measure(intra, inter, batch):
        runs = sorted((_run_worker("train", {**base, "batch_size": batch,
                                             "threads": {"intra_op": intra, "inter_op": inter}})
                       for _ in range(repeats)), key=lambda r: r["examples_per_s"])
        r = runs[len(runs) // 2]     # the median run
        tried.append({"intra_op_threads": intra, "inter_op_threads": inter, "batch_size": batch,
                      "examples_per_s": r["examples_per_s"], "input_bound": r["input_bound"],
                      "runs": [x["examples_per_s"] for x in runs]})
        print(f"intra {intra} inter {inter} batch {batch:5d}: {r['examples_per_s']:10,.0f} ex/s"
              f" (median of {repeats})", flush=True)
        return r["examples_per_s"]

    best_threads = max(candidates(cores), key=lambda t: measure(*t, base["batch_size"]))
    for b in batch_sizes:
        if b != base["batch_size"]:
            measure(*best_threads, b)
    best = max(tried, key=lambda t: t["examples_per_s"])
    settings = {k: best[k] for k in ("intra_op_threads", "inter_op_threads", "batch_size")}
    record = {"settings": settings, "examples_per_s": best["examples_per_s"], "tried": tried,
              "repeats": repeats,
              "machine": describe_machine(), "data": data, "date": time.strftime("%Y-%m-%d")}
    path = Path(out) if out else tuned_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"best: {settings} at {best['examples_per_s']:,.0f} ex/s; written to {path}")
    return record
