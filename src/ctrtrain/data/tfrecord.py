"""TFRecord files of `tf.train.Example(label, ids, values)` (DESIGN.md 3.1), written without TF.

Writing builds the protobuf wire bytes of a whole block of examples with NumPy (the layout is
fixed but for the varint-packed ids), frames them as TFRecords (length, masked CRC32C) and
optionally gzips the stream exactly as TensorFlow's `GZIP` option reads it. Converter workers
therefore never import TensorFlow, which would cost seconds per process. Reading is
TensorFlow's own (see `ctrtrain.input`), so every file written here is checked by the engine
that trains on it.
"""

from __future__ import annotations

import gzip
import hashlib
import os

import google_crc32c
import numpy as np

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

    def write_rows(self, rows: Rows) -> None:
        if len(rows):
            self._out.write(frame_records(encode_examples(rows)))
            self.records += len(rows)

    def commit(self) -> tuple[int, int, str]:
        if self._out is not self._stream:
            self._out.close()
        self._raw.close()
        os.replace(self.tmp, self.path)
        return self.records, os.path.getsize(self.path), self._sha.hexdigest()

    def abort(self) -> None:
        try:
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
        head = f.read(12)
    return len(head) == 12 and _masked_crc(head[:8]) == int.from_bytes(head[8:], "little")


def feature_spec(field_size: int):
    """The parse spec of DESIGN.md 3.1; the one place it is written down."""
    import tensorflow as tf
    return {"label": tf.io.FixedLenFeature([1], tf.float32),
            "ids": tf.io.FixedLenFeature([field_size], tf.int64),
            "values": tf.io.FixedLenFeature([field_size], tf.float32)}


def tf_compression(compression: str | None) -> str:
    return "GZIP" if compression == "gzip" else ""


def read_rows(path: str, field_size: int, compression: str | None = None, batch: int = 20_000):
    """Yields Rows blocks of one TFRecord file with TensorFlow's reader. A truncated or corrupt
    file, or an Example of the wrong shape, raises DataError naming the exact record."""
    import tensorflow as tf

    from ..errors import DataError
    spec = feature_spec(field_size)
    ds = tf.data.TFRecordDataset(path, compression_type=tf_compression(compression))
    done = 0
    it = iter(ds.batch(batch).map(lambda s: tf.io.parse_example(s, spec)))
    while True:
        try:
            b = next(it)
        except StopIteration:
            return
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            index, reason = _scan_records(ds, done, spec)
            raise DataError(reason, path=path, record=index) from e
        n = int(b["label"].shape[0])
        yield Rows(b["label"].numpy()[:, 0], b["ids"].numpy(), b["values"].numpy())
        done += n


def _scan_records(ds, start: int, spec):
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
            msg = e.message.splitlines()[0] if e.message else str(e)
            return i, f"Example does not match the schema (label[1], ids/values[field_size]): {msg}"
        i += 1
