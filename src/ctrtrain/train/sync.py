"""The synchronous modes' trainer (single, mirrored, allreduce, horovod; runtime.py says how
each combines gradients), run by the controller.

In a multi-process job every process runs the same number of steps, computed from the job's
total record count (summed over readers at start), and repeats its own part of the data as
often as needed, so uneven shards never leave a rank waiting for the others. Only the chief
writes: checkpoints, metrics, evaluations and the export. Mid-training the other ranks wait
for its evaluation (and its early-stopping decision, SyncTrainer.agree); at the end they do
not (they have finished)."""

from __future__ import annotations

import dataclasses
import time

from .. import heartbeat
from ..data.index import describe_source
from ..errors import ConfigError
from . import tracking
from .config import TrainConfig, model_config, optimizer_params, run_schema
from .controller import ChiefActions, Controller, StepStats, announce_model_choice, finish
from .inputs import (check_data, local_records, planned_steps, positive_rate, schedule_of,
                     train_read_error, training_dataset)
from .metrics_log import MetricsLog, run_settings
from .model_dir import (announce_resume, data_fingerprint, data_vocabulary, prepare_model_dir,
                        restore_checkpoint, write_checkpoint)


class SyncTrainer(ChiefActions):
    """Runs steps of the compiled synchronous step on this process's input: its elements are
    stacks of up to steps_per_execution batches (training_dataset), run by one call of
    `train_steps` (step.py stacked_steps_function) as far as the controller's next event
    allows; the rest of a stack goes to the next call."""

    def __init__(self, cfg: TrainConfig, rt, model, opt, train_steps, variables, manager,
                 start_step: int, data_iter, log, feature_size: int, explain):
        from .evaluate import make_predict_fn
        from .step import settle_function
        self.cfg, self.rt, self.model, self.opt = cfg, rt, model, opt
        self.run_steps, self.variables, self.manager = train_steps, variables, manager
        self.step, self.start_step, self.it, self.log = start_step, start_step, data_iter, log
        self.feature_size, self.explain = feature_size, explain
        self.predict = make_predict_fn(model)
        self._settle = settle_function(opt, rt)
        self._stack, self._stack_len, self._at = None, 0, 0

    def settle(self) -> None:
        self._settle()

    def _next_stack(self) -> bool:
        """The next stack of batches from the input (False: the data ended)."""
        import tensorflow as tf
        try:
            self._stack = next(self.it)
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            raise self.explain(e) from None
        except StopIteration:
            return False
        first = tf.nest.flatten(self._stack)[0]
        if isinstance(first, tf.distribute.DistributedValues):
            first = first.values[0]     # every replica's stack holds as many batches
        self._stack_len, self._at = int(first.shape[0]), 0
        return True

    def train_steps(self, n: int, stop) -> StepStats:
        import numpy as np
        import tensorflow as tf
        s = StepStats()
        while s.steps < n and not stop():
            t0 = time.perf_counter()
            if self._at >= self._stack_len and not self._next_stack():
                s.data_ended = True
                break
            t1 = time.perf_counter()
            # The first step alone: Horovod then starts every rank from rank 0's variables.
            count = 1 if self.step == self.start_step else \
                min(n - s.steps, self._stack_len - self._at)
            losses = self.run_steps(self._stack, tf.constant(self._at), tf.constant(count)).numpy()
            t2 = time.perf_counter()
            self._at += len(losses)
            if self.step == self.start_step:
                self.rt.after_first_step(self.variables)
            bad = np.flatnonzero(~np.isfinite(losses))
            if bad.size:
                s.nonfinite_step, s.loss_sum = self.step + int(bad[0]) + 1, float(losses[bad[0]])
                break
            self.step += len(losses)
            heartbeat.beat()
            s.steps += len(losses)
            s.loss_sum += float(losses.sum())
            s.input_wait_s += t1 - t0
            s.compute_s += t2 - t1
        return s

    def save(self, step: int) -> None:
        if self.rt.is_chief:
            write_checkpoint(self.manager, step)
            self.log.event("checkpoint", step=step)

    def evaluate(self, name: str, step: int, keep: bool = False):
        """The chief evaluates; every process settles its own copy of the tables first, so the
        replicas stay equal."""
        if self.rt.is_chief:
            return super().evaluate(name, step, keep)
        self.settle()
        return None

    def agree(self, decision: int) -> int:
        """The chief's decision on every rank (a collective: the other ranks, whose decision is
        0, wait here while the chief evaluates)."""
        return self.rt.sum_over_readers(decision)


def train_sync(cfg: TrainConfig, threads, rt) -> dict:
    import tensorflow as tf

    from .step import build_training, stacked_steps_function
    m, feature_size = check_data(cfg)
    global_batch = cfg.batch_size * rt.replicas
    if cfg.input_mode == "Pipe":
        # A stream's length is unknown until it ends: one reader may train until then, but
        # ranks that must run the same number of steps need it given.
        if rt.readers > 1 and not cfg.steps:
            raise ConfigError(f"Pipe channel {cfg.train_dir} with {rt.readers} readers: give "
                              "steps (every rank must run as many, and a stream's length is "
                              "unknown before it ends)")
        total_records, total_steps = None, cfg.steps
    else:
        mine = local_records(cfg, m)
        total_records = m.records if cfg.data_service else rt.sum_over_readers(mine)
        if mine == 0 and not cfg.data_service:
            raise ConfigError(f"reader {rt.reader_index} of {rt.readers} has no training records "
                              f"in {describe_source(cfg.train_dir)} (read plan {cfg.read_plan}); "
                              "every rank needs data")
        total_steps = planned_steps(cfg, total_records, global_batch,
                                    f"the global batch ({cfg.batch_size} x {rt.replicas} replicas)")
    # Several readers: the chief evaluates while the other ranks wait for its decision, so
    # all must evaluate at the same steps (a rank without the validation channel would not).
    schedule = schedule_of(cfg, total_steps, total_records, global_batch)
    if rt.readers > 1 and rt.sum_over_readers(schedule.eval_every) != \
            rt.readers * schedule.eval_every:
        raise ConfigError(f"the ranks of mode {cfg.mode} would evaluate at different steps "
                          f"(this one every {schedule.eval_every or 'never'}): give every host "
                          "the validation channel, or the same eval_every")
    vocabulary = data_vocabulary(cfg.train_dir, m)
    md = prepare_model_dir(cfg, feature_size, m.field_size, write=rt.is_chief,
                           train_data=data_fingerprint(m), fields=m.fields, vocabulary=vocabulary)
    tf.random.set_seed(cfg.seed)
    lr = cfg.learning_rate * (rt.replicas if cfg.scale_lr else 1)
    with rt.scope():
        model, opt, replica_step, variables = build_training(
            model_config(cfg, feature_size, m.field_size, positive_rate(m), run_schema(cfg, m)), cfg.optimizer, lr, rt,
            compile_step=False, optimizer_params=optimizer_params(cfg))
    train_steps = stacked_steps_function(replica_step, rt)
    manager, start_step = restore_checkpoint(cfg, md, model, opt, write=rt.is_chief,
                                             vocabulary=vocabulary, feature_size=feature_size)
    heartbeat.beat(force=True)
    log = MetricsLog(md, not cfg.quiet, enabled=rt.is_chief, settings=run_settings(cfg),
                     schedule=schedule, tracking=tracking.plan(cfg))
    announce_resume(log, md, start_step, total_steps)
    announce_model_choice(log, cfg, schedule)
    log.event("start", step=start_step, total_steps=total_steps, resumed=start_step > 0,
              threads=dataclasses.asdict(threads), records=total_records, mode=cfg.mode,
              replicas=rt.replicas, readers=rt.readers, global_batch=global_batch,
              learning_rate=lr * float(opt.lr_scale.numpy()),    # a resumed run's, decayed
              feature_size=m.feature_size, field_size=m.field_size)
    # Each reader seeds its shuffle differently; resuming skips the batches already consumed.
    data = rt.distribute(lambda: training_dataset(
        cfg, m, cfg.batch_size, start_step * rt.replicas // max(1, rt.readers),
        cfg.seed + 1000 * rt.reader_index, stack=rt.steps_per_call(cfg.steps_per_execution)))
    trainer = SyncTrainer(cfg, rt, model, opt, train_steps, variables, manager, start_step,
                          iter(data), log, feature_size,
                          lambda e: train_read_error(e, cfg, m, feature_size))
    outcome = Controller(trainer, schedule, log, global_batch=global_batch,
                         data_name=describe_source(cfg.train_dir),
                         progress=cfg.progress and rt.is_chief).run()
    if not rt.is_chief:
        heartbeat.finishing()
        log.close()
        return {"step": outcome.step, "total_steps": total_steps, "chief": False}
    return finish(cfg, trainer, log, outcome, manifest=m, feature_size=feature_size,
                  model_dir=md, result={"total_steps": total_steps, "resumed_from": start_step,
                                        "mode": cfg.mode, "replicas": rt.replicas,
                                        "global_batch": global_batch})
