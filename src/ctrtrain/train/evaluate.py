"""Exact evaluation: every example's probability, then AUC and logloss in NumPy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .. import heartbeat
from ..metrics import logloss, roc_auc


def predict_probs(predict_fn, dataset, max_batches: int | None = None):
    """(labels, probs) over a dataset of parsed batches, in dataset order."""
    labels, probs = [], []
    for i, b in enumerate(dataset):
        if max_batches is not None and i >= max_batches:
            break
        probs.append(predict_fn(b["ids"], b["values"]).numpy())
        labels.append(b["label"].numpy())
        heartbeat.beat()
    if not labels:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate(labels), np.concatenate(probs)


def evaluate(predict_fn, dataset) -> dict:
    y, p = predict_probs(predict_fn, dataset)
    return {"auc": roc_auc(y, p), "logloss": logloss(y, p), "examples": int(y.size),
            "positive_rate": float(y.mean()) if y.size else float("nan")}


def make_predict_fn(model):
    @tf.function(reduce_retracing=True)
    def predict(ids, values):
        logits, _ = model(ids, values, training=False)
        return tf.sigmoid(logits)
    return predict
