"""A Keras 2 script as SageMaker's TensorFlow 2.x examples write it for one host: model.fit
on in-memory data, model.save(dir) as a SavedModel in SM_MODEL_DIR/1."""
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

rng = np.random.RandomState(0)
x = rng.randn(512, 4).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5], [0.0]], dtype="float32") > 0).astype("float32")
model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                             tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="binary_crossentropy",
              metrics=["accuracy"])
history = model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=2)
model.save(os.path.join(args.sm_model_dir, "1"))
with open(os.path.join(args.sm_model_dir, "history.json"), "w") as f:
    json.dump({"keras_model_class": tf.keras.Model.__module__, "tf": tf.__version__,
               "accuracy": history.history["accuracy"]}, f)
