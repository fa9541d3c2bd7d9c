"""Reads a Pipe-mode channel (SageMaker: one FIFO per channel per epoch) and counts bytes."""
import json
import os

channel = os.environ["SM_CHANNEL_TRAINING"]
with open(f"{channel}_0", "rb") as f:
    data = f.read()
out = os.path.join(os.environ["SM_MODEL_DIR"], f"pipe-{os.environ['SM_CURRENT_HOST']}.json")
with open(out, "w") as f:
    json.dump({"bytes": len(data), "lines": data.count(b"\n")}, f)
print(f"read {len(data)} bytes from {channel}_0")
