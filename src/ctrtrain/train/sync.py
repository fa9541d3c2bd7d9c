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
import math
import time

from .. import heartbeat
from ..data.index import describe_source
from ..errors import ConfigError
from .config import TrainConfig, model_config, optimizer_params
from .controller import ChiefActions, Controller, StepStats, announce_model_choice, finish
from .inputs import (check_data, local_records, planned_steps, positive_rate, schedule_of,
                     train_read_error, training_dataset)
from .metrics_log import MetricsLog
from .model_dir import (announce_resume, data_fingerprint, prepare_model_dir,
                        restore_checkpoint, write_checkpoint)


class SyncTrainer(ChiefActions):
    """Runs steps of the compiled synchronous step on this process's input."""

    def __init__(self, cfg: TrainConfig, rt, model, opt, train_step, variables, manager,
                 start_step: int, data_iter, log, feature_size: int, explain):
        from .evaluate import make_predict_fn
        from .step import settle_function
        self.cfg, self.rt, self.model, self.opt = cfg, rt, model, opt
        self.train_step, self.variables, self.manager = train_step, variables, manager
        self.step, self.start_step, self.it, self.log = start_step, start_step, data_iter, log
        self.feature_size, self.explain = feature_size, explain
        self.predict = make_predict_fn(model)
        self._settle = settle_function(opt, rt)

    def settle(self) -> None:
        self._settle()

    def train_steps(self, n: int, stop) -> StepStats:
        import tensorflow as tf
        s = StepStats()
        for _ in range(n):
            if stop():
                break
            t0 = time.perf_counter()
            try:
                batch = next(self.it)
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
                raise self.explain(e) from None
            except StopIteration:
                s.data_ended = True
                break
            t1 = time.perf_counter()
            loss = float(self.train_step(batch))
            t2 = time.perf_counter()
            if not math.isfinite(loss):
                s.nonfinite_step, s.loss_sum = self.step + 1, loss
                break
            if self.step == self.start_step:
                self.rt.after_first_step(self.variables)
            self.step += 1
            heartbeat.beat()
            s.steps += 1
            s.loss_sum += loss
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

    from .step import build_training
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
    md = prepare_model_dir(cfg, feature_size, m.field_size, write=rt.is_chief,
                           train_data=data_fingerprint(m))
    tf.random.set_seed(cfg.seed)
    lr = cfg.learning_rate * (rt.replicas if cfg.scale_lr else 1)
    with rt.scope():
        model, opt, train_step, variables = build_training(
            model_config(cfg, feature_size, m.field_size, positive_rate(m), m.schema), cfg.optimizer, lr, rt,
            optimizer_params=optimizer_params(cfg))
    manager, start_step = restore_checkpoint(cfg, md, model, opt)
    heartbeat.beat(force=True)
    log = MetricsLog(md, not cfg.quiet, enabled=rt.is_chief)
    announce_resume(log, md, start_step, total_steps)
    announce_model_choice(log, cfg, schedule)
    log.event("start", step=start_step, total_steps=total_steps, resumed=start_step > 0,
              threads=dataclasses.asdict(threads), records=total_records, mode=cfg.mode,
              replicas=rt.replicas, readers=rt.readers, global_batch=global_batch, learning_rate=lr,
              feature_size=m.feature_size, field_size=m.field_size)
    # Each reader seeds its shuffle differently; resuming skips the batches already consumed.
    data = rt.distribute(lambda: training_dataset(
        cfg, m, cfg.batch_size, start_step * rt.replicas // max(1, rt.readers),
        cfg.seed + 1000 * rt.reader_index))
    trainer = SyncTrainer(cfg, rt, model, opt, train_step, variables, manager, start_step,
                          iter(data), log, feature_size,
                          lambda e: train_read_error(e, cfg, m, feature_size))
    outcome = Controller(trainer, schedule, log, global_batch=global_batch,
                         data_name=describe_source(cfg.train_dir),
                         progress=cfg.progress and rt.is_chief).run()
    if not rt.is_chief:
        log.close()
        return {"step": outcome.step, "total_steps": total_steps, "chief": False}
    return finish(cfg, trainer, log, outcome, manifest=m, feature_size=feature_size,
                  model_dir=md, result={"total_steps": total_steps, "resumed_from": start_step,
                                        "mode": cfg.mode, "replicas": rt.replicas,
                                        "global_batch": global_batch})
