"""Issue 27's XLA question, measured: can XLA fuse the static-shape part of DeepFM's step?

Three steps of the same model, optimizer (Adam, catch-up table updates, table L2 1e-4) and
batches (the reference configuration's: 1024 x 39 ids of `bench train`'s synthesized data,
Zipf(0.7) per field, ~8,400 distinct rows per batch; dropout 0.5), the batches held in
memory (no input pipeline), timed alternately, 200 steps x 3 runs each:

- reference: ctrtrain's compiled step (train/step.py);
- xla: everything from the gathered [B, F, K+1] block to the loss, and its gradients with
  respect to the block and the dense variables, one XLA cluster (jit_compile); the unique
  ids, the gathers, the segment sum and the catch-up update stay outside;
- xla_fm: only the value scaling and the FM's first- and second-order terms (and their
  gradient) compiled; the MLP runs on oneDNN as in the reference.

    .venv/bin/python scripts/xla_static_part.py [reference xla xla_fm]
"""
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from ctrtrain.data.synth import HiddenModel, SynthConfig
from ctrtrain.models.base import ModelConfig
from ctrtrain.models.blocks import first_and_fm
from ctrtrain.models.engine.tables import Embedded
from ctrtrain.train.step import build_training

B, F, K, ROWS = 1024, 39, 16, 1_000_000
rng = np.random.default_rng(0)
# The reference data of `ctrtrain bench train`: SynthConfig with Zipf(0.7) ids per field.
hm = HiddenModel(SynthConfig(rows=1_000_000, feature_size=ROWS, zipf=0.7, valid_fraction=0.0,
                             test_fraction=0.0))
batches = []
for _ in range(40):
    ids, vals, _ = hm.sample_features(rng, B)
    batches.append({"ids": tf.constant(ids), "values": tf.constant(vals.astype(np.float32)),
                    "label": tf.constant((rng.random(B) < 0.25).astype(np.float32))})
print("distinct rows per batch:", np.mean([len(np.unique(b["ids"].numpy())) for b in batches[:5]]))

cfg = ModelConfig(feature_size=ROWS, field_size=F, embedding_size=K, deep_layers=(256, 128, 64),
                  dropout=0.5, seed=1)


def make(kind):
    """The compiled step of a variant (reference, xla, xla_fm) over a fresh model."""
    model, opt, step, variables = build_training(
        cfg, "adam", 1e-3, optimizer_params={"table_updates": "catchup", "table_l2": 1e-4})
    if kind == "reference":
        return step
    table = model.embeddings.table
    dense = variables[1:]

    def loss_of(logits, labels):
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))

    @tf.function(jit_compile=True)
    def whole(rows, values, labels):
        """xla: the block to the loss and its gradients, one cluster."""
        with tf.GradientTape() as tape:
            tape.watch(rows)
            logits = model.bias
            for t in model.terms(Embedded(rows * tf.expand_dims(values, -1), True), True):
                logits = logits + t
            loss = loss_of(logits, labels)
        return loss, tape.gradient(loss, [rows] + dense)

    @tf.function(jit_compile=True)
    def fm_jit(rows, values):
        scaled = rows * tf.expand_dims(values, -1)
        first, fm = first_and_fm(scaled)
        return scaled, first + fm

    def fm_only(rows, values, labels):
        """xla_fm: only the scaling and the FM terms compiled; the MLP outside."""
        with tf.GradientTape() as tape:
            tape.watch(rows)
            scaled, lin = fm_jit(rows, values)
            loss = loss_of(model.bias + lin + model.mlp(tf.reshape(scaled, [B, -1]), True)[:, 0],
                           labels)
        return loss, tape.gradient(loss, [rows] + dense)

    static_part = whole if kind == "xla" else fm_only

    @tf.function
    def split_step(batch):
        # Dynamic: distinct ids, their (caught-up) rows, the block; then the static part;
        # then the block's gradient summed per distinct row, and the update.
        distinct, where = tf.unique(tf.reshape(batch["ids"], [-1]))
        table_rows = tf.nn.embedding_lookup(table, distinct)
        offset = opt.row_correction(table, distinct, stored=table_rows)
        if offset is not None:
            table_rows = table_rows - tf.stop_gradient(offset)
        rows = tf.reshape(tf.gather(table_rows, where), [B, F, K + 1])
        loss, g = static_part(rows, batch["values"], batch["label"])
        g_table = tf.math.unsorted_segment_sum(tf.reshape(g[0], [-1, K + 1]), where,
                                               tf.shape(distinct)[0])
        grads = [tf.IndexedSlices(g_table, distinct, tf.shape(table, out_type=tf.int64))] + list(g[1:])
        opt.apply_gradients(zip(grads, variables), unique_indices=True)
        return loss
    return split_step


def timed(step, n):
    for b in batches[:10]:
        step(b)
    t = time.perf_counter()
    for i in range(n):
        loss = step(batches[i % len(batches)])
    loss.numpy()
    return n * B / (time.perf_counter() - t)


kinds = sys.argv[1:] or ["reference", "xla", "xla_fm"]
steps = {k: make(k) for k in kinds}
res = {k: [] for k in kinds}
for r in range(3):
    for k in kinds:
        res[k].append(timed(steps[k], 200))
        print(r, k, f"{res[k][-1]:,.0f} ex/s", flush=True)
for k in kinds:
    print(k, f"median {statistics.median(res[k]):,.0f} ex/s", res[k])
