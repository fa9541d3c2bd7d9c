"""A run's data: the training data's manifest checked against the evaluation splits, this
process's training dataset (its read plan, tf.data service), the planned steps, and read
errors traced to the file and record."""

from __future__ import annotations

import math
from pathlib import Path

from ..data.index import describe_source, source_files
from ..errors import ConfigError, DataError
from .config import (TrainConfig, embedding_width, resolve_model_options, resolve_shuffle_buffer,
                     resolve_table_scale, resolve_table_updates, run_schema)
from .threads import data_options


def check_data(cfg: TrainConfig):
    """(train manifest, table rows): the training data's, checked against the other splits.
    A Pipe channel's manifest is made from the config (no files, records unknown). Once the
    table's size is known, table_updates `auto` becomes what it chooses for it, and
    shuffle_buffer, batch_size and embedding_size `auto` what they choose for the data's
    size."""
    from ..data.index import resolve_source
    from ..data.manifest import Manifest, declared_fields
    if cfg.input_mode == "Pipe":    # field_size or fields, and feature_size (check_config)
        fields = declared_fields(cfg.fields) if cfg.fields else None
        if fields and cfg.field_size not in (None, len(fields)):
            raise ConfigError(f"field_size {cfg.field_size}, but fields declares {len(fields)}")
        m = Manifest(cfg.data_format, len(fields) if fields else cfg.field_size,
                     cfg.feature_size, [], label_format=cfg.label_format, fields=fields)
        if m.schema is not None:
            m.schema.check_ids(cfg.feature_size, "fields")
    else:
        # A directory, files or globs; without a manifest, indexed now.
        m, root = resolve_source(cfg.train_dir)
        check_first_record(m, root)
    feature_size = cfg.feature_size or m.feature_size
    if feature_size < m.feature_size:
        raise ConfigError(f"feature_size {feature_size} is smaller than the data's {m.feature_size}")
    for other in (cfg.valid_dir, cfg.test_dir):
        if other:
            o, root = resolve_source(other)
            if o.fields != m.fields:
                raise DataError("declares other fields than the training data (the manifests' "
                                "`fields`)", path=describe_source(other))
            if o.field_size != m.field_size:
                raise DataError(f"field_size {o.field_size} does not match the training data's "
                                f"{m.field_size}", path=describe_source(other))
            if o.feature_size > feature_size:
                raise DataError(f"ids up to {o.feature_size - 1} do not fit the model's table of "
                                f"{feature_size} rows (the training data's feature_size; convert "
                                "every split with `--like <train dir>`, or give --feature-size)",
                                path=describe_source(other))
            check_checksums(o, root)
            check_first_record(o, root)
    schema = run_schema(cfg, m)     # dynamic_fields named by the data, or refused by name
    if cfg.dynamic_fields:          # `all` recorded as the fields it names
        cfg.dynamic_fields = tuple(f.name for f in schema.fields if f.dynamic)
    resolve_table_updates(cfg, feature_size)
    resolve_shuffle_buffer(cfg, m)
    resolve_table_scale(cfg, m)
    resolve_model_options(cfg, m)
    if m.schema is not None:
        check_bag_memory(m.schema, cfg.batch_size, embedding_width(cfg),
                         "fields" if cfg.input_mode == "Pipe" else describe_source(cfg.train_dir))
    if cfg.cache:
        check_cache_memory(cfg, m)
    return m, feature_size


def check_cache_memory(cfg: TrainConfig, m) -> None:
    """`cache` holds this reader's records twice while parsing them in one call (serialized,
    then parsed, the parse's padded copy beside): refused before reading when that would
    take over 80% of the memory left, as the kernel's OOM killer would end it without a
    word. Streaming (no cache) needs a few batches."""
    from ..usage import available_memory
    free = available_memory()
    if free is None or not m.records:
        return
    records = local_records(cfg, m)
    share = records / m.records
    serialized = share * sum(f.bytes for f in m.files) * (4 if m.compression else 1)
    per = m.schema.parsed_record_bytes() if m.schema is not None else 4 + 12 * m.field_size
    need = serialized + 2 * records * per
    if need <= 0.8 * free:
        return
    raise DataError(f"--cache: holding the training data in memory needs about "
                    f"{need / 2**30:.2f} GiB ({records:,} records: {serialized / 2**30:.2f} GiB "
                    f"read, then {per:,} bytes a record parsed, twice while parsing), over 80% "
                    f"of the {free / 2**30:.2f} GiB of memory left: train without --cache (the "
                    "records stream from the files)", path=describe_source(cfg.train_dir))


def check_bag_memory(schema, batch_size: int, embedding_size: int, where: str) -> None:
    """Every row's bags are padded to max_len: refused before anything is allocated when a
    batch of them would take more than half the memory left (a process grows to it with no
    step, then is killed)."""
    from ..usage import available_memory
    need, free = schema.bag_batch_bytes(batch_size, embedding_size), available_memory()
    if free is None or need <= free // 2:
        return
    widest = max(schema.lists(), key=lambda f: f.max_len)
    raise DataError(f"a batch's bags need about {need / 2**30:.1f} GiB (batch_size {batch_size} "
                    f"x {schema.bag_width:,} bag ids a row x embedding_size {embedding_size}; "
                    f"max_len {widest.max_len:,} here), over half the "
                    f"{free / 2**30:.1f} GiB of memory left: lower max_len (featurize --max-len) "
                    "or batch_size", path=where, field=widest.name)


EVAL_CHECKSUM_BYTES = 512 << 20


def check_first_record(m, directory) -> None:
    """Declared fields the records do not hold would be read as empty bags: refused. The first
    record of every file (a file written by another job may lack a field the others hold)."""
    if m.schema is not None and m.files:
        from ..data.validate import check_declared_keys
        for path in m.paths(directory):
            check_declared_keys(path, m.schema, m.compression)


def positive_rate(m) -> float | None:
    """The training data's share of positive labels (None for a stream: not known ahead)."""
    return m.positives / m.records if m.records else None


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


def training_dataset(cfg: TrainConfig, m, batch_size: int, skip_batches: int, seed: int | None,
                     stack: int = 0):
    """This reader's part of the training data (cfg.read_plan), batched, repeated forever,
    optionally through tf.data service; with `stack`, in stacks of that many batches (each
    tensor [stack, ...]; the last of a finite stream may hold fewer), for a trainer that runs
    several steps a call (step.py stacked_steps_function)."""
    import tensorflow as tf

    from ..input.pipeline import PipelineConfig, make_dataset, make_pipe_dataset
    # Through tf.data service every consumer registers the same dataset (all of it, one seed):
    # the service decides who gets what (distributed_epoch: each element once).
    plan = None if cfg.data_service else cfg.read_plan
    seed = cfg.seed if cfg.data_service else seed
    pcfg = PipelineConfig(batch_size=batch_size, shuffle_buffer=cfg.shuffle_buffer,
                          cache=cfg.cache, seed=seed, parse=cfg.parse,
                          read_block=cfg.read_block,
                          label_format=m.label_format if m.format == "libsvm" else "01",
                          feature_size=cfg.feature_size or m.feature_size)
    if cfg.input_mode == "Pipe":
        # The platform serves as many epochs as are read: `epochs` FIFOs, or without end
        # when the run is given in steps (the trainer stops the reading).
        pcfg.epochs = None if cfg.steps else int(cfg.epochs)
        ds = make_pipe_dataset(cfg.train_dir, m.field_size, fmt=m.format, cfg=pcfg,
                               record_shard=plan.record_shard if plan else None,
                               skip_batches=skip_batches, schema=run_schema(cfg, m))
    else:
        ds = make_dataset(source_files(cfg.train_dir), m.field_size, fmt=m.format,
                          compression=m.compression, cfg=pcfg,
                          file_shard=plan.file_shard if plan else None,
                          record_shard=plan.record_shard if plan else None,
                          skip_batches=0 if cfg.data_service else skip_batches,
                          schema=run_schema(cfg, m))
    if cfg.data_service:
        # The whole pipeline (read, shuffle, batch, parse) runs on the data-service workers;
        # every training process of the job joins one shared job.
        ds = ds.apply(tf.data.experimental.service.distribute(
            processing_mode=cfg.processing_mode, service=cfg.data_service,
            job_name=f"ctrtrain-{Path(cfg.model_dir).name}"))
        if skip_batches:
            # A resumed job's service job starts the data anew: each consumer drops as many
            # batches as it had consumed, so training goes on from the same point of the
            # epochs (the service hands out splits as workers ask: the same amount of data,
            # not the same batches). Without it every retry re-read its epoch's first part.
            ds = ds.skip(skip_batches)
        ds = ds.prefetch(tf.data.AUTOTUNE)
    if stack:
        ds = ds.batch(stack).prefetch(1)
    return ds.with_options(data_options(cfg.threads))


def local_records(cfg: TrainConfig, m) -> int:
    from ..data.sharding import ReadPlan
    return (cfg.read_plan or ReadPlan("training")).records([f.records for f in m.files])


def train_read_error(e, cfg: TrainConfig, m, feature_size: int):
    """The training data's read error as a DataError naming the file and record."""
    from ..input.pipeline import explain_error
    if cfg.input_mode == "Pipe" or not m.files:
        from ..errors import DataError
        return DataError(f"reading the stream failed: {str(e).strip().splitlines()[0]}",
                         path=cfg.train_dir)
    return explain_error(e, source_files(cfg.train_dir), fmt=m.format, field_size=m.field_size,
                         feature_size=feature_size, compression=m.compression,
                         label_format=m.label_format, what="training data", schema=run_schema(cfg, m))


def planned_steps(cfg: TrainConfig, records: int, global_batch: int, batch_desc: str) -> int:
    """Steps of the run: cfg.steps, else cfg.epochs over `records` in global batches."""
    steps_per_epoch = records // global_batch
    if steps_per_epoch == 0:
        raise ConfigError(f"{batch_desc} is larger than the training set ({records} records)")
    return cfg.steps or max(1, int(math.ceil(cfg.epochs * steps_per_epoch)))


def schedule_of(cfg: TrainConfig, total_steps: int | None, records: int | None,
                global_batch: int):
    """The controller's schedule in steps: settings given in epochs ('0.5 epochs') become
    steps of this run's global batch. eval_every `auto`: every epoch with a validation split
    and a known epoch length (not a Pipe stream), else at the end only."""
    from .controller import Schedule

    def steps(name):
        v = getattr(cfg, name)
        if v == "auto":
            v = "1 epochs" if cfg.valid_dir and records else 0
        if not isinstance(v, str):
            return v
        if not records:
            raise ConfigError(f"{name}: {v} needs a known epoch length; give steps")
        return max(1, int(round(float(v.split()[0]) * records / global_batch)))
    every = {n: steps(n) for n in ("log_every", "checkpoint_every", "eval_every")}
    return Schedule(total_steps, every["log_every"], every["checkpoint_every"],
                    cfg.checkpoint_secs, every["eval_every"], cfg.early_stopping, cfg.eval_test,
                    monitor=cfg.monitor, lr_decay=cfg.lr_decay_on_plateau,
                    keep_best=cfg.export_best and bool(cfg.valid_dir),
                    steps_per_epoch=records / global_batch if records else None,
                    epochs=None if cfg.steps or not total_steps else cfg.epochs)
