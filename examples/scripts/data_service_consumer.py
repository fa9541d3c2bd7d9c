"""A training process of a heterogeneous cluster: its input pipeline runs on the CPU group's
tf.data service (dispatcher address in CTRTRAIN_DATA_SERVICE), consumed with distribute()."""
import json
import os

import tensorflow as tf

service = os.environ["CTRTRAIN_DATA_SERVICE"]
mode = os.environ.get("CTRTRAIN_DATA_SERVICE_MODE", "parallel_epochs")  # from the job spec
ds = tf.data.Dataset.range(1000).map(lambda x: x * 2)
ds = ds.apply(tf.data.experimental.service.distribute(processing_mode=mode, service=service,
                                                      job_name="shared-job"))
values = [int(v) for v in ds]
rank = os.environ.get("RANK", "0")
print(f"rank {rank}: {len(values)} elements from {service} ({mode})", flush=True)
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"consumed-{rank}.json"), "w") as f:
    json.dump(sorted(values), f)
