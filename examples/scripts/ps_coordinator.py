"""The chief of a TF2 parameter-server job: a ClusterCoordinator schedules steps on the workers
against variables that live on the parameter servers (cluster from TF_CONFIG)."""
import json
import os

import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    counter = tf.Variable(0.0)


@tf.function
def step():
    counter.assign_add(1.0)
    return counter.read_value()


for _ in range(20):
    coordinator.schedule(step)
coordinator.join()
print(f"20 steps scheduled on {len(resolver.cluster_spec().as_dict()['worker'])} workers; "
      f"counter = {counter.numpy()}", flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "ps_result.json"), "w") as f:
    json.dump({"counter": float(counter.numpy())}, f)
