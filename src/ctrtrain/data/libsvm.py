"""libsvm / libfm text: `label id:val id:val ...` with exactly field_size pairs per line.

Parsing has two paths that must agree: a vectorized fast path for well-formed canonical text
(single spaces, LF line ends) and a per-line path that tolerates extra white space and names
the exact line and reason of every malformed row. The fast path falls back to the per-line
path on the first sign of trouble, so speed never costs a precise error.
"""

from __future__ import annotations

import dataclasses
import io
import re
import warnings

import numpy as np

from ..errors import DataError

# Label formats: text label value -> 0/1 training label.
LABEL_FORMATS = {"01": {0.0: 0.0, 1.0: 1.0}, "pm1": {-1.0: 0.0, 1.0: 1.0}}
MAX_EXACT_ID = 2 ** 53  # ids travel through float64 on the fast path

_SEPARATORS = np.zeros(256, dtype=bool)
_SEPARATORS[[ord(" "), ord(":"), ord("\n")]] = True
# The only bytes the fast path reads: anything else (quotes, a BOM, CR, tabs, letters of
# "inf" or "nan", "_" in "1_000") goes to the per-line path, which alone decides about it, so a
# line is accepted or refused the same whatever else its block holds.
_FAST_BYTES = np.zeros(256, dtype=bool)
_FAST_BYTES[[ord(c) for c in "0123456789.+-eE :\n"]] = True
# A number as both paths accept it (no "inf", "nan", "0x1p3", "1_000", which float() takes).
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# An id is written as digits: "5.0" or "1e3" would be read as 5 and 1000 by a float parse,
# while TensorFlow's reader (tf.strings.to_number to int64) refuses them.
_ID = re.compile(r"[0-9]+")
_NOT_AN_ID = re.compile(rb"[.+\-eE][0-9]*:")     # an id token's non-digit, then its colon
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclasses.dataclass
class Rows:
    """A block of examples in the fixed-field schema."""
    labels: np.ndarray   # float32 [n], 0/1
    ids: np.ndarray      # int64 [n, field_size]
    values: np.ndarray   # float32 [n, field_size]

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @staticmethod
    def concat(parts: list["Rows"], field_size: int) -> "Rows":
        if not parts:
            return Rows(np.zeros(0, np.float32), np.zeros((0, field_size), np.int64),
                        np.zeros((0, field_size), np.float32))
        return Rows(np.concatenate([p.labels for p in parts]),
                    np.concatenate([p.ids for p in parts]),
                    np.concatenate([p.values for p in parts]))


@dataclasses.dataclass
class BadRow:
    path: str
    line: int
    reason: str

    def as_error(self) -> DataError:
        return DataError(self.reason, path=self.path, line=self.line)


def _parse_fast(text: bytes, field_size: int) -> np.ndarray | None:
    """All numbers of a canonical block as float64 [n, 1 + 2*field_size], or None if not canonical."""
    buf = np.frombuffer(text, dtype=np.uint8)
    n = text.count(b"\n")
    width = 2 * field_size + 1
    if not _FAST_BYTES[buf].all():
        return None
    is_sep = _SEPARATORS[buf]
    if is_sep[0] or (is_sep[1:] & is_sep[:-1]).any():
        return None  # an empty token: doubled space, blank line, "id:" ...
    seps = buf[is_sep]
    if seps.size != n * width:
        return None
    pattern = np.array([ord(" "), ord(":")] * field_size + [ord("\n")], dtype=np.uint8)
    if not (seps.reshape(n, width) == pattern).all():
        return None
    if _NOT_AN_ID.search(text):
        return None   # "5.0:" or "1e3:": the per-line path names it
    import pandas as pd
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            frame = pd.read_csv(io.BytesIO(text.replace(b":", b" ")), sep=" ", header=None,
                                dtype=np.float64, engine="c", na_filter=False)
    except (ValueError, pd.errors.ParserError):
        return None
    arr = frame.to_numpy(dtype=np.float64)
    if arr.shape != (n, width) or np.isnan(arr).any():
        return None   # a token pandas could not read: the per-line path names it
    return arr


def split_tokens(line: str) -> list[str]:
    """A text line's tokens, separated by spaces or tabs (str.split would also split at
    Unicode spaces such as U+2003 or at control characters: a damaged line read as if whole)."""
    odd = next((c for c in line if c.isspace() and c not in " \t\r\n\v\f"), None)
    if odd is not None:
        raise ValueError(f"holds the character U+{ord(odd):04X} where pairs are separated by "
                         "spaces or tabs")
    return line.split()


def _parse_line(line: str, field_size: int) -> list[float]:
    tokens = split_tokens(line)
    if not tokens:
        raise ValueError("empty line")
    if len(tokens) - 1 != field_size:
        raise ValueError(f"expected {field_size} id:value pairs, found {len(tokens) - 1}")
    if not _NUMBER.fullmatch(tokens[0]):
        raise ValueError(f"label {tokens[0][:40]!r} is not a number")
    out = [float(tokens[0])]
    for j, tok in enumerate(tokens[1:]):
        key, colon, val = tok.partition(":")
        if not colon:
            raise ValueError(f"pair {j + 1} {tok[:40]!r} has no ':'")
        if not (_NUMBER.fullmatch(key) and _NUMBER.fullmatch(val)):
            raise ValueError(f"pair {j + 1} {tok[:40]!r} is not numeric id:value")
        if not _ID.fullmatch(key):
            raise ValueError(f"pair {j + 1}: id {key[:40]!r} is not a non-negative integer "
                             "written in digits")
        out.append(float(key))
        out.append(float(val))
    return out


def _parse_slow(text: bytes, field_size: int, path: str, first_line: int):
    good, good_idx, bad = [], [], []
    for i, raw in enumerate(text.split(b"\n")[: text.count(b"\n")]):
        try:
            good.append(_parse_line(raw.decode("utf-8", errors="replace"), field_size))
            good_idx.append(i)
        except ValueError as e:
            bad.append(BadRow(path, first_line + i, str(e)))
    arr = np.array(good, dtype=np.float64).reshape(len(good), 2 * field_size + 1)
    return arr, np.array(good_idx, dtype=np.int64), bad


def parse_libsvm(text: bytes, field_size: int, *, path: str = "<text>", first_line: int = 1,
                 label_format: str = "01", feature_size: int | None = None):
    """Parses a block of whole lines. Returns (Rows of the good lines, [BadRow]), never dropping
    a line without a BadRow for it. `first_line` is the 1-based number of the block's first line."""
    if label_format not in LABEL_FORMATS:
        raise DataError(f"unknown label format {label_format!r} (allowed: {sorted(LABEL_FORMATS)})")
    if text and not text.endswith(b"\n"):
        text += b"\n"
    arr = _parse_fast(text, field_size) if text else np.zeros((0, 2 * field_size + 1))
    if arr is not None:
        line_idx, bad = np.arange(arr.shape[0]), []
    else:
        arr, line_idx, bad = _parse_slow(text, field_size, path, first_line)

    labels, ids, values = arr[:, 0], arr[:, 1::2], arr[:, 2::2]
    mapping = LABEL_FORMATS[label_format]
    allowed = np.array(sorted(mapping))
    label_ok = np.isin(labels, allowed)
    id_int = (ids == np.floor(ids)) & (ids >= 0) & (ids < MAX_EXACT_ID)
    id_range = ids < feature_size if feature_size is not None else np.ones_like(id_int)
    with np.errstate(over="ignore", invalid="ignore"):
        value_ok = np.isfinite(values.astype(np.float32))   # stored as float32: 1e39 -> inf
    row_ok = label_ok & id_int.all(1) & id_range.all(1) & value_ok.all(1)
    if not row_ok.all():
        for r in np.flatnonzero(~row_ok):
            if not label_ok[r]:
                reason = (f"label {labels[r]:g} is not one of {[f'{a:g}' for a in allowed]} "
                          f"(label format {label_format})")
            elif not id_int[r].all():
                j = int(np.flatnonzero(~id_int[r])[0])
                reason = f"pair {j + 1}: id {ids[r, j]!r} is not a non-negative integer"
            elif not id_range[r].all():
                j = int(np.flatnonzero(~id_range[r])[0])
                reason = f"pair {j + 1}: id {int(ids[r, j])} is outside [0, {feature_size})"
            else:
                j = int(np.flatnonzero(~value_ok[r])[0])
                reason = (f"pair {j + 1}: value {values[r, j]:g} is outside float32's range "
                          f"(|x| <= {FLOAT32_MAX:.4g})")
            bad.append(BadRow(path, first_line + int(line_idx[r]), reason))
        bad.sort(key=lambda b: b.line)
        labels, ids, values = labels[row_ok], ids[row_ok], values[row_ok]

    out_labels = np.zeros(labels.shape, np.float32)
    for src, dst in mapping.items():
        out_labels[labels == src] = dst
    return Rows(out_labels, ids.astype(np.int64), values.astype(np.float32)), bad


def _format_numbers(x: np.ndarray) -> np.ndarray:
    """Shortest text that reads back to the same float32; integral values without '.0'."""
    x32 = np.asarray(x, dtype=np.float32)
    integral = (x32 == np.round(x32)) & (np.abs(x32) < 2 ** 24)
    return np.where(integral, np.where(integral, x32, 0).astype(np.int64).astype(str), x32.astype(str))


def _format_generic(rows: Rows) -> bytes:
    pairs = np.char.add(np.char.add(rows.ids.astype(str), ":"), _format_numbers(rows.values))
    labels = _format_numbers(rows.labels)
    lines = [lab + " " + " ".join(p) for lab, p in zip(labels.tolist(), pairs.tolist())]
    return ("\n".join(lines) + "\n").encode()


def _digit_slots(a: np.ndarray, width: int):
    """Right-aligned ASCII digits of non-negative integers: (chars [..., width], valid mask)."""
    q = a.astype(np.uint32 if a.size == 0 or a.max() < 2 ** 32 else np.uint64)
    chars = np.empty(a.shape + (width,), np.uint8)
    ndigits = np.ones(a.shape, np.uint8)
    for k in range(width - 1, -1, -1):
        chars[..., k] = q % 10 + 48
        q //= 10
        if k:
            ndigits += q > 0
    valid = np.arange(width, dtype=np.uint8) >= (width - ndigits)[..., None]
    return chars, valid


def _number_slots(x: np.ndarray, decimals: int):
    """Fixed-point text slots of numbers known to be exact at `decimals` places."""
    scaled = np.round(np.abs(x.astype(np.float64)) * 10 ** decimals).astype(np.int64)
    whole, frac = np.divmod(scaled, 10 ** decimals)
    iw = max(1, len(str(int(whole.max(initial=0)))))
    sign_c = np.where(x < 0, ord("-"), 0).astype(np.uint8)[..., None]
    sign_v = (x < 0)[..., None]
    wc, wv = _digit_slots(whole, iw)
    parts_c, parts_v = [sign_c, wc], [sign_v, wv]
    if decimals:
        fc, _ = _digit_slots(frac, decimals)
        trailing = sum((frac % 10 ** k == 0).astype(np.int64) for k in range(1, decimals + 1))
        keep = np.where(frac > 0, decimals - trailing, 0)
        parts_c += [np.full(x.shape + (1,), ord("."), np.uint8), fc]
        parts_v += [(keep > 0)[..., None], np.arange(decimals) < keep[..., None]]
    return np.concatenate(parts_c, -1), np.concatenate(parts_v, -1)


def _exact_decimals(x: np.ndarray, limit: int = 6) -> int | None:
    """Fewest decimals at which fixed-point text reads back to the same float32, or None."""
    x64 = x.astype(np.float64)
    if x.size and (not np.isfinite(x64).all() or np.abs(x64).max() >= 1e9):
        return None
    for d in range(limit + 1):
        if (np.round(x64, d).astype(np.float32) == x).all():
            return d
    return None


def format_libsvm(rows: Rows) -> bytes:
    """Canonical libsvm text (single spaces, LF): what the fast parser reads fastest.
    Vectorized when every value has an exact short decimal form (synthesized and featurized
    data); otherwise per-row shortest float32 text. Both read back to the same float32s."""
    n = len(rows)
    if n == 0:
        return b""
    dv, dl = _exact_decimals(rows.values), _exact_decimals(rows.labels)
    if dv is None or dl is None or rows.ids.min() < 0:
        return _format_generic(rows)
    f = rows.ids.shape[1]
    lab_c, lab_v = _number_slots(rows.labels, dl)
    id_c, id_v = _digit_slots(rows.ids, max(1, len(str(int(rows.ids.max())))))
    val_c, val_v = _number_slots(rows.values, dv)
    space = np.full((n, f, 1), ord(" "), np.uint8)
    colon = np.full((n, f, 1), ord(":"), np.uint8)
    ones = np.ones((n, f, 1), bool)
    pair_c = np.concatenate([space, id_c, colon, val_c], -1).reshape(n, -1)
    pair_v = np.concatenate([ones, id_v, ones, val_v], -1).reshape(n, -1)
    newline = np.full((n, 1), ord("\n"), np.uint8)
    chars = np.concatenate([lab_c, pair_c, newline], 1)
    valid = np.concatenate([lab_v, pair_v, np.ones((n, 1), bool)], 1)
    return chars[valid].tobytes()
