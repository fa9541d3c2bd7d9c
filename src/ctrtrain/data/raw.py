"""Raw CTR tables (Criteo Kaggle TSV, CSV with a header such as DeepCTR's samples or Avazu),
read in chunks as columns of strings with their line numbers."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pandas as pd

from ..errors import DataError

CRITEO_NUMERIC = [f"I{i}" for i in range(1, 14)]
CRITEO_CATEGORICAL = [f"C{i}" for i in range(1, 27)]


@dataclasses.dataclass
class RawSchema:
    """Which columns are the label, numeric and categorical fields (in field order)."""
    label: str | None
    numeric: list[str]
    categorical: list[str]

    @property
    def fields(self) -> list[str]:
        return self.numeric + self.categorical


CRITEO = RawSchema("label", CRITEO_NUMERIC, CRITEO_CATEGORICAL)
FORMATS = ("criteo", "csv")


@dataclasses.dataclass
class RawChunk:
    first_line: int               # 1-based file line of the chunk's first row
    labels: np.ndarray | None     # float32 [n] 0/1, or None for unlabeled data
    numeric: np.ndarray           # float64 [n, n_numeric], NaN = missing
    categorical: np.ndarray       # object [n, n_categorical] of str, '' = missing


def infer_csv_schema(header: list[str], label: str | None = None) -> RawSchema:
    """CSV header: label `label` or `click`; I<n> columns numeric; `id` and `hour` aside from
    Avazu's time stamp ignored as ids; everything else categorical."""
    if label is None:
        label = next((c for c in ("label", "click") if c in header), None)
    numeric = [c for c in header if c[:1] == "I" and c[1:].isdigit()]
    categorical = [c for c in header if c not in numeric and c not in (label, "id")]
    return RawSchema(label, numeric, categorical)


def read_raw(path: str, fmt: str, schema: RawSchema | None = None, chunk_rows: int = 200_000,
             has_label: bool = True):
    """Yields (schema, RawChunk) for a raw file. Criteo TSV rows may have fewer columns than 40
    (trailing empty fields stripped): the missing ones are missing values, not an error."""
    if fmt == "criteo":
        schema = schema or CRITEO
        names = ([schema.label] if has_label else []) + schema.fields
        reader = pd.read_csv(path, sep="\t", header=None, names=names, dtype=str,
                             keep_default_na=False, na_filter=False, chunksize=chunk_rows,
                             engine="c", quoting=3)
        header_lines = 0
    elif fmt == "csv":
        header = pd.read_csv(path, nrows=0).columns.tolist()
        schema = schema or infer_csv_schema(header)
        missing = [c for c in ([schema.label] if has_label and schema.label else []) + schema.fields
                   if c not in header]
        if missing:
            raise DataError(f"columns {missing} not in the header {header}", path=path, line=1)
        reader = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False,
                             chunksize=chunk_rows, engine="c")
        header_lines = 1
    else:
        raise DataError(f"unknown raw format {fmt!r} (allowed: {', '.join(FORMATS)})", path=path)
    line = 1 + header_lines
    try:
        for frame in reader:
            yield schema, _to_chunk(frame.fillna(""), schema, path, line, has_label)
            line += len(frame)
    except pd.errors.ParserError as e:
        raise DataError(f"malformed row: {e}", path=path) from e


def _to_chunk(frame: pd.DataFrame, schema: RawSchema, path: str, line: int,
              has_label: bool) -> RawChunk:
    labels = None
    if has_label and schema.label:
        lab = pd.to_numeric(frame[schema.label], errors="coerce").to_numpy(np.float64)
        bad = ~np.isin(lab, (0.0, 1.0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"label {frame[schema.label].iloc[i]!r} is not 0 or 1", path=path,
                            line=line + i, field=schema.label)
        labels = lab.astype(np.float32)
    numeric = np.empty((len(frame), len(schema.numeric)), np.float64)
    for j, col in enumerate(schema.numeric):
        text = frame[col]
        num = pd.to_numeric(text, errors="coerce").to_numpy(np.float64)
        bad = np.isnan(num) & (text.to_numpy() != "")
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{text.iloc[i]!r} is not a number", path=path, line=line + i,
                            field=col)
        numeric[:, j] = num
    categorical = frame[schema.categorical].to_numpy(dtype=object) if schema.categorical \
        else np.empty((len(frame), 0), object)
    return RawChunk(line, labels, numeric, categorical)


def sniff_format(path: str) -> str:
    """'criteo' for TAB-separated rows, 'csv' for a comma-separated file with a header."""
    with io.open(path, "r", errors="replace") as f:
        first = f.readline()
    return "criteo" if "\t" in first else "csv"
