import os

if os.environ["SM_CURRENT_HOST"] == "algo-2":
    raise ValueError("the learning rate must be positive, got -1")
