"""A heterogeneous job in the style of SageMaker's tf.data service example: the same script on
every host; the hosts of `data_group` serve the input pipeline with tf.data service on fixed
ports, the host of `dnn_group` trains on what they produce and, when done, tells them to stop."""
import json
import os
import socket

import numpy as np
import tensorflow as tf
from sagemaker_training import environment

DISPATCHER_PORT, WORKER_PORT, STOP_PORT = 6000, 6001, 16000
env = environment.Environment()
data_hosts = env.instance_groups_dict["data_group"]["hosts"]
dispatcher = data_hosts[0]

if env.current_instance_group == "data_group":
    if env.current_host == dispatcher:
        d = tf.data.experimental.service.DispatchServer(
            tf.data.experimental.service.DispatcherConfig(port=DISPATCHER_PORT))
    w = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=f"{dispatcher}:{DISPATCHER_PORT}", port=WORKER_PORT,
            worker_address=f"{env.current_host}:{WORKER_PORT}"))
    stop = socket.socket()
    stop.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    stop.bind(("0.0.0.0", STOP_PORT))
    stop.listen()
    conn, _ = stop.accept()      # the trainer says training is over
    conn.close()
    print("data service stopped by the trainer", flush=True)
else:
    def preprocess(x):
        return x, tf.cast(tf.reduce_sum(x, axis=-1, keepdims=True) > 0, tf.float32)
    ds = (tf.data.Dataset.from_tensor_slices(np.random.RandomState(1).randn(256, 3).astype("float32"))
          .map(preprocess).batch(32).repeat()
          .apply(tf.data.experimental.service.distribute(
              processing_mode="parallel_epochs", service=f"grpc://{dispatcher}:{DISPATCHER_PORT}")))
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy")
    history = model.fit(ds, epochs=2, steps_per_epoch=8, verbose=2)
    model_dir = os.environ["SM_MODEL_DIR"]
    model.save(os.path.join(model_dir, "model.keras"))
    with open(os.path.join(model_dir, "history.json"), "w") as f:
        json.dump({"loss": history.history["loss"], "host": env.current_host,
                   "dispatcher": dispatcher}, f)
    for h in data_hosts:
        socket.create_connection((h, STOP_PORT), timeout=30).close()
