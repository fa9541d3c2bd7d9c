"""How a training process takes part in its job, per distribution mode: which strategy holds
the variables, how gradients are combined, who this process is (reader index, chief).

- single: no strategy, one replica.
- mirrored: MirroredStrategy over this host's devices (GPUs, or logical CPUs where there are
  none), one input pipeline, one replica per device.
- allreduce: MultiWorkerMirroredStrategy (RING collectives on CPU, NCCL on GPU), one replica per
  process, cluster from TF_CONFIG.
- horovod: Horovod's allreduce/allgather, one process per slot, ranks from horovodrun.
- parameter_server: see ps.py (asynchronous, a coordinator; not a replica loop).

The synchronous modes share one step: each replica's loss is divided by the number of replicas
and the gradients are SUM-reduced, which is the gradient of the mean loss over the global
batch (per-replica batch x replicas). Sparse table gradients are either all-gathered as
IndexedSlices (`gather`: bytes ~ rows the batch touched) or densified and all-reduced (`dense`:
bytes ~ the whole table); `docs/benchmarks.md` has both measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import tensorflow as tf

from ..errors import ConfigError

SPARSE_REDUCE = ("gather", "dense")


@dataclasses.dataclass
class Runtime:
    mode: str
    strategy: tf.distribute.Strategy | None = None
    replicas: int = 1            # replicas in one synchronous step
    readers: int = 1             # input pipelines in the job (processes reading data)
    reader_index: int = 0
    is_chief: bool = True
    sparse_reduce: str = "gather"
    hvd: object = None           # horovod.tensorflow, in mode horovod

    def scope(self):
        return self.strategy.scope() if self.strategy else contextlib.nullcontext()

    # -- inside a replica -------------------------------------------------------------------
    def reduce_gradients(self, grads: list) -> list:
        """SUM over replicas (each replica's loss already divided by `replicas`)."""
        if self.replicas == 1:
            return grads
        if self.sparse_reduce == "dense":
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        if self.hvd is not None:
            # IndexedSlices are all-gathered by horovod, dense tensors all-reduced.
            return [self.hvd.allreduce(g, op=self.hvd.Sum) if g is not None else None
                    for g in grads]
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)

    def assign_keys(self, keys, assign):
        """(this replica's rows, the rows claimed) of `assign(keys)` (the dynamic fields' map,
        models/engine/dynamic.py) over the keys of every replica of the step, concatenated
        in replica order: every copy of the map sees the same keys in the same order and
        stays the same. A process of several replicas (mirrored) holds one map, assigned once
        (a merge_call) for all of them; each process of an all-reduce or Horovod job its own
        copy, assigned by each from the all-gathered keys."""
        if self.replicas == 1:
            return assign(keys)
        ctx = tf.distribute.get_replica_context()
        n = tf.shape(keys, out_type=tf.int64)[0]
        if self.mode == "mirrored":
            def merged(strategy, keys, n):
                rows, claimed = assign(tf.concat(strategy.experimental_local_results(keys), 0))
                starts = tf.cumsum(tf.stack(strategy.experimental_local_results(n)),
                                   exclusive=True)
                return rows, starts, claimed
            rows, starts, claimed = ctx.merge_call(merged, args=(keys, n))
            start = starts[ctx.replica_id_in_sync_group]
        else:
            if self.hvd is not None:
                every, sizes = self.hvd.allgather(keys), self.hvd.allgather(n[None])
                me = self.hvd.rank()
            else:
                every, sizes = ctx.all_gather(keys, axis=0), ctx.all_gather(n[None], axis=0)
                me = ctx.replica_id_in_sync_group
            rows, claimed = assign(every)
            start = tf.reduce_sum(sizes[:me])
        return tf.ensure_shape(rows[start:start + n], keys.shape), claimed

    # -- around the step ----------------------------------------------------------------------
    def distribute(self, make_dataset):
        """An iterable of per-replica batches. make_dataset() builds this process's input
        (already sharded and batched per replica); under a strategy each replica takes its
        own batches from it (no re-batching, no auto-sharding: the sharding plan decided)."""
        if self.strategy is None:
            return make_dataset()
        return self.strategy.distribute_datasets_from_function(lambda ctx: make_dataset())

    def run(self, replica_fn, *args):
        """replica_fn(*args) -> loss on every replica (per-replica args: each replica's own
        value); returns the mean loss (call in tf.function)."""
        if self.strategy is None:
            return replica_fn(*args)
        per_replica = self.strategy.run(replica_fn, args=args)
        return self.strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    def steps_per_call(self, requested: int) -> int:
        """Training steps one compiled call may run (TrainConfig.steps_per_execution). Under
        MultiWorkerMirroredStrategy one: its all-gather of a table's IndexedSlices (a
        variable number of rows) run twice in one call fails with "Shape mismatch in the
        collective instance" (the second run meets the first's shape; tests/test_pipe.py's
        allreduce job showed it), so each step is its own call there, as before."""
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy) \
                and self.replicas > 1 and self.sparse_reduce == "gather":
            return 1
        return requested

    def sum_over_readers(self, value: int) -> int:
        """The sum of an integer over every reading process (a collective: all must call)."""
        if self.readers == 1:
            return value
        if self.hvd is not None:
            return int(self.hvd.allreduce(tf.constant(value, tf.int64), op=self.hvd.Sum).numpy())
        per_replica = self.strategy.run(lambda: tf.constant(value, tf.int64))
        return int(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy())

    def after_first_step(self, variables):
        """Horovod starts every rank from rank 0's variables (strategies do this themselves)."""
        if self.hvd is not None:
            self.hvd.broadcast_variables(variables, root_rank=0)


def logical_cpus(n: int) -> list[str]:
    """Splits the host CPU into n logical devices (before TensorFlow initializes them)."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    except RuntimeError as e:
        raise ConfigError(f"cannot create {n} logical CPU devices after TensorFlow started: {e}") from e
    return [d.name for d in tf.config.list_logical_devices("CPU")]


@functools.cache
def multi_worker_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    """This process's MultiWorkerMirroredStrategy (cluster from TF_CONFIG), made once: a second
    one re-configures TensorFlow's collective ops, which aborts those another rank still has in
    flight ("Delete called on non-empty BufRendezvous"), so a process that trains several
    models in turn shares one."""
    impl = (tf.distribute.experimental.CommunicationImplementation.NCCL
            if tf.config.list_physical_devices("GPU")
            else tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=impl))


def make_runtime(mode, sparse_reduce: str = "gather", devices: int = 2, env=None) -> Runtime:
    """The runtime of a synchronous mode; `env` (ctrtrain.environment.Environment, default
    this process's) says who this process is."""
    from ..environment import Environment, tf_config_rank
    from ..mode import Mode
    mode = Mode.parse(mode)
    env = env or Environment()
    if sparse_reduce not in SPARSE_REDUCE:
        raise ConfigError(f"sparse_reduce must be one of {', '.join(SPARSE_REDUCE)}, not {sparse_reduce!r}")
    if mode is Mode.SINGLE:
        return Runtime("single")
    if mode is Mode.MIRRORED:
        gpus = tf.config.list_physical_devices("GPU")
        names = [f"/gpu:{i}" for i in range(len(gpus))] if gpus else logical_cpus(devices)
        strategy = tf.distribute.MirroredStrategy(
            names, cross_device_ops=None if gpus else tf.distribute.ReductionToOneDevice())
        return Runtime("mirrored", strategy, strategy.num_replicas_in_sync,
                       sparse_reduce=sparse_reduce)
    if mode is Mode.ALLREDUCE:
        if not env.tf_config:
            raise ConfigError("mode allreduce needs TF_CONFIG (set by `ctrtrain launch` / `ctrtrain run`)")
        strategy = multi_worker_strategy()
        index, workers, chief = tf_config_rank(env.tf_config)
        return Runtime("allreduce", strategy, strategy.num_replicas_in_sync, workers, index,
                       is_chief=chief, sparse_reduce=sparse_reduce)
    if mode is Mode.HOROVOD:
        try:
            import horovod.tensorflow as hvd
        except ImportError as e:
            raise ConfigError("mode horovod needs Horovod (see scripts/horovod_env.sh)") from e
        hvd.init()
        return Runtime("horovod", None, hvd.size(), hvd.size(), hvd.rank(),
                       is_chief=hvd.rank() == 0, sparse_reduce=sparse_reduce, hvd=hvd)
    raise ConfigError(f"mode {mode} has no synchronous runtime (it runs train/ps.py)")
