"""Thread settings for TensorFlow on this host, chosen once and logged.

The common advice "intra = inter = vCPUs" over-subscribes: TensorFlow's intra-op pool, its
inter-op pool and tf.data's pool then all want every core. Measured on 2 cores (docs/
benchmarks.md): intra-op = cores keeps the matmuls fed; two inter-op threads let the sparse
and dense branches of a step overlap (one was 20% slower; four were no faster); tf.data gets
its own small pool so parsing does not queue behind the step's ops.
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass
class ThreadConfig:
    intra_op: int = 0      # 0 = automatic
    inter_op: int = 0
    data: int = 0          # tf.data private thread pool size
    omp: int = 0           # OMP_NUM_THREADS (oneDNN); only effective before TF starts

    def resolved(self, cores: int | None = None) -> "ThreadConfig":
        from .tuned import tuned_settings
        cores = cores or _usable_cores()
        # Explicit settings, then a launched process's share of its host (TF_NUM_*_THREADS,
        # process_env.py), then what `ctrtrain tune` measured best here, then the defaults.
        env = lambda k: int(os.environ.get(k, "0") or 0)  # noqa: E731
        tuned = tuned_settings()
        intra = self.intra_op or env("TF_NUM_INTRAOP_THREADS") or tuned.get("intra_op_threads") \
            or cores
        return ThreadConfig(intra_op=intra,
                            inter_op=self.inter_op or env("TF_NUM_INTEROP_THREADS")
                            or tuned.get("inter_op_threads") or max(2, min(4, cores // 2)),
                            data=self.data or max(1, intra // 2),
                            omp=self.omp or env("OMP_NUM_THREADS") or intra)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def apply_threads(cfg: ThreadConfig) -> ThreadConfig:
    """Applies the settings to this process's TensorFlow runtime (before it runs any op)."""
    r = cfg.resolved()
    os.environ.setdefault("OMP_NUM_THREADS", str(r.omp))
    import tensorflow as tf
    try:
        tf.config.threading.set_intra_op_parallelism_threads(r.intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(r.inter_op)
    except RuntimeError:
        pass  # the runtime already started (e.g. a second run in one process): keep its pools
    return r


def data_options(cfg: ThreadConfig):
    import tensorflow as tf
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = cfg.resolved().data
    opts.autotune.enabled = True
    return opts
