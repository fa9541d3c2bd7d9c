"""The one function that fixes the order of the input pipeline's transformations.

    records: File mode: list files -> [shard files] -> each file read in blocks of
                        `read_block` records -> interleave (deterministic)
             Pipe mode: the channel's FIFO stream, framed (pipe.py)
    -> [shard records, then blocks] -> [shuffle blocks] -> repeat
    -> rebatch to the batch size -> [skip resumed batches] -> vectorized parse -> prefetch

With `cache`, training reads differently: the records are parsed once, all of them, and
kept in memory as tensors; each epoch is a new permutation of them, gathered a batch at a
time (in_memory_batches). Keras users train so from arrays; here reading and parsing (with
the shuffle, 2.57 against 0.33 ms of CPU a batch of 1,024 on MovieLens-100K,
scripts/input_cpu.py; CPU the step shares) are paid once instead of every epoch, and the shuffle
draws single records from the whole part, whatever shuffle_buffer (unless 0: the read
order) and read_block say.

Why this order: shuffle before repeat so epochs do not blend; batch *before* parse so one
`parse_example` call decodes a whole batch (about 8x faster than per record); skipping
serialized batches is how a resumed run returns to the data position it stopped at without
paying for parsing; prefetch last so the next batch is ready while the model steps.
Why blocks: tf.data pays about a microsecond per element in every transformation it passes;
moving records 16 at a time through the interleave, the shuffle and the batching took the
pipeline from 2.4-3.2 to 1.6-1.75 ms of CPU a batch of 1,024 (scripts/input_cpu.py), CPU the
training step shares. The cost: a batch is 64 runs of 16 consecutive records of a file, drawn from a
buffer of shuffle_buffer / 16 blocks, instead of 1,024 records drawn one by one
(docs/benchmarks.md measures the quality either way; `read_block=1` is the record-by-record
pipeline).
"""

from __future__ import annotations

import dataclasses
import os
import random

import tensorflow as tf

from ..data.tfrecord import feature_spec, tf_compression

AUTOTUNE = tf.data.AUTOTUNE
# The pipeline's functions are plain TensorFlow (no Python control flow on tensors): traced as
# written, not rewritten by AutoGraph first, whose conversion was most of a small run's
# tracing CPU (as train/step.py's functions, `autograph=False`).
plain = tf.autograph.experimental.do_not_convert


@dataclasses.dataclass
class PipelineConfig:
    batch_size: int = 1024
    shuffle_buffer: int = 10_000      # 0 = no shuffling
    cache: bool = False               # training: the records parsed once and kept in memory,
                                      # each epoch a new permutation (in_memory_batches)
    epochs: int | None = None         # None = repeat forever (the trainer counts steps)
    drop_remainder: bool = True       # static batch shapes for training
    seed: int = 0
    parallel_reads: int = 4           # files interleaved (training)
    read_threads: bool | None = None  # interleaved by tf.data's threads; None: for compressed
                                      # files or more than 4 cores (make_dataset)
    read_block: int = 16              # records read, shuffled and batched as one element
                                      # (1: one by one; the module's docstring says why)
    label_format: str = "01"          # libsvm text only
    parse: str = "vectorized"         # or "scalar": parse each record, then batch (the
                                      # common tutorial order; kept to measure the difference)
    feature_size: int | None = None   # when given, every batch is checked: labels 0/1 (or
                                      # -1/1), ids in [0, feature_size), finite values


def parse_tfrecord_batch(serialized, field_size: int, with_label: bool = True):
    spec = feature_spec(field_size)
    if not with_label:
        del spec["label"]
    f = tf.io.parse_example(serialized, spec)
    out = {"ids": f["ids"], "values": f["values"]}
    return {"label": f["label"][:, 0], **out} if with_label else out


def parse_fields_batch(serialized, schema, with_label: bool = True):
    """A batch of a declared schema's Examples (data/schema.py) in the batch layout
    documented there: categorical ids [B, C] (values 1; bucketized numeric fields' bucket ids
    after them), numeric [B, N], every bag cut to its
    max_len (a multi_hot's first ids, a sequence's last) and padded with -1 ids and 0 weights
    into bag_ids / bag_weights [B, sum max_len]."""
    from ..data.schema import feature_spec as fields_spec
    spec = fields_spec(schema)
    if not with_label:
        del spec["label"]
    return fields_batch(tf.io.parse_example(serialized, spec), schema, with_label)


def fields_batch(f: dict, schema, with_label: bool = True) -> dict:
    """parse_fields_batch's layout from the fields as parse_example gives them ({name: [B, 1]
    tensor or RaggedTensor}): from records, or from raw cells (data/raw_graph.py)."""
    from ..data.schema import WEIGHTS_SUFFIX
    first = f[schema.fields[0].name]
    rows = (first.nrows() if isinstance(first, tf.RaggedTensor)
            else tf.shape(first, out_type=tf.int64)[0])[None]
    out = {"label": f["label"][:, 0]} if with_label else {}
    checks = _outside_reserved_spans(f, schema)
    f.update({c.name: field_ids(c, f[c.name]) for c in schema.fields if c.hash_buckets})
    cat = [f[c.name] for c in schema.of("categorical")]
    cat += [tf.cast(tf.raw_ops.Bucketize(input=f[c.name], boundaries=list(c.boundaries)),
                    tf.int64) + c.bucket_base for c in schema.bucketized()]
    out["ids"] = tf.concat(cat, 1) if cat else tf.zeros(tf.concat([rows, [0]], 0), tf.int64)
    out["values"] = tf.ones_like(out["ids"], tf.float32)
    if schema.of("numeric"):
        out["numeric"] = tf.concat([f[c.name] for c in schema.of("numeric")], 1)
    bags = schema.lists()
    if bags:
        ids, weights = [], []
        for b in bags:
            bag = f[b.name]
            if b.weighted:
                w = f[b.name + WEIGHTS_SUFFIX]
                tf.debugging.assert_equal(
                    bag.row_lengths(), w.row_lengths(),
                    message=f"ctrtrain: a record's {b.name}{WEIGHTS_SUFFIX} does not have one "
                            f"weight per id of {b.name}")
            else:
                w = tf.ones_like(bag, tf.float32)
            # -1 pads a bag below: an id of -1 in a record would vanish into the padding.
            checks.append(tf.debugging.Assert(~tf.reduce_any(bag.flat_values < 0), [
                f"ctrtrain: a record holds a negative id in {b.name}"]))
            kept = slice(-b.max_len, None) if b.kind == "sequence" else slice(None, b.max_len)
            ids.append(bag[:, kept].to_tensor(-1, shape=[None, b.max_len]))
            weights.append(w[:, kept].to_tensor(0.0, shape=[None, b.max_len]))
        out["bag_ids"] = tf.concat(ids, 1)
        out["bag_weights"] = tf.concat(weights, 1)
    if checks:
        with tf.control_dependencies(checks):
            out = {k: tf.identity(v) for k, v in out.items()}
    return out


def _outside_reserved_spans(parsed, schema) -> list:
    """Asserts that no id a record holds itself (fields without hashing) lies among the ids
    a hashed field or a bucketized one owns (Schema.reserved_spans): it would share their
    rows. A comparison per span on the batch's ids; nothing when the schema reserves none."""
    spans = schema.reserved_spans()
    own = [parsed[c.name] for c in schema.fields if c.kind != "numeric" and not c.hash_buckets]
    if not spans or not own:
        return []
    ids = tf.concat([tf.reshape(v.flat_values if isinstance(v, tf.RaggedTensor) else v, [-1])
                     for v in own], 0)
    return [tf.debugging.Assert(~tf.reduce_any((ids >= lo) & (ids < hi)), [
        f"ctrtrain: a record holds an id among {name}'s {what} {lo}..{hi - 1}"])
        for lo, hi, name, what in spans]


# A dynamic field's keys: Fingerprint64 of the raw value into [0, 2^63 - 1), the int64 a
# hash table takes; two of a field's values share a key with probability ~ n^2 / 2^64.
DYNAMIC_KEYS = 2 ** 63 - 1


def dynamic_salt(name: str) -> int:
    """A field's salt in [0, 2^62): its keys XOR it, so equal values of two fields are two
    keys (models/engine/dynamic.py holds every dynamic field's keys in one map)."""
    import hashlib
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 2


def field_ids(field, values):
    """A field's int64 ids from its parsed feature (dense or ragged): a hashed field's strings
    become hash_base + Fingerprint64 mod hash_buckets (data/schema.py), a dynamic field's
    their raw keys (the model maps them onto its buckets), here for training, evaluation and
    the exported model alike."""
    if not field.hash_buckets:
        return values

    def hashed(s):
        if field.dynamic:     # salted by the field's name: one map holds every field's keys
            return tf.bitwise.bitwise_xor(tf.strings.to_hash_bucket_fast(s, DYNAMIC_KEYS),
                                          dynamic_salt(field.name))
        return tf.strings.to_hash_bucket_fast(s, field.hash_buckets) + field.hash_base
    if isinstance(values, tf.RaggedTensor):
        return tf.ragged.map_flat_values(hashed, values)
    return hashed(values)


def parse_libsvm_batch(lines, field_size: int, label_format: str = "01"):
    """Vectorized libsvm parse of a batch of lines (tf.strings; dense before slicing)."""
    tokens = tf.strings.split(tf.strings.strip(lines))
    tf.debugging.assert_equal(
        tokens.row_lengths(), tf.cast(field_size + 1, tf.int64),
        message=f"a libsvm line in this batch does not have {field_size} id:value pairs "
                "(run `ctrtrain data validate` to find it)")
    dense = tokens.to_tensor(shape=[None, field_size + 1])
    pairs = tf.strings.split(dense[:, 1:], ":").to_tensor(shape=[None, field_size, 2])
    label = tf.strings.to_number(dense[:, 0], tf.float32)
    if label_format == "pm1":
        # -1/1 -> 0/1; anything else stays out of {0, 1} and fails check_batch.
        label = tf.where(tf.abs(label) == 1, tf.cast(label > 0, tf.float32), label + 0.5)
    return {"label": label,
            "ids": tf.strings.to_number(pairs[..., 0], tf.int64),
            "values": tf.strings.to_number(pairs[..., 1], tf.float32)}


BAD_BATCH = "ctrtrain: a batch holds a record that is not valid"


def _bad_rows(b, feature_size: int, keys: tuple[int, ...] = ()) -> list:
    """(per-row bool [B], what is wrong) for each check a record must pass: ids inside the
    table (-1 pads a bag; `keys`: the ids columns of dynamic fields, any key >= 0), finite
    values."""
    def rows(checks):       # per row, without copying the batch into one tensor
        return ~tf.math.reduce_all(tf.stack([tf.reduce_all(c, axis=1) for c in checks]), 0)
    in_table = b["ids"] < feature_size
    if keys:
        in_table |= tf.constant([j in keys for j in range(b["ids"].shape[1])])[None, :]
    ids_ok = [(b["ids"] >= 0) & in_table]
    finite = [tf.math.is_finite(b["values"])]
    if "numeric" in b:
        finite.append(tf.math.is_finite(b["numeric"]))
    if "bag_ids" in b:
        ids_ok.append((b["bag_ids"] >= -1) & (b["bag_ids"] < feature_size))
        finite.append(tf.math.is_finite(b["bag_weights"]))
    return [(rows(ids_ok), f"an id outside the table [0, {feature_size})"),
            (rows(finite), "a value that is not finite")]


def dynamic_columns(schema) -> tuple[int, ...]:
    """The ids columns that hold a dynamic field's raw keys (none without a schema)."""
    return tuple(c for c, _, _ in schema.dynamic_pools()) if schema is not None else ()


def check_batch(b, feature_size: int, keys: tuple[int, ...] = ()):
    """Fails the batch (InvalidArgumentError carrying BAD_BATCH) if a label is not 0/1, an id
    is outside the table or a value is not finite: such a record would train a wrong model or
    crash the lookup with no place named. The reader then finds the record (explain_error).
    A handful of element-wise ops per batch, small beside a training step."""
    ok = tf.reduce_all((b["label"] == 0.0) | (b["label"] == 1.0))
    for bad, _ in _bad_rows(b, feature_size, keys):
        ok &= ~tf.reduce_any(bad)
    with tf.control_dependencies([tf.debugging.Assert(ok, [BAD_BATCH])]):
        return {k: tf.identity(v) for k, v in b.items()}


def check_request(features, feature_size: int, keys: tuple[int, ...] = ()):
    """A serving request's features, or InvalidArgumentError naming the first record (0-based,
    in the request) that training would refuse: an id outside the table or a value that is
    not finite, which the model would otherwise score as if valid (or answer NaN). `keys`:
    the ids columns of dynamic fields (raw keys)."""
    asserts = []
    for bad, what in _bad_rows(features, feature_size, keys):
        first = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
        asserts.append(tf.debugging.Assert(~tf.reduce_any(bad), [tf.strings.format(
            "ctrtrain: record {} of the request has " + what, first)]))
    with tf.control_dependencies(asserts):
        return {k: tf.identity(v) for k, v in features.items()}


def check_request_keys(serialized, schema) -> list:
    """Asserts that each record of an `examples` request holds every declared bag's key (and
    its weights' key). parse_example reads a missing RaggedFeature key as an empty bag, so a
    client that misnames or drops a field would be scored as if the field were empty; every
    ctrtrain writer writes an empty bag as an empty list. [] when the schema has no bag."""
    from ..data.tfrecord import lacking_keys
    names = schema.bag_keys()
    if not names:
        return []
    lacking = lacking_keys(serialized, names)
    asserts = []
    for j, name in enumerate(names):
        first = tf.argmax(tf.cast(lacking[:, j], tf.int32), output_type=tf.int64)
        asserts.append(tf.debugging.Assert(~tf.reduce_any(lacking[:, j]), [tf.strings.format(
            "ctrtrain: record {} of the request has no feature " + name + " (a declared "
            "field; an empty one is an empty list)", first)]))
    return asserts


def explain_error(e: Exception, paths: list[str], *, fmt: str, field_size: int,
                  feature_size: int | None, compression: str | None = None,
                  label_format: str = "01", what: str = "data", schema=None):
    """A DataError naming the file and record (or line) behind a read error of TensorFlow's
    (a corrupt or cut TFRecord, a record outside the schema, a bad label or id), found by
    scanning the files; if none is found, the error as TensorFlow said it."""
    from ..data.validate import first_bad_record
    from ..errors import DataError
    found = first_bad_record(paths, fmt=fmt, field_size=field_size, feature_size=feature_size,
                             compression=compression, label_format=label_format, schema=schema)
    if found is not None:
        return found
    from ..errors import first_line
    return DataError(f"reading the {what} failed: {first_line(e)}", path=", ".join(paths[:3]))


def make_dataset(files: list[str], field_size: int, *, fmt: str = "tfrecord",
                 compression: str | None = None, cfg: PipelineConfig = PipelineConfig(),
                 file_shard: tuple[int, int] | None = None,
                 record_shard: tuple[int, int] | None = None,
                 skip_batches: int = 0, training: bool = True,
                 schema=None) -> tf.data.Dataset:
    """Batches of {"label": [B], "ids": [B, F], "values": [B, F]} from files (with a declared
    `schema`, data/schema.py: its batch layout).
    `file_shard`/`record_shard` = (count, index): this reader's part of the data (decided by
    the sharding policy, not here). Evaluation (`training=False`) keeps file order, does not
    shuffle or repeat, and keeps the last partial batch."""
    if not files:
        raise ValueError("no input files")
    ds = tf.data.Dataset.from_tensor_slices(list(files))
    if file_shard:
        ds = ds.shard(*file_shard)
    if fmt == "tfrecord":
        def records(f):
            return tf.data.TFRecordDataset(f, compression_type=tf_compression(compression))
    elif fmt == "libsvm":
        records = tf.data.TextLineDataset
    else:
        raise ValueError(f"unknown input format {fmt!r}")
    # Each file is cut into blocks where it is read (per-file blocks cost less than blocks cut
    # after the interleave: 1.7 against 2.0 ms a batch); a reader sharded by record takes its
    # records first and blocks them after (batches).
    block = read_block(cfg)
    blocked = block > 1 and not record_shard

    def read(f):
        return records(f).batch(block) if blocked else records(f)
    mine = len(files) if not file_shard else len(range(file_shard[1], len(files), file_shard[0]))
    cycle = max(1, min(cfg.parallel_reads, mine))
    # One file is read in order either way; a parallel interleave of one input costs ~15 us a
    # record in synchronization (16 ms a batch of 1024 against 1.5 ms read in sequence).
    # Several files are interleaved in the same order (deterministic) by the pipeline's own
    # thread, unless reading is work worth threads: decompression, or more than 4 cores to
    # spare. On 2 cores the threads' per-record handoff took about twice the CPU (8.3 against
    # 3.9-4.1 ms a batch of 1024, scripts/input_cpu.py), CPU the training step shares.
    threaded = cfg.read_threads
    if threaded is None:
        threaded = bool(tf_compression(compression)) or (os.cpu_count() or 1) > 4
    threads = {"num_parallel_calls": AUTOTUNE, "deterministic": True} if threaded else {}
    ds = ds.interleave(plain(read), cycle_length=cycle, block_length=1, **threads) \
        if training and cycle > 1 else ds.flat_map(plain(read))
    return batches(ds, field_size, fmt=fmt, cfg=cfg, record_shard=record_shard,
                   skip_batches=skip_batches, training=training, schema=schema,
                   blocked=blocked)


def read_block(cfg: PipelineConfig) -> int:
    """Records per element before batching: cfg.read_block, or 1 where records are parsed
    one by one (parse="scalar")."""
    if cfg.read_block < 1:
        raise ValueError(f"read_block must be at least 1, not {cfg.read_block}")
    return 1 if cfg.parse == "scalar" else cfg.read_block


def make_pipe_dataset(fifo_prefix: str, field_size: int, *, fmt: str = "tfrecord",
                      cfg: PipelineConfig = PipelineConfig(),
                      record_shard: tuple[int, int] | None = None,
                      skip_batches: int = 0, schema=None) -> tf.data.Dataset:
    """Training batches from a Pipe channel (FIFOs `<fifo_prefix>_<epoch>`): cfg.epochs of
    them (None: as many as the trainer's steps take), each streamed once (no cache; the
    epochs are FIFOs, not a repeat)."""
    from .pipe import pipe_records
    stream = pipe_records(fifo_prefix, fmt, cfg.epochs)
    cfg = dataclasses.replace(cfg, cache=False, epochs=1)
    return batches(stream, field_size, fmt=fmt, cfg=cfg,
                   record_shard=record_shard, skip_batches=skip_batches, training=True,
                   schema=schema)


def batches(ds: tf.data.Dataset, field_size: int, *, fmt: str, cfg: PipelineConfig,
            record_shard: tuple[int, int] | None, skip_batches: int,
            training: bool, schema=None, blocked: bool = False) -> tf.data.Dataset:
    """Serialized records (or libsvm lines; `blocked`: vectors of read_block of them) -> parsed
    batches, in the order documented above."""
    parse = batch_parser(field_size, fmt=fmt, cfg=cfg, schema=schema)
    if record_shard:
        ds = ds.shard(*record_shard)
    keys = dynamic_columns(schema)
    if training and cfg.cache:      # the read order kept: blocks of a file taken apart
        return in_memory_batches(ds.unbatch() if blocked else ds, parse, cfg, skip_batches, keys)
    block = read_block(cfg)
    if block > 1 and not blocked:
        ds = ds.batch(block)
    if training:
        if cfg.shuffle_buffer:
            ds = ds.shuffle(-(-cfg.shuffle_buffer // block), seed=cfg.seed,
                            reshuffle_each_iteration=True)
        ds = ds.repeat(cfg.epochs)
    if cfg.parse == "scalar":
        # One record at a time (a batch of one), then batch the parsed tensors.
        ds = ds.map(plain(lambda s: {k: v[0] for k, v in parse(tf.reshape(s, [1])).items()}),
                    num_parallel_calls=AUTOTUNE)
    elif cfg.parse != "vectorized":
        raise ValueError(f"parse must be vectorized or scalar, not {cfg.parse!r}")
    drop = cfg.drop_remainder and training
    # rebatch = unbatch().batch() in one copy: batches of exactly batch_size records.
    ds = ds.rebatch(cfg.batch_size, drop_remainder=drop) if block > 1 \
        else ds.batch(cfg.batch_size, drop_remainder=drop)
    if skip_batches:
        ds = ds.skip(skip_batches)
    if cfg.parse == "vectorized":
        ds = ds.map(plain(parse), num_parallel_calls=AUTOTUNE)
    if cfg.feature_size:
        ds = ds.map(plain(lambda b: check_batch(b, cfg.feature_size, keys)),
                    num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE)


def batch_parser(field_size: int, *, fmt: str, cfg: PipelineConfig, schema=None):
    """A vector of serialized records (or libsvm lines) -> its batch of tensors."""
    if schema is not None:
        return lambda s: parse_fields_batch(s, schema)
    if fmt == "tfrecord":
        return lambda s: parse_tfrecord_batch(s, field_size)
    return lambda s: parse_libsvm_batch(s, field_size, cfg.label_format)


def in_memory_batches(records: tf.data.Dataset, parse, cfg: PipelineConfig,
                      skip_batches: int, keys: tuple[int, ...] = ()) -> tf.data.Dataset:
    """Training batches from records parsed once, in one call, and kept as tensors: each epoch
    a permutation of all of them, single records whatever shuffle_buffer and read_block say
    (shuffle_buffer 0: the read order), drawn from (seed, epoch) alone, so a resumed run skips
    to where it stopped; epochs run on into each other as the streaming pipeline's do; each
    batch gathered from the tensors. Checked once (check_batch), not per batch."""
    whole = records.batch(1 << 40).map(plain(parse))  # one element; batch reserves <= 65,536
    if cfg.feature_size:
        whole = whole.map(plain(lambda b: check_batch(b, cfg.feature_size, keys)))
    seed = cfg.seed if cfg.seed is not None else random.getrandbits(31)

    def epochs(t):
        n = tf.shape(t["label"])[0]

        def order(epoch):
            if not cfg.shuffle_buffer:
                return tf.range(n)
            return tf.argsort(tf.random.stateless_uniform(
                [n], seed=tf.stack([tf.constant(seed, tf.int64), epoch])))
        # An empty part yields no epochs (not endless empty ones); None: without end.
        count = tf.where(n > 0, tf.constant(cfg.epochs or -1, tf.int64), 0)
        return (tf.data.Dataset.range(1 << 62).take(count).map(plain(order))
                .rebatch(cfg.batch_size, drop_remainder=cfg.drop_remainder)
                .skip(skip_batches)
                .map(plain(lambda i: {k: tf.gather(v, i) for k, v in t.items()})))
    return whole.flat_map(plain(epochs)).prefetch(AUTOTUNE)


def dataset_from_dir(data_dir, cfg: PipelineConfig = PipelineConfig(), **kwargs):
    """make_dataset over a data directory (TFRecord or libsvm), from its manifest -- or over
    files, a glob or a directory without one, indexed first (data/index.py). `dynamic`: the
    model's dynamic fields (read as raw keys: data/schema.py Schema.with_dynamic)."""
    from ..data.index import resolve_source
    m, root = resolve_source(data_dir)
    if m.format == "libsvm":
        cfg = dataclasses.replace(cfg, label_format=m.label_format)
    dynamic = kwargs.pop("dynamic", None)
    schema = m.schema.with_dynamic(dynamic) if m.schema is not None else None
    return make_dataset(m.paths(root), m.field_size, fmt=m.format, compression=m.compression,
                        cfg=cfg, schema=schema, **kwargs), m
