"""A warm start onto a grown (or rebuilt) vocabulary: the earlier model's table rows, and
their optimizer state, moved to where the same values' ids are now (issue 57: a fixed table
whose vocabulary grows day by day, `data featurize --vocab OLD --grow`).

This is the warm start TensorFlow's Estimator made with `WarmStartSettings` and `VocabInfo`
(and Keras' `warmstart_embedding_matrix`): a value the earlier vocabulary had keeps its row,
a new one starts as a new row does (the new model's initial values: its embedding drawn, its
optimizer state zero, current as of the step the warm start goes on from). Every other
variable is restored as it was.

The checkpoint is merged rather than restored piecewise: the new model's initial state is
written once (tf.train.Checkpoint.write), each of its tensors replaced by the earlier
checkpoint's (the table's and its slots' rows moved), written again and restored as any
checkpoint is -- the object graph, and so every variable's match, is TensorFlow's own."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..errors import ConfigError

# The table and its optimizer slots (train/step.py gives the optimizer the table first).
TABLE_KEYS = ("model/embeddings/table/", "optimizer/slots/0/")
ITERATIONS = "optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE"


def table_row_map(ids: np.ndarray, old_features: int, old_rows: int, new_features: int,
                  new_rows: int) -> np.ndarray:
    """[new_rows]: each row of the new table's row in the old one (-1: a new row). `ids`:
    Vocabulary.ids_from over the ids; the rows after the ids (declared numeric fields') follow
    them in both tables."""
    if new_rows - new_features != old_rows - old_features:
        raise ConfigError("the earlier model's table has other rows after its ids "
                          f"({old_rows - old_features}, now {new_rows - new_features})")
    rows = np.full(new_rows, -1, np.int64)
    n = min(len(ids), new_features)
    rows[:n] = np.where(ids[:n] < old_features, ids[:n], -1)
    tail = new_rows - new_features
    rows[new_features:] = np.arange(old_features, old_features + tail)
    return rows


def restore_remapped(ckpt, prefix: str, ids: np.ndarray, old_features: int,
                     new_features: int) -> int:
    """Restores checkpoint `prefix` into `ckpt`'s objects with the table's rows moved (ids:
    each new id's old id, or -1). Returns how many rows kept an earlier row."""
    import tensorflow as tf
    with tempfile.TemporaryDirectory(prefix="ctrtrain-remap-") as tmp:
        # save_counter made now, as a save makes it: the earlier checkpoint has one.
        ckpt.save_counter  # noqa: B018
        fresh = tf.train.load_checkpoint(ckpt.write(str(Path(tmp) / "fresh")))
        old = tf.train.load_checkpoint(prefix)
        old_shapes = old.get_variable_to_shape_map()
        step = old.get_tensor(ITERATIONS) if ITERATIONS in old_shapes else 0
        names, tensors, kept, rows = [], [], 0, None
        for name in fresh.get_variable_to_shape_map():
            value = old.get_tensor(name) if name in old_shapes else fresh.get_tensor(name)
            if name.startswith(TABLE_KEYS) and name in old_shapes:
                start = fresh.get_tensor(name)
                if rows is None:    # the table's and its slots' rows move alike
                    rows = table_row_map(ids, old_features, value.shape[0], new_features,
                                         start.shape[0])
                has = rows >= 0
                if "/last_step/" in name:    # a new row is current as of the step
                    start[~has] = step
                start[has] = value[rows[has]]
                value, kept = start, int(has.sum())
            names.append(name)
            tensors.append(tf.constant(value))
        merged = str(Path(tmp) / "merged")
        tf.raw_ops.SaveV2(prefix=merged, tensor_names=names,
                          shape_and_slices=[""] * len(names), tensors=tensors)
        ckpt.restore(merged).assert_existing_objects_matched()
    return kept
