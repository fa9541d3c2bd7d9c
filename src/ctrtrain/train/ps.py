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
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time

import tensorflow as tf

from ..errors import ConfigError
from .. import heartbeat
from .loop import (NonFiniteLoss, _MetricsLog, _evaluate, _finish, _prepare_model_dir,
                   announce_resume, check_data, data_fingerprint, model_config, planned_steps,
                   restore_checkpoint, saved_at, training_dataset,
                   write_checkpoint)
from .stop import Interrupted, StopRequests

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


def train_parameter_server(cfg, threads) -> dict:
    from .evaluate import make_predict_fn
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
    md = _prepare_model_dir(cfg, feature_size, m.field_size,
                            train_data=data_fingerprint(m, cfg.train_dir))
    with strategy.scope():
        model, opt, replica_step, variables = build_training(
            model_config(cfg, feature_size, m.field_size), cfg.optimizer, cfg.learning_rate,
            compile_step=False)
    slots = [s for d in opt.slots for s in d.values()]
    load = bytes_per_server(variables + slots + [opt.iterations])
    print("parameter-server load (bytes of variables and optimizer slots): "
          + ", ".join(f"{k} {v:,}" for k, v in load.items() if "/job:ps" in k), flush=True)

    manager, start_step = restore_checkpoint(cfg, md, model, opt)
    log = _MetricsLog(md, not cfg.quiet)
    announce_resume(log, md, start_step, total_steps)
    log.event("start", step=start_step, total_steps=total_steps, resumed=start_step > 0,
              threads=dataclasses.asdict(threads), records=m.records, mode=cfg.mode,
              workers=num_workers, parameter_servers=num_ps, ps_bytes=load,
              table_shards=len(model.embedding_tables),
              feature_size=m.feature_size, field_size=m.field_size)

    with strategy.scope():
        # Loss sums kept on a server and read by the chief at log time: fetching every step's
        # RemoteValue copies it worker -> chief, a path that failed under load here with TF
        # 2.21 ("invalid UTF-8" in a serialized device name), and costs a round trip per step.
        loss_sum = tf.Variable(0.0, trainable=False, name="loss_sum")
        loss_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="loss_steps")

    @tf.function
    def worker_step(iterator):
        loss = strategy.run(replica_step, args=(next(iterator),))
        loss_sum.assign_add(loss)
        loss_steps.assign_add(1)

    if not cfg.data_service:
        print("warning: no tf.data service: each worker samples the whole training set in its "
              "own order (see ctrtrain.train.ps)", flush=True)
    # seed None: without a service every worker shuffles differently.
    per_worker = coordinator.create_per_worker_dataset(
        lambda: training_dataset(dataclasses.replace(cfg, read_plan=None), m, cfg.batch_size, 0, None))
    it = iter(per_worker)
    predict = make_predict_fn(model)

    step, windows = start_step, []
    t_window, seen_sum, seen_steps = time.perf_counter(), 0.0, 0
    last_ckpt = time.monotonic()
    stop = StopRequests().__enter__()
    while step < total_steps:
        heartbeat.beat()
        if stop.signum is not None:
            coordinator.join()
            step = int(opt.iterations.numpy())
            write_checkpoint(manager, step)
            log.event("stopped", step=step, signal=stop.signum)
            stop.__exit__()
            raise Interrupted(stop.signum, step, saved=True)
        coordinator.schedule(worker_step, args=(it,))
        step += 1
        boundary = step % cfg.log_every == 0 or step == total_steps
        ckpt_due = (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or \
            (cfg.checkpoint_secs and time.monotonic() - last_ckpt >= cfg.checkpoint_secs)
        eval_due = cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps
        if boundary or ckpt_due or eval_due:
            coordinator.join()
            now = time.perf_counter()
            if boundary:
                total, done = float(loss_sum.numpy()), int(loss_steps.numpy())
                n = max(1, done - seen_steps)
                if not math.isfinite(total):
                    raise NonFiniteLoss(f"the training loss became {total} by step {step}: the "
                                        "model diverged or the data holds extreme values; not "
                                        "checkpointed", path=cfg.train_dir)
                w = {"step": step, "loss": (total - seen_sum) / n, "steps": n,
                     "seconds": now - t_window, "examples_per_s": n * cfg.batch_size / (now - t_window)}
                windows.append(w)
                log.event("train", **w)
                t_window, seen_sum, seen_steps = now, total, done
            if ckpt_due:
                write_checkpoint(manager, step)
                last_ckpt = time.monotonic()
                log.event("checkpoint", step=step)
            if eval_due:
                _evaluate(cfg, predict, cfg.valid_dir, "valid", step, log, feature_size)
    stop.__exit__()
    coordinator.join()
    step = int(opt.iterations.numpy())
    if not saved_at(manager, step):
        write_checkpoint(manager, step)
    return _finish(cfg, model, m, feature_size, md, predict, log, step,
                   {"total_steps": total_steps, "resumed_from": start_step, "stopped_early": False,
                    "mode": cfg.mode, "workers": num_workers, "parameter_servers": num_ps,
                    "ps_bytes": load, "windows": windows})
