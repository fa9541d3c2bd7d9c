"""A Pipe-mode script as SageMaker's examples write it: PipeModeDataset over a TFRecord
channel, one dataset per epoch, parsed and batched with tf.data."""
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
with open(os.path.join(os.environ["SM_MODEL_DIR"], "pipe.json"), "w") as f:
    json.dump({"rows": rows}, f)
