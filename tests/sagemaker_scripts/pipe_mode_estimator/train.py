"""A Pipe-mode Estimator script written like the deep-learning containers' own Pipe-mode test:
an Estimator trains on a PipeModeDataset repeated for `epochs`, checks that the platform has
made the FIFO after the ones it read, evaluates the same way, then makes new
PipeModeDatasets on the channel several times in graph mode (read, discard, recreate). The
script never says how many epochs the channel serves: SageMaker makes each FIFO on demand."""
import json
import os

import tensorflow as tf
from sagemaker_tensorflow import PipeModeDataset

hp = json.load(open("/opt/ml/input/config/hyperparameters.json"))
channel = hp.get("channel", "training")
epochs = int(hp.get("epochs", 3))
dimension = int(hp["dimension"])
batch_size = int(hp.get("batch_size", 5))


features = {"data": tf.io.FixedLenFeature([], tf.string),
            "labels": tf.io.FixedLenFeature([], tf.int64)}


def parse(record):
    parsed = tf.io.parse_single_example(serialized=record, features=features)
    return {"data": tf.io.decode_raw(parsed["data"], tf.float64)}, parsed["labels"]


def input_fn():
    ds = PipeModeDataset(channel, record_format="TFRecord")
    if epochs > 1:
        ds = ds.repeat(epochs)
    ds = ds.prefetch(100)
    ds = ds.map(parse, num_parallel_calls=2)
    return ds.batch(batch_size)


column = tf.feature_column.numeric_column("data", shape=(dimension,))
estimator = tf.estimator.LinearClassifier(feature_columns=[column])
estimator.train(input_fn=input_fn)
fifos = sorted(n for n in os.listdir("/opt/ml/input/data") if n.startswith(channel + "_"))
print("FIFOs after training:", fifos, flush=True)
assert os.path.exists(f"/opt/ml/input/data/{channel}_{epochs + 1}")

result = estimator.evaluate(input_fn=input_fn)
print("evaluation:", {k: float(v) for k, v in sorted(result.items())}, flush=True)

# New datasets on the same channel after training, in graph mode.
tf.compat.v1.disable_eager_execution()
ds = PipeModeDataset(channel, record_format="TFRecord")
with tf.compat.v1.Session() as sess:
    first = sess.run(tf.compat.v1.data.make_one_shot_iterator(ds).get_next())

# Create, read, discard, recreate.
ds = PipeModeDataset(channel, record_format="TFRecord")
with tf.compat.v1.Session() as sess:
    it = tf.compat.v1.data.make_one_shot_iterator(ds)
    next_record = it.get_next()
with tf.compat.v1.Session() as sess:
    it = tf.compat.v1.data.make_one_shot_iterator(ds)
    again = sess.run(it.get_next())
ds = PipeModeDataset(channel, record_format="TFRecord")
with tf.compat.v1.Session() as sess:
    records = 0
    next_record = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    try:
        while True:
            sess.run(next_record)
            records += 1
    except tf.errors.OutOfRangeError:
        pass

with open(os.path.join(os.environ["SM_MODEL_DIR"], "pipe.json"), "w") as f:
    json.dump({"evaluated": int(result["global_step"]), "same_first": bool(first == again),
               "last_epoch_records": records, "fifos_after_training": fifos}, f)
