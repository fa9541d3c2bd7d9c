"""Single-process DeepFM training: a custom loop in tf.function with evaluation, checkpoints
that resume at the same step and data position, TensorBoard summaries, a JSON-lines metrics
file and a SavedModel export."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DataError
from ..progress import bar
from .threads import ThreadConfig, apply_threads, data_options

METRICS = "metrics.jsonl"
RESULT = "result.json"
CONFIG = "train_config.json"


@dataclasses.dataclass
class TrainConfig:
    train_dir: str
    model_dir: str
    valid_dir: str | None = None
    test_dir: str | None = None
    feature_size: int | None = None   # table rows; default the data's (may be larger: room to grow)
    embedding_size: int = 16
    deep_layers: tuple[int, ...] = (256, 128, 64)
    dropout: float = 0.0
    batch_norm: bool = False
    l2_reg: float = 1e-6
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    batch_size: int = 1024
    epochs: float = 1.0
    steps: int | None = None          # overrides epochs
    shuffle_buffer: int = 10_000
    cache: bool = False
    log_every: int = 100
    eval_every: int = 0               # steps; 0 = evaluate at the end only
    checkpoint_every: int = 1000      # steps; 0 = only at the end
    checkpoint_secs: float = 0        # also save when this many seconds passed; 0 = off
    keep_checkpoints: int = 3
    early_stopping: int = 0           # evaluations without AUC improvement before stopping
    xla: bool = False                 # XLA-compile the dense part of the model
    mixed_precision: bool = False
    threads: ThreadConfig = dataclasses.field(default_factory=ThreadConfig)
    seed: int = 0
    export: bool = True
    progress: bool = True

    # Fields that must match for a checkpoint to be resumed.
    SHAPE_FIELDS = ("embedding_size", "deep_layers", "batch_norm", "optimizer")


def _check_config(cfg: TrainConfig):
    if cfg.batch_size <= 0:
        raise ConfigError("batch_size must be positive")
    if not 0 <= cfg.dropout < 1:
        raise ConfigError(f"dropout is a drop rate in [0, 1), got {cfg.dropout}")
    if cfg.steps is not None and cfg.steps <= 0:
        raise ConfigError("steps must be positive")


def _prepare_model_dir(cfg: TrainConfig, feature_size: int, field_size: int) -> Path:
    md = Path(cfg.model_dir)
    try:
        md.mkdir(parents=True, exist_ok=True)
        probe = md / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"model directory {md} is not writable: {e.strerror}") from e
    record = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "threads"}
    record.update(feature_size=feature_size, field_size=field_size)
    record["deep_layers"] = list(cfg.deep_layers)
    prev = md / CONFIG
    if prev.exists():
        old = json.loads(prev.read_text())
        for k in TrainConfig.SHAPE_FIELDS + ("feature_size", "field_size"):
            if k in old and old[k] != record[k]:
                raise ConfigError(f"{md} holds a model trained with {k}={old[k]!r}, not {record[k]!r}"
                                  " (use another --model-dir to start afresh)")
    prev.write_text(json.dumps(record, indent=2) + "\n")
    return md


def train(cfg: TrainConfig) -> dict:
    _check_config(cfg)
    threads = apply_threads(cfg.threads)
    import tensorflow as tf

    from ..data.manifest import read_manifest
    from ..input.pipeline import PipelineConfig, dataset_from_dir
    from ..models.deepfm import DeepFMConfig
    from .evaluate import evaluate, make_predict_fn
    from .export import export_saved_model
    from .step import build_training

    m = read_manifest(cfg.train_dir)
    steps_per_epoch = m.records // cfg.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size {cfg.batch_size} is larger than the training set "
                          f"({m.records} records)")
    total_steps = cfg.steps or max(1, int(math.ceil(cfg.epochs * steps_per_epoch)))
    feature_size = cfg.feature_size or m.feature_size
    if feature_size < m.feature_size:
        raise ConfigError(f"feature_size {feature_size} is smaller than the data's {m.feature_size}")
    for other in (cfg.valid_dir, cfg.test_dir):
        if other:
            o = read_manifest(other)
            if o.field_size != m.field_size or o.feature_size > feature_size:
                raise DataError(f"field_size/feature_size ({o.field_size}/{o.feature_size}) do "
                                f"not match the model's ({m.field_size}/{feature_size})",
                                path=str(other))
    md = _prepare_model_dir(cfg, feature_size, m.field_size)
    tf.random.set_seed(cfg.seed)

    model, opt, train_step = build_training(
        DeepFMConfig(feature_size, m.field_size, cfg.embedding_size, tuple(cfg.deep_layers),
                     cfg.dropout, cfg.batch_norm, cfg.l2_reg, cfg.mixed_precision, cfg.xla, cfg.seed),
        cfg.optimizer, cfg.learning_rate)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, str(md / "checkpoints"), max_to_keep=cfg.keep_checkpoints)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    start_step = int(opt.iterations.numpy())
    resumed = start_step > 0
    log = _MetricsLog(md, cfg.progress)
    log.event("start", step=start_step, total_steps=total_steps, resumed=resumed,
              threads=dataclasses.asdict(threads), records=m.records,
              feature_size=m.feature_size, field_size=m.field_size)

    pcfg = PipelineConfig(batch_size=cfg.batch_size, shuffle_buffer=cfg.shuffle_buffer,
                          cache=cfg.cache, seed=cfg.seed)
    ds, _ = dataset_from_dir(cfg.train_dir, pcfg, skip_batches=start_step)
    ds = ds.with_options(data_options(cfg.threads))

    predict = make_predict_fn(model)

    def run_eval(split_dir, name, step):
        if not split_dir:
            return None
        eval_ds, _ = dataset_from_dir(split_dir, dataclasses.replace(pcfg, batch_size=8192),
                                      training=False)
        r = evaluate(predict, eval_ds)
        log.event("eval", step=step, split=name, **r)
        return r

    best_auc, bad_evals, stopped_early = -1.0, 0, False
    wait_s = compute_s = 0.0
    windows = []
    window = {"wait": 0.0, "compute": 0.0, "steps": 0, "t": time.perf_counter(), "loss": 0.0}
    last_ckpt_time = time.monotonic()
    saved_step = start_step if manager.latest_checkpoint else -1
    it = iter(ds)
    step = start_step
    with bar(total=total_steps, desc="train", unit="step",
             disable=None if cfg.progress else True) as pb:
        pb.update(start_step)
        while step < total_steps:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            loss = train_step(batch)
            t2 = time.perf_counter()
            step += 1
            pb.update(1)
            window["wait"] += t1 - t0
            window["compute"] += t2 - t1
            window["steps"] += 1
            window["loss"] += float(loss)
            if step % cfg.log_every == 0 or step == total_steps:
                now = time.perf_counter()
                w = window
                busy = w["wait"] + w["compute"]
                stats = {"loss": w["loss"] / w["steps"], "steps": w["steps"], "seconds": now - w["t"],
                         "examples_per_s": w["steps"] * cfg.batch_size / (now - w["t"]),
                         "input_wait_s": w["wait"], "compute_s": w["compute"],
                         "input_bound": w["wait"] / busy if busy else 0.0}
                windows.append({"step": step, **stats})
                log.event("train", step=step, **stats)
                pb.set_postfix(loss=f"{w['loss'] / w['steps']:.4f}")
                wait_s += w["wait"]
                compute_s += w["compute"]
                window.update(wait=0.0, compute=0.0, steps=0, t=now, loss=0.0)
            if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or \
                    (cfg.checkpoint_secs and time.monotonic() - last_ckpt_time >= cfg.checkpoint_secs):
                manager.save(checkpoint_number=step)
                last_ckpt_time, saved_step = time.monotonic(), step
                log.event("checkpoint", step=step)
            if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                r = run_eval(cfg.valid_dir, "valid", step)
                if r and cfg.early_stopping:
                    if r["auc"] > best_auc + 1e-5:
                        best_auc, bad_evals = r["auc"], 0
                    else:
                        bad_evals += 1
                        if bad_evals >= cfg.early_stopping:
                            stopped_early = True
                            log.event("early_stop", step=step, best_auc=best_auc)
                            break
    wait_s += window["wait"]
    compute_s += window["compute"]
    if saved_step != step:
        manager.save(checkpoint_number=step)
    result = {"step": step, "total_steps": total_steps, "resumed_from": start_step,
              "stopped_early": stopped_early,
              "input_wait_s": wait_s, "compute_s": compute_s,
              "input_bound": wait_s / (wait_s + compute_s) if wait_s + compute_s else 0.0,
              "windows": windows}
    result["valid"] = run_eval(cfg.valid_dir, "valid", step)
    result["test"] = run_eval(cfg.test_dir, "test", step)
    if cfg.export:
        vocab = str(Path(cfg.train_dir) / m.vocabulary) if m.vocabulary else None
        result["export"] = export_saved_model(
            model, md / "export", step, {"field_size": m.field_size, "feature_size": feature_size,
                                         "step": step, "test": result["test"]}, vocab)
        log.event("export", step=step, path=result["export"])
    (md / RESULT).write_text(json.dumps(result, indent=2) + "\n")
    log.close()
    return result


class _MetricsLog:
    """metrics.jsonl (one JSON object per event), TensorBoard scalars, and console lines."""

    def __init__(self, model_dir: Path, console: bool):
        import tensorflow as tf
        self.f = open(model_dir / METRICS, "a")
        self.writer = tf.summary.create_file_writer(str(model_dir / "logs"))
        self.console = console

    def event(self, kind: str, step: int, **fields):
        import tensorflow as tf
        rec = {"event": kind, "step": step, "time": time.time(), **fields}
        self.f.write(json.dumps(rec, default=_jsonable) + "\n")
        self.f.flush()
        with self.writer.as_default(step=step):
            for k, v in fields.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    tf.summary.scalar(f"{fields.get('split', kind)}/{k}", v)
        if self.console:
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items() if not isinstance(v, dict))
            print(f"[{kind}] step {step} {shown}", flush=True)

    def close(self):
        self.f.close()
        self.writer.close()


def _fmt(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return str(v)
