"""Written as many public SageMaker scripts are: the platform's paths hard-coded, a channel
with sub-folders read by walking it, scratch files in /tmp, checkpoints in /opt/ml/checkpoints,
the model in /opt/ml/model."""
import argparse
import json
import os
import socket

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--verbose", type=str, default="False")
args, _ = parser.parse_known_args()

with open("/opt/ml/input/config/resourceconfig.json") as f:
    resources = json.load(f)
with open("/opt/ml/input/config/hyperparameters.json") as f:
    hyperparameters = json.load(f)
host = resources["current_host"]

seen = {}
for root, _, files in os.walk("/opt/ml/input/data/training"):
    for name in files:
        path = os.path.join(root, name)
        seen[os.path.relpath(path, "/opt/ml/input/data/training")] = open(path).read()
# Scripts sometimes write next to their input (a cache, a decompressed copy).
with open("/opt/ml/input/data/training/train/part-0.csv", "a") as f:
    f.write("appended by " + host + "\n")

with open("/tmp/scratch.txt", "a") as f:       # this host's own /tmp
    f.write(host + "\n")
os.makedirs("/opt/ml/checkpoints", exist_ok=True)
with open(f"/opt/ml/checkpoints/{host}.ckpt", "w") as f:
    f.write(str(args.epochs))
os.makedirs("/opt/ml/model", exist_ok=True)
with open(f"/opt/ml/model/{host}.json", "w") as f:
    json.dump({"host": host, "hostname": socket.gethostname(), "epochs": args.epochs,
               "verbose": args.verbose, "cwd": os.getcwd(), "files": seen,
               "scratch": open("/tmp/scratch.txt").read().split(),
               "checkpoints": sorted(os.listdir("/opt/ml/checkpoints")),
               "hyperparameters": hyperparameters}, f)
