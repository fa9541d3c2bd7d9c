"""TFRecord files of `tf.train.Example(label, ids, values)` (docs/data.md, "Data layout"), written without TF.

Writing builds the protobuf wire bytes of a whole block of examples with NumPy (the layout is
fixed but for the varint-packed ids), frames them as TFRecords (length, masked CRC32C) and
optionally gzips the stream exactly as TensorFlow's `GZIP` option reads it. Converter workers
therefore never import TensorFlow, which would cost seconds per process. Reading is
TensorFlow's own (see `ctrtrain.input`), so every file written here is checked by the engine
that trains on it.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import re

import google_crc32c
import numpy as np

from ..errors import named
from .libsvm import Rows

SUFFIX = ".tfrecord"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(tag: int, payload_len: int) -> bytes:
    """Header of a length-delimited protobuf field."""
    return bytes([tag]) + _varint(payload_len)


def _feature_entry_header(key: str, kind_tag: int, list_payload_len: int) -> bytes:
    """Bytes of a Features map entry up to the packed list payload.
    entry = key(1) + value(2: Feature{ kind_tag: List{ 1: packed } })."""
    k = key.encode()
    packed = _field(0x0A, list_payload_len)
    lst_len = len(packed) + list_payload_len
    feature = _field(kind_tag, lst_len)
    feat_len = len(feature) + lst_len
    entry_body = _field(0x0A, len(k)) + k + _field(0x12, feat_len)
    entry_len = len(entry_body) + feat_len
    return _field(0x0A, entry_len) + entry_body + feature + packed


_FLOAT_LIST, _INT64_LIST = 0x12, 0x1A


def _bytes_entry(key: str, values: list) -> bytes:
    """A whole Features map entry holding a BytesList (its values are not packed)."""
    k = key.encode()
    body = b"".join(_field(0x0A, len(v)) + v for v in values)
    feature = _field(0x0A, len(body)) + body
    entry_body = _field(0x0A, len(k)) + k + _field(0x12, len(feature)) + feature
    return _field(0x0A, len(entry_body)) + entry_body


def _masked_crc(data) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _left_slots(byte_strings: list[bytes], which: np.ndarray):
    """Row i gets byte_strings[which[i]], left-aligned in a slot as wide as the longest."""
    width = max(len(b) for b in byte_strings)
    table = np.zeros((len(byte_strings), width), np.uint8)
    lens = np.array([len(b) for b in byte_strings])
    for i, b in enumerate(byte_strings):
        table[i, :len(b)] = np.frombuffer(b, np.uint8)
    return table[which], np.arange(width) < lens[which][:, None]


def encode_examples(rows: Rows) -> list[bytes]:
    """Serialized tf.train.Example bytes of each row.

    Every row is laid out in fixed-width slots (Example header, label and values entries,
    ids entry header, varint bytes of each id) with a mask of the bytes in use; one
    compress of the slot matrix yields all records back to back."""
    n, f = rows.ids.shape
    if n == 0:
        return []
    ids = rows.ids.astype(np.uint64)
    vlen = np.ones(ids.shape, np.int64)
    for k in range(1, 10):
        vlen += ids >= (np.uint64(1) << np.uint64(7 * k))
    payload = vlen.sum(1)

    label_part = _feature_entry_header("label", _FLOAT_LIST, 4)
    values_part = _feature_entry_header("values", _FLOAT_LIST, 4 * f)
    fixed_w = len(label_part) + 4 + len(values_part) + 4 * f
    fixed = np.concatenate([
        np.broadcast_to(np.frombuffer(label_part, np.uint8), (n, len(label_part))),
        rows.labels.astype("<f4").reshape(n, 1).view(np.uint8),
        np.broadcast_to(np.frombuffer(values_part, np.uint8), (n, len(values_part))),
        np.ascontiguousarray(rows.values, dtype="<f4").view(np.uint8).reshape(n, 4 * f)], 1)

    # The Example header and the ids entry header depend only on the payload length.
    distinct, which = np.unique(payload, return_inverse=True)
    tails = [_feature_entry_header("ids", _INT64_LIST, int(p)) for p in distinct]
    heads = [_field(0x0A, fixed_w + len(t) + int(p)) for t, p in zip(tails, distinct)]
    head_c, head_v = _left_slots(heads, which)
    tail_c, tail_v = _left_slots(tails, which)

    width = int(vlen.max())
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    var_c = ((ids[..., None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    var_c |= np.where(np.arange(width) < vlen[..., None] - 1, 0x80, 0).astype(np.uint8)
    var_v = np.arange(width) < vlen[..., None]

    chars = np.concatenate([head_c, fixed, tail_c, var_c.reshape(n, -1)], 1)
    valid = np.concatenate([head_v, np.ones((n, fixed_w), bool), tail_v, var_v.reshape(n, -1)], 1)
    out = chars[valid]
    rec_len = head_v.sum(1) + fixed_w + tail_v.sum(1) + payload
    ends = np.cumsum(rec_len).tolist()
    data = out.tobytes()
    return [data[s:e] for s, e in zip([0] + ends[:-1], ends)]


def encode_field_examples(rows, schema) -> list[bytes]:
    """Serialized tf.train.Example bytes of each row of a declared schema (data/schema.py):
    one feature per field, under its name (a hashed field's raw values as a bytes list). Row
    by row (a bag's length varies), with each field's fixed bytes made once."""
    from .schema import WEIGHTS_SUFFIX
    n = len(rows)
    if n == 0:
        return []
    parts: list[list[bytes]] = [[] for _ in range(n)]
    label_head = _feature_entry_header("label", _FLOAT_LIST, 4)
    for i, b in enumerate(rows.labels.astype("<f4").tobytes()[j:j + 4] for j in range(0, 4 * n, 4)):
        parts[i].append(label_head + b)
    for f in schema.fields:
        col = rows.columns[f.name]
        if f.kind == "numeric":
            head = _feature_entry_header(f.name, _FLOAT_LIST, 4)
            data = np.asarray(col, "<f4").tobytes()
            for i in range(n):
                parts[i].append(head + data[4 * i:4 * i + 4])
        elif f.hash_buckets and f.kind == "categorical":
            for i, v in enumerate(col):
                parts[i].append(_bytes_entry(f.name, [str(v).encode()]))
        elif f.kind == "categorical":
            heads: dict[int, bytes] = {}
            for i, v in enumerate(np.asarray(col, np.int64).tolist()):
                b = _varint(v)
                h = heads.get(len(b)) or heads.setdefault(
                    len(b), _feature_entry_header(f.name, _INT64_LIST, len(b)))
                parts[i].append(h + b)
        else:   # multi_hot, sequence
            lengths, ids, weights = col
            ends = np.cumsum(lengths).tolist()
            ids = [str(v).encode() for v in ids] if f.hash_buckets else \
                np.asarray(ids, np.int64).tolist()
            wdata = np.asarray(weights, "<f4").tobytes() if f.weighted else b""
            start = 0
            for i, end in enumerate(ends):
                if f.hash_buckets:
                    parts[i].append(_bytes_entry(f.name, ids[start:end]))
                else:
                    b = b"".join(_varint(v) for v in ids[start:end])
                    parts[i].append(_feature_entry_header(f.name, _INT64_LIST, len(b)) + b)
                if f.weighted:
                    w = wdata[4 * start:4 * end]
                    parts[i].append(_feature_entry_header(f.name + WEIGHTS_SUFFIX, _FLOAT_LIST,
                                                          len(w)) + w)
                start = end
    out = []
    for p in parts:
        body = b"".join(p)
        out.append(_field(0x0A, len(body)) + body)
    return out


def frame_records(records: list) -> bytes:
    """TFRecord framing: u64 length, masked crc of length, data, masked crc of data."""
    parts = []
    len_cache: dict[int, bytes] = {}
    for rec in records:
        n = len(rec)
        head = len_cache.get(n)
        if head is None:
            lb = n.to_bytes(8, "little")
            head = len_cache[n] = lb + _masked_crc(lb).to_bytes(4, "little")
        parts.append(head)
        parts.append(rec)
        parts.append(_masked_crc(rec).to_bytes(4, "little"))
    return b"".join(parts)


class ShardWriter:
    """Writes one TFRecord shard to `<path>.tmp`, renamed into place only by `commit()`, so a
    failed conversion never leaves a file that looks complete. Tracks records, bytes, sha256."""

    def __init__(self, path: str, compression: str | None = None):
        if compression not in (None, "gzip"):
            raise ValueError(f"compression must be None or 'gzip', not {compression!r}")
        self.path, self.tmp = path, path + ".tmp"
        self.records = 0
        self._raw = open(self.tmp, "wb")
        self._sha = hashlib.sha256()
        self._stream = _HashingFile(self._raw, self._sha)
        self._out = gzip.GzipFile(fileobj=self._stream, mode="wb", compresslevel=6, mtime=0) \
            if compression == "gzip" else self._stream

    def write_rows(self, rows: Rows, schema=None) -> None:
        """Rows of the fixed schema, or FieldRows of a declared `schema`."""
        if len(rows):
            records = encode_examples(rows) if schema is None else \
                encode_field_examples(rows, schema)
            try:
                self._out.write(frame_records(records))
            except OSError as e:     # a full disk: say which file
                raise named(e, self.tmp) from e
            self.records += len(rows)

    def commit(self) -> tuple[int, int, str]:
        try:
            if self._out is not self._stream:
                self._out.close()
            self._raw.close()
        except OSError as e:
            raise named(e, self.tmp) from e
        os.replace(self.tmp, self.path)
        return self.records, os.path.getsize(self.path), self._sha.hexdigest()

    def abort(self) -> None:
        try:
            with contextlib.suppress(OSError):  # its flush fails again on a full disk
                self._raw.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)


class _HashingFile:
    def __init__(self, f, sha):
        self.f, self.sha = f, sha

    def write(self, b):
        self.sha.update(b)
        return self.f.write(b)

    def flush(self):
        self.f.flush()


def is_tfrecord(path: str) -> bool:
    """Whether a file starts with a TFRecord frame (its length's masked CRC checks out)."""
    with open(path, "rb") as f:
        return is_tfrecord_head(f.read(12))


def is_tfrecord_head(head: bytes) -> bool:
    """Whether bytes start with a TFRecord frame: a length whose masked CRC checks out."""
    return len(head) >= 12 and _masked_crc(head[:8]) == int.from_bytes(head[8:12], "little")


def feature_spec(field_size: int):
    """The parse spec of the fixed schema (docs/data.md); the one place it is written down."""
    import tensorflow as tf
    return {"label": tf.io.FixedLenFeature([1], tf.float32),
            "ids": tf.io.FixedLenFeature([field_size], tf.int64),
            "values": tf.io.FixedLenFeature([field_size], tf.float32)}


def tf_compression(compression: str | None) -> str:
    return "GZIP" if compression == "gzip" else ""


def read_rows(path: str, field_size: int, compression: str | None = None, batch: int = 20_000):
    """Yields Rows blocks of one TFRecord file with TensorFlow's reader. A truncated or corrupt
    file, or an Example of the wrong shape, raises DataError naming the exact record."""
    for b in _parsed_blocks(path, feature_spec(field_size), compression, batch,
                            "label[1], ids/values[field_size]"):
        yield Rows(b["label"].numpy()[:, 0], b["ids"].numpy(), b["values"].numpy())


LACKING = "__lacking"     # read_field_blocks' key for lacking_keys, beside the features


def read_field_blocks(path: str, schema, compression: str | None = None, batch: int = 20_000,
                      check_keys: bool = False):
    """Yields blocks of a declared schema's file (data/schema.py) as parsed by TensorFlow:
    {feature name: Tensor or RaggedTensor}; errors as read_rows's. `check_keys`: also
    LACKING, lacking_keys of the schema's bag_keys."""
    from .schema import feature_spec as fields_spec
    keys = schema.bag_keys() if check_keys else []
    yield from _parsed_blocks(path, fields_spec(schema), compression, batch,
                              "the manifest's declared fields",
                              (lambda s: {LACKING: lacking_keys(s, keys)}) if keys else None)


def lacking_keys(serialized, names: list[str]):
    """[records, len(names)] bool: which of `names` each serialized tf.Example lacks, read
    from the records' own protos (tensorflow.Features' map entries), where parse_example
    cannot tell a missing RaggedFeature key from an empty list."""
    import tensorflow as tf
    _, (features,) = tf.io.decode_proto(serialized, "tensorflow.Example", ["features"],
                                        [tf.string])
    _, (entries,) = tf.io.decode_proto(features[:, 0], "tensorflow.Features", ["feature"],
                                       [tf.string])
    _, (keys,) = tf.io.decode_proto(entries, "tensorflow.Features.FeatureEntry", ["key"],
                                    [tf.string])
    keys = keys[:, :, 0]     # [records, entries]; '' pads records with fewer entries
    return tf.stack([~tf.reduce_any(tf.equal(keys, n), axis=1) for n in names], axis=1)


def _parsed_blocks(path, spec, compression, batch, schema_desc, extra=None):
    import tensorflow as tf

    from ..errors import DataError
    ds = tf.data.TFRecordDataset(path, compression_type=tf_compression(compression))
    done = 0
    it = iter(ds.batch(batch).map(
        lambda s: {**tf.io.parse_example(s, spec), **(extra(s) if extra else {})}))
    while True:
        try:
            b = next(it)
        except StopIteration:
            return
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            index, reason = _scan_records(ds, done, spec, schema_desc)
            raise DataError(reason, path=path, record=index) from e
        n = int(b["label"].shape[0])
        yield b
        done += n


_LISTS = {"int64_list": "int64", "float_list": "float32", "bytes_list": "string"}


def _mismatch(serialized: bytes, spec) -> str | None:
    """What a record that TensorFlow could not parse holds against the spec, in the schema's
    terms ("ids holds 39 values where the schema reads 40"), where TensorFlow says only "Some
    int64_list slice was not parsed"; None if the record is not a readable Example or the
    difference is something else."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2
    try:
        held = example_pb2.Example.FromString(serialized).features.feature
    except DecodeError:
        return None
    for key, want in spec.items():
        if key not in held:
            if isinstance(want, tf.io.FixedLenFeature) and want.default_value is None:
                return f"the record has no feature {key}"
            continue
        kind = held[key].WhichOneof("kind")
        values = len(getattr(held[key], kind).value) if kind else 0
        if kind and _LISTS[kind] != want.dtype.name:
            return f"{key} holds {_LISTS[kind]} values where the schema reads {want.dtype.name}"
        if isinstance(want, tf.io.FixedLenFeature):
            n = int(np.prod(want.shape))
            if values != n:
                return f"{key} holds {values} values where the schema reads {n}"
    return None


def _scan_records(ds, start: int, spec, schema_desc: str):
    """(index, message) of the first record at or after `start` that cannot be read/parsed."""
    import tensorflow as tf
    i = start
    it = iter(ds.skip(start))
    while True:
        try:
            s = next(it)
        except StopIteration:
            return None, "unreadable record"
        except tf.errors.DataLossError:
            return i, "file is truncated or corrupted (TFRecord framing/CRC check failed)"
        try:
            tf.io.parse_single_example(s, spec)
        except tf.errors.InvalidArgumentError as e:
            from ..errors import first_line
            msg = _mismatch(s.numpy(), spec) or re.sub(r"\s+", " ", first_line(e))
            return i, f"Example does not match the schema ({schema_desc}): {msg}"
        i += 1
