"""A TensorFlow 2 Horovod script as SageMaker's Horovod examples write one (run under the
`mpi` distribution): hvd.init(), the learning rate scaled by hvd.size(), each rank its own
shard of the data, gradients averaged by DistributedGradientTape, rank 0's variables
broadcast after the first step, and rank 0 saving to SM_MODEL_DIR."""
import argparse
import json
import os
import socket

import horovod
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--model_dir", type=str)
parser.add_argument("--model-dir-local", type=str, default=os.environ.get("SM_MODEL_DIR"))
args, _ = parser.parse_known_args()

hvd.init()
rng = np.random.default_rng(hvd.rank())            # this rank's shard
x = tf.constant(rng.normal(size=(64, 3)), tf.float32)
y = tf.reduce_sum(x * [1.0, -2.0, 0.5], axis=1, keepdims=True)
w = tf.Variable(tf.zeros((3, 1)))
opt = tf.optimizers.SGD(args.lr * hvd.size())


@tf.function
def step(first):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
    if first:
        hvd.broadcast_variables([w], root_rank=0)
    return loss


for i in range(args.steps):
    step(i == 0)
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
me = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
      "host": socket.gethostname(), "current_host": os.environ.get("SM_CURRENT_HOST"),
      "tf": tf.__version__, "horovod": horovod.__version__, "sum": float(total.numpy()[0]),
      "gloo": hvd.gloo_enabled(), "mpi": hvd.mpi_enabled(), "w": w.numpy().ravel().tolist()}
everyone = hvd.allgather_object(me)
if hvd.rank() == 0:
    with open(os.path.join(args.model_dir_local, "ranks.json"), "w") as f:
        json.dump(everyone, f)
