"""The model, its optimizer and the compiled training step, built in one place so training
(every synchronous mode), the benchmark and the profiler run exactly the same step."""

from __future__ import annotations

import tensorflow as tf

from ..models import build_model
from ..models.base import ModelConfig
from ..models.engine.optimizers import make_optimizer
from ..models.engine.tables import rows_by_shard


def build_training(model_cfg: ModelConfig, optimizer: str, learning_rate: float, runtime=None,
                   compile_step: bool = True, optimizer_params: dict | None = None):
    """(model, opt, train_step, variables); train_step(batch) applies one update and returns
    the mean loss. Call inside runtime.scope(). `runtime` (train/runtime.py) says how replicas
    combine gradients; None = one process, one replica. With compile_step=False the step is
    the per-replica function, for callers that schedule it themselves (parameter servers).
    `optimizer_params`: the optimizer's settings, with table_updates and table_l2."""
    model = build_model(model_cfg)
    opt = make_optimizer(optimizer, learning_rate, **(optimizer_params or {}))
    variables = model.embedding_tables + model.dense_variables()
    opt.build(variables, tables=model.embedding_tables, terms=model.gradient_terms())
    replicas = runtime.replicas if runtime else 1
    # After a cross-replica reduction a table's gradient rows may repeat (one set per replica).
    unique = model.unique_gradients and replicas == 1

    share = runtime.assign_keys if runtime is not None else None

    def claim_rows(batch):
        """The batch with its dynamic fields' keys mapped to rows; new keys' rows renewed
        with their optimizer state before the forward pass reads them
        (models/engine/dynamic.py)."""
        batch, rows = model.claim_rows(batch, opt.iterations, share=share)
        model.embeddings.renew(rows, opt.iterations)
        for shard, own, _ in rows_by_shard(model.table, rows):
            opt.reset_rows(shard, own)
        return batch

    def replica_step(batch):
        dynamic = model.dynamic is not None
        if dynamic:
            batch = claim_rows(batch)
        with tf.GradientTape() as tape:
            # The dense kernels' L2 penalty (the second value) is not differentiated here:
            # its gradient is added in their update (model.gradient_terms), after the
            # replicas' reduction, once.
            logits, _ = model(batch, training=True, read_rows=opt.read_rows,
                              keys_mapped=dynamic)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=batch["label"], logits=logits))
            # Divided by the replicas so that SUM-reduced gradients are those of the global
            # batch's mean loss.
            total = loss / replicas
        grads = tape.gradient(total, variables)
        if runtime is not None:
            grads = runtime.reduce_gradients(grads)
        opt.apply_gradients(zip(grads, variables), unique_indices=unique)
        return loss

    if not compile_step:
        return model, opt, replica_step, variables
    if runtime is None:
        return model, opt, tf.function(replica_step, autograph=False), variables
    return model, opt, tf.function(lambda batch: runtime.run(replica_step, batch),
                                   autograph=False), variables


def stacked_steps_function(replica_step, runtime=None):
    """steps(stack, start, count) -> the losses of up to `count` training steps, the j-th on
    batch start + j of `stack` (each tensor [K, ...]: K batches, the input's `.batch(K)`),
    ending early after a non-finite loss (the last one returned). Several steps in one
    compiled call: a call's dispatch costs about a millisecond on 2 cores, paid once for all
    (the reference configuration through the trainer: 7.80 ms a step with 10 steps a call,
    8.88 with one; docs/benchmarks.md)."""

    def one(stack, i):
        return replica_step(tf.nest.map_structure(lambda t: t[i], stack))

    @tf.function(reduce_retracing=True, autograph=False)
    def steps(stack, start, count):
        def more(j, losses, finite):
            return tf.logical_and(finite, j < count)

        def step(j, losses, finite):
            loss = tf.cast(runtime.run(one, stack, start + j) if runtime is not None
                           else one(stack, start + j), tf.float32)
            return j + 1, losses.write(j, loss), tf.math.is_finite(loss)
        # One step after the other (parallel_iterations 1): a step reads what the previous one
        # wrote, and the collectives of two steps (the same ops, the same instance keys) must
        # not meet.
        _, losses, _ = tf.while_loop(
            more, step, (tf.zeros_like(count), tf.TensorArray(tf.float32, size=0, dynamic_size=True),
                         tf.constant(True)), parallel_iterations=1)
        return losses.stack()
    return steps


def settle_function(opt, runtime=None):
    """A compiled opt.settle() that updates every replica's copy of the tables."""
    if runtime is None or runtime.strategy is None:
        return tf.function(opt.settle, autograph=False)
    return tf.function(lambda: runtime.strategy.run(opt.settle), autograph=False)
