"""Checks a data directory against its manifest: files, sizes, sha256, record counts, ids
within [0, feature_size), field counts and labels. Reports every problem, naming the place."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import DataError
from .files import Segment, count_lines, read_line_blocks
from .libsvm import parse_libsvm
from .manifest import read_manifest, sha256_file


def validate(data_dir, *, max_bad_rows: int = 0, check_rows: bool = True) -> dict:
    """Returns a report {"records", "problems": [...], "bad_rows": [...]}; raises DataError when
    anything is wrong beyond `max_bad_rows` bad rows (which are reported, never ignored)."""
    m = read_manifest(data_dir)
    problems, bad_rows, records = [], [], 0
    for path, entry in zip(m.paths(data_dir), m.files):
        if not os.path.exists(path):
            problems.append(f"{path}: listed in the manifest but missing")
            continue
        size = os.path.getsize(path)
        if size != entry.bytes:
            problems.append(f"{path}: {size} bytes, manifest says {entry.bytes} (truncated or changed)")
        digest = sha256_file(path)
        if digest != entry.sha256:
            problems.append(f"{path}: sha256 {digest[:12]}... does not match the manifest's "
                            f"{entry.sha256[:12]}...")
        if not check_rows:
            continue
        try:
            n, bad = _check_rows(path, m)
        except DataError as e:
            problems.append(str(e))
            continue
        records += n
        bad_rows += bad
        if n + len(bad) != entry.records:
            problems.append(f"{path}: {n + len(bad)} records, manifest says {entry.records}")
    report = {"data_dir": str(data_dir), "format": m.format, "files": len(m.files),
              "records": records, "field_size": m.field_size, "feature_size": m.feature_size,
              "problems": problems, "bad_rows": [str(b) for b in bad_rows]}
    if problems or len(bad_rows) > max_bad_rows:
        first = problems[0] if problems else str(bad_rows[0])
        more = len(problems) + max(0, len(bad_rows)) - 1
        err = DataError(f"{first}" + (f" (and {more} more problems)" if more > 0 else ""))
        err.report = report
        raise err
    return report


def _check_rows(path: str, m):
    """(good record count, [bad row descriptions]) of one file."""
    if m.format == "libsvm":
        bad, n = [], 0
        seg = Segment(path, 0, count_lines(path), 0)
        for first, text in read_line_blocks(seg, 50_000):
            rows, b = parse_libsvm(text, m.field_size, path=path, first_line=first + 1,
                                   label_format=m.label_format, feature_size=m.feature_size)
            n += len(rows)
            bad += [x.as_error() for x in b]
        return n, bad
    from .tfrecord import read_rows
    bad, n = [], 0
    for rows in read_rows(path, m.field_size, m.compression):
        ok = ((rows.ids >= 0) & (rows.ids < m.feature_size)).all(1) & np.isin(rows.labels, (0, 1)) \
            & np.isfinite(rows.values).all(1)
        for i in np.flatnonzero(~ok):
            r = n + int(i)
            what = ("id outside [0, feature_size)" if not ((rows.ids[i] >= 0) &
                    (rows.ids[i] < m.feature_size)).all()
                    else "label not 0/1" if rows.labels[i] not in (0, 1) else "value not finite")
            bad.append(DataError(what, path=path, record=r))
        n += len(rows)
    return n - len(bad), bad


def describe(data_dir) -> str:
    m = read_manifest(data_dir)
    lines = [f"{Path(data_dir)}: {m.format}" + (f" ({m.compression})" if m.compression else ""),
             f"  records {m.records:,}  positives {m.positives:,} "
             f"({m.positives / max(m.records, 1):.1%})",
             f"  field_size {m.field_size}  feature_size {m.feature_size:,}",
             f"  files {len(m.files)}: " + ", ".join(f"{f.path} ({f.records:,})" for f in m.files[:4])
             + (" ..." if len(m.files) > 4 else "")]
    if m.skipped_rows:
        lines.append(f"  skipped rows {len(m.skipped_rows)} (listed in the manifest)")
    return "\n".join(lines)
