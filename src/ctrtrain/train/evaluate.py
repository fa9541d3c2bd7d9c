"""Exact evaluation: every example's probability, then AUC and logloss in NumPy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .. import heartbeat
from ..data.index import source_files
from ..metrics import logloss, roc_auc


def predict_probs(predict_fn, dataset, max_batches: int | None = None):
    """(labels, probs) over a dataset of parsed batches, in dataset order."""
    labels, probs = [], []
    for i, b in enumerate(dataset):
        if max_batches is not None and i >= max_batches:
            break
        probs.append(predict_fn(features(b)).numpy())
        labels.append(b["label"].numpy())
        heartbeat.beat()
    if not labels:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate(labels), np.concatenate(probs)


def evaluate(predict_fn, dataset) -> dict:
    y, p = predict_probs(predict_fn, dataset)
    return {"auc": roc_auc(y, p), "logloss": logloss(y, p), "examples": int(y.size),
            "positive_rate": float(y.mean()) if y.size else float("nan")}


def features(batch: dict) -> dict:
    """A parsed batch without its label: what a model and the serving signature take."""
    return {k: v for k, v in batch.items() if k != "label"}


def make_predict_fn(model):
    @tf.function(reduce_retracing=True, autograph=False)
    def predict(features):
        logits, _ = model(features, training=False)
        return tf.sigmoid(logits)
    return predict


def evaluate_split(split_dir, name: str, predict, log, step: int, feature_size: int | None,
                   keep: bool = False, dynamic=None) -> dict | None:
    """Exact AUC and logloss of a data directory (None without one), logged as an `eval`
    event; a read error names the file and record. keep: also return `labels` and `probs`;
    `dynamic`: the model's dynamic fields (read as raw keys)."""
    if not split_dir:
        return None
    from ..input.pipeline import PipelineConfig, dataset_from_dir, explain_error
    heartbeat.beat(force=True)
    ds, m = dataset_from_dir(split_dir, PipelineConfig(batch_size=8192, feature_size=feature_size),
                             training=False, dynamic=dynamic)
    try:
        y, p = predict_probs(predict, ds)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        raise explain_error(e, source_files(split_dir), fmt=m.format, field_size=m.field_size,
                            feature_size=feature_size or m.feature_size,
                            compression=m.compression, label_format=m.label_format,
                            what=f"{name} split",
                            schema=m.schema.with_dynamic(dynamic) if m.schema else None) from None
    heartbeat.beat(force=True)
    r = {"auc": roc_auc(y, p), "logloss": logloss(y, p), "examples": int(y.size),
         "positive_rate": float(y.mean()) if y.size else float("nan")}
    log.event("eval", step=step, split=name, **r)
    return {**r, "labels": y, "probs": p} if keep else r
