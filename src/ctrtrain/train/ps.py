"""Asynchronous training with parameter servers (TF2 ParameterServerStrategy).

This process is the chief (the coordinator): it creates the variables on the parameter
servers, builds a dataset on every worker (`create_per_worker_dataset`), and schedules steps
that the workers run against the servers, each at its own pace. The chief logs, checkpoints,
evaluates and exports; a worker that dies is left out and its scheduled steps go to the others
(the ClusterCoordinator's own fault handling).

Load balance: the embedding table is partitioned in row blocks over every parameter server
(a ShardedVariable; see table_partitioner), and the small dense variables are placed round-robin,
so no server holds a whole big table. The bytes per server are printed at start.

Data: the coordinator traces one dataset function for all workers, so a worker cannot learn
its own index inside it, and sharding by worker is impossible there. The launcher and
`ctrtrain run` therefore give parameter-server jobs a tf.data service (a dispatcher and a data
worker on the training hosts, or the job's data-service group), and every worker reads from
one shared job in `distributed_epoch` mode: a disjoint part of each epoch per worker, every
example once. Without a service (a bare TF_CONFIG cluster) each worker reads the whole set in
its own random order, TensorFlow's default setup, which samples rather than sweeps the data
and trains a little worse (docs/benchmarks.md). Asynchronous updates are noisier than
synchronous ones: a smaller learning rate may be needed for the same quality.

The controller (controller.py) runs this mode like every other: log windows, checkpoints,
evaluation and early stopping, stop requests. Each worker times its own input wait and compute
(`tf.timestamp` around `next(iterator)` and the step) into variables on a server, which the
chief reads at each window: the same input-bound share as the synchronous modes report.
"""

from __future__ import annotations

import collections
import dataclasses

import tensorflow as tf

from ..errors import ConfigError
from .. import heartbeat
from ..data.index import describe_source
from . import tracking
from .config import model_config, optimizer_params, run_schema
from .controller import ChiefActions, Controller, StepStats, announce_model_choice, finish
from .inputs import (check_data, planned_steps, positive_rate, schedule_of, train_read_error,
                     training_dataset)
from .metrics_log import MetricsLog, run_settings
from .model_dir import (announce_resume, data_fingerprint, data_vocabulary, prepare_model_dir,
                        restore_checkpoint, write_checkpoint)

MIN_SHARD_BYTES = 64 << 10    # below this a variable stays whole on one server


def table_partitioner(num_ps: int, min_bytes: int = MIN_SHARD_BYTES):
    """Row-partitions every variable of at least `min_bytes` over all `num_ps` servers."""
    def partition(shape, dtype):
        nbytes = shape.num_elements() * dtype.size
        if num_ps > 1 and nbytes >= min_bytes and shape[0] >= num_ps:
            return [num_ps] + [1] * (shape.rank - 1)
        return [1] * shape.rank
    return partition


def bytes_per_server(variables) -> dict[str, int]:
    out: collections.Counter = collections.Counter()
    for v in variables:
        spec = tf.DeviceSpec.from_string(v.device)
        out[f"/job:{spec.job}/task:{spec.task}"] += v.shape.num_elements() * v.dtype.size
    return dict(sorted(out.items()))


class PSTrainer(ChiefActions):
    """Schedules steps on the workers and joins them at every boundary the controller sets."""

    def __init__(self, cfg, coordinator, worker_step, iterator, model, opt, manager, stats,
                 start_step: int, log, feature_size: int, explain):
        from .evaluate import make_predict_fn
        from .step import settle_function
        self.cfg, self.coordinator, self.worker_step, self.it = cfg, coordinator, worker_step, iterator
        self.model, self.opt, self.manager, self.stats = model, opt, manager, stats
        self.step, self.log, self.feature_size, self.explain = start_step, log, feature_size, explain
        self.predict = make_predict_fn(model)
        self._seen = self._read()
        self._settle = settle_function(opt)   # on the chief; the rows live on the servers

    def settle(self) -> None:
        self.coordinator.join()
        self._settle()

    def _read(self):
        return [float(v.numpy()) for v in self.stats]

    def train_steps(self, n: int, stop) -> StepStats:
        scheduled = 0
        for _ in range(n):
            if stop():
                break
            self.coordinator.schedule(self.worker_step, args=(self.it,))
            scheduled += 1
            heartbeat.beat()
        try:
            self.coordinator.join()
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            raise self.explain(e) from None
        now = self._read()
        loss, steps, wait, compute = (a - b for a, b in zip(now, self._seen))
        self._seen = now
        self.step += scheduled
        # A step in flight on a worker that died runs again elsewhere: count what was scheduled.
        return StepStats(scheduled, loss * scheduled / steps if steps else 0.0, wait, compute)

    def save(self, step: int) -> None:
        self.coordinator.join()
        write_checkpoint(self.manager, step)
        self.log.event("checkpoint", step=step)


def train_parameter_server(cfg, threads) -> dict:
    from .step import build_training

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec()
    if "ps" not in cluster.jobs or "chief" not in cluster.jobs:
        raise ConfigError("mode parameter_server needs TF_CONFIG with chief, worker and ps jobs")
    if resolver.task_type != "chief":
        raise ConfigError(f"in mode parameter_server only the chief runs training; "
                          f"a {resolver.task_type} runs a server (ctrtrain.cluster.server)")
    num_ps, num_workers = cluster.num_tasks("ps"), cluster.num_tasks("worker")
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=table_partitioner(num_ps))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    m, feature_size = check_data(cfg)
    total_steps = planned_steps(cfg, m.records, cfg.batch_size, f"batch_size {cfg.batch_size}")
    schedule = schedule_of(cfg, total_steps, m.records, cfg.batch_size)
    vocabulary = data_vocabulary(cfg.train_dir, m)
    md = prepare_model_dir(cfg, feature_size, m.field_size,
                           train_data=data_fingerprint(m), fields=m.fields, vocabulary=vocabulary)
    with strategy.scope():
        model, opt, replica_step, variables = build_training(
            model_config(cfg, feature_size, m.field_size, positive_rate(m), run_schema(cfg, m)), cfg.optimizer,
            cfg.learning_rate,
            compile_step=False, optimizer_params=optimizer_params(cfg))
    slots = [s for d in opt.slots for s in d.values()]
    load = bytes_per_server(variables + slots + [opt.iterations])
    print("parameter-server load (bytes of variables and optimizer slots): "
          + ", ".join(f"{k} {v:,}" for k, v in load.items() if "/job:ps" in k), flush=True)

    manager, start_step = restore_checkpoint(cfg, md, model, opt, vocabulary=vocabulary,
                                             feature_size=feature_size)
    log = MetricsLog(md, not cfg.quiet, settings=run_settings(cfg), schedule=schedule,
                     tracking=tracking.plan(cfg))
    announce_resume(log, md, start_step, total_steps)
    announce_model_choice(log, cfg, schedule)
    log.event("start", step=start_step, total_steps=total_steps, resumed=start_step > 0,
              threads=dataclasses.asdict(threads), records=m.records, mode=cfg.mode,
              workers=num_workers, parameter_servers=num_ps, ps_bytes=load,
              learning_rate=cfg.learning_rate * float(opt.lr_scale.numpy()),
              table_shards=len(model.embedding_tables),
              feature_size=m.feature_size, field_size=m.field_size)

    with strategy.scope():
        # Sums kept on a server and read by the chief at log time: fetching every step's
        # RemoteValue copies it worker -> chief, a path that failed under load here with TF
        # 2.21 ("invalid UTF-8" in a serialized device name), and costs a round trip per step.
        stats = [tf.Variable(0.0, dtype=tf.float64, trainable=False, name=n)
                 for n in ("loss_sum", "loss_steps", "input_wait_s", "compute_s")]
    loss_sum, loss_steps, wait_s, compute_s = stats

    @tf.function(autograph=False)
    def worker_step(iterator):
        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            batch = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(batch)):
            t1 = tf.timestamp()
        loss = strategy.run(replica_step, args=(batch,))
        with tf.control_dependencies([loss]):
            t2 = tf.timestamp()
        loss_sum.assign_add(tf.cast(loss, tf.float64))
        loss_steps.assign_add(1.0)
        wait_s.assign_add(t1 - t0)
        compute_s.assign_add(t2 - t1)

    if not cfg.data_service:
        print("warning: no tf.data service: each worker samples the whole training set in its "
              "own order (see ctrtrain.train.ps)", flush=True)
    # seed None: without a service every worker shuffles differently. Through the service a
    # resumed job's workers together skip the batches of the steps before it (each its share:
    # the steps were taken by whichever worker was free), as sync training does.
    skip = start_step // num_workers if cfg.data_service else 0
    per_worker = coordinator.create_per_worker_dataset(
        lambda: training_dataset(dataclasses.replace(cfg, read_plan=None), m, cfg.batch_size,
                                 skip, None))
    trainer = PSTrainer(cfg, coordinator, worker_step, iter(per_worker), model, opt, manager,
                        stats, start_step, log, feature_size,
                        lambda e: train_read_error(e, cfg, m, feature_size))
    outcome = Controller(trainer, schedule, log, global_batch=cfg.batch_size,
                         data_name=describe_source(cfg.train_dir), progress=cfg.progress).run()
    coordinator.join()
    return finish(cfg, trainer, log, outcome, manifest=m, feature_size=feature_size,
                  model_dir=md, result={"total_steps": total_steps, "resumed_from": start_step,
                                        "mode": cfg.mode, "workers": num_workers,
                                        "parameter_servers": num_ps, "ps_bytes": load})
