"""Deterministic train/validation/test split of text rows (libsvm, Criteo TSV, CSV)."""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from pathlib import Path

from ..errors import DataError, named
from .files import abandon_output_dir, finish_output_dir, list_inputs, prepare_output_dir
from .raw import UNDECOMPRESSED, undecompressed_error, has_csv_header, open_raw

SPLIT_NAMES = ("train", "valid", "test")


def split_text(inputs, out_dir, *, fractions=(0.8, 0.1, 0.1), by: str = "hash", seed: int = 0,
               header: bool | None = None, overwrite: bool = False) -> dict:
    """`by="hash"`: a row goes where the CRC32 of (seed, row text) falls, so a row's split does
    not depend on the order or the other rows (and duplicates never straddle splits).
    `by="order"`: the first fraction of rows to train, the next to valid, the rest to test.
    A header line is copied to every output; `header` None: a CSV table (commas, no TABs on
    its first line) has one, as featurize reads it. A gzip, bzip2 or xz input is split as
    its text (open_raw), into uncompressed outputs (`train.csv.gz` -> `train.csv` ...)."""
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
        raise DataError(f"fractions must be three non-negative numbers summing to 1, got {fractions}",
                        field="fractions")
    if by not in ("hash", "order"):
        raise DataError(f"split by must be 'hash' or 'order', not {by!r}", field="by")
    files = list_inputs(inputs)
    if header is None:
        header = has_csv_header(files[0])
    out = prepare_output_dir(out_dir, overwrite, inputs)
    suffix = _text_suffix(files[0])
    paths = [out / f"{name}{suffix}" for name in SPLIT_NAMES]
    handles = [open(str(p) + ".tmp", "wb") for p in paths]
    counts = [0, 0, 0]
    cut1 = fractions[0]
    cut2 = fractions[0] + fractions[1]
    try:
        total = 0
        if by == "order":
            total = sum(_data_lines(f, header) for f in files)
        salt = f"{seed}\x00".encode()
        first_header, seen = None, 0
        for f in files:
            # closed at once if the split stops mid-file (a full disk), not when collected
            with contextlib.closing(_text_lines(f)) as lines:
                if header:
                    h = next(lines, b"")
                    if first_header is None:
                        first_header = h
                        for k, w in enumerate(handles):
                            try:
                                w.write(h)
                            except OSError as e:
                                raise named(e, f"{paths[k]}.tmp") from e
                for line in lines:
                    if not line.endswith(b"\n"):
                        line += b"\n"
                    if by == "hash":
                        u = zlib.crc32(salt + line) / 2 ** 32
                    else:
                        u = seen / total
                    k = 0 if u < cut1 else (1 if u < cut2 else 2)
                    try:
                        handles[k].write(line)
                    except OSError as e:     # a full disk: say which file
                        raise named(e, f"{paths[k]}.tmp") from e
                    counts[k] += 1
                    seen += 1
        for w, p in zip(handles, paths):
            try:
                w.close()               # flushes: a full disk may show only here
            except OSError as e:
                raise named(e, f"{p}.tmp") from e
        for p in paths:
            os.replace(str(p) + ".tmp", p)
    except BaseException:
        for w in handles:
            with contextlib.suppress(OSError):  # its flush fails again on a full disk
                w.close()
        for p in paths:
            for q in (p, Path(str(p) + ".tmp")):
                if q.exists():
                    q.unlink()
        abandon_output_dir(out)
        raise
    summary = {"by": by, "seed": seed, "fractions": list(fractions), "inputs": files,
               "header": header,
               "rows": dict(zip(SPLIT_NAMES, counts)),
               "files": {n: p.name for n, p in zip(SPLIT_NAMES, paths)}}
    (out / "split.json").write_text(json.dumps(summary, indent=2) + "\n")
    finish_output_dir(out)
    return summary


def _data_lines(path: str, header: bool) -> int:
    return sum(1 for _ in _text_lines(path)) - (1 if header else 0)


# Compression suffixes a split's output name drops: the outputs are written uncompressed.
_COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")


def _text_suffix(path: str) -> str:
    """The outputs' suffix: the input's, less a compression suffix (`train.csv.gz` -> `.csv`,
    Criteo's `day_0.gz` -> `.txt`), since the rows are written out decompressed; `.txt` when
    the name has none."""
    name = Path(path)
    if name.suffix.lower() in _COMPRESSED_SUFFIXES:
        name = name.with_suffix("")
    return name.suffix or ".txt"


def _text_lines(path: str):
    """The input's lines as bytes, decompressed if it is gzip, bzip2 or xz (open_raw: as
    featurize reads it, so a split of `train.csv.gz` holds its rows, not compressed bytes);
    a file that does not decompress (cut short, corrupt) is named as featurize names it."""
    try:
        with open_raw(path) as f:
            yield from f
    except UNDECOMPRESSED as e:
        raise undecompressed_error(e, path) from None
