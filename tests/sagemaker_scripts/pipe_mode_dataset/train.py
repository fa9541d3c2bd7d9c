"""A Pipe-mode script as SageMaker's examples write it: PipeModeDataset over a TFRecord
channel, one dataset per epoch, parsed and batched with tf.data; then, as TF1-style scripts
do, one more epoch through a bare PipeModeDataset's iterator in graph mode."""
import argparse
import json
import os

import tensorflow as tf
from sagemaker_tensorflow import PipeModeDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args, _ = parser.parse_known_args()

features = {"x": tf.io.FixedLenFeature([3], tf.float32), "y": tf.io.FixedLenFeature([1], tf.float32)}


def parse(record):
    ex = tf.io.parse_single_example(record, features)
    return ex["x"], ex["y"]


rows = 0
for epoch in range(args.epochs):
    ds = PipeModeDataset(channel="training", record_format="TFRecord").map(parse).batch(8)
    for x, y in ds:
        rows += int(x.shape[0])
bare = 0
with tf.Graph().as_default():
    record = tf.compat.v1.data.make_one_shot_iterator(
        PipeModeDataset(channel="training", record_format="TFRecord")).get_next()
    with tf.compat.v1.Session() as sess:
        try:
            while True:
                sess.run(record)
                bare += 1
        except tf.errors.OutOfRangeError:
            pass
import sagemaker_tensorflow  # noqa: E402  (whose PipeModeDataset this is)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "pipe.json"), "w") as f:
    json.dump({"rows": rows, "bare": bare, "package": sagemaker_tensorflow.__file__}, f)
