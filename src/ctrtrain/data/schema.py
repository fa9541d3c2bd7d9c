"""The fields a data set declares (its manifest's `fields`), and how their TFRecords look.

Without a declaration a data set has the fixed schema of the SageMaker DeepFM sample (docs/data.md, "Data layout"): `field_size`
single ids, each with a value, stored as `ids`/`values` lists. With one, every field is a
feature of its own in each tf.train.Example, under its name:

    categorical  one id                        int64 list of 1
    numeric      one float, fed as it is       float list of 1
    multi_hot    0 .. max_len ids (a bag),     int64 list of any length (the first max_len
                 pooled by sum, mean or sqrtn  are used); `<name>__w` float list of the same
                 (optional weights)            length when `weighted`
    sequence     ordered ids, oldest first     int64 list of any length (the last max_len,
                 (a history), kept in order    the most recent, are used)
                 for models that attend over
                 them; DeepFM pools them

A categorical, multi_hot or sequence field may be **hashed at training time**: with
`hash_buckets` N and `hash_base` B its feature holds the raw values as strings (bytes list),
and a value's id is B + Fingerprint64(value) mod N (`tf.strings.to_hash_bucket_fast`), the
same in training, evaluation and the exported model (whose `examples` signature then serves
raw strings). Ids B .. B + N - 1 are the field's rows, inside the data's feature_size.

A numeric field may also be **bucketized into an id**: with `boundaries` [b0 < b1 < ...] and
`bucket_base` B, a value x also takes id B + (the number of boundaries <= x) (TensorFlow's
Bucketize), an FM slot of its own beside the value's: the field counts twice in field_size.
Ids B .. B + len(boundaries) are its rows, inside feature_size like hashed ones.

Parsed batches (input/pipeline.py) hold, besides `label`:
    ids, values   [B, categorical fields    (values 1; the bucket ids after the categorical
                   + bucketized numeric]     fields' ids, in field order)
    numeric       [B, numeric fields]       (only when there are numeric fields)
    bag_ids       [B, sum of max_len]       every multi_hot and sequence field padded to its
    bag_weights   [B, sum of max_len]       max_len with -1 ids and weight 0, side by side, in
                                            field order (a sequence in its order)
so that every distribution mode carries dense tensors of static width, and a model pools a
bag over the ids it really holds.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from ..errors import DataError

KINDS = ("categorical", "numeric", "multi_hot", "sequence")
LISTS = ("multi_hot", "sequence")     # kinds with a variable number of ids per row
POOLINGS = ("sum", "mean", "sqrtn")
WEIGHTS_SUFFIX = "__w"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_RESERVED = {"label", "ids", "values"}
# The most ids a row of one bag field is read with. Every row is padded to max_len, so one
# over-long row would make every batch that large (a declared 1e9, one libffm row of 200,000
# pairs: gigabytes a batch, no step); convert and featurize cap what they find at this and
# say so, a declaration above it is refused. CTR bags (genres, tags, a history) hold tens to
# hundreds; the trainer checks a batch's bags against memory besides (bag_batch_bytes).
MAX_LEN_LIMIT = 10_000


def field_name_ok(name: str) -> bool:
    """Whether `name` can name a declared field (a tf.train.Example feature)."""
    return bool(_NAME.fullmatch(name)) and name not in _RESERVED and not name.endswith(
        WEIGHTS_SUFFIX)


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: str = "categorical"
    max_len: int = 1           # multi_hot, sequence: ids used per row (more are cut)
    pooling: str = "sum"       # multi_hot, sequence (how a model that pools them pools)
    weighted: bool = False     # multi_hot: a weight per id (`<name>__w`)
    hash_buckets: int = 0      # > 0: values are strings, hashed into this many ids ...
    hash_base: int = 0         # ... from this one
    boundaries: tuple = ()     # numeric: also bucketized into an id at these boundaries ...
    bucket_base: int = 0       # ... the first bucket's id
    # A run's setting, never declared by the data (train --dynamic-fields): a hashed
    # categorical field read as raw 64-bit keys, which the model maps onto its buckets as
    # ids claim and give back rows (models/engine/dynamic.py).
    dynamic: bool = False

    def to_json(self) -> dict:
        d = {"name": self.name, "kind": self.kind}
        if self.kind == "multi_hot":
            d.update(max_len=self.max_len, pooling=self.pooling, weighted=self.weighted)
        elif self.kind == "sequence":
            d.update(max_len=self.max_len, pooling=self.pooling)
        if self.hash_buckets:
            d.update(hash_buckets=self.hash_buckets, hash_base=self.hash_base)
        if self.boundaries:
            d.update(boundaries=list(self.boundaries), bucket_base=self.bucket_base)
        return d


@dataclasses.dataclass(frozen=True)
class Schema:
    fields: tuple[Field, ...]

    def of(self, kind: str) -> list[Field]:
        return [f for f in self.fields if f.kind == kind]

    def bucketized(self) -> list[Field]:
        """The numeric fields also bucketized into an id: their ids follow the categorical
        fields' in the batch."""
        return [f for f in self.fields if f.boundaries]

    @property
    def field_size(self) -> int:
        """Slots of the model's FM: every declared field (a bag pools into one), and a
        bucketized numeric field's bucket id besides its value."""
        return len(self.fields) + len(self.bucketized())

    def lists(self) -> list[Field]:
        """The multi_hot and sequence fields, in field order: the batch's bag columns."""
        return [f for f in self.fields if f.kind in LISTS]

    def bag_keys(self) -> list[str]:
        """The features a record must hold for its bags: each bag's ids and, weighted, its
        weights. TensorFlow's RaggedFeature reads a missing key as an empty bag, so their
        presence is checked apart (tfrecord.lacking_keys)."""
        return [n for b in self.lists()
                for n in (b.name, *([b.name + WEIGHTS_SUFFIX] if b.weighted else []))]

    @property
    def bag_width(self) -> int:
        return sum(f.max_len for f in self.lists())

    def bag_batch_bytes(self, batch_size: int, embedding_size: int) -> int:
        """What a batch's bags take in memory at least: ids, weights, and the gathered
        embeddings with their gradient, float32 (the padded [batch, bag_width] form)."""
        return batch_size * self.bag_width * (8 + 4 + 2 * 4 * embedding_size)

    def parsed_record_bytes(self) -> int:
        """A parsed record's size in the batch layout: label, ids and values of the
        categorical and bucket slots, numeric values, and every bag padded to its max_len."""
        slots = len(self.of("categorical")) + len(self.bucketized())
        return 4 + 12 * slots + 4 * len(self.of("numeric")) + 12 * self.bag_width

    def to_json(self) -> list[dict]:
        return [f.to_json() for f in self.fields]

    def with_dynamic(self, names) -> "Schema":
        """The schema with fields `names` (or every hashed categorical field: "all") read as
        raw keys for a dynamic table; a name that is not a hashed categorical field is
        refused by name (ConfigError)."""
        from ..errors import ConfigError
        if not names:
            return self
        hashed = [f.name for f in self.of("categorical") if f.hash_buckets]
        chosen = set(hashed) if names == "all" or tuple(names) == ("all",) else set(names)
        if not chosen:
            raise ConfigError("dynamic_fields all: the data has no hashed categorical field "
                              "(declared with hash_buckets; docs/fields.md)")
        for name in sorted(chosen - set(hashed)):
            what = next((f"a {f.kind} field" if f.kind != "categorical" else
                         "a categorical field of ids, not hashed" for f in self.fields
                         if f.name == name), "not a declared field")
            raise ConfigError(f"dynamic_fields: {name} is {what}; a dynamic field is a "
                              f"hashed categorical one (the data's: {', '.join(hashed) or 'none'})")
        return Schema(tuple(dataclasses.replace(f, dynamic=f.name in chosen)
                            for f in self.fields))

    def dynamic_pools(self) -> tuple[tuple[int, int, int], ...]:
        """(ids column, first row, rows) of each dynamic field: its column in the batch's
        `ids` (the categorical fields' order) and its buckets, the pool its keys claim."""
        return tuple((j, f.hash_base, f.hash_buckets)
                     for j, f in enumerate(self.of("categorical")) if f.dynamic)

    @classmethod
    def from_json(cls, fields, where: str = "manifest") -> "Schema":
        """The declaration as a manifest holds it, or a DataError naming the field entry
        that is wrong."""
        def bad(i, why):
            return DataError(f"field declaration: {why}", path=where,
                             field=f"fields[{i}]" if i is not None else "fields")
        if not isinstance(fields, list) or not fields:
            raise bad(None, "must be a non-empty list")
        out, names = [], set()
        for i, d in enumerate(fields):
            if not isinstance(d, dict):
                raise bad(i, "must be an object with name and kind")
            unknown = set(d) - {"name", "kind", "max_len", "pooling", "weighted",
                                "hash_buckets", "hash_base", "boundaries", "bucket_base"}
            if unknown:
                raise bad(i, f"unknown key(s) {sorted(unknown)}")
            name, kind = d.get("name"), d.get("kind", "categorical")
            if not isinstance(name, str) or not _NAME.fullmatch(name) or name in _RESERVED \
                    or name.endswith(WEIGHTS_SUFFIX):
                raise bad(i, f"name {name!r} must start with a letter or '_' and be 1-64 letters, digits, '_', '.', '-' "
                          f"(not {sorted(_RESERVED)}, not ending in {WEIGHTS_SUFFIX})")
            if name in names:
                raise bad(i, f"name {name!r} is declared twice")
            names.add(name)
            if kind not in KINDS:
                raise bad(i, f"kind {kind!r} is not one of {', '.join(KINDS)}")
            hashing = _hashing(d, kind, lambda why: bad(i, why))
            hashing.update(_bucketing(d, kind, lambda why: bad(i, why)))
            if kind not in LISTS:
                extra = {"max_len", "pooling", "weighted"} & set(d)
                if extra:
                    raise bad(i, f"{sorted(extra)} apply to multi_hot and sequence fields only")
                out.append(Field(name, kind, **hashing))
                continue
            max_len = d.get("max_len")
            pooling = d.get("pooling", "sum" if kind == "multi_hot" else "mean")
            weighted = d.get("weighted", False)
            if kind == "sequence" and "weighted" in d:
                raise bad(i, "a sequence field has no weights")
            if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
                raise bad(i, f"a {kind} field needs max_len, a positive integer "
                          f"(not {max_len!r})")
            if max_len > MAX_LEN_LIMIT:
                raise bad(i, f"{name}: max_len {max_len:,} is over {MAX_LEN_LIMIT:,} ids a row "
                          "(each row is padded to it: every batch would be that wide)")
            if pooling not in POOLINGS:
                raise bad(i, f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
            if not isinstance(weighted, bool):
                raise bad(i, "weighted must be true or false")
            out.append(Field(name, kind, max_len, pooling, weighted, **hashing))
        return cls(tuple(out))

    def reserved_spans(self) -> list[tuple[int, int, str, str]]:
        """(first id, end, field, what) of the ids the declaration gives fields itself:
        hashed fields' and buckets'. Another field's id inside one would share its row."""
        return sorted([(f.hash_base, f.hash_base + f.hash_buckets, f.name, "hashed ids")
                       for f in self.fields if f.hash_buckets]
                      + [(f.bucket_base, f.bucket_base + len(f.boundaries) + 1, f.name,
                          "bucket ids") for f in self.bucketized()])

    def check_ids(self, feature_size: int, where: str = "manifest") -> None:
        """Every hashed field's and bucket's ids inside the table, and no two fields sharing
        them (the records' own ids are checked against them where the records are read)."""
        spans = self.reserved_spans()
        for i, (lo, hi, name, what) in enumerate(spans):
            if hi > feature_size:
                raise DataError(f"field declaration: {name}'s {what} {lo}..{hi - 1} "
                                f"exceed feature_size {feature_size}", path=where,
                                field="fields")
            if i and lo < spans[i - 1][1]:
                raise DataError(f"field declaration: {name}'s {what} {lo}..{hi - 1} "
                                f"overlap {spans[i - 1][2]}'s", path=where, field="fields")


def _hashing(d: dict, kind: str, bad) -> dict:
    """A field declaration's hash_buckets and hash_base (both, or neither)."""
    if "hash_buckets" not in d and "hash_base" not in d:
        return {}
    if kind == "numeric":
        raise bad("a numeric field is not hashed")
    buckets, base = d.get("hash_buckets"), d.get("hash_base")
    for key, v, least in (("hash_buckets", buckets, 1), ("hash_base", base, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise bad(f"{key} must be an integer of at least {least} (hash_buckets and "
                      f"hash_base go together), not {v!r}")
    return {"hash_buckets": buckets, "hash_base": base}


def _bucketing(d: dict, kind: str, bad) -> dict:
    """A numeric field declaration's boundaries and bucket_base (both, or neither)."""
    if "boundaries" not in d and "bucket_base" not in d:
        return {}
    if kind != "numeric":
        raise bad("boundaries and bucket_base apply to numeric fields only")
    edges, base = d.get("boundaries"), d.get("bucket_base")
    if not isinstance(edges, list) or not edges or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)
            for x in edges) or any(a >= b for a, b in zip(edges, edges[1:])):
        raise bad(f"boundaries must be a non-empty list of finite numbers in increasing order "
                  f"(boundaries and bucket_base go together), not {edges!r}")
    if not isinstance(base, int) or isinstance(base, bool) or base < 0:
        raise bad(f"bucket_base must be a non-negative integer, not {base!r}")
    return {"boundaries": tuple(float(x) for x in edges), "bucket_base": base}


def feature_spec(schema: Schema) -> dict:
    """The parse spec of a declared schema's Examples; the one place it is written down."""
    import tensorflow as tf
    spec = {"label": tf.io.FixedLenFeature([1], tf.float32)}
    for f in schema.fields:
        ids = tf.string if f.hash_buckets else tf.int64
        if f.kind == "categorical":
            spec[f.name] = tf.io.FixedLenFeature([1], ids)
        elif f.kind == "numeric":
            spec[f.name] = tf.io.FixedLenFeature([1], tf.float32)
        else:   # multi_hot, sequence
            spec[f.name] = tf.io.RaggedFeature(ids, row_splits_dtype=tf.int64)
            if f.weighted:
                spec[f.name + WEIGHTS_SUFFIX] = tf.io.RaggedFeature(
                    tf.float32, row_splits_dtype=tf.int64)
    return spec


@dataclasses.dataclass
class FieldRows:
    """A block of examples in a declared schema: per field, a column.
    categorical: int64 [n]; numeric: float32 [n]; multi_hot, sequence: (lengths int64 [n],
    ids int64 [sum of lengths], weights float32 [same] or None), row after row. A hashed
    field's ids are its raw values instead (str, an object array)."""
    labels: np.ndarray
    columns: dict

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def largest_id(self) -> int:
        """The largest id the rows' integer id columns hold (-1 if none): what a table needs."""
        cols = [c[1] if isinstance(c, tuple) else c for c in self.columns.values()]
        return max((int(c.max()) for c in cols if c.size and c.dtype == np.int64), default=-1)

    def slice(self, start: int, stop: int) -> "FieldRows":
        """Rows [start, stop)."""
        columns = {}
        for name, col in self.columns.items():
            if isinstance(col, tuple):
                lengths, ids, weights = col
                ends = np.concatenate([[0], np.cumsum(lengths)])
                lo, hi = int(ends[start]), int(ends[min(stop, len(lengths))])
                columns[name] = (lengths[start:stop], ids[lo:hi],
                                 None if weights is None else weights[lo:hi])
            else:
                columns[name] = col[start:stop]
        return FieldRows(self.labels[start:stop], columns)
