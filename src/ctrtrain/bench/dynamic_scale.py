"""`ctrtrain bench dynamic-scale`: dynamic fields at the scale of a large id space, by
simulation on one machine -- a stream of ids born without end trains in its pools' memory.

Each of `fields` fields draws its keys from ids born one after the other: at step t the newest
id of a field is about w + t * birth (w = `pool` ids live at the start), and a draw takes the
id `offset` places older than the newest, `offset` Pareto-distributed (exponent `zipf`): the
newest ids are drawn most (new ads, new items), then fade. Over the run the fields bear `ids`
ids in all. Labels come from a hidden model: each id's weight a pseudo-random function of the
id, the logit a bias plus the fields' weights. Batches are made in the graph, seeded by the
step: a stream of 100 million ids would be tens of GB of records on disk, and the point here
is the table's memory, not the reading. The training step is `train`'s (train/step.py) with
every field dynamic in a pool of `pool` rows; every `probe_every` steps the model first
predicts the batch it is about to train on (progressive validation: an AUC on ids it has not
trained on at that step).

Reported per window and in all: examples/s, the ids drawn so far (exact: a bit per id born),
the rows held, the process's resident memory (and its peak, ru_maxrss), the training loss and
the progressive AUC; and what a fixed table with a row of its own for every id drawn would
take (its floats with Adam's two slots).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import numpy as np

SALT_BITS = 40        # field j's ids are j * 2^40 + serial: distinct across fields


def resident_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_dynamic_scale(ids: int = 100_000_000, fields: int = 8, pool: int = 1_000_000,
                      steps: int = 20_000, batch_size: int = 1024, embedding_size: int = 16,
                      zipf: float = 1.1, windows: int = 20, probe_every: int = 10,
                      seed: int = 0, json_path: str | None = None) -> dict:
    from ..errors import ConfigError
    if ids < fields * pool:
        raise ConfigError(f"--ids {ids:,}: at least fields x pool ({fields * pool:,}); the "
                          "simulation is of more ids than the pools hold")
    import tensorflow as tf

    from ..metrics import roc_auc
    from ..models.base import ModelConfig
    from ..progress import bar
    from ..train.config import TrainConfig, optimizer_params, resolve_table_updates
    from ..train.evaluate import features, make_predict_fn
    from ..train.step import build_training
    per_field = ids // fields
    birth = (per_field - pool) / steps          # ids born a step, in each field

    def batch(step):
        """The step's batch: keys [B, fields], labels from the hidden model."""
        s = tf.stack([tf.constant(seed, tf.int64), step])
        u = tf.random.stateless_uniform([batch_size, fields], s, minval=1e-12, maxval=1.0,
                                        dtype=tf.float64)
        newest = pool + tf.floor(tf.cast(step + 1, tf.float64) * birth) - 1
        # Clipped as floats: a draw far in the tail is beyond int64.
        offset = tf.minimum(tf.floor(tf.pow(u, -1.0 / (zipf - 1.0))) - 1.0, newest)
        serial = tf.cast(newest - offset, tf.int64)
        keys = serial + tf.constant(np.arange(fields, dtype=np.int64) << SALT_BITS)[None, :]
        weight = tf.math.floormod(tf.sin(tf.cast(keys, tf.float64) * 12.9898) * 43758.5453,
                                  1.0) * 2.0 - 1.0
        logit = -1.2 + 0.8 * tf.reduce_sum(weight, 1)
        y = tf.random.stateless_uniform([batch_size], s + 1, dtype=tf.float64) < \
            tf.sigmoid(logit)
        return {"label": tf.cast(y, tf.float32), "ids": keys,
                "values": tf.ones([batch_size, fields], tf.float32)}

    data = tf.data.Dataset.range(steps).map(batch, num_parallel_calls=tf.data.AUTOTUNE) \
        .prefetch(4)
    feature_size = fields * pool
    cfg = TrainConfig(model="deepfm", embedding_size=embedding_size, batch_size=batch_size)
    resolve_table_updates(cfg, feature_size)
    model_cfg = ModelConfig(feature_size, fields, embedding_size, seed=seed,
                            fields=tuple((f"C{j + 1}", "categorical") for j in range(fields)),
                            dynamic=tuple((j, j * pool, pool) for j in range(fields)))
    model, opt, train_step, _ = build_training(model_cfg, cfg.optimizer, cfg.learning_rate,
                                               optimizer_params=optimizer_params(cfg))
    predict = make_predict_fn(model)
    drawn = np.zeros(fields * (per_field + 1), np.bool_)     # a bit per id born
    every = max(probe_every, steps // windows)      # a window holds probes
    rows, losses, labels, probs, positives = [], [], [], [], 0.0
    start = last = time.perf_counter()
    with bar(steps, "dynamic-scale", "step") as progress:
        for step, b in enumerate(data, start=1):
            keys = b["ids"].numpy()
            positives += float(b["label"].numpy().sum())
            drawn[(keys & ((1 << SALT_BITS) - 1)) + (keys >> SALT_BITS) * (per_field + 1)] = True
            if step % probe_every == 0:
                probs.append(predict(features(b)).numpy())
                labels.append(b["label"].numpy())
            losses.append(float(train_step(b)))
            progress.update(1)
            if step % every == 0 or step == steps:
                now = time.perf_counter()
                y, p = (np.concatenate(labels), np.concatenate(probs)) if labels else \
                    (np.zeros(0), np.zeros(0))
                rate = positives / (len(losses) * batch_size)
                rows.append({
                    "step": step, "examples_per_s": len(losses) * batch_size / (now - last),
                    "ids_born": int(fields * (pool + np.floor(step * birth))),
                    "ids_drawn": int(drawn.sum()), "held_rows": int(model.dynamic.live()),
                    "resident_bytes": resident_bytes(), "loss": float(np.mean(losses)),
                    "loss_of_the_rate": float(-(rate * np.log(rate)
                                                + (1 - rate) * np.log(1 - rate))),
                    "progressive_auc": roc_auc(y, p) if y.size else None})
                r = rows[-1]
                print(f"[dynamic-scale] step {step:,}: {r['examples_per_s']:,.0f} ex/s, ids "
                      f"drawn {r['ids_drawn']:,}, rows held {r['held_rows']:,} of "
                      f"{feature_size:,}, resident {r['resident_bytes'] / 2**30:.2f} GiB, loss "
                      f"{r['loss']:.4f} (the rate's {r['loss_of_the_rate']:.4f})"
                      + (f", progressive AUC {r['progressive_auc']:.4f}"
                         if r["progressive_auc"] is not None else ""), flush=True)
                losses, labels, probs, positives, last = [], [], [], 0.0, now
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    width = embedding_size + 1
    report = {
        "ids": ids, "fields": fields, "pool": pool, "steps": steps, "batch_size": batch_size,
        "embedding_size": embedding_size, "zipf": zipf, "seed": seed, "seconds": seconds,
        "examples_per_s": steps * batch_size / seconds, "peak_resident_bytes": peak,
        "ids_drawn": rows[-1]["ids_drawn"], "held_rows": rows[-1]["held_rows"],
        "table_bytes": feature_size * width * 4 * 3,
        "map_bytes": feature_size * 48,
        "fixed_table_bytes_for_every_id": rows[-1]["ids_drawn"] * width * 4 * 3,
        "windows": rows}
    print(f"[dynamic-scale] {report['ids_drawn']:,} ids drawn over {steps:,} steps in "
          f"{seconds:.0f} s ({report['examples_per_s']:,.0f} ex/s); peak resident memory "
          f"{peak / 2**30:.2f} GiB (table {report['table_bytes'] / 2**30:.2f} GiB + map "
          f"{report['map_bytes'] / 2**30:.2f} GiB); a row for every id drawn would take "
          f"{report['fixed_table_bytes_for_every_id'] / 2**30:.1f} GiB", flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        plot(report, Path(json_path).with_suffix(".png"))
    return report


def plot(report: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    w = report["windows"]
    steps = [r["step"] for r in w]
    fig, (ids, mem, auc) = plt.subplots(1, 3, figsize=(14, 4))
    ids.plot(steps, [r["ids_drawn"] / 1e6 for r in w], label="ids drawn")
    ids.plot(steps, [r["held_rows"] / 1e6 for r in w], label="rows held")
    ids.set(xlabel="step", ylabel="millions", title="ids against the rows that hold them")
    ids.legend()
    mem.plot(steps, [r["resident_bytes"] / 2**30 for r in w], label="resident")
    mem.plot(steps, [r["ids_drawn"] * (report["embedding_size"] + 1) * 12 / 2**30 for r in w],
             "--", label="a row for every id drawn")
    mem.set(xlabel="step", ylabel="GiB", title="memory")
    mem.legend()
    auc.plot(steps, [r["progressive_auc"] or float("nan") for r in w])
    auc.set(xlabel="step", ylabel="AUC before training on the batch",
            title="progressive AUC")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
