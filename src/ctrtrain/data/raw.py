"""Raw CTR tables (Criteo Kaggle TSV, CSV with a header such as DeepCTR's samples or Avazu),
read in chunks as columns of strings with their line numbers."""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import io
import lzma
import sys

import numpy as np
import pandas as pd

from ..errors import DataError

CRITEO_NUMERIC = [f"I{i}" for i in range(1, 14)]
CRITEO_CATEGORICAL = [f"C{i}" for i in range(1, 27)]


@dataclasses.dataclass
class RawSchema:
    """Which columns are the label, numeric, categorical and multi-valued fields (in field
    order). A multi-valued cell (a multi_hot bag, or a sequence, oldest first) holds several
    values joined by `separator` ('' = none)."""
    label: str | None
    numeric: list[str]
    categorical: list[str]
    multi_hot: list[str] = dataclasses.field(default_factory=list)
    separator: str = "|"
    sequence: list[str] = dataclasses.field(default_factory=list)
    # A multi-valued column whose values are another (categorical) column's: its ids are that
    # column's (a history of items and the candidate item share rows, as DIN needs).
    shared: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def lists(self) -> list[str]:
        """The multi-valued columns: multi_hot, then sequence."""
        return self.multi_hot + self.sequence

    @property
    def fields(self) -> list[str]:
        return self.numeric + self.categorical + self.lists


CRITEO = RawSchema("label", CRITEO_NUMERIC, CRITEO_CATEGORICAL)
FORMATS = ("criteo", "csv")


@dataclasses.dataclass
class RawChunk:
    first_line: int               # 1-based file line of the chunk's first row
    labels: np.ndarray | None     # float32 [n] 0/1, or None for unlabeled data
    numeric: np.ndarray           # float64 [n, n_numeric], NaN = missing
    categorical: np.ndarray       # object [n, n_categorical] of str, '' = missing
    lists: np.ndarray | None = None   # object [n, schema.lists] of str, as in the file
    cells: dict | None = None     # read_raw(keep_cells=True): each field's cells [n], as in the file


LABEL_NAMES = ("label", "click")


@dataclasses.dataclass
class ColumnRoles:
    """What the user said of a CSV's columns (featurize --numeric, --multi-hot, --drop,
    --separator); the rest is inferred from the header."""
    numeric: tuple[str, ...] = ()
    multi_hot: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    separator: str = "|"
    sequence: tuple[str, ...] = ()
    shared: tuple[tuple[str, str], ...] = ()   # (multi-valued column, categorical column)


def infer_csv_schema(header: list[str], label: str | None = None, has_label: bool = True,
                     path: str = "<csv>", roles: ColumnRoles = ColumnRoles()) -> RawSchema:
    """CSV header: the label column is `label_column` if given, else `label` or `click` in any
    case; I<n> columns and those named numeric are numeric; those named multi_hot or
    sequence are multi-valued; `id` and those named in drop are ignored; everything else categorical.
    Labeled data without a label column is refused: guessing would train on all-zero labels
    and feed the real label in as a feature."""
    for kind, cols in (("--numeric", roles.numeric), ("--multi-hot", roles.multi_hot),
                       ("--sequence", roles.sequence),
                       ("--share-vocab", [c for pair in roles.shared for c in pair]),
                       ("--drop", roles.drop)):
        missing = [c for c in cols if c not in header]
        if missing:
            raise DataError(f"{kind} names {missing}, not in the header {_cols(header)}",
                            path=path, line=1)
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
    taken = set(roles.multi_hot) | set(roles.sequence) | set(roles.drop) | {label, "id"}
    numeric = [c for c in header if c not in taken and (
        c in roles.numeric or (c[:1] == "I" and c[1:].isdigit()))]
    categorical = [c for c in header if c not in numeric and c not in taken]
    multi_hot = [c for c in header if c in roles.multi_hot]
    sequence = [c for c in header if c in roles.sequence and c not in roles.multi_hot]
    for col, of in roles.shared:
        if col not in multi_hot + sequence or of not in categorical:
            raise DataError(f"--share-vocab {col}={of}: {col} must be a --multi-hot or --sequence "
                            f"column and {of} a categorical one", path=path, line=1)
    return RawSchema(label, numeric, categorical, multi_hot, roles.separator, sequence,
                     dict(roles.shared))


def _cols(header: list[str]) -> str:
    return str(header[:12])[:-1] + (", ...]" if len(header) > 12 else "]")


def read_raw(path: str, fmt: str, schema: RawSchema | None = None, chunk_rows: int = 200_000,
             has_label: bool = True, label_column: str | None = None,
             roles: ColumnRoles = ColumnRoles(), label_threshold: float | None = None,
             warn_cut: bool = True, keep_cells: bool = False):
    """Yields (schema, RawChunk) for a raw file (gzip, bzip2 or xz compressed too: open_raw).
    Criteo TSV rows may have fewer columns than 40 (trailing empty fields stripped): the
    missing ones are missing values, not an error. `label_threshold`: the label column is a
    score (a rating); at least this is a click. `warn_cut`: once the file is read through,
    warn if its last line looks cut (_LineEnds); a caller that reads a file twice (featurize:
    the vocabulary, then the rows) asks it of one pass only, so the warning comes once.
    `keep_cells`: each chunk also holds every field's cells as the file has them (`cells`),
    for the model's own transform of them (predict's raw rows)."""
    try:
        yield from _read_raw(path, fmt, schema, chunk_rows, has_label, label_column, roles,
                             label_threshold, warn_cut, keep_cells)
    except pd.errors.EmptyDataError:
        raise DataError("file is empty (no header, no rows)", path=path) from None
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=path) from None
    except UNDECOMPRESSED as e:
        raise undecompressed_error(e, path) from None


_COMPRESSED = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
_UNREAD = ((b"PK\x03\x04", "zip"), (b"\x28\xb5\x2f\xfd", "zstd"))


UNDECOMPRESSED = (EOFError, lzma.LZMAError, OSError)


def undecompressed_error(e: Exception, path: str) -> Exception:
    """What to raise for an error while decompressing: the file's (gzip's, bzip2's, xz's
    complaints) named as a DataError; the system's (an errno: a missing file, a disk) as is."""
    if isinstance(e, OSError) and e.errno is not None:
        return e
    cut = " (is the file cut short?)" if isinstance(e, EOFError) else ""
    return DataError(f"cannot decompress: {e}{cut}", path=path)


def open_raw(path: str):
    """A raw file's bytes, decompressed if it is gzip, bzip2 or xz (told by its first bytes,
    whatever its name: `train.csv.gz`, Criteo's `day_0.gz`). Everything that reads a raw
    file -- the format sniff, the CSV header, the rows -- reads through this, so all see the
    same text (pandas alone would decompress by the name's extension only)."""
    with open(path, "rb") as f:
        magic = f.read(6)
    for start, opener in _COMPRESSED:
        if magic.startswith(start):
            return opener(path, "rb")
    for start, kind in _UNREAD:
        if magic.startswith(start):
            raise DataError(f"a {kind} archive: raw files are read as text, or gzip, bzip2 or "
                            "xz compressed; unpack it", path=path)
    return open(path, "rb")


def first_line(path: str) -> str:
    """The raw file's first line of text (its first MiB if longer), as open_raw reads it."""
    try:
        with open_raw(path) as f:
            return f.readline(1 << 20).decode("utf-8", errors="replace")
    except UNDECOMPRESSED as e:
        raise undecompressed_error(e, path) from None


class _LineEnds(io.RawIOBase):
    """Passes a binary stream through while counting its line ends and the cells of what
    follows the last one, so the read itself can tell (warn_if_cut) whether the file ends in a
    cut line: a compressed file has no end to seek to, and a second pass would read it twice."""

    def __init__(self, stream, sep: str):
        self._stream, self._sep = stream, sep.encode()
        self.ends = 0           # line ends seen
        self.pending = 0        # bytes after the last line end
        self.seps = 0           # separators in them
        self.quoted = False     # a quote in them

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = self._stream.read(len(buf))
        n = len(data)
        buf[:n] = data
        k = data.count(b"\n")
        if k:
            self.ends += k
            data = data[data.rindex(b"\n") + 1:]
            self.pending, self.seps, self.quoted = 0, 0, False
        self.pending += len(data)
        self.seps += data.count(self._sep)
        self.quoted = self.quoted or b'"' in data
        return n

    def warn_if_cut(self, path: str, columns: int) -> None:
        """Warns when the last line has no line end and fewer than `columns` cells: a copy or
        download stopped mid-row looks so, and its missing cells would be read as missing
        values without a word. Only a warning: real Criteo files end so too (a last row whose
        trailing empty fields were stripped, with no final line end), and the two cannot be
        told apart. Quoted cells: the separators cannot be counted here, no warning."""
        while self.read(1 << 16):      # the reader stops at its end; make sure it is the file's
            pass
        cells = self.seps + 1
        if self.pending and not self.quoted and cells < columns:
            print(f"warning: {path}, line {self.ends + 1}: the last line has no line end and "
                  f"{cells} of {columns} cells; if the file was cut short, that row is incomplete "
                  "(its missing cells are read as missing values)", file=sys.stderr, flush=True)


def read_header(path: str) -> list[str]:
    """A CSV's column names, as read_raw reads them."""
    with open_raw(path) as f:
        return pd.read_csv(f, nrows=0, compression=None).columns.tolist()


def _read_raw(path, fmt, schema, chunk_rows, has_label, label_column, roles, label_threshold,
              warn_cut, keep_cells):
    if fmt == "criteo":
        schema = schema or CRITEO
        names = ([schema.label] if has_label else []) + schema.fields
        sep, columns, header_lines = "\t", len(names), 0
        options = dict(sep="\t", header=None, names=names, quoting=3)
    elif fmt == "csv":
        header = read_header(path)
        if len(header) == 1 and "\t" in header[0]:
            raise DataError("the header is TAB-separated, not a CSV: use --format criteo for "
                            "Criteo's TSV", path=path, line=1)
        if len(header) < 2:
            raise DataError(f"a CSV needs a header with the label and feature columns, found "
                            f"{_cols(header)}", path=path, line=1)
        if schema is None:
            schema = infer_csv_schema(header, label_column, has_label, path, roles)
        elif has_label and (label_column or not schema.label):
            # A vocabulary's schema (built from unlabeled rows, or another label name).
            found = infer_csv_schema(header, label_column, True, path).label
            schema = dataclasses.replace(schema, label=found)
        missing = [c for c in ([schema.label] if has_label and schema.label else []) + schema.fields
                   if c not in header]
        if missing:
            raise DataError(f"columns {missing} not in the header {header}", path=path, line=1)
        sep, columns, header_lines, options = ",", len(header), 1, {}
    else:
        raise DataError(f"unknown raw format {fmt!r} (allowed: {', '.join(FORMATS)})", path=path)
    with open_raw(path) as stream:
        ends = _LineEnds(stream, sep)
        reader = pd.read_csv(io.BufferedReader(ends, 1 << 16), dtype=str, keep_default_na=False,
                             na_filter=False, chunksize=chunk_rows, engine="c",
                             compression=None, **options)
        line = 1 + header_lines
        try:
            with reader:
                for frame in reader:
                    frame = frame.fillna("")
                    chunk = _to_chunk(frame, schema, path, line, has_label, label_threshold)
                    if keep_cells:
                        chunk.cells = {c: frame[c].to_numpy(object) for c in schema.fields}
                    yield schema, chunk
                    line += len(frame)
        except pd.errors.ParserError as e:
            raise DataError(f"malformed row: {e}", path=path) from e
        if warn_cut:
            ends.warn_if_cut(path, columns)


def _to_chunk(frame: pd.DataFrame, schema: RawSchema, path: str, line: int,
              has_label: bool, label_threshold: float | None = None) -> RawChunk:
    labels = None
    if has_label and schema.label:
        lab = pd.to_numeric(frame[schema.label], errors="coerce").to_numpy(np.float64)
        bad = ~np.isin(lab, (0.0, 1.0)) if label_threshold is None else ~np.isfinite(lab)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "is not 0 or 1" if label_threshold is None else "is not a number"
            raise DataError(f"label {frame[schema.label].iloc[i]!r} {what}", path=path,
                            line=line + i, field=schema.label)
        labels = (lab if label_threshold is None else lab >= label_threshold).astype(np.float32)
    numeric = np.empty((len(frame), len(schema.numeric)), np.float64)
    for j, col in enumerate(schema.numeric):
        text = frame[col]
        num = pd.to_numeric(text, errors="coerce").to_numpy(np.float64)
        # An empty cell is a missing value; 'nan', 'inf' and 1e400 (past float64) are not
        # values a transform can use: refused alike, naming the cell.
        bad = (np.isnan(num) & (text.to_numpy() != "")) | np.isinf(num)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "is not finite" if np.isinf(num[i]) else "is not a number"
            raise DataError(f"{text.iloc[i]!r} {what}", path=path, line=line + i, field=col)
        numeric[:, j] = num
    categorical = frame[schema.categorical].to_numpy(dtype=object) if schema.categorical \
        else np.empty((len(frame), 0), object)
    lists = frame[schema.lists].to_numpy(dtype=object) if schema.lists else None
    return RawChunk(line, labels, numeric, categorical, lists)


def has_csv_header(path: str) -> bool:
    """A comma-separated first line without TABs: a CSV table, which (as read_raw reads it)
    starts with its header. libsvm and Criteo TSV rows have no commas."""
    first = first_line(path)
    return "," in first and "\t" not in first


def sniff_format(path: str) -> str:
    """'criteo' for TAB-separated rows, 'csv' for a comma-separated file with a header."""
    return "criteo" if "\t" in first_line(path) else "csv"
