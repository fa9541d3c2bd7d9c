"""DeepFM training: a custom loop in tf.function with evaluation, checkpoints that resume at
the same step and data position, TensorBoard summaries, a JSON-lines metrics file and a
SavedModel export. One loop serves the synchronous modes (single, mirrored, allreduce,
horovod; runtime.py says how each combines gradients); parameter servers run ps.py.

In a multi-process job every process runs the same number of steps, computed from the job's
total record count (summed over readers at start), and repeats its own part of the data as
often as needed, so uneven shards never leave a rank waiting for the others. Only the chief
writes: checkpoints, metrics, evaluation at the end and the export (other ranks do not wait
for its evaluation: they have finished)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
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
    train_dir: str                    # File: a ctrtrain data directory; Pipe: a Pipe channel,
                                      # FIFOs <train_dir>_<epoch> (input/pipe.py)
    model_dir: str
    valid_dir: str | None = None
    test_dir: str | None = None
    feature_size: int | None = None   # table rows; default the data's (may be larger: room to grow)
    input_mode: str = "File"          # File | Pipe
    field_size: int | None = None     # Pipe only (a stream has no manifest); File: the data's
    data_format: str = "tfrecord"     # Pipe only: tfrecord | libsvm
    label_format: str = "01"          # Pipe libsvm only: 01 | pm1
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
    parse: str = "vectorized"         # input parsing: vectorized (batch, then parse) | scalar
    log_every: int = 100
    eval_every: int = 0               # steps; 0 = evaluate at the end only
    checkpoint_every: int = 1000      # steps; 0 = only at the end
    checkpoint_secs: float = 0        # also save when this many seconds passed; 0 = off
    keep_checkpoints: int = 3
    early_stopping: int = 0           # evaluations without AUC improvement before stopping
    xla: bool = False                 # XLA-compile the dense part of the model
    mixed_precision: bool = False
    threads: ThreadConfig = dataclasses.field(default_factory=ThreadConfig)
    mode: str = "single"              # single | mirrored | allreduce | horovod | parameter_server
    sparse_reduce: str = "gather"     # table gradients across replicas: gather | dense
    scale_lr: bool = False            # learning rate x replicas (synchronous modes)
    devices: int = 2                  # mirrored on a CPU-only host: logical CPU devices
    data_service: str | None = None   # grpc://dispatcher: read through tf.data service
    processing_mode: str = "parallel_epochs"
    read_plan: object = None          # data.sharding.ReadPlan; None = read everything
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
    if cfg.input_mode not in ("File", "Pipe"):
        raise ConfigError(f"input_mode must be File or Pipe, not {cfg.input_mode!r}")
    if cfg.input_mode == "Pipe":
        if not (cfg.field_size and cfg.feature_size):
            raise ConfigError(f"Pipe channel {cfg.train_dir}: a stream carries no manifest; "
                              "give field_size and feature_size")
        if cfg.mode == "parameter_server":
            raise ConfigError("mode parameter_server reads File channels: the chief defines "
                              "every worker's dataset as a graph, and a Pipe channel's FIFO "
                              "(read in Python, on one host) cannot run on a worker")
        if cfg.data_service:
            raise ConfigError("a Pipe channel cannot be read through tf.data service (its FIFO "
                              "is on the training host, read in this process)")
        if cfg.cache:
            raise ConfigError("cache: a Pipe channel streams every epoch anew (the job's "
                              "pipe_epochs); use a File channel to cache the data in memory")


def _prepare_model_dir(cfg: TrainConfig, feature_size: int, field_size: int,
                       write: bool = True) -> Path:
    """Checks that the directory can be written and that a model already in it has the same
    shapes. Non-chief processes only read it (they restore the chief's checkpoints)."""
    md = Path(cfg.model_dir)
    if not write:
        return md
    try:
        md.mkdir(parents=True, exist_ok=True)
        probe = md / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"model directory {md} is not writable: {e.strerror}") from e
    # A checkpoint holds the table and its optimizer slots (up to 3 x the table) plus the MLP;
    # saving writes the new one before deleting the oldest. Refuse now rather than fail later.
    need = 2 * 3 * 4 * feature_size * (1 + cfg.embedding_size) + (64 << 20)
    free = shutil.disk_usage(md).free
    if free < need:
        raise ConfigError(f"model directory {md} has {free / 2**20:,.0f} MB free; checkpoints of "
                          f"this model need about {need / 2**20:,.0f} MB")
    record = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("threads", "read_plan")}
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
    if cfg.mode == "parameter_server":
        from .ps import train_parameter_server
        return train_parameter_server(cfg, threads)
    from .runtime import make_runtime
    rt = make_runtime(cfg.mode, cfg.sparse_reduce, cfg.devices)
    return _train_sync(cfg, threads, rt)


def check_data(cfg: TrainConfig):
    """(train manifest, table rows): the training data's, checked against the other splits.
    A Pipe channel's manifest is made from the config (no files, records unknown)."""
    from ..data.manifest import Manifest, read_manifest
    if cfg.input_mode == "Pipe":    # field_size and feature_size given (_check_config)
        m = Manifest(cfg.data_format, cfg.field_size, cfg.feature_size, [],
                     label_format=cfg.label_format)
    else:
        m = read_manifest(cfg.train_dir)
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
    return m, feature_size


def model_config(cfg: TrainConfig, feature_size: int, field_size: int):
    from ..models.deepfm import DeepFMConfig
    return DeepFMConfig(feature_size, field_size, cfg.embedding_size, tuple(cfg.deep_layers),
                        cfg.dropout, cfg.batch_norm, cfg.l2_reg, cfg.mixed_precision, cfg.xla,
                        cfg.seed)


def training_dataset(cfg: TrainConfig, m, batch_size: int, skip_batches: int, seed: int | None):
    """This reader's part of the training data (cfg.read_plan), batched, repeated forever,
    optionally through tf.data service."""
    import tensorflow as tf

    from ..input.pipeline import PipelineConfig, make_dataset, make_pipe_dataset
    # Through tf.data service every consumer registers the same dataset (all of it, one seed):
    # the service decides who gets what (distributed_epoch: each element once).
    plan = None if cfg.data_service else cfg.read_plan
    seed = cfg.seed if cfg.data_service else seed
    pcfg = PipelineConfig(batch_size=batch_size, shuffle_buffer=cfg.shuffle_buffer,
                          cache=cfg.cache, seed=seed, parse=cfg.parse,
                          label_format=m.label_format if m.format == "libsvm" else "01")
    if cfg.input_mode == "Pipe":
        ds = make_pipe_dataset(cfg.train_dir, m.field_size, fmt=m.format, cfg=pcfg,
                               record_shard=plan.record_shard if plan else None,
                               skip_batches=skip_batches)
    else:
        ds = make_dataset(m.paths(cfg.train_dir), m.field_size, fmt=m.format,
                          compression=m.compression, cfg=pcfg,
                          file_shard=plan.file_shard if plan else None,
                          record_shard=plan.record_shard if plan else None,
                          skip_batches=0 if cfg.data_service else skip_batches)
    if cfg.data_service:
        # The whole pipeline (read, shuffle, batch, parse) runs on the data-service workers;
        # every training process of the job joins one shared job.
        ds = ds.apply(tf.data.experimental.service.distribute(
            processing_mode=cfg.processing_mode, service=cfg.data_service,
            job_name=f"ctrtrain-{Path(cfg.model_dir).name}")).prefetch(tf.data.AUTOTUNE)
    return ds.with_options(data_options(cfg.threads))


def local_records(cfg: TrainConfig, m) -> int:
    from ..data.sharding import ReadPlan
    return (cfg.read_plan or ReadPlan("training")).records([f.records for f in m.files])


def _train_sync(cfg: TrainConfig, threads, rt) -> dict:
    import tensorflow as tf

    from .evaluate import make_predict_fn
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
                              f"in {cfg.train_dir} (read plan {cfg.read_plan}); every rank needs data")
        total_steps = planned_steps(cfg, total_records, global_batch,
                                    f"the global batch ({cfg.batch_size} x {rt.replicas} replicas)")
    if cfg.eval_every and rt.readers > 1:
        raise ConfigError(f"eval_every: in mode {cfg.mode} the chief evaluates at the end only "
                          "(evaluating mid-training would stall the other ranks)")
    md = _prepare_model_dir(cfg, feature_size, m.field_size, write=rt.is_chief)
    tf.random.set_seed(cfg.seed)
    lr = cfg.learning_rate * (rt.replicas if cfg.scale_lr else 1)
    with rt.scope():
        model, opt, train_step, variables = build_training(
            model_config(cfg, feature_size, m.field_size), cfg.optimizer, lr, rt)
    manager, start_step = restore_checkpoint(cfg, md, model, opt)
    log = _MetricsLog(md, cfg.progress, enabled=rt.is_chief)
    log.event("start", step=start_step, total_steps=total_steps, resumed=start_step > 0,
              threads=dataclasses.asdict(threads), records=total_records, mode=cfg.mode,
              replicas=rt.replicas, readers=rt.readers, global_batch=global_batch, learning_rate=lr,
              feature_size=m.feature_size, field_size=m.field_size)
    # Each reader seeds its shuffle differently; resuming skips the batches already consumed.
    data = rt.distribute(lambda: training_dataset(
        cfg, m, cfg.batch_size, start_step * rt.replicas // max(1, rt.readers),
        cfg.seed + 1000 * rt.reader_index))
    predict = make_predict_fn(model)

    def save(step):
        if rt.is_chief:
            manager.save(checkpoint_number=step)
            log.event("checkpoint", step=step)

    stats, stopped_early, step = _run_steps(
        cfg, log, iter(data), train_step, start_step, total_steps, global_batch, save,
        lambda step: _evaluate(cfg, predict, cfg.valid_dir, "valid", step, log),
        after_first=lambda: rt.after_first_step(variables))
    if not rt.is_chief:
        log.close()
        return {"step": step, "total_steps": total_steps, "chief": False}
    if not saved_at(manager, step):
        save(step)
    return _finish(cfg, model, m, feature_size, md, predict, log, step,
                   {"total_steps": total_steps, "resumed_from": start_step,
                    "stopped_early": stopped_early, "mode": cfg.mode, "replicas": rt.replicas,
                    "global_batch": global_batch, **stats})


def planned_steps(cfg: TrainConfig, records: int, global_batch: int, batch_desc: str) -> int:
    """Steps of the run: cfg.steps, else cfg.epochs over `records` in global batches."""
    steps_per_epoch = records // global_batch
    if steps_per_epoch == 0:
        raise ConfigError(f"{batch_desc} is larger than the training set ({records} records)")
    return cfg.steps or max(1, int(math.ceil(cfg.epochs * steps_per_epoch)))


def restore_checkpoint(cfg: TrainConfig, md: Path, model, opt):
    """(CheckpointManager over md/checkpoints, step to start from): the latest checkpoint
    restored if there is one (a re-run resumes), else step 0."""
    import tensorflow as tf
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, str(md / "checkpoints"),
                                         max_to_keep=cfg.keep_checkpoints)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    return manager, int(opt.iterations.numpy())


def saved_at(manager, step: int) -> bool:
    """Whether the latest checkpoint is of this step (the final save would repeat it)."""
    latest = manager.latest_checkpoint
    return latest is not None and int(latest.rsplit("-", 1)[1]) == step


def _run_steps(cfg, log, it, train_step, start_step, total_steps, global_batch, save, evaluate,
               after_first=lambda: None):
    """The step loop: input wait and compute timed apart, logging, checkpoints, evaluation and
    early stopping. total_steps None: until the data ends (a Pipe stream); otherwise data
    that ends first is an error. Returns (stats, stopped_early, last step)."""
    best_auc, bad_evals, stopped_early = -1.0, 0, False
    windows = []
    window = {"wait": 0.0, "compute": 0.0, "steps": 0, "t": time.perf_counter(), "loss": 0.0}
    last_ckpt_time = time.monotonic()
    step = start_step
    totals = {"wait": 0.0, "compute": 0.0}

    def flush_window(step):
        now = time.perf_counter()
        w = window
        busy = w["wait"] + w["compute"]
        stats = {"loss": w["loss"] / w["steps"], "steps": w["steps"], "seconds": now - w["t"],
                 "examples_per_s": w["steps"] * global_batch / (now - w["t"]),
                 "input_wait_s": w["wait"], "compute_s": w["compute"],
                 "input_bound": w["wait"] / busy if busy else 0.0}
        windows.append({"step": step, **stats})
        log.event("train", step=step, **stats)
        pb.set_postfix(loss=f"{w['loss'] / w['steps']:.4f}")
        totals["wait"] += w["wait"]
        totals["compute"] += w["compute"]
        window.update(wait=0.0, compute=0.0, steps=0, t=now, loss=0.0)

    with bar(total=total_steps, desc="train", unit="step",
             disable=None if (cfg.progress and log.enabled) else True) as pb:
        pb.update(start_step)
        while total_steps is None or step < total_steps:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                if window["steps"]:
                    flush_window(step)
                if total_steps is not None:
                    raise DataError(f"the training data ended after {step} of {total_steps} "
                                    "steps (a Pipe channel: feed more epochs, pipe_epochs, or "
                                    "train fewer steps)", path=cfg.train_dir)
                break
            t1 = time.perf_counter()
            loss = train_step(batch)
            t2 = time.perf_counter()
            if step == start_step:
                after_first()
            step += 1
            pb.update(1)
            window["wait"] += t1 - t0
            window["compute"] += t2 - t1
            window["steps"] += 1
            window["loss"] += float(loss)
            if step % cfg.log_every == 0 or step == total_steps:
                flush_window(step)
            if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or \
                    (cfg.checkpoint_secs and time.monotonic() - last_ckpt_time >= cfg.checkpoint_secs):
                save(step)
                last_ckpt_time = time.monotonic()
            if cfg.eval_every and step % cfg.eval_every == 0 and step != total_steps:
                r = evaluate(step)
                if r and cfg.early_stopping:
                    if r["auc"] > best_auc + 1e-5:
                        best_auc, bad_evals = r["auc"], 0
                    else:
                        bad_evals += 1
                        if bad_evals >= cfg.early_stopping:
                            stopped_early = True
                            log.event("early_stop", step=step, best_auc=best_auc)
                            break
    wait_s = totals["wait"] + window["wait"]
    compute_s = totals["compute"] + window["compute"]
    stats = {"input_wait_s": wait_s, "compute_s": compute_s,
             "input_bound": wait_s / (wait_s + compute_s) if wait_s + compute_s else 0.0,
             "windows": windows}
    return stats, stopped_early, step


def _evaluate(cfg: TrainConfig, predict, split_dir, name, step, log):
    if not split_dir:
        return None
    from ..input.pipeline import PipelineConfig, dataset_from_dir
    from .evaluate import evaluate
    eval_ds, _ = dataset_from_dir(split_dir, PipelineConfig(batch_size=8192), training=False)
    r = evaluate(predict, eval_ds)
    log.event("eval", step=step, split=name, **r)
    return r


def _finish(cfg: TrainConfig, model, m, feature_size, md: Path, predict, log, step, result) -> dict:
    """The chief's end of training: final evaluation, export, result.json."""
    from .export import export_saved_model
    result = {"step": step, **result}
    result["valid"] = _evaluate(cfg, predict, cfg.valid_dir, "valid", step, log)
    result["test"] = _evaluate(cfg, predict, cfg.test_dir, "test", step, log)
    if cfg.export:
        vocab = str(Path(cfg.train_dir) / m.vocabulary) if m.vocabulary else None
        result["export"] = export_saved_model(
            model, md / "export", step, {"field_size": m.field_size, "feature_size": feature_size,
                                         "step": step, "test": result["test"], "mode": cfg.mode},
            vocab)
        log.event("export", step=step, path=result["export"])
    (md / RESULT).write_text(json.dumps(result, indent=2) + "\n")
    log.close()
    return result


class _MetricsLog:
    """metrics.jsonl (one JSON object per event), TensorBoard scalars, and console lines."""

    def __init__(self, model_dir: Path, console: bool, enabled: bool = True):
        import tensorflow as tf
        self.enabled = enabled    # only the chief of a job writes
        self.console = console and enabled
        if enabled:
            self.f = open(model_dir / METRICS, "a")
            self.writer = tf.summary.create_file_writer(str(model_dir / "logs"))

    def event(self, kind: str, step: int, **fields):
        import tensorflow as tf
        if not self.enabled:
            return
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
        if self.enabled:
            self.f.close()
            self.writer.close()


def _fmt(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return str(v)
