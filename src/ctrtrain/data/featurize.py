"""Raw columns -> the fixed-field schema (one id and one value per field).

Numeric field i: id i, value sign(x)*log1p(|x|) rounded to 5 decimals, missing = 0.
Categorical field j: either a vocabulary built on the training split (values seen at least
`min_count` times; index 0 of each field is its out-of-vocabulary id) or hashing into a fixed
number of buckets per field. Empty (missing) is a value like any other. The vocabulary is saved
as JSON and reused for the test split and for prediction, so ids are stable.
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
from .raw import RawChunk, RawSchema, read_raw, sniff_format

VOCAB_NAME = "vocab.json"


@dataclasses.dataclass
class Vocabulary:
    schema: RawSchema
    mode: str = "vocab"                  # "vocab" or "hash"
    min_count: int = 10
    hash_buckets: int = 0
    values: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self._index = {c: {v: i + 1 for i, v in enumerate(vals)} for c, vals in self.values.items()}

    @property
    def field_size(self) -> int:
        return len(self.schema.fields)

    def field_width(self, col: str) -> int:
        return self.hash_buckets if self.mode == "hash" else len(self.values[col]) + 1

    def bases(self) -> list[int]:
        base, out = len(self.schema.numeric), []
        for c in self.schema.categorical:
            out.append(base)
            base += self.field_width(c)
        return out

    @property
    def feature_size(self) -> int:
        return len(self.schema.numeric) + sum(self.field_width(c) for c in self.schema.categorical)

    def transform(self, chunk: RawChunk) -> Rows:
        n = chunk.numeric.shape[0]
        x = np.nan_to_num(chunk.numeric, nan=0.0)
        num_vals = np.round(np.sign(x) * np.log1p(np.abs(x)), 5)
        ids = np.empty((n, self.field_size), np.int64)
        values = np.ones((n, self.field_size), np.float32)
        k = len(self.schema.numeric)
        ids[:, :k] = np.arange(k)
        values[:, :k] = num_vals
        for j, (col, base) in enumerate(zip(self.schema.categorical, self.bases())):
            codes, uniques = pd.factorize(chunk.categorical[:, j])
            if self.mode == "hash":
                local = np.array([zlib.crc32(f"{col}\x00{u}".encode()) % self.hash_buckets
                                  for u in uniques], np.int64)
            else:
                index = self._index[col]
                local = np.array([index.get(u, 0) for u in uniques], np.int64)
            ids[:, k + j] = base + local[codes]
        labels = chunk.labels if chunk.labels is not None else np.zeros(n, np.float32)
        return Rows(labels, ids, values)

    def to_json(self) -> dict:
        return {"version": 1, "mode": self.mode, "min_count": self.min_count,
                "hash_buckets": self.hash_buckets, "schema": dataclasses.asdict(self.schema),
                "feature_size": self.feature_size, "field_size": self.field_size,
                "numeric_transform": "sign(x)*log1p(|x|), missing=0", "values": self.values}

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
            if set(sc) != {"label", "numeric", "categorical"} or not strs(sc["numeric"]) \
                    or not strs(sc["categorical"]) or not isinstance(sc["label"], (str, type(None))):
                problem = "schema needs label, numeric and categorical column names"
            elif d.get("mode") not in ("vocab", "hash"):
                problem = f"mode {str(d.get('mode'))[:20]!r} is not vocab or hash"
            elif not (isinstance(d.get("hash_buckets"), int) and d["hash_buckets"] >= 0
                      and (d["mode"] == "vocab" or d["hash_buckets"] > 0)):
                problem = "hash_buckets must be a non-negative integer (positive for hash mode)"
            elif not isinstance(d.get("min_count"), int):
                problem = "min_count must be an integer"
            elif not isinstance(d.get("values"), dict) or (d["mode"] == "vocab" and any(
                    not strs(d["values"].get(c)) for c in sc["categorical"])):
                problem = "values must map every categorical column to a list of strings"
        if problem:
            raise DataError(f"not a ctrtrain vocabulary: {problem}", path=path)
        return cls(RawSchema(**d["schema"]), d["mode"], d["min_count"], d["hash_buckets"],
                   d["values"])


def build_vocabulary(paths: list[str], fmt: str | None = None, schema: RawSchema | None = None,
                     min_count: int = 10, hash_buckets: int = 0, has_label: bool = True,
                     label_column: str | None = None) -> Vocabulary:
    """Counts categorical values over the training files (one pass) and keeps the frequent ones,
    most frequent first (ties by value, so the result does not depend on chunking)."""
    if hash_buckets:
        for p in paths:
            schema, _ = next(read_raw(p, fmt or sniff_format(p), schema, chunk_rows=1,
                                      has_label=has_label, label_column=label_column))
        return Vocabulary(schema, "hash", min_count, hash_buckets)
    counts: dict[str, Counter] = {}
    for p in paths:
        for schema, chunk in read_raw(p, fmt or sniff_format(p), schema, has_label=has_label,
                                      label_column=label_column):
            for j, col in enumerate(schema.categorical):
                vc = pd.Series(chunk.categorical[:, j]).value_counts()
                counts.setdefault(col, Counter()).update(dict(zip(vc.index, vc.to_numpy().tolist())))
    if schema is None:
        raise DataError("no rows to build a vocabulary from", path=", ".join(paths))
    values = {}
    for col in schema.categorical:
        kept = [(v, c) for v, c in counts.get(col, Counter()).items() if c >= min_count]
        values[col] = [v for v, _ in sorted(kept, key=lambda vc: (-vc[1], vc[0]))]
    return Vocabulary(schema, "vocab", min_count, 0, values)


def featurize_file(path: str, vocab: Vocabulary, fmt: str | None = None, has_label: bool = True,
                   label_column: str | None = None):
    """Yields Rows blocks of a raw file under a vocabulary."""
    for _, chunk in read_raw(path, fmt or sniff_format(path), vocab.schema, has_label=has_label,
                             label_column=label_column):
        yield vocab.transform(chunk)


def output_names(files: list[str]) -> list[str]:
    """`<stem>.libsvm` per input, made unique in input order (`a/day.txt` and `b/day.txt`, or
    `day.txt` and `day.tsv`, would otherwise write one file over the other)."""
    from pathlib import Path
    names, used = [], set()
    for f in files:
        stem, k = Path(f).stem, 1
        name = f"{stem}.libsvm"
        while name in used:
            k += 1
            name = f"{stem}-{k}.libsvm"
        used.add(name)
        names.append(name)
    return names


def featurize(inputs, out_dir, *, fmt: str | None = None, vocab_path: str | None = None,
              min_count: int = 10, hash_buckets: int = 0, has_label: bool = True,
              label_column: str | None = None, overwrite: bool = False):
    """Raw files -> a libsvm data directory (one file per input) with the vocabulary beside it.
    Without `vocab_path` the vocabulary is built from these inputs (the training split)."""

    from .files import list_inputs, prepare_output_dir
    from .libsvm import format_libsvm
    from .manifest import FileEntry, Manifest, sha256_file

    files = list_inputs(inputs)
    vocab = Vocabulary.load(vocab_path) if vocab_path else \
        build_vocabulary(files, fmt, min_count=min_count, hash_buckets=hash_buckets,
                         has_label=has_label, label_column=label_column)
    out = prepare_output_dir(out_dir, overwrite, [*inputs, *([vocab_path] if vocab_path else [])])
    entries, positives = [], 0
    try:
        for f, name in zip(files, output_names(files)):
            dst = out / name
            n = 0
            with open(str(dst) + ".tmp", "wb") as w:
                for rows in featurize_file(f, vocab, fmt, has_label, label_column):
                    w.write(format_libsvm(rows))
                    n += len(rows)
                    positives += int(rows.labels.sum())
            os.replace(str(dst) + ".tmp", dst)
            entries.append(FileEntry(dst.name, n, dst.stat().st_size, sha256_file(dst)))
        vocab.save(str(out / VOCAB_NAME))
    except BaseException:
        import shutil
        shutil.rmtree(out, ignore_errors=True)
        raise
    m = Manifest(format="libsvm", field_size=vocab.field_size, feature_size=vocab.feature_size,
                 files=entries, positives=positives, vocabulary=VOCAB_NAME,
                 extra={"source": files, "labeled": has_label})
    m.write(out)
    return m
