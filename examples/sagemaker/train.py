"""The multi-worker Keras example as SageMaker's TensorFlow (<= 2.15) containers run it:
MultiWorkerMirroredStrategy from TF_CONFIG (port 8890 on every host), model.fit, and
model.save(dir) as a SavedModel -- the chief into SM_MODEL_DIR/1, the others into a
temporary directory, as the TensorFlow tutorial has it."""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--model_dir", type=str)
parser.add_argument("--sm-model-dir", type=str, default=os.environ.get("SM_MODEL_DIR"))
args, _ = parser.parse_known_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
tf_config = json.loads(os.environ["TF_CONFIG"])
task = tf_config["task"]
rng = np.random.RandomState(0)
x = rng.randn(512, 4).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5], [0.0]], dtype="float32") > 0).astype("float32")
global_batch = args.batch_size * strategy.num_replicas_in_sync
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                                 tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                  metrics=["accuracy"])
history = model.fit(data, epochs=args.epochs, steps_per_epoch=10, verbose=2)

is_chief = task["type"] == "worker" and task["index"] == 0
target = os.path.join(args.sm_model_dir, "1") if is_chief else f"/tmp/worker-{task['index']}"
model.save(target)
if is_chief:
    with open(os.path.join(args.sm_model_dir, "history.json"), "w") as f:
        json.dump({"keras_model_class": tf.keras.Model.__module__, "tf": tf.__version__, "task": task,
                   "workers": tf_config["cluster"]["worker"],
                   "replicas": strategy.num_replicas_in_sync,
                   "accuracy": history.history["accuracy"]}, f)
