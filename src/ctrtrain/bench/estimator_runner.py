"""The public SageMaker DeepFM sample's training (a TF1 Estimator) as a speed reference for
`ctrtrain bench train --estimator-python`, in an environment with tf.estimator (TensorFlow
2.15: .venv-hvd). Run by path with that environment's python; imports TensorFlow only.

    python estimator_runner.py PARAMS_JSON   ->  {"examples_per_s": ..., "step_ms": ...}

The model and training are the sample's model_fn, written here after its structure: separate
w [feature_size] and V [feature_size, k] tables (glorot-normal), first order, FM second order,
an MLP of dense layers with dropout, loss = mean logloss + l2_reg * (l2_loss(w) + l2_loss(V))
(whole tables: every step's gradient is dense), tf.compat.v1.train.AdamOptimizer(lr, 0.9,
0.999, 1e-8); its input_fn parses example by example, then shuffle(1000), repeat, batch. It
reads the benchmark's TFRecords (the sample's schema: label, ids, values).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
CURVE_STEPS = 50


def main(p: dict) -> None:
    import tensorflow as tf
    v1 = tf.compat.v1
    F, k = p["field_size"], p["embedding_size"]

    def input_fn():
        files = p["files"]
        spec = {"label": tf.io.FixedLenFeature([1], tf.float32),
                "ids": tf.io.FixedLenFeature([F], tf.int64),
                "values": tf.io.FixedLenFeature([F], tf.float32)}

        def parse(record):
            ex = tf.io.parse_single_example(record, spec)
            return {"feat_ids": ex["ids"], "feat_vals": ex["values"]}, ex["label"]
        ds = tf.data.TFRecordDataset(files, compression_type=p.get("compression") or "")
        ds = ds.map(parse, num_parallel_calls=10).prefetch(500000)
        return ds.shuffle(1000).repeat().batch(p["batch_size"])

    def model_fn(features, labels, mode, params):
        fm_b = v1.get_variable("fm_bias", [1], initializer=v1.constant_initializer(0.0))
        fm_w = v1.get_variable("fm_w", [p["feature_size"]], initializer=v1.glorot_normal_initializer())
        fm_v = v1.get_variable("fm_v", [p["feature_size"], k],
                               initializer=v1.glorot_normal_initializer())
        ids, vals = features["feat_ids"], features["feat_vals"]
        y_w = tf.reduce_sum(tf.nn.embedding_lookup(fm_w, ids) * vals, 1)
        emb = tf.nn.embedding_lookup(fm_v, ids) * tf.reshape(vals, [-1, F, 1])
        y_v = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(emb, 1))
                                  - tf.reduce_sum(tf.square(emb), 1), 1)
        deep = tf.reshape(emb, [-1, F * k])
        training = mode == tf.estimator.ModeKeys.TRAIN
        for units in p["deep_layers"]:
            deep = v1.layers.dense(deep, units, activation=tf.nn.relu)
            if training and p.get("dropout"):
                deep = tf.nn.dropout(deep, rate=p["dropout"])
        y_d = tf.reshape(v1.layers.dense(deep, 1), [-1])
        logits = fm_b + y_w + y_v + y_d
        loss = (tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                    labels=tf.reshape(labels, [-1]), logits=logits))
                + p["l2"] * tf.nn.l2_loss(fm_w) + p["l2"] * tf.nn.l2_loss(fm_v))
        opt = v1.train.AdamOptimizer(p["learning_rate"], beta1=0.9, beta2=0.999, epsilon=1e-8)
        train_op = opt.minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode=mode, loss=loss, train_op=train_op)

    class Clock(tf.estimator.SessionRunHook):
        def __init__(self):
            self.times = []

        def after_run(self, run_context, run_values):
            self.times.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as md:
        est = tf.estimator.Estimator(model_fn, model_dir=md, config=tf.estimator.RunConfig(
            save_checkpoints_steps=None, save_checkpoints_secs=None, save_summary_steps=None,
            log_step_count_steps=None))
        clock = Clock()
        est.train(input_fn, steps=p["warmup"] + p["steps"], hooks=[clock])
    measured = clock.times[p["warmup"]:]
    if len(measured) < 2:
        sys.exit(f"estimator reference: {len(clock.times)} steps ran of the "
                 f"{p['warmup'] + p['steps']} asked (no data in {len(p['files'])} files?)")
    secs = measured[-1] - measured[0]
    steps = len(measured) - 1
    # The warm-up curve: examples/s of each CURVE_STEPS steps from the start, the input
    # buffer filling beside the steps in the first ones.
    t, n = clock.times, CURVE_STEPS
    curve = [{"step": i + n, "examples_per_s": n * p["batch_size"] / (t[i + n] - t[i])}
             for i in range(0, len(t) - n, n)]
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"examples_per_s": steps * p["batch_size"] / secs,
                      "step_ms": 1000 * secs / steps, "tensorflow": tf.__version__,
                      "curve": curve, "cpu_s": own.ru_utime + own.ru_stime + kids.ru_utime
                      + kids.ru_stime}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    # Its figures are printed. TensorFlow's teardown at interpreter exit (0.6-1.7 CPU-s, which
    # no figure includes) writes nothing: the process ends at once, as ctrtrain's own do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
