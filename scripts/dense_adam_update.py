"""Adam's update of one dense variable, measured alone: TensorFlow's ResourceApplyAdam against
CtrAdamDense, which also folds an L2 term (and, for the MLP's first kernel, a row mask) into
the gradient in the same pass (optimizers.py Adam._dense_with_terms).

Each shape: 200 updates a call, 3 rounds, the two timed alternately; the best round's ms per
update:

    .venv/bin/python scripts/dense_adam_update.py
"""
import sys
import time

import tensorflow as tf
from tensorflow.python.ops import gen_training_ops as raw

from ctrtrain import kernels
from ctrtrain.train.threads import ThreadConfig, apply_threads

# DCN-v2's full-rank cross kernel, DeepFM's first MLP kernel, a hidden one, a wide flat one
SHAPES = [(624, 624), (663, 256), (256, 256), (3, 200_000)]


def repeated(update):
    """A compiled loop of n updates, each after the one before."""
    @tf.function(autograph=False)
    def loop(n):
        def body(i):
            with tf.control_dependencies([update()]):
                return [i + 1]
        return tf.while_loop(lambda i: i < n, body, [0], parallel_iterations=1)
    return loop


def main():
    apply_threads(ThreadConfig())
    if not kernels.available():
        sys.exit("the kernels are not built (python -m ctrtrain.kernels.build)")
    for shape in SHAPES:
        w, m, v = (tf.Variable(tf.random.normal(shape) if i == 0 else tf.zeros(shape))
                   for i in range(3))
        g, c = tf.random.normal(shape), tf.constant

        def fused():
            return kernels.adam_dense(w, m, v, g, None, c(1e-3), 0.9, 0.999, 1e-7, 1e-4)

        def tensorflow_op():
            return raw.ResourceApplyAdam(var=w.handle, m=m.handle, v=v.handle,
                                         beta1_power=c(0.5), beta2_power=c(0.5), lr=c(1e-3),
                                         beta1=c(0.9), beta2=c(0.999), epsilon=c(1e-7), grad=g)
        fused, tensorflow_op = repeated(fused), repeated(tensorflow_op)

        best = {}
        for name, f in (("CtrAdamDense", fused), ("ResourceApplyAdam", tensorflow_op)):
            f(c(5))
        for _ in range(3):
            for name, f in (("CtrAdamDense", fused), ("ResourceApplyAdam", tensorflow_op)):
                t = time.perf_counter()
                f(c(200))
                ms = (time.perf_counter() - t) / 200 * 1e3
                best[name] = min(best.get(name, ms), ms)
        print(f"{shape}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in best.items()))


if __name__ == "__main__":
    main()
