"""`ctrtrain bench profile`: where a training step's time goes, op by op (DeepFM's, or
`--model`'s).

Runs the reference step under TensorFlow's profiler and sums the CPU time of every op over
the profiled steps (ops of a step run on several threads at once, so the column adds up to
more than the wall time per step)."""

from __future__ import annotations

import collections
import glob
import tempfile
import time


def profile_step(data_dir: str, steps: int = 40, warmup: int = 20, mixed_precision: bool = False,
                 top: int = 25, table_updates: str = "auto", model: str = "deepfm") -> dict:
    """The step `ctrtrain train --model MODEL` runs with its defaults on `data_dir` (with the
    reference configuration's dropout where the model has an MLP, as `bench train` measures
    it)."""
    from ..errors import ConfigError
    from ..models import MODELS
    if mixed_precision and "mixed_precision" not in MODELS[model].reads:
        raise ConfigError(f"--mixed-precision: model {model} does not use it")
    from ..train.threads import ThreadConfig, apply_threads
    apply_threads(ThreadConfig())
    import tensorflow as tf
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError as e:  # an internal module; present in TF 2.21
        raise RuntimeError(f"this TensorFlow build has no profiler protos ({e})") from e
    from ..input.pipeline import PipelineConfig, dataset_from_dir
    from ..train.config import TrainConfig, model_config, optimizer_params, resolve_table_updates
    from ..train.inputs import positive_rate
    from ..train.step import build_training
    from .train_bench import REFERENCE

    ds, m = dataset_from_dir(data_dir, PipelineConfig())
    batches = [b for _, b in zip(range(warmup + steps), ds)]
    deep = {"dropout": REFERENCE["dropout"], "mixed_precision": mixed_precision,
            "embedding_size": REFERENCE["embedding_size"]}
    cfg = TrainConfig(train_dir=data_dir, model_dir="unused", model=model,
                      table_updates=table_updates,
                      **{k: v for k, v in deep.items() if k in MODELS[model].reads})
    resolve_table_updates(cfg, m.feature_size)
    _, _, step, _ = build_training(
        model_config(cfg, m.feature_size, m.field_size, positive_rate(m), m.schema), cfg.optimizer,
        cfg.learning_rate, optimizer_params=optimizer_params(cfg))

    for b in batches[:warmup]:
        step(b).numpy()
    # The trace is read here and then of no use: a temporary directory, removed on return.
    with tempfile.TemporaryDirectory(prefix="ctrtrain-profile-") as logdir:
        tf.profiler.experimental.start(logdir)
        t = time.perf_counter()
        for b in batches[warmup:]:
            step(b).numpy()
        wall = (time.perf_counter() - t) / steps
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        path = sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1]
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    per_op = collections.Counter()
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                name = names.get(ev.metadata_id, "?")
                if ":" in name and "::" not in name and not name.startswith(("EagerLocalExecute", "KernelAndDevice")):
                    per_op[name] += ev.duration_ps / 1e9  # ms
    ops = [{"op": k, "ms_per_step": v / steps} for k, v in per_op.most_common(top)]
    return {"model": model, "wall_ms_per_step": wall * 1000,
            "op_ms_total": sum(per_op.values()) / steps, "ops": ops}


def print_profile(p: dict) -> None:
    print(f"wall time per step {p['wall_ms_per_step']:.2f} ms; CPU time in ops "
          f"{p['op_ms_total']:.2f} ms (2 cores run ops side by side)")
    for o in p["ops"]:
        print(f"  {o['ms_per_step']:6.2f} ms  {o['op']}")
