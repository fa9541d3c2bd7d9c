"""Processes that only serve: a TF gRPC server (parameter server, or a worker under
ParameterServerStrategy) or a tf.data service dispatcher / worker. They block in join()
forever; whoever runs the job ends them. Role from CTRTRAIN_ROLE, cluster from TF_CONFIG."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from ..usage import print_usage


def _wait_for_sigterm() -> None:
    """Blocks like server.join(), but in Python, so that on SIGTERM (the launcher stopping the
    job) the process reports its resource use and then dies of the signal as before."""
    def stop(signum, frame):
        print_usage()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(3600)


def serve() -> None:
    role = os.environ["CTRTRAIN_ROLE"]
    import tensorflow as tf
    if role in ("ps", "worker", "chief"):
        cfg = json.loads(os.environ["TF_CONFIG"])
        cluster = tf.train.ClusterSpec(cfg["cluster"])
        task = cfg["task"]
        print(f"serving as {task['type']} {task['index']} of {json.dumps(cfg['cluster'])}", flush=True)
        server = tf.distribute.Server(cluster, job_name=task["type"], task_index=task["index"],
                                      protocol="grpc", start=True)
        _wait_for_sigterm()
    elif role == "dispatcher":
        port = int(os.environ["CTRTRAIN_ADDRESS"].rsplit(":", 1)[1])
        server = tf.data.experimental.service.DispatchServer(
            tf.data.experimental.service.DispatcherConfig(port=port))
        print(f"tf.data service dispatcher on {server.target}", flush=True)
        _wait_for_sigterm()
    elif role == "data_worker":
        port = int(os.environ["CTRTRAIN_ADDRESS"].rsplit(":", 1)[1])
        dispatcher = os.environ["CTRTRAIN_DATA_SERVICE"].replace("grpc://", "")
        server = tf.data.experimental.service.WorkerServer(
            tf.data.experimental.service.WorkerConfig(
                dispatcher_address=dispatcher, port=port,
                worker_address=os.environ["CTRTRAIN_ADDRESS"]))
        print(f"tf.data service worker on port {port}, dispatcher {dispatcher}", flush=True)
        _wait_for_sigterm()
    else:
        sys.exit(f"ctrtrain server: no server for role {role!r}")


if __name__ == "__main__":
    serve()
