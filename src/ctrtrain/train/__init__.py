"""Training: the configuration (config.py), the controller that owns the loop
(controller.py) and a trainer per distribution mode (sync.py, ps.py), evaluation, checkpoints,
export and batch prediction.

Called, the package is the Python API's train (`ctrtrain.train(train=..., model_dir=...)`:
api.py, docs/api.md); `train(cfg)` below runs a TrainConfig."""

from __future__ import annotations


def train(cfg) -> dict:
    """Trains as `cfg` says, in the mode it names; returns the run's result (result.json)."""
    from . import tracking
    from .config import check_config
    check_config(cfg)
    # Before TensorFlow's import: a tracking server that does not answer is a mistake to
    # report in a second, not after the data and the model are built.
    tracking.check_reachable(cfg)
    try:
        return _train(cfg)
    except BaseException as e:
        tracking.end_unfinished(e)      # the MLflow run of a failed or stopped training
        raise


def _train(cfg) -> dict:
    from .threads import apply_threads
    threads = apply_threads(cfg.threads)
    from .. import kernels
    kernels.set_enabled(cfg.fused_kernels)
    # TensorFlow's import (by apply_threads) took seconds, more on a loaded host: alive again
    # before the data and the model are built (the launcher's watchdog reads this).
    from .. import heartbeat
    heartbeat.beat(force=True)
    from ..mode import Mode
    if Mode.parse(cfg.mode).asynchronous:
        from .ps import train_parameter_server
        return train_parameter_server(cfg, threads)
    from .runtime import make_runtime
    from .sync import train_sync
    rt = make_runtime(cfg.mode, cfg.sparse_reduce, cfg.devices)
    return train_sync(cfg, threads, rt)
