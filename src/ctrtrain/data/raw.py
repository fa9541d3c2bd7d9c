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


LABEL_NAMES = ("label", "click")


def infer_csv_schema(header: list[str], label: str | None = None, has_label: bool = True,
                     path: str = "<csv>") -> RawSchema:
    """CSV header: the label column is `label_column` if given, else `label` or `click` in any
    case; I<n> columns numeric; `id` ignored; everything else categorical. Labeled data
    without a label column is refused: guessing would train on all-zero labels and feed the
    real label in as a feature."""
    if not has_label:
        label = None
    elif label is not None:
        if label not in header:
            raise DataError(f"label column {label!r} is not in the header {_cols(header)}",
                            path=path, line=1)
    else:
        label = next((c for c in header if c.lower() in LABEL_NAMES), None)
        if label is None:
            raise DataError(f"no label column ({' or '.join(LABEL_NAMES)}) in the header "
                            f"{_cols(header)}: name it with --label-column, or pass --no-label "
                            "for unlabeled rows", path=path, line=1)
    numeric = [c for c in header if c[:1] == "I" and c[1:].isdigit()]
    categorical = [c for c in header if c not in numeric and c not in (label, "id")]
    return RawSchema(label, numeric, categorical)


def _cols(header: list[str]) -> str:
    return str(header[:12])[:-1] + (", ...]" if len(header) > 12 else "]")


def read_raw(path: str, fmt: str, schema: RawSchema | None = None, chunk_rows: int = 200_000,
             has_label: bool = True, label_column: str | None = None):
    """Yields (schema, RawChunk) for a raw file. Criteo TSV rows may have fewer columns than 40
    (trailing empty fields stripped): the missing ones are missing values, not an error."""
    try:
        yield from _read_raw(path, fmt, schema, chunk_rows, has_label, label_column)
    except pd.errors.EmptyDataError:
        raise DataError("file is empty (no header, no rows)", path=path) from None
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=path) from None


def _read_raw(path, fmt, schema, chunk_rows, has_label, label_column):
    if fmt == "criteo":
        schema = schema or CRITEO
        names = ([schema.label] if has_label else []) + schema.fields
        reader = pd.read_csv(path, sep="\t", header=None, names=names, dtype=str,
                             keep_default_na=False, na_filter=False, chunksize=chunk_rows,
                             engine="c", quoting=3)
        header_lines = 0
    elif fmt == "csv":
        header = pd.read_csv(path, nrows=0).columns.tolist()
        if len(header) == 1 and "\t" in header[0]:
            raise DataError("the header is TAB-separated, not a CSV: use --format criteo for "
                            "Criteo's TSV", path=path, line=1)
        if len(header) < 2:
            raise DataError(f"a CSV needs a header with the label and feature columns, found "
                            f"{_cols(header)}", path=path, line=1)
        if schema is None:
            schema = infer_csv_schema(header, label_column, has_label, path)
        elif has_label and (label_column or not schema.label):
            # A vocabulary's schema (built from unlabeled rows, or another label name).
            found = infer_csv_schema(header, label_column, True, path).label
            schema = dataclasses.replace(schema, label=found)
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


def has_csv_header(path: str) -> bool:
    """A comma-separated first line without TABs: a CSV table, which (as read_raw reads it)
    starts with its header. libsvm and Criteo TSV rows have no commas."""
    with io.open(path, "r", errors="replace") as f:
        first = f.readline()
    return "," in first and "\t" not in first


def sniff_format(path: str) -> str:
    """'criteo' for TAB-separated rows, 'csv' for a comma-separated file with a header."""
    with io.open(path, "r", errors="replace") as f:
        first = f.readline()
    return "criteo" if "\t" in first else "csv"
