"""A Horovod-style MNIST script rewritten to TensorFlow's own collective all-reduce
(MultiWorkerMirroredStrategy, cluster from TF_CONFIG): synchronous data-parallel training,
each worker on its shard, rank 0 saves the model. MNIST-like data is generated (no download):
28x28 images whose label a fixed linear teacher decides, so accuracy must rise well above
chance. Plain tf.Module (no Keras) so it runs on any TF 2.x."""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch_size", type=int, default=64)       # per worker
parser.add_argument("--learning_rate", type=float, default=0.5)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rank = int(os.environ.get("RANK", 0))
world = int(os.environ.get("WORLD_SIZE", 1))
teacher = np.random.default_rng(0).normal(size=(784, 10)).astype(np.float32)


def shard(rank, n=4096):
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(n, 784)).astype(np.float32)
    return x, np.argmax(x @ teacher, 1).astype(np.int64)


x, y = shard(rank)
ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)

with strategy.scope():
    w = tf.Variable(tf.zeros([784, 10]))
    b = tf.Variable(tf.zeros([10]))


@tf.function
def step(xb, yb):
    def replica(xb, yb):
        with tf.GradientTape() as tape:
            logits = xb @ w + b
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits))
        gw, gb = tape.gradient(loss, [w, b])
        ctx = tf.distribute.get_replica_context()
        gw, gb = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, [gw, gb])
        w.assign_sub(args.learning_rate * gw)
        b.assign_sub(args.learning_rate * gb)
        return loss
    return strategy.run(replica, args=(xb, yb))


it = iter(ds)
for i in range(args.steps):
    xb, yb = next(it)
    loss = step(xb, yb)
    if i % 20 == 0:
        print(f"rank {rank}/{world} step {i} loss {float(strategy.reduce('MEAN', loss, None)):.4f}", flush=True)
xt, yt = shard(99, 2000)
acc = float(np.mean(np.argmax(xt @ w.numpy() + b.numpy(), 1) == yt))
print(f"rank {rank} accuracy {acc:.3f}", flush=True)
if rank == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "mnist_like.json"), "w") as f:
        json.dump({"accuracy": acc, "world_size": world, "steps": args.steps,
                   "w_checksum": float(np.abs(w.numpy()).sum())}, f)
