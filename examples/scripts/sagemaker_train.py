"""A training script written as SageMaker's documentation describes, run unchanged by
`ctrtrain launch`: hyperparameters arrive as --key value, data under SM_CHANNEL_TRAINING,
the cluster in SM_HOSTS / SM_CURRENT_HOST, and the model goes to SM_MODEL_DIR."""
import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--learning_rate", type=float, default=0.1)
args = parser.parse_args()

train_dir = os.environ["SM_CHANNEL_TRAINING"]
hosts = json.loads(os.environ["SM_HOSTS"])
current = os.environ["SM_CURRENT_HOST"]
rows = 0
for name in sorted(os.listdir(train_dir)):
    with open(os.path.join(train_dir, name)) as f:
        rows += sum(1 for _ in f)
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"model-{current}.json"), "w") as f:
    json.dump({"host": current, "hosts": hosts, "rows": rows, "files": sorted(os.listdir(train_dir)),
               "epochs": args.epochs, "learning_rate": args.learning_rate}, f)
print(f"{current}: {rows} rows from {train_dir}")
