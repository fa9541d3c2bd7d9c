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
import os
import shutil
import time
from pathlib import Path

import numpy as np

from .. import heartbeat
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
    progress: bool = True             # a progress bar on a terminal
    quiet: bool = False               # no console line per log window, evaluation, checkpoint
    fresh: bool = False               # delete the model directory's run and start over

    # Fields that must match for a checkpoint to be resumed: the variables' shapes, and where
    # in the data a resumed run continues (the seeded pipeline skips the batches consumed).
    SHAPE_FIELDS = ("embedding_size", "deep_layers", "batch_norm", "optimizer")
    POSITION_FIELDS = ("batch_size", "seed", "shuffle_buffer", "cache", "mode", "train_data")


def _check_config(cfg: TrainConfig):
    """Every setting in range before anything starts (the recipe and the API bypass the
    CLI's argument checks; a zero-width layer, say, aborts inside oneDNN)."""
    def positive(name, integer=True, zero=False):
        v = getattr(cfg, name)
        ok = (isinstance(v, int) and not isinstance(v, bool)) if integer else \
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (v == 0 and not zero):
            raise ConfigError(f"{name} must be a {'non-negative' if zero else 'positive'} "
                              f"{'integer' if integer else 'number'}, got {str(v)[:40]}")
    for name in ("batch_size", "embedding_size", "log_every", "keep_checkpoints"):
        positive(name)
    for name in ("eval_every", "checkpoint_every", "early_stopping", "shuffle_buffer", "seed"):
        positive(name, zero=True)
    positive("epochs", integer=False)
    positive("learning_rate", integer=False)
    positive("l2_reg", integer=False, zero=True)
    positive("checkpoint_secs", integer=False, zero=True)
    layers = tuple(cfg.deep_layers)
    if not layers or not all(isinstance(u, int) and not isinstance(u, bool) and u > 0 for u in layers):
        raise ConfigError(f"deep_layers must be one or more positive layer widths, got {list(layers)[:8]}")
    if cfg.feature_size is not None:
        positive("feature_size")
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


RUN_FILES = ("checkpoints", "logs", "export", METRICS, RESULT, CONFIG, "predictions.csv")


def _prepare_model_dir(cfg: TrainConfig, feature_size: int, field_size: int,
                       write: bool = True, train_data: str | None = None) -> Path:
    """Checks that the directory can be written and that a run already in it can be resumed:
    the same shapes, and the same data position settings (batch size, seed, shuffle, mode,
    training data), without which a resumed run would skip to the wrong batches. --fresh
    removes the earlier run's files first (only those: the directory may hold others).
    Non-chief processes only read it (they restore the chief's checkpoints)."""
    md = Path(cfg.model_dir)
    if not write:
        return md
    if md.exists() and not md.is_dir():
        raise ConfigError(f"model directory {md} exists and is not a directory")
    if cfg.fresh and md.is_dir():
        for name in RUN_FILES:
            target = md / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
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
    record.update(feature_size=feature_size, field_size=field_size, train_data=train_data)
    record["deep_layers"] = list(cfg.deep_layers)
    prev = md / CONFIG
    if prev.exists() and has_checkpoint(md):
        try:
            old = json.loads(prev.read_text())
            assert isinstance(old, dict)
        except (ValueError, AssertionError):
            raise ConfigError(f"{prev} is damaged, so the checkpoints beside it cannot be checked "
                              "before resuming; --fresh starts over") from None
        for k in TrainConfig.SHAPE_FIELDS + ("feature_size", "field_size") + TrainConfig.POSITION_FIELDS:
            if k in old and old[k] != record[k]:
                what = "data position" if k in TrainConfig.POSITION_FIELDS else "model"
                raise ConfigError(
                    f"{md} holds checkpoints of a run with {k}={_brief(old[k])}, not "
                    f"{_brief(record[k])}: resuming would continue at the wrong {what}. Use the "
                    "same setting, another --model-dir, or --fresh to start over")
    prev.write_text(json.dumps(record, indent=2) + "\n")
    return md


def _brief(v) -> str:
    text = repr(v)
    return text if len(text) <= 24 else text[:20] + "..."


def has_checkpoint(md: Path) -> bool:
    return any((md / "checkpoints").glob("ckpt-*.index"))


def data_fingerprint(m, directory) -> str | None:
    """Identity of the training data a data position refers to: its files' names, record
    counts and checksums (None for a Pipe stream, which has no files to name)."""
    import hashlib
    if not m.files:
        return None
    text = json.dumps(sorted((Path(f.path).name, f.records, f.sha256) for f in m.files))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
            check_checksums(o, other)
    return m, feature_size


EVAL_CHECKSUM_BYTES = 512 << 20


def check_checksums(m, directory) -> None:
    """Evaluation splits are read only after training: a corrupted file found then would
    waste the run. Up to 512 MB their checksums are checked now (a second or so per 500 MB);
    larger splits are checked record by record when read."""
    from ..data.manifest import sha256_file
    if sum(f.bytes for f in m.files) > EVAL_CHECKSUM_BYTES:
        return
    for f, path in zip(m.files, m.paths(directory)):
        if sha256_file(path) != f.sha256:
            raise DataError("sha256 does not match the manifest: the file is corrupted or was "
                            "changed (run `ctrtrain data validate`)", path=path)


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
                          label_format=m.label_format if m.format == "libsvm" else "01",
                          feature_size=cfg.feature_size or m.feature_size)
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
    md = _prepare_model_dir(cfg, feature_size, m.field_size, write=rt.is_chief,
                            train_data=data_fingerprint(m, cfg.train_dir))
    tf.random.set_seed(cfg.seed)
    lr = cfg.learning_rate * (rt.replicas if cfg.scale_lr else 1)
    with rt.scope():
        model, opt, train_step, variables = build_training(
            model_config(cfg, feature_size, m.field_size), cfg.optimizer, lr, rt)
    manager, start_step = restore_checkpoint(cfg, md, model, opt)
    heartbeat.beat(force=True)
    log = _MetricsLog(md, not cfg.quiet, enabled=rt.is_chief)
    announce_resume(log, md, start_step, total_steps)
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
            write_checkpoint(manager, step)
            log.event("checkpoint", step=step)

    stats, stopped_early, step = _run_steps(
        cfg, log, iter(data), train_step, start_step, total_steps, global_batch, save,
        lambda step: _evaluate(cfg, predict, cfg.valid_dir, "valid", step, log, feature_size),
        after_first=lambda: rt.after_first_step(variables),
        explain=lambda e: train_read_error(e, cfg, m, feature_size), is_chief=rt.is_chief)
    if not rt.is_chief:
        log.close()
        return {"step": step, "total_steps": total_steps, "chief": False}
    if not saved_at(manager, step):
        save(step)
    return _finish(cfg, model, m, feature_size, md, predict, log, step,
                   {"total_steps": total_steps, "resumed_from": start_step,
                    "stopped_early": stopped_early, "mode": cfg.mode, "replicas": rt.replicas,
                    "global_batch": global_batch, **stats})


def announce_resume(log, md: Path, start_step: int, total_steps) -> None:
    """A re-run that resumes says so, loudly: it may train no step at all."""
    if start_step and log.enabled:
        left = "" if total_steps is None else (
            f"; {max(0, total_steps - start_step)} of {total_steps} steps left"
            + (" (nothing to train: evaluating and exporting again)" if start_step >= total_steps else ""))
        print(f"resuming from the checkpoint at step {start_step} in {md}{left}. "
              "--fresh starts over", flush=True)


def train_read_error(e, cfg: TrainConfig, m, feature_size: int):
    """The training data's read error as a DataError naming the file and record."""
    from ..input.pipeline import explain_error
    if cfg.input_mode == "Pipe" or not m.files:
        from ..errors import DataError
        return DataError(f"reading the stream failed: {str(e).strip().splitlines()[0]}",
                         path=cfg.train_dir)
    return explain_error(e, m.paths(cfg.train_dir), fmt=m.format, field_size=m.field_size,
                         feature_size=feature_size, compression=m.compression,
                         label_format=m.label_format, what="training data")


def planned_steps(cfg: TrainConfig, records: int, global_batch: int, batch_desc: str) -> int:
    """Steps of the run: cfg.steps, else cfg.epochs over `records` in global batches."""
    steps_per_epoch = records // global_batch
    if steps_per_epoch == 0:
        raise ConfigError(f"{batch_desc} is larger than the training set ({records} records)")
    return cfg.steps or max(1, int(math.ceil(cfg.epochs * steps_per_epoch)))


def restore_checkpoint(cfg: TrainConfig, md: Path, model, opt):
    """(CheckpointManager over md/checkpoints, step to start from): the newest checkpoint that
    restores, else step 0 when there is none. A damaged state file (`checkpoint`) is set aside
    and the checkpoints are found by name; a damaged newest checkpoint falls back to the one
    before it, loudly. Checkpoints that exist but none of which restores are an error, never
    a silent restart from step 0."""
    import tensorflow as tf
    ckpt_dir = md / "checkpoints"
    state = ckpt_dir / "checkpoint"
    if state.exists():
        try:
            # TensorFlow logs a text proto that does not parse and returns None.
            problem = None if tf.train.get_checkpoint_state(str(ckpt_dir)) else "does not parse"
        except Exception as e:
            problem = str(e).splitlines()[0][:80]
        if problem:
            aside = state.with_name(f"checkpoint.damaged-{int(time.time())}")
            os.replace(state, aside)
            print(f"warning: {state} is damaged ({problem}); set aside as {aside.name}, "
                  "checkpoints found by name instead", flush=True)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir), max_to_keep=cfg.keep_checkpoints)
    candidates = sorted(((int(p.name[5:-6]), str(p)[:-6]) for p in ckpt_dir.glob("ckpt-*.index")
                         if p.name[5:-6].isdigit()), reverse=True)
    failures = []
    for step, prefix in candidates:
        try:
            ckpt.restore(prefix).assert_existing_objects_matched()
        except Exception as e:  # a cut or corrupted data file, a missing shard
            failures.append(f"{Path(prefix).name}: {str(e).strip().splitlines()[0][:120]}")
            continue
        if failures:
            print(f"warning: could not restore {'; '.join(failures)}; resumed from "
                  f"{Path(prefix).name} instead", flush=True)
            # The damaged ones are kept, renamed, out of every later restore's way.
            for bad_step, bad_prefix in candidates:
                if bad_step > step:
                    for part in ckpt_dir.glob(f"{Path(bad_prefix).name}.*"):
                        os.replace(part, part.with_name("damaged-" + part.name))
        if manager.latest_checkpoint != prefix:
            # Make the state file name the checkpoint in use, so later saves follow it.
            kept = [p for s, p in sorted(candidates) if s <= step]
            tf.compat.v1.train.update_checkpoint_state(str(ckpt_dir), prefix,
                                                       all_model_checkpoint_paths=kept)
            manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir),
                                                 max_to_keep=cfg.keep_checkpoints)
        return manager, int(opt.iterations.numpy())
    if failures:
        raise DataError("no checkpoint restores (" + "; ".join(failures) + "); move the "
                        "directory aside or train with --fresh", path=str(ckpt_dir))
    return manager, 0


def write_checkpoint(manager, step: int) -> None:
    """manager.save, with TensorFlow's write errors (a full disk, a vanished directory) named
    as the user's to fix instead of a traceback; the earlier checkpoints stay as they were."""
    import tensorflow as tf
    try:
        manager.save(checkpoint_number=step)
    except tf.errors.OpError as e:
        from ..errors import CtrError
        raise CtrError(f"cannot write the checkpoint of step {step} in {manager.directory}: "
                       f"{e.message.strip().splitlines()[0] if e.message else e}") from None


def saved_at(manager, step: int) -> bool:
    """Whether the latest checkpoint is of this step (the final save would repeat it)."""
    latest = manager.latest_checkpoint
    return latest is not None and int(latest.rsplit("-", 1)[1]) == step


def _run_steps(cfg, log, it, train_step, start_step, total_steps, global_batch, save, evaluate,
               after_first=lambda: None, explain=lambda e: e, is_chief=True):
    """The step loop: input wait and compute timed apart, logging, checkpoints, evaluation and
    early stopping. total_steps None: until the data ends (a Pipe stream); otherwise data
    that ends first is an error. A read error becomes a DataError naming the record
    (`explain`); a loss that is not finite stops the run before it is checkpointed; SIGTERM
    or SIGINT stop it after a checkpoint. Returns (stats, stopped_early, last step)."""
    import tensorflow as tf

    from .stop import Interrupted, StopRequests
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
             disable=None if (cfg.progress and log.enabled) else True) as pb, \
            StopRequests() as stop:
        pb.update(start_step)
        heartbeat.beat(force=True)
        while total_steps is None or step < total_steps:
            if stop.signum is not None:
                if window["steps"]:
                    flush_window(step)
                save(step)
                log.event("stopped", step=step, signal=stop.signum)
                raise Interrupted(stop.signum, step, saved=is_chief)
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
                raise explain(e) from None
            except StopIteration:
                if window["steps"]:
                    flush_window(step)
                if total_steps is not None:
                    raise DataError(f"the training data ended after {step} of {total_steps} "
                                    "steps (a Pipe channel: feed more epochs, pipe_epochs, or "
                                    "train fewer steps)", path=cfg.train_dir)
                break
            t1 = time.perf_counter()
            loss = float(train_step(batch))
            t2 = time.perf_counter()
            if not math.isfinite(loss):
                raise NonFiniteLoss(f"the training loss became {loss} at step {step + 1}: the "
                                    "model diverged (learning rate too high?) or the data holds "
                                    "extreme values; nothing of this step was checkpointed "
                                    "(the last checkpoint is intact)", path=cfg.train_dir)
            if step == start_step:
                after_first()
            step += 1
            pb.update(1)
            heartbeat.beat()
            window["wait"] += t1 - t0
            window["compute"] += t2 - t1
            window["steps"] += 1
            window["loss"] += loss
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


class NonFiniteLoss(DataError):
    pass


def _evaluate(cfg: TrainConfig, predict, split_dir, name, step, log, feature_size=None):
    if not split_dir:
        return None
    import tensorflow as tf

    from ..input.pipeline import PipelineConfig, dataset_from_dir, explain_error
    from .evaluate import evaluate
    heartbeat.beat(force=True)
    eval_ds, m = dataset_from_dir(split_dir, PipelineConfig(batch_size=8192,
                                                            feature_size=feature_size),
                                  training=False)
    try:
        r = evaluate(predict, eval_ds)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        raise explain_error(e, m.paths(split_dir), fmt=m.format, field_size=m.field_size,
                            feature_size=feature_size or m.feature_size,
                            compression=m.compression, label_format=m.label_format,
                            what=f"{name} split") from None
    heartbeat.beat(force=True)
    log.event("eval", step=step, split=name, **r)
    return r


def _finish(cfg: TrainConfig, model, m, feature_size, md: Path, predict, log, step, result) -> dict:
    """The chief's end of training: final evaluation, export, result.json."""
    from .export import export_saved_model
    result = {"step": step, **result}
    result["valid"] = _evaluate(cfg, predict, cfg.valid_dir, "valid", step, log, feature_size)
    result["test"] = _evaluate(cfg, predict, cfg.test_dir, "test", step, log, feature_size)
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
