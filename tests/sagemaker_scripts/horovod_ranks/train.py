"""A Horovod script as SageMaker's Horovod examples are written: hvd.init(), one process per
slot, the local rank choosing the device, an allreduce, rank 0 saving. In a heterogeneous job
the hosts of a group outside the distribution run it once each, without Horovod."""
import json
import os
import socket
import sys

if os.environ.get("SM_CURRENT_INSTANCE_GROUP") == "data_group":
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "ran.json"), "w") as f:
        json.dump({"host": socket.gethostname(), "argv": sys.argv[1:]}, f)
    sys.exit(0)

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum)
me = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
      "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
      "cross_size": hvd.cross_size(), "host": socket.gethostname(),
      "sum": float(total.numpy()[0]),
      "env": {k: os.environ.get(k) for k in ("OMPI_COMM_WORLD_LOCAL_RANK", "SM_CURRENT_HOST",
                                             "NCCL_DEBUG", "MY_FLAG", "SM_FRAMEWORK_PARAMS")}}
everyone = hvd.allgather_object(me)
# As the training toolkit's own hvdbasic test: every rank saves a file of its own (all of them
# are in model.tar.gz), and each host's first rank one of the same name on every host.
model_dir = os.environ.get("SM_MODEL_DIR", "")
if model_dir:
    with open(os.path.join(model_dir, f"rank-{hvd.rank()}"), "w") as f:
        f.write(socket.gethostname())
    if hvd.local_rank() == 0:
        with open(os.path.join(model_dir, "host"), "w") as f:
            f.write(socket.gethostname())
if hvd.rank() == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "ranks.json"), "w") as f:
        json.dump(everyone, f)
