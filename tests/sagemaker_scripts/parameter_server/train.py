"""A SageMaker parameter-server script as they were written for the TensorFlow 2.x containers
up to 2.15: a tf.estimator model trained with train_and_evaluate. SageMaker runs it on every
host with TF_CONFIG naming the first host `master` and the others `worker` (port 2222), and a
parameter server beside each (port 2223); the Estimator places its variables on them. The
master exports the model for serving."""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--model_dir", type=str)
parser.add_argument("--max_steps", type=int, default=40)
parser.add_argument("--sm-model-dir", type=str, default=os.environ.get("SM_MODEL_DIR"))
parser.add_argument("--train", type=str, default=os.environ.get("SM_CHANNEL_TRAIN"))
args, _ = parser.parse_known_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
print("TF_CONFIG " + json.dumps(tf_config), flush=True)


def input_fn():
    x = np.load(os.path.join(args.train, "x.npy")).astype("float32")
    y = (x @ np.array([[2.0], [-1.0]], dtype="float32") + 0.5)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(16)


def model_fn(features, labels, mode):
    w = tf.compat.v1.get_variable("w", [2, 1])
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    pred = tf.matmul(features["x"], w) + b
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"y": pred})
    loss = tf.reduce_mean(tf.square(pred - labels))
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


estimator = tf.estimator.Estimator(model_fn, model_dir=args.model_dir,
                                   config=tf.estimator.RunConfig(save_checkpoints_steps=20))
tf.estimator.train_and_evaluate(
    estimator, tf.estimator.TrainSpec(input_fn, max_steps=args.max_steps),
    tf.estimator.EvalSpec(input_fn, steps=5, start_delay_secs=0, throttle_secs=0))

if tf_config["task"]["type"] == "master":
    def serving_input_fn():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        return tf.estimator.export.ServingInputReceiver({"x": x}, {"x": x})
    path = estimator.export_saved_model(args.sm_model_dir, serving_input_fn)
    weights = estimator.get_variable_value("w").ravel().tolist()
    with open(os.path.join(args.sm_model_dir, "result.json"), "w") as f:
        json.dump({"task": tf_config["task"], "w": weights,
                   "global_step": int(estimator.get_variable_value("global_step")),
                   "export": os.path.basename(path.decode() if isinstance(path, bytes) else path)}, f)
print("done", tf_config["task"], flush=True)
