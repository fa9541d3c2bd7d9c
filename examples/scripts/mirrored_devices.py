"""Several devices on one host: MirroredStrategy over local devices. On a CPU-only machine the
CPU is split into logical devices (set LOGICAL_CPUS), so the same script runs on GPUs unchanged."""
import json
import os

import tensorflow as tf

n = int(os.environ.get("LOGICAL_CPUS", "2"))
if not tf.config.list_physical_devices("GPU"):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    w = tf.Variable(tf.zeros([4, 1]))
x = tf.random.stateless_normal([256, 4], seed=[1, 2])
y = x @ tf.constant([[1.0], [-2.0], [0.5], [3.0]])
ds = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32))


@tf.function
def step(batch):
    def replica(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((xb @ w - yb) ** 2)
        g = tape.gradient(loss, w)
        g = tf.distribute.get_replica_context().all_reduce("MEAN", g)
        w.assign_sub(0.1 * g)
        return loss
    return strategy.run(replica, args=batch)


it = iter(ds)
for i in range(100):
    loss = strategy.reduce("MEAN", step(next(it)), None)
print(f"{strategy.num_replicas_in_sync} replicas, final loss {float(loss):.5f}", flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "mirrored.json"), "w") as f:
    json.dump({"replicas": strategy.num_replicas_in_sync, "loss": float(loss),
               "w": w.numpy().ravel().tolist()}, f)
