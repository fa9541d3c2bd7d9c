"""One MLP layer's backward through dropout, ReLU and its bias, measured: TensorFlow's three ops
(CtrDropout's gradient, ReluGrad, the bias's Sum over the rows) against CtrReluDropoutGrad's
one pass, and a plain element-wise op over the same [B, n] as the floor.

Ten layers a call (a [1024, 400] gradient each, DeepFM's hidden width, dropout 0.5), 30 calls
x 7 rounds, the three timed alternately; medians in ms per layer:

    .venv/bin/python scripts/mlp_layer_backward.py [BATCH WIDTH]
"""
import statistics
import sys
import time

import tensorflow as tf

from ctrtrain import kernels
from ctrtrain.train.threads import ThreadConfig, apply_threads


def main():
    batch, width = (int(a) for a in (sys.argv[1:3] or (1024, 400)))
    apply_threads(ThreadConfig())
    if not kernels.available():
        sys.exit("the kernels are not built (python -m ctrtrain.kernels.build)")
    rate, seed = 0.5, tf.constant([1, 2], tf.int64)
    ys = [kernels.dropout(tf.nn.relu(tf.random.normal([batch, width])), rate, seed)
          for _ in range(10)]
    dys = [tf.random.normal([batch, width]) for _ in range(10)]

    def tensorflow_ops(dy, y):
        dz = tf.raw_ops.ReluGrad(gradients=kernels.dropout(dy, rate, seed), features=y)
        return dz, tf.reduce_sum(dz, 0)

    ways = {"tensorflow's ops": tensorflow_ops,
            "one pass": lambda dy, y: kernels.relu_dropout_grad(dy, y, rate),
            "element-wise floor": lambda dy, y: dy * 2.0}
    calls = {k: tf.function(lambda dys, ys, f=f: [f(dy, y) for dy, y in zip(dys, ys)])
             for k, f in ways.items()}
    times = {k: [] for k in ways}
    for _ in range(7):
        for k, f in calls.items():
            for _ in range(3):
                f(dys, ys)
            t = time.perf_counter()
            for _ in range(30):
                f(dys, ys)
            times[k].append((time.perf_counter() - t) / 30 / 10 * 1e3)
    for k, v in times.items():
        print(f"{k:20s} {statistics.median(v):.3f} ms a layer  ({' / '.join(f'{x:.3f}' for x in v)})")


if __name__ == "__main__":
    main()
