"""libffm text (`label field:id:value ...`, the input of LIBFFM's field-aware FMs) as declared
fields (data/schema.py).

A line holds any number of pairs per field, in any order: field j of a row is every pair whose
field is j, in line order (none, one or several). `data convert` declares fields f0, f1, ...
from the data it converts (or takes the declaration of another split, --like):

  categorical   when every row holds exactly one pair of field j, of value 1 (one id)
  multi_hot     otherwise: pooled by `sum` (an FM's sum of value x embedding over the field's
                pairs), weighted by the values when any is not 1, max_len the most pairs a
                row holds

A row that does not fit a declaration taken --like (two pairs of a categorical field, a value
other than 1 in an unweighted one, a field the declaration lacks) is a bad row, named by line;
a bag longer than max_len is kept whole and cut when read, as featurize does, and counted.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from .libsvm import _NUMBER, FLOAT32_MAX, LABEL_FORMATS, MAX_EXACT_ID, BadRow, split_tokens
from .schema import MAX_LEN_LIMIT, Field, FieldRows, Schema

# More is a sign of another format (or a typo), not of libffm data (Criteo's has 39 fields);
# it also bounds the [rows, fields] count block a worker holds (200 MB at most).
MAX_FIELDS = 1_000
_INT = re.compile(r"[0-9]+")


def field_name(j: int) -> str:
    return f"f{j}"


def is_libffm(path: str) -> bool:
    """Whether a text file's first non-blank line's first pair is field:id:value (libsvm's has
    one ':'). Blank lines are skipped (at most the first MiB of them): a libffm file opening
    with one was taken for libsvm."""
    with open(path, "rb") as f:
        line, seen = f.readline(1 << 20), 0
        while line and not line.strip() and seen < 1 << 20:
            seen += len(line)
            line = f.readline(1 << 20)
        return is_libffm_line(line)


def is_libffm_line(line: bytes) -> bool:
    """Whether a line's first pair is field:id:value (libsvm's has one ':')."""
    tokens = line.split()
    return len(tokens) > 1 and tokens[1].count(b":") == 2


@dataclasses.dataclass
class FfmBlock:
    """The good lines of a block: labels [n] and their pairs, flat [m], row after row."""
    labels: np.ndarray    # float32 [n], 0/1
    lines: np.ndarray     # int64 [n]: each row's 1-based line number
    row: np.ndarray       # int64 [m]: the row a pair belongs to
    field: np.ndarray     # int64 [m]
    ids: np.ndarray       # int64 [m]
    values: np.ndarray    # float32 [m]

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _parse_line(line: str, feature_size: int | None, allowed: dict) -> tuple[float, list]:
    tokens = split_tokens(line)
    if not tokens:
        raise ValueError("empty line")
    if not _NUMBER.fullmatch(tokens[0]) or float(tokens[0]) not in allowed:
        raise ValueError(f"label {tokens[0][:40]!r} is not one of "
                         f"{[f'{a:g}' for a in sorted(allowed)]}")
    pairs = []
    for j, tok in enumerate(tokens[1:]):
        parts = tok.split(":")
        if len(parts) != 3:
            raise ValueError(f"pair {j + 1} {tok[:40]!r} is not field:id:value")
        f, i, v = parts
        if not (_INT.fullmatch(f) and _INT.fullmatch(i)):
            raise ValueError(f"pair {j + 1} {tok[:40]!r}: field and id must be non-negative "
                             "integers")
        f, i = int(f), int(i)
        if f >= MAX_FIELDS:
            raise ValueError(f"pair {j + 1}: field {f} is not below {MAX_FIELDS}")
        if i >= (feature_size if feature_size is not None else MAX_EXACT_ID):
            raise ValueError(f"pair {j + 1}: id {i} is outside [0, "
                             f"{feature_size if feature_size is not None else MAX_EXACT_ID})")
        if not _NUMBER.fullmatch(v) or abs(float(v)) > FLOAT32_MAX:
            raise ValueError(f"pair {j + 1} {tok[:40]!r}: value is not a number within "
                             f"float32's range")
        pairs.append((f, i, float(v)))
    return allowed[float(tokens[0])], pairs


def parse_libffm(text: bytes, *, path: str = "<text>", first_line: int = 1,
                 label_format: str = "01", feature_size: int | None = None):
    """(FfmBlock of a block's good lines, [BadRow]): every line is either."""
    allowed = LABEL_FORMATS[label_format]
    if text and not text.endswith(b"\n"):
        text += b"\n"
    labels, lines, row, field, ids, values, bad = [], [], [], [], [], [], []
    for k, raw in enumerate(text.split(b"\n")[: text.count(b"\n")]):
        try:
            label, pairs = _parse_line(raw.decode("utf-8", errors="replace"), feature_size,
                                       allowed)
        except ValueError as e:
            bad.append(BadRow(path, first_line + k, str(e)))
            continue
        r = len(labels)
        labels.append(label)
        lines.append(first_line + k)
        for f, i, v in pairs:
            row.append(r)
            field.append(f)
            ids.append(i)
            values.append(v)
    return FfmBlock(np.array(labels, np.float32), np.array(lines, np.int64),
                    np.array(row, np.int64), np.array(field, np.int64),
                    np.array(ids, np.int64), np.array(values, np.float32)), bad


@dataclasses.dataclass
class FieldStats:
    """What declaring the fields needs, over any number of rows: per field, the fewest and
    most pairs a row holds and whether a value is not 1."""
    rows: int = 0
    fewest: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    most: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    weighted: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))
    most_at: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, object))
    # ^ per field, "path, line N" of a row holding `most` pairs (what a warning names)

    @classmethod
    def of(cls, block: FfmBlock, path: str = "<text>") -> "FieldStats":
        n, width = len(block), int(block.field.max()) + 1 if block.field.size else 0
        counts = _counts(block, width)
        weighted = np.zeros(width, bool)
        weighted[block.field[block.values != 1]] = True
        at = np.array([f"{path}, line {block.lines[r]}" for r in counts.argmax(0)], object) \
            if n else np.full(width, "", object)
        return cls(n, counts.min(0) if n else np.zeros(width, np.int64),
                   counts.max(0) if n else np.zeros(width, np.int64), weighted, at)

    def merge(self, other: "FieldStats") -> "FieldStats":
        if not other.rows:
            return self
        if not self.rows:
            return other
        width = max(len(self.most), len(other.most))

        def pad(a):     # a field a block never holds: 0 pairs in its every row, no value
            return np.concatenate([a, np.full(width - len(a), "" if a.dtype == object else 0,
                                              a.dtype)])
        mine = pad(self.most) >= pad(other.most)
        return FieldStats(self.rows + other.rows, np.minimum(pad(self.fewest), pad(other.fewest)),
                          np.maximum(pad(self.most), pad(other.most)),
                          pad(self.weighted) | pad(other.weighted),
                          np.where(mine, pad(self.most_at), pad(other.most_at)))

    def declare(self, say=print) -> Schema:
        """The fields; a bag's max_len is the most pairs a row holds, at most MAX_LEN_LIMIT
        (longer rows are cut when read and counted, and `say` tells which field)."""
        fields = []
        for j in range(len(self.most)):
            if self.fewest[j] == self.most[j] == 1 and not self.weighted[j]:
                fields.append(Field(field_name(j)))
                continue
            most = max(1, int(self.most[j]))
            if most > MAX_LEN_LIMIT:
                say(f"warning: field {j} ({field_name(j)}): a row holds {most:,} pairs "
                    f"({self.most_at[j]}); max_len "
                    f"set to {MAX_LEN_LIMIT:,} (every row is padded to it), longer rows are cut "
                    "when read and counted in the manifest")
                most = MAX_LEN_LIMIT
            fields.append(Field(field_name(j), "multi_hot", most, "sum", bool(self.weighted[j])))
        empty = [j for j in range(len(self.most)) if self.most[j] == 0]
        if empty:   # one line naming field 999 declares 1,000 fields
            say(f"warning: {len(empty):,} of the {len(self.most):,} fields hold no pair in any "
                f"row ({_spans(empty)}): field numbers are taken as positions, so the highest "
                "one named sets the field count; check the data if that is not intended")
        return Schema(tuple(fields))


def _spans(numbers: list[int], most: int = 5) -> str:
    """Sorted integers as ranges, `f3..f998, f1200`, the first `most` of them."""
    runs, start = [], numbers[0]
    for a, b in zip(numbers, numbers[1:] + [None]):
        if b != a + 1:
            runs.append(field_name(start) + (f"..{field_name(a)}" if a != start else ""))
            if b is not None:
                start = b
    return ", ".join(runs[:most]) + (", ..." if len(runs) > most else "")


def _counts(block: FfmBlock, width: int) -> np.ndarray:
    """Pairs per row and field, [n, width] (pairs of fields at or above width left out)."""
    counts = np.zeros((len(block), width), np.int32)
    inside = block.field < width
    np.add.at(counts, (block.row[inside], block.field[inside]), 1)
    return counts


def check_declaration(schema: Schema, where: str) -> None:
    """A declaration libffm rows can be read into: fields f0, f1, ... of these kinds."""
    from ..errors import DataError
    for j, f in enumerate(schema.fields):
        if f.name != field_name(j) or f.kind not in ("categorical", "multi_hot") or f.hash_buckets:
            raise DataError(f"field {j} is {f.name!r} ({f.kind}): libffm rows are read into "
                            "the fields f0, f1, ... (categorical or multi_hot) that converting "
                            "libffm declares", path=where, field="fields")


def to_field_rows(block: FfmBlock, schema: Schema, path: str):
    """(FieldRows of the rows that fit the declaration, [BadRow] of those that do not,
    {multi_hot field: rows longer than its max_len})."""
    width = len(schema.fields)
    counts = _counts(block, width)
    why: list[str | None] = [None] * len(block)

    def flag(mask, reason):
        for r in np.flatnonzero(mask):
            if why[r] is None:
                why[r] = reason(r)
    outside = block.field >= width
    flag(np.bincount(block.row[outside], minlength=len(block)) > 0,
         lambda r: f"field {int(block.field[(block.row == r) & outside][0])} is not declared "
                   f"(the data declares fields f0..f{width - 1})")
    not_one = block.values != 1
    for j, f in enumerate(schema.fields):
        if f.kind == "categorical":
            flag(counts[:, j] != 1, lambda r, j=j: f"field f{j} holds {counts[r, j]} pairs: it is "
                 "declared categorical (exactly one)")
        if not f.weighted:
            mine = (block.field == j) & not_one
            flag(np.bincount(block.row[mine], minlength=len(block)) > 0,
                 lambda r, j=j, mine=mine: f"field f{j} has value "
                 f"{float(block.values[mine & (block.row == r)][0]):g}: it is declared with "
                 "values of 1 only")
    ok = np.array([w is None for w in why], bool)
    bad = [BadRow(path, int(block.lines[r]), w) for r, w in enumerate(why) if w]
    keep = ok[block.row] & ~outside
    new_row = np.cumsum(ok) - 1
    row, field = new_row[block.row[keep]], block.field[keep]
    ids, values, counts = block.ids[keep], block.values[keep], counts[ok]
    order = np.lexsort((np.arange(row.size), row, field))     # by field, then row, then line
    row, field, ids, values = row[order], field[order], ids[order], values[order]
    starts = np.searchsorted(field, np.arange(width + 1))
    columns, longer = {}, {}
    for j, f in enumerate(schema.fields):
        lo, hi = starts[j], starts[j + 1]
        if f.kind == "categorical":
            columns[f.name] = ids[lo:hi]
        else:
            columns[f.name] = (counts[:, j].astype(np.int64), ids[lo:hi],
                               values[lo:hi] if f.weighted else None)
            longer[f.name] = int((counts[:, j] > f.max_len).sum())
    return FieldRows(block.labels[ok], columns), bad, longer
