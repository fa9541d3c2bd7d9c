"""xDeepFM's CIN alone, forward and backward, three ways: the paper's form with TensorFlow's
ops (every layer per embedding dimension, then summed; the full row-wise outer products,
their gradient two Muls and two Sums over [B D, H m]); the same with the kernels (the first
layer over the distinct pairs of fields, CtrPairProduct, half its matmul; every product's
gradient in one pass, CtrOuterProductGrad); and the kernels with the last layer summed over
the dimensions first (CIN.pool_last_first, the default). float32 and bfloat16
(`--mixed-precision`'s CIN). The reference shapes: a batch of 1,024, 39 fields, embedding 16,
maps 128,128; 10 calls x 7 rounds, the ways timed alternately, medians in ms a step:

    .venv/bin/python scripts/cin_backward.py [BATCH]
"""
import statistics
import sys
import time

import tensorflow as tf

from ctrtrain import kernels
from ctrtrain.models.blocks import CIN
from ctrtrain.train.threads import ThreadConfig, apply_threads


def main():
    batch = int(sys.argv[1]) if sys.argv[1:] else 1024
    apply_threads(ThreadConfig())
    if not kernels.available():
        sys.exit("the kernels are not built (python -m ctrtrain.kernels.build)")
    vectors = tf.random.normal([batch, 39, 16], stddev=0.1)
    calls = {}
    for dtype in ("float32", "bfloat16"):
        ways = (("tensorflow's ops, per dimension", False, False),
                ("the kernels, per dimension", True, False),
                ("the kernels, last pooled first", True, True))
        for way, on, first in ways:
            cin = CIN(39, [128, 128], seed=1, mixed_precision=dtype == "bfloat16")
            cin.pool_last_first = first
            kernels.set_enabled(on)

            @tf.function
            def step(v, cin=cin):
                with tf.GradientTape() as tape:
                    tape.watch(v)
                    loss = tf.reduce_sum(cin(v))
                return tape.gradient(loss, [v] + cin.kernels)

            step(vectors)               # traced now, with the kernels on or off
            calls[f"{dtype:9s} {way}"] = step
    kernels.set_enabled(True)
    times = {k: [] for k in calls}
    for _ in range(7):
        for k, f in calls.items():
            f(vectors)
            t = time.perf_counter()
            for _ in range(10):
                [g.numpy() for g in f(vectors)[:1]]
            times[k].append((time.perf_counter() - t) / 10 * 1e3)
    for k, v in times.items():
        print(f"{k:42s} {statistics.median(v):7.1f} ms  ({' / '.join(f'{x:.1f}' for x in v)})")


if __name__ == "__main__":
    main()
