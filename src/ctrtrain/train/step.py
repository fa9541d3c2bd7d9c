"""The model, its optimizer and the compiled training step, built in one place so training,
the benchmark and the profiler run exactly the same step."""

from __future__ import annotations

import tensorflow as tf

from ..models.deepfm import DeepFM, DeepFMConfig
from ..models.optimizers import make_optimizer


def build_training(model_cfg: DeepFMConfig, optimizer: str, learning_rate: float):
    """(model, optimizer, train_step): train_step(batch) applies one update, returns the loss."""
    model = DeepFM(model_cfg)
    opt = make_optimizer(optimizer, learning_rate)
    variables = model.embedding_tables + model.dense_variables()
    opt.build(variables, tables=model.embedding_tables)

    @tf.function
    def train_step(batch):
        with tf.GradientTape() as tape:
            logits, l2 = model(batch["ids"], batch["values"], training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=batch["label"], logits=logits))
            total = loss + l2  # inside the tape: the sum must be recorded to be differentiated
        grads = tape.gradient(total, variables)
        opt.apply_gradients(zip(grads, variables), unique_indices=model.unique_gradients)
        return loss

    return model, opt, train_step
