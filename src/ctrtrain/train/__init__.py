"""Training: loops per strategy, evaluation, checkpoints, export and batch prediction."""
