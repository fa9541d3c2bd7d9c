"""Raw columns -> the fixed-field schema (one id and one value per field), or declared fields.

Numeric field i: id i, its value transformed (`numeric_transform`, NUMERIC_TRANSFORMS) and
rounded to 5 decimals, missing = 0: log, sign(x)*log1p(|x|); standard, (x - mean) /
deviation; log-standard (the default), the log then standardized; minmax, (x - min) / (max -
min); none. The default was log until four real tables showed its flaw (docs/quality.md,
"Numeric fields as values"): a year's log barely varies, and columns whose logs differ in
scale meet the model unequally; standardized after the log, test AUC rose by 0.005 to 0.03. The statistics are the training split's (present values only), kept in the vocabulary
and applied to every later split and to prediction, as the categorical values are. A missing
value is 0 after the transform: for the standardized forms, the training split's mean.
With `buckets` (--buckets N) the output declares its fields and every numeric field is also
bucketized into an id (data/schema.py: TensorFlow's Bucketize of the written value, in the
input pipeline and the exported model alike) at N quantiles of the training split's present
values, transformed as the values are (boundaries that repeat, as a column mostly 0 gives,
merged): the model reads the value and the bucket's embedding.
Categorical field j: either a vocabulary built on the training split (values seen at least
`min_count` times; index 0 of each field is its out-of-vocabulary id) or hashing into a fixed
number of buckets per field. Empty (missing) is a value like any other. The vocabulary is saved
as JSON and reused for the test split and for prediction, so ids are stable.

With multi-valued columns (`--multi-hot genres`: `Comedy|Drama`) the output declares its
fields (data/schema.py) and is TFRecord: numeric columns become `numeric` fields (the same
transform, no id of their own), categorical ones `categorical`, multi-valued ones `multi_hot`
bags (each value an id of the column's vocabulary or hash; an empty cell is an empty bag),
mean-pooled, max_len the longest bag of the training files (or --max-len). `--sequence`
columns are ordered histories (oldest first) and become `sequence` fields the same way. A
longer bag at test or predict time is kept whole in the file and cut to max_len when read
(a bag's first ids, a sequence's last); featurize counts such rows. With --hash-buckets the
declared fields are hashed at training time: the files hold the raw values (strings) and each
field declares its hash_buckets and hash_base, so training, evaluation and the exported model
hash alike (TensorFlow's Fingerprint64, not the fixed schema's featurize-time crc32) and a
served model takes raw strings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from collections import Counter

import numpy as np
import pandas as pd

from ..errors import DataError
from .libsvm import Rows
from .raw import ColumnRoles, RawChunk, RawSchema, read_raw, sniff_format
from .schema import MAX_LEN_LIMIT

VOCAB_NAME = "vocab.json"
NUMERIC_TRANSFORMS = ("log", "standard", "log-standard", "minmax", "none")
DEFAULT_NUMERIC_TRANSFORM = "log-standard"
BUCKET_SAMPLE = 1_000_000     # rows whose values place the quantile boundaries (all, if fewer)


def signed_log(x):
    return np.sign(x) * np.log1p(np.abs(x))


def numeric_statistics(x, transform: str) -> dict:
    """Running sums of a chunk's numeric columns [n, k] (NaN: missing) before the final
    scaling, for merge_statistics and scale_numeric."""
    if transform.startswith("log"):
        x = signed_log(x)
    present = ~np.isnan(x)
    z = np.where(present, x, 0.0)
    return {"count": present.sum(0).astype(np.float64), "sum": z.sum(0),
            "sumsq": (z * z).sum(0),
            "min": np.where(present, x, np.inf).min(0) if len(x) else np.full(x.shape[1], np.inf),
            "max": np.where(present, x, -np.inf).max(0) if len(x) else np.full(x.shape[1], -np.inf)}


def merge_statistics(a: dict | None, b: dict) -> dict:
    if a is None:
        return b
    return {"count": a["count"] + b["count"], "sum": a["sum"] + b["sum"],
            "sumsq": a["sumsq"] + b["sumsq"], "min": np.minimum(a["min"], b["min"]),
            "max": np.maximum(a["max"], b["max"])}


def column_statistics(sums: dict | None, columns: list[str]) -> dict:
    """{column: {mean, std, min, max}} of the present values (a column with none: 0, 1, 0, 0;
    a constant one: std 1), JSON-ready."""
    out = {}
    for j, c in enumerate(columns):
        n = float(sums["count"][j]) if sums else 0.0
        if n == 0:
            out[c] = {"mean": 0.0, "std": 1.0, "min": 0.0, "max": 0.0}
            continue
        mean = float(sums["sum"][j]) / n
        var = max(float(sums["sumsq"][j]) / n - mean * mean, 0.0)
        std = var ** 0.5
        out[c] = {"mean": mean, "std": std if std > 1e-12 else 1.0,
                  "min": float(sums["min"][j]), "max": float(sums["max"][j])}
    return out


def scale_numeric(x, transform: str, stats: dict, columns: list[str]):
    """The numeric columns [n, k] (NaN: missing) as featurize writes them."""
    missing = np.isnan(x)
    x = np.where(missing, 0.0, x)
    if transform.startswith("log"):
        x = signed_log(x)
    if transform in ("standard", "log-standard"):
        mean = np.array([stats[c]["mean"] for c in columns])
        std = np.array([stats[c]["std"] for c in columns])
        x = (x - mean) / std
    elif transform == "minmax":
        lo = np.array([stats[c]["min"] for c in columns])
        width = np.array([stats[c]["max"] - stats[c]["min"] for c in columns])
        x = (x - lo) / np.where(width > 0, width, 1.0)
    return np.round(np.where(missing, 0.0, x), 5)


def refuse_unwritable(x, chunk: RawChunk, columns: list[str], path: str, transform: str):
    """A DataError naming the cell of the chunk's numeric columns whose value `x` (as
    transformed) a 32-bit float cannot hold: 1e300 under `none` or `standard` was written
    as inf and trained on without a word. The sums behind `standard` stay finite below it."""
    bad = np.abs(x) > np.finfo(np.float32).max
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise DataError(f"{chunk.numeric[i, j]:g} is too large for --numeric-transform "
                        f"{transform}: as a 32-bit float it would be infinite (log and "
                        "log-standard take it)", path=path, line=chunk.first_line + i,
                        field=columns[j])


class QuantileSample:
    """A uniform sample of at most `cap` rows of the numeric columns, over chunks: each row
    draws a key (a fixed seed: the same files give the same sample) and the smallest keys stay,
    so the boundaries of a large training split cost memory of `cap` rows, not its size."""

    def __init__(self, cap: int = BUCKET_SAMPLE):
        self.cap, self.rng = cap, np.random.default_rng(0)
        self.keys, self.rows, self.held = [], [], 0

    def add(self, x) -> None:
        # Chunks are kept as they come and cut to `cap` only past twice that: each row is
        # copied a bounded number of times, not once per later chunk.
        self.keys.append(self.rng.random(len(x)))
        self.rows.append(x)
        self.held += len(x)
        if self.held > 2 * self.cap:
            self._cut()

    def _cut(self) -> None:
        keys, rows = np.concatenate(self.keys), np.concatenate(self.rows)
        if len(keys) > self.cap:
            keep = np.argpartition(keys, self.cap)[:self.cap]
            keys, rows = keys[keep], rows[keep]
        self.keys, self.rows, self.held = [keys], [rows], len(keys)

    def boundaries(self, buckets: int, columns: list[str]) -> dict[str, list[float]]:
        """{column: the sorted distinct inner quantiles of its present values}."""
        if self.rows:
            self._cut()
        out = {}
        for j, c in enumerate(columns):
            x = self.rows[0][:, j] if self.rows else np.zeros(0)
            x = x[~np.isnan(x)]
            qs = np.quantile(x, np.arange(1, buckets) / buckets) if len(x) else []
            out[c] = [float(q) for q in np.unique(qs)]
        return out


@dataclasses.dataclass
class Vocabulary:
    schema: RawSchema
    mode: str = "vocab"                  # "vocab" or "hash"
    min_count: int = 10
    hash_buckets: int = 0
    values: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    max_len: dict[str, int] = dataclasses.field(default_factory=dict)   # multi-valued columns
    label_threshold: float | None = None   # the label column is a score: >= this is a click
    numeric_transform: str = "log"         # NUMERIC_TRANSFORMS ("log": what a vocabulary of
                                           # the first versions, which named none, used)
    numeric_stats: dict = dataclasses.field(default_factory=dict)   # {column: mean, std, min,
                                                                     # max} of the training split
    declare: bool = False     # declared fields without multi-valued columns (--declared)
    buckets: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # {numeric
                              # column: its boundaries, as written}: also bucketized (--buckets)

    def __post_init__(self):
        self._index = {c: {v: i + 1 for i, v in enumerate(vals)} for c, vals in self.values.items()}

    @property
    def field_size(self) -> int:
        return len(self.schema.fields)

    @property
    def declared(self) -> bool:
        """Whether the output declares its fields (there are multi-valued columns, or it was
        asked for: numeric columns then become numeric fields, whose values a model can read
        as values, --numeric-input value)."""
        return bool(self.schema.lists) or self.declare or bool(self.buckets)

    def fields(self):
        """The declared fields (data/schema.py) of this vocabulary's output."""
        from .schema import Field, Schema
        s = self.schema
        hashing = {c: {"hash_buckets": self.hash_buckets, "hash_base": base}
                   for c, base in zip(s.categorical + s.lists, self.bases())
                   } if self.mode == "hash" else {}
        edges = dict(zip(s.numeric, self.numeric_bases()))
        return Schema(tuple([Field(c, "numeric", boundaries=tuple(self.buckets[c]),
                                   bucket_base=edges[c]) if self.buckets.get(c)
                             else Field(c, "numeric") for c in s.numeric]
                            + [Field(c, **hashing.get(c, {})) for c in s.categorical]
                            + [Field(c, "multi_hot", self.max_len[c], "mean", **hashing.get(c, {}))
                               for c in s.multi_hot]
                            + [Field(c, "sequence", self.max_len[c], "mean", **hashing.get(c, {}))
                               for c in s.sequence]))

    def field_width(self, col: str) -> int:
        return self.hash_buckets if self.mode == "hash" else len(self.values[col]) + 1

    def numeric_bases(self) -> list[int]:
        """The first id of each numeric column, then the next free one: one id each in the
        fixed schema (its value beside it); a declared numeric field none, or its buckets'
        (boundaries + 1) when it is bucketized."""
        out, base = [], 0
        for c in self.schema.numeric:
            out.append(base)
            base += len(self.buckets[c]) + 1 if self.buckets.get(c) else int(not self.declared)
        return out + [base]

    def _owned(self) -> list[str]:
        """The columns with ids of their own (a shared column has its categorical's)."""
        return [c for c in self.schema.categorical + self.schema.lists
                if c not in self.schema.shared]

    def bases(self) -> list[int]:
        """The first id of each categorical then multi-valued column (a shared column's is
        its categorical column's), after the numeric columns' (numeric_bases)."""
        base, first = self.numeric_bases()[-1], {}
        for c in self._owned():
            first[c] = base
            base += self.field_width(c)
        shared = self.schema.shared
        return [first[shared.get(c, c)] for c in self.schema.categorical + self.schema.lists]

    @property
    def feature_size(self) -> int:
        return self.numeric_bases()[-1] + sum(self.field_width(c) for c in self._owned())

    def _local_ids(self, col: str, uniques) -> np.ndarray:
        if self.mode == "hash":
            return np.array([zlib.crc32(f"{col}\x00{u}".encode()) % self.hash_buckets
                             for u in uniques], np.int64)
        index = self._index[self.schema.shared.get(col, col)]
        return np.array([index.get(u, 0) for u in uniques], np.int64)

    def transform_fields(self, chunk: RawChunk):
        """(FieldRows of declared fields, {multi-valued column: rows longer than its max_len}).
        In hash mode the categorical and multi-valued columns keep their raw values: the
        hash is training's (declared hash_buckets and hash_base)."""
        from .schema import FieldRows
        legacy = self.transform(chunk)
        k = len(self.schema.numeric)
        hashed = self.mode == "hash"
        columns = {c: legacy.values[:, j] for j, c in enumerate(self.schema.numeric)}
        columns.update({c: chunk.categorical[:, j] if hashed else legacy.ids[:, k + j]
                        for j, c in enumerate(self.schema.categorical)})
        longer = {}
        bases = self.bases()[len(self.schema.categorical):]
        for j, (col, base) in enumerate(zip(self.schema.lists, bases)):
            codes, uniques = pd.factorize(chunk.lists[:, j])
            bags = [split_bag(u, self.schema.separator) for u in uniques]
            lengths = np.array([len(b) for b in bags], np.int64)[codes]
            if hashed:
                flat = np.array([v for c in codes for v in bags[c]], object)
            else:
                ids = [base + self._local_ids(col, b) for b in bags]
                flat = (np.concatenate([ids[c] for c in codes]) if len(codes)
                        else np.zeros(0, np.int64)).astype(np.int64)
            columns[col] = (lengths, flat, None)
            longer[col] = int((lengths > self.max_len[col]).sum())
        return FieldRows(legacy.labels, columns), longer

    def transform(self, chunk: RawChunk) -> Rows:
        n = chunk.numeric.shape[0]
        num_vals = scale_numeric(chunk.numeric, self.numeric_transform, self.numeric_stats,
                                 self.schema.numeric)
        ids = np.empty((n, self.field_size), np.int64)
        values = np.ones((n, self.field_size), np.float32)
        k = len(self.schema.numeric)
        ids[:, :k] = np.arange(k)
        values[:, :k] = num_vals
        for j, (col, base) in enumerate(zip(self.schema.categorical, self.bases())):
            codes, uniques = pd.factorize(chunk.categorical[:, j])
            ids[:, k + j] = base + self._local_ids(col, uniques)[codes]
        labels = chunk.labels if chunk.labels is not None else np.zeros(n, np.float32)
        return Rows(labels, ids, values)

    def grown(self, paths: list[str], min_count: int, fmt: str | None = None,
              has_label: bool = True, label_column: str | None = None) -> "Vocabulary":
        """This vocabulary with the values these files hold at least `min_count` times, and it
        lacks, appended to their columns' (a day's new ads, users, items): every value it
        had keeps its place in its column; the ids after the first grown column move, and a
        model warm-started from one trained on this vocabulary takes each value's row by
        value (ids_from). The numeric statistics and max_len stay this vocabulary's."""
        if self.mode != "vocab":
            raise DataError("--grow adds values to a vocabulary; hashed columns "
                            "(--hash-buckets) have none to add (train --dynamic-fields gives "
                            "new values rows of their own)", path=", ".join(paths))
        more = build_vocabulary(paths, fmt, self.schema, min_count, has_label=has_label,
                                label_column=label_column, label_threshold=self.label_threshold,
                                numeric_transform="log", declare=self.declare)
        values = {c: old + [v for v in more.values.get(c, []) if v not in self._index[c]]
                  for c, old in self.values.items()}
        return dataclasses.replace(self, values=values)

    def ids_from(self, older: "Vocabulary") -> np.ndarray:
        """[feature_size]: each id's id under `older` (the same value of the same column, a
        column's out-of-vocabulary id, a numeric column's ids, a hashed column's buckets),
        -1 where `older` has none (a new value). Raises DataError when the two do not
        describe the same columns."""
        a, b = self.schema, older.schema
        if (a.numeric, a.categorical, a.lists, a.shared) != (b.numeric, b.categorical,
                                                             b.lists, b.shared) \
                or self.mode != older.mode:
            raise DataError("the vocabularies describe other columns (or one hashes them): "
                            f"{self.mode} {list(a.categorical + a.lists)} against "
                            f"{older.mode} {list(b.categorical + b.lists)}")
        out = np.full(self.feature_size, -1, np.int64)
        new_nb, old_nb = self.numeric_bases(), older.numeric_bases()
        for j in range(len(a.numeric)):
            width = new_nb[j + 1] - new_nb[j]
            if width == old_nb[j + 1] - old_nb[j]:
                out[new_nb[j]:new_nb[j] + width] = np.arange(old_nb[j], old_nb[j] + width)
        columns = a.categorical + a.lists
        new_base = dict(zip(columns, self.bases()))
        old_base = dict(zip(columns, older.bases()))
        for c in self._owned():
            nb, ob = new_base[c], old_base[c]
            if self.mode == "hash":
                if self.hash_buckets == older.hash_buckets:
                    out[nb:nb + self.hash_buckets] = np.arange(ob, ob + self.hash_buckets)
                continue
            out[nb] = ob        # the out-of-vocabulary id
            index = older._index[c]
            old_ids = np.array([index.get(v, -1) for v in self.values[c]], np.int64)
            out[nb + 1:nb + 1 + len(old_ids)] = np.where(old_ids > 0, ob + old_ids, -1)
        return out

    def to_json(self) -> dict:
        return {"version": 1, "mode": self.mode, "min_count": self.min_count,
                "hash_buckets": self.hash_buckets, "schema": dataclasses.asdict(self.schema),
                "feature_size": self.feature_size, "field_size": self.field_size,
                "numeric_transform": self.numeric_transform, "numeric_stats": self.numeric_stats,
                "values": self.values, "max_len": self.max_len,
                "label_threshold": self.label_threshold, "declared": self.declare,
                "buckets": self.buckets}

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> "Vocabulary":
        """A saved vocabulary, every field type-checked (a damaged file is named, not a
        traceback or, worse, other ids)."""
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise DataError("vocabulary file not found", path=path) from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise DataError(f"not a ctrtrain vocabulary: not valid JSON ({e})", path=path) from None

        def strs(v):
            return isinstance(v, list) and all(isinstance(x, str) for x in v)
        problem = None
        if not isinstance(d, dict) or not isinstance(d.get("schema"), dict):
            problem = "no schema"
        else:
            sc = d["schema"]
            shared = sc.get("shared", {})
            if not {"label", "numeric", "categorical"} <= set(sc) <= {
                    "label", "numeric", "categorical", "multi_hot", "separator", "sequence",
                    "shared"} \
                    or not strs(sc["numeric"]) or not strs(sc["categorical"]) \
                    or not strs(sc.get("multi_hot", [])) or not strs(sc.get("sequence", [])) \
                    or not isinstance(sc.get("separator", "|"), str) \
                    or not isinstance(sc["label"], (str, type(None))):
                problem = "schema needs label, numeric and categorical column names"
            elif not isinstance(shared, dict) or any(
                    k not in sc.get("multi_hot", []) + sc.get("sequence", [])
                    or v not in sc["categorical"] for k, v in shared.items()):
                problem = "shared must map multi-valued columns to categorical ones"
            elif not isinstance(d.get("max_len", {}), dict) or any(
                    not isinstance(d.get("max_len", {}).get(c), int)
                    for c in sc.get("multi_hot", []) + sc.get("sequence", [])):
                problem = "max_len must give every multi-valued column an integer"
            elif d.get("mode") not in ("vocab", "hash"):
                problem = f"mode {str(d.get('mode'))[:20]!r} is not vocab or hash"
            elif not (isinstance(d.get("hash_buckets"), int) and d["hash_buckets"] >= 0
                      and (d["mode"] == "vocab" or d["hash_buckets"] > 0)):
                problem = "hash_buckets must be a non-negative integer (positive for hash mode)"
            elif not isinstance(d.get("label_threshold"), (int, float, type(None))) \
                    or isinstance(d.get("label_threshold"), bool):
                problem = "label_threshold must be a number or null"
            elif d.get("numeric_transform", "log") not in NUMERIC_TRANSFORMS + (
                    "sign(x)*log1p(|x|), missing=0",):
                problem = f"numeric_transform must be one of {', '.join(NUMERIC_TRANSFORMS)}"
            elif not isinstance(d.get("numeric_stats", {}), dict) or any(
                    not isinstance(d.get("numeric_stats", {}).get(c), dict)
                    or not all(isinstance(d["numeric_stats"][c].get(k), (int, float))
                               for k in ("mean", "std", "min", "max"))
                    for c in (sc["numeric"] if d.get("numeric_transform", "log")
                              in ("standard", "log-standard", "minmax") else [])):
                problem = "numeric_stats must give every numeric column mean, std, min, max"
            elif not isinstance(d.get("buckets", {}), dict) or any(
                    c not in sc["numeric"] or not isinstance(b, list)
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in b)
                    or b != sorted(set(b)) for c, b in d.get("buckets", {}).items()):
                problem = "buckets must map numeric columns to increasing boundaries"
            elif not isinstance(d.get("declared", False), bool):
                problem = "declared must be true or false"
            elif not isinstance(d.get("min_count"), int):
                problem = "min_count must be an integer"
            elif not isinstance(d.get("values"), dict) or (d["mode"] == "vocab" and any(
                    not strs(d["values"].get(c))
                    for c in sc["categorical"] + sc.get("multi_hot", [])
                    + sc.get("sequence", []) if c not in shared)):
                problem = "values must map every categorical column to a list of strings"
        if problem:
            raise DataError(f"not a ctrtrain vocabulary: {problem}", path=path)
        transform = d.get("numeric_transform", "log")     # the first versions wrote a formula
        return cls(RawSchema(**d["schema"]), d["mode"], d["min_count"], d["hash_buckets"],
                   d["values"], d.get("max_len", {}), d.get("label_threshold"),
                   transform if transform in NUMERIC_TRANSFORMS else "log",
                   d.get("numeric_stats", {}), d.get("declared", False), d.get("buckets", {}))


def split_bag(cell: str, separator: str) -> list[str]:
    """The values of a multi-valued cell ('' and empty items: none)."""
    return [v for v in cell.split(separator) if v]


def build_vocabulary(paths: list[str], fmt: str | None = None, schema: RawSchema | None = None,
                     min_count: int = 10, hash_buckets: int = 0, has_label: bool = True,
                     label_column: str | None = None, roles: ColumnRoles = ColumnRoles(),
                     label_threshold: float | None = None,
                     max_len: int | None = None,
                     numeric_transform: str = DEFAULT_NUMERIC_TRANSFORM,
                     declare: bool = False, buckets: int = 0) -> Vocabulary:
    """Counts categorical values (and each value of a multi-valued cell) over the training
    files (one pass) and keeps the frequent ones, most frequent first (ties by value, so the
    result does not depend on chunking); a multi-valued column's max_len is its longest bag,
    at most `max_len`; the numeric columns' statistics for `numeric_transform`, or with
    with `buckets` their quantile boundaries too. `declare`: declared fields even without
    multi-valued columns."""
    def read(p, **kw):      # a cut last line is warned of once, by featurize_file's pass
        return read_raw(p, fmt or sniff_format(p), schema, has_label=has_label,
                        label_column=label_column, roles=roles,
                        label_threshold=label_threshold, warn_cut=False, **kw)
    if max_len is not None and max_len > MAX_LEN_LIMIT:
        raise DataError(f"--max-len {max_len:,} is over {MAX_LEN_LIMIT:,} ids a row (each row "
                        "is padded to it: every batch would be that wide)", path=", ".join(paths))
    if hash_buckets and roles.shared:
        raise DataError("--share-vocab gives a column another's vocabulary: not with "
                        "--hash-buckets (each hashed field has ids of its own)",
                        path=", ".join(paths))
    if numeric_transform not in NUMERIC_TRANSFORMS:
        raise DataError(f"numeric transform {numeric_transform!r} is not one of "
                        f"{', '.join(NUMERIC_TRANSFORMS)}", field="numeric_transform")
    if buckets == 1 or buckets < 0:
        raise DataError(f"--buckets {buckets}: give at least 2 (or 0: values)", field="buckets")
    scaled = numeric_transform in ("standard", "log-standard", "minmax")
    if hash_buckets and not (roles.multi_hot or roles.sequence) and not scaled and not buckets:
        for p in paths:
            schema, _ = next(read(p, chunk_rows=1))
        return Vocabulary(schema, "hash", min_count, hash_buckets,
                          label_threshold=label_threshold, numeric_transform=numeric_transform,
                          declare=declare)
    counts: dict[str, Counter] = {}
    longest: dict[str, int] = {}
    longest_at: dict[str, str] = {}
    sums, sample = None, QuantileSample() if buckets else None
    for p in paths:
        for schema, chunk in read(p):
            if not numeric_transform.startswith("log"):
                refuse_unwritable(chunk.numeric, chunk, schema.numeric, p, numeric_transform)
            if sample is not None:
                sample.add(chunk.numeric)
            if scaled:
                sums = merge_statistics(sums, numeric_statistics(chunk.numeric, numeric_transform))
            for j, col in enumerate(schema.categorical if not hash_buckets else []):
                vc = pd.Series(chunk.categorical[:, j]).value_counts()
                counts.setdefault(col, Counter()).update(dict(zip(vc.index, vc.to_numpy().tolist())))
            for j, col in enumerate(schema.lists):
                vc = pd.Series(chunk.lists[:, j]).value_counts()
                items = counts.setdefault(schema.shared.get(col, col), Counter())
                for cell, c in zip(vc.index, vc.to_numpy().tolist()):
                    bag = split_bag(cell, schema.separator)
                    if len(bag) > longest.get(col, 1):
                        longest[col] = len(bag)
                        if len(bag) > MAX_LEN_LIMIT:    # the row a warning will name
                            i = int(np.flatnonzero(chunk.lists[:, j] == cell)[0])
                            longest_at[col] = f"{p}, line {chunk.first_line + i}"
                    for v in bag:
                        items[v] += c
    if schema is None:
        raise DataError("no rows to build a vocabulary from", path=", ".join(paths))
    lens = {c: min(longest.get(c, 1), max_len or MAX_LEN_LIMIT) for c in schema.lists}
    for c in schema.lists:
        if max_len is None and longest.get(c, 1) > MAX_LEN_LIMIT:
            print(f"warning: column {c}: a cell holds {longest[c]:,} values ({longest_at[c]}); "
                  f"max_len set to "
                  f"{MAX_LEN_LIMIT:,} (every row is padded to it: --max-len to choose less), "
                  "longer cells are kept in the file and cut when read")
    stats = column_statistics(sums, schema.numeric) if scaled else {}
    edges = {}
    if sample is not None:      # the quantiles of the raw values, written as the values are
        for c, raw in sample.boundaries(buckets, schema.numeric).items():
            written = scale_numeric(np.array(raw, np.float64)[:, None], numeric_transform,
                                    stats, [c])[:, 0] if raw else []
            edges[c] = [float(x) for x in np.unique(written)]
    if hash_buckets:
        return Vocabulary(schema, "hash", min_count, hash_buckets, max_len=lens,
                          label_threshold=label_threshold, numeric_transform=numeric_transform,
                          numeric_stats=stats, declare=declare, buckets=edges)
    values = {}
    for col in [c for c in schema.categorical + schema.lists if c not in schema.shared]:
        kept = [(v, c) for v, c in counts.get(col, Counter()).items() if c >= min_count]
        values[col] = [v for v, _ in sorted(kept, key=lambda vc: (-vc[1], vc[0]))]
    return Vocabulary(schema, "vocab", min_count, 0, values, lens, label_threshold,
                      numeric_transform, stats, declare, edges)


def featurize_file(path: str, vocab: Vocabulary, fmt: str | None = None, has_label: bool = True,
                   label_column: str | None = None, longer: dict | None = None):
    """Yields Rows blocks of a raw file under a vocabulary (FieldRows with declared fields,
    adding to `longer` the rows whose bags exceed their max_len). Read through, a file whose
    last line looks cut is warned of (read_raw's warn_cut)."""
    for _, chunk in read_raw(path, fmt or sniff_format(path), vocab.schema, has_label=has_label,
                             label_column=label_column, label_threshold=vocab.label_threshold):
        refuse_unwritable(scale_numeric(chunk.numeric, vocab.numeric_transform,
                                        vocab.numeric_stats, vocab.schema.numeric),
                          chunk, vocab.schema.numeric, path, vocab.numeric_transform)
        if not vocab.declared:
            yield vocab.transform(chunk)
            continue
        rows, over = vocab.transform_fields(chunk)
        for col, n in over.items():
            if longer is not None:
                longer[col] = longer.get(col, 0) + n
        yield rows


def output_names(files: list[str], suffix: str = ".libsvm") -> list[str]:
    """`<stem>.libsvm` per input (`day.txt.gz` too: `day.libsvm`), made unique in input order
    (`a/day.txt` and `b/day.txt`, or `day.txt` and `day.tsv`, would otherwise write one file
    over the other)."""
    from pathlib import Path
    names, used = [], set()
    for f in files:
        p = Path(f)
        if p.suffix.lower() in (".gz", ".bz2", ".xz") and Path(p.stem).suffix:
            p = Path(p.stem)
        stem, k = p.stem, 1
        name = f"{stem}{suffix}"
        while name in used:
            k += 1
            name = f"{stem}-{k}{suffix}"
        used.add(name)
        names.append(name)
    return names


def featurize(inputs, out_dir, *, fmt: str | None = None, vocab_path: str | None = None,
              min_count: int = 10, hash_buckets: int = 0, has_label: bool = True,
              label_column: str | None = None, overwrite: bool = False,
              roles: ColumnRoles = ColumnRoles(), label_threshold: float | None = None,
              max_len: int | None = None,
              numeric_transform: str | None = DEFAULT_NUMERIC_TRANSFORM,
              declare: bool = False, buckets: int = 0, grow: bool = False):
    """Raw files -> a libsvm data directory (one file per input; TFRecord with declared fields
    when there are multi-valued columns) with the vocabulary beside it. Without `vocab_path`
    the vocabulary is built from these inputs (the training split); with it and `grow`,
    `vocab_path`'s grown by these inputs' new values (Vocabulary.grown)."""

    from .files import finish_output_dir, list_inputs, prepare_output_dir, staged
    from .libsvm import format_libsvm
    from .manifest import FileEntry, Manifest, sha256_file

    files = list_inputs(inputs)
    if grow and not vocab_path:
        raise DataError("--grow adds to an earlier vocabulary: give it with --vocab",
                        path=", ".join(files))
    vocab = Vocabulary.load(vocab_path) if vocab_path else \
        build_vocabulary(files, fmt, min_count=min_count, hash_buckets=hash_buckets,
                         has_label=has_label, label_column=label_column, roles=roles,
                         label_threshold=label_threshold, max_len=max_len,
                         numeric_transform=numeric_transform or DEFAULT_NUMERIC_TRANSFORM,
                         declare=declare, buckets=buckets)
    if grow:
        vocab = vocab.grown(files, min_count, fmt, has_label, label_column)
    if vocab.declared:     # before anything is written: each column names a field
        from .schema import field_name_ok
        s = vocab.schema
        bad = [c for c in s.numeric + s.categorical + s.lists if not field_name_ok(c)]
        if bad:
            raise DataError(f"column {bad[0]!r} cannot name a declared field (a name starts "
                            "with a letter or '_', then letters, digits, '_', '.', '-'; not "
                            "label, ids or values): rename it in the header"
                            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                            path=files[0])
    out = prepare_output_dir(out_dir, overwrite, [*inputs, *([vocab_path] if vocab_path else [])])
    entries, positives, longer = [], 0, {}
    fields = vocab.fields() if vocab.declared else None
    try:
        for f, name in zip(files, output_names(files, ".tfrecord" if fields else ".libsvm")):
            dst = out / name
            n = 0
            if fields:
                from .tfrecord import ShardWriter
                w = ShardWriter(str(dst))
                try:
                    for rows in featurize_file(f, vocab, fmt, has_label, label_column, longer):
                        w.write_rows(rows, fields)
                        n += len(rows)
                        positives += int(rows.labels.sum())
                    w.commit()
                except BaseException:
                    w.abort()
                    raise
            else:
                with staged(dst) as w:
                    for rows in featurize_file(f, vocab, fmt, has_label, label_column):
                        w.write(format_libsvm(rows))
                        n += len(rows)
                        positives += int(rows.labels.sum())
            entries.append(FileEntry(dst.name, n, dst.stat().st_size, sha256_file(dst)))
        vocab.save(str(out / VOCAB_NAME))
    except BaseException:
        import shutil
        shutil.rmtree(out, ignore_errors=True)
        raise
    extra = {"source": files, "labeled": has_label}
    if fields:
        # Rows whose bag is longer than the field's max_len: kept whole, cut when read.
        extra["longer_than_max_len"] = {c: longer.get(c, 0) for c in vocab.schema.lists}
    m = Manifest(format="tfrecord" if fields else "libsvm",
                 field_size=fields.field_size if fields else vocab.field_size,
                 feature_size=vocab.feature_size, files=entries, positives=positives,
                 vocabulary=VOCAB_NAME, extra=extra,
                 fields=fields.to_json() if fields else None)
    m.write(out)
    finish_output_dir(out)
    return m
