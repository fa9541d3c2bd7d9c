"""Checks a data directory against its manifest: files, sizes, sha256, record counts, ids
within [0, feature_size), field counts and labels. Reports every problem, naming the place."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import DataError
from .files import Segment, count_lines, read_line_blocks
from .libsvm import Rows, parse_libsvm
from .manifest import read_manifest, sha256_file


def validate(data_dir, *, max_bad_rows: int = 0, check_rows: bool = True) -> dict:
    """Returns a report {"records", "problems": [...], "bad_rows": [...]}; raises DataError when
    anything is wrong beyond `max_bad_rows` bad rows (which are reported, never ignored)."""
    m = read_manifest(data_dir, check=False)   # every problem is reported below
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
    problems += [f"{p}: a data file the manifest does not list: training does not read it "
                 "(`ctrtrain data index --overwrite` lists every file)"
                 for p in unlisted_files(data_dir, m)]
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


def unlisted_files(data_dir, m) -> list[str]:
    """Files beside the listed ones, named as they are (the same suffix, `.tfrecord`,
    `.tfrecord.gz`, `.libsvm` ...), that the manifest does not list: a shard copied in after
    indexing, whose records every reader would skip."""
    listed = {os.path.normpath(p) for p in m.paths(data_dir)}
    def kind(name: str) -> str:         # ".tfrecord", ".tfrecord.gz", ".libsvm"
        parts = Path(name).suffixes
        return "".join(parts[-2:] if parts[-1:] == [".gz"] else parts[-1:])
    suffixes = {kind(f.path) for f in m.files}
    folders = {os.path.dirname(p) for p in listed}
    out = []
    for folder in sorted(folders):
        for e in sorted(Path(folder).iterdir()):
            if e.is_file() and not e.name.startswith(".") and kind(e.name) in suffixes \
                    and os.path.normpath(str(e)) not in listed:
                out.append(str(e))
    return out


def _check_rows(path: str, m):
    """(good record count, [bad row descriptions]) of one file."""
    n, bad = 0, []
    for rows, errors in file_rows(path, fmt=m.format, field_size=m.field_size,
                                  feature_size=m.feature_size, compression=m.compression,
                                  label_format=m.label_format, schema=m.schema):
        n += len(rows)
        bad += errors
    return n, bad


def file_rows(path: str, *, fmt: str, field_size: int, feature_size: int | None,
              compression: str | None, label_format: str = "01", schema=None):
    """Yields (Rows of the good rows, [DataError per bad row]) block by block: labels 0/1,
    ids in [0, feature_size) (only >= 0 when None), finite values. A file that cannot be read
    on (a corrupt or cut TFRecord) raises a DataError naming the record. With declared fields
    (`schema`), the good rows are FieldRows of their labels and id columns."""
    if schema is not None:
        check_declared_keys(path, schema, compression)
        yield from _declared_rows(path, schema, feature_size, compression)
        return
    if fmt == "libsvm":
        seg = Segment(path, 0, count_lines(path), 0)
        for first, text in read_line_blocks(seg, 50_000):
            rows, b = parse_libsvm(text, field_size, path=path, first_line=first + 1,
                                   label_format=label_format, feature_size=feature_size)
            yield rows, [x.as_error() for x in b]
        return
    from .tfrecord import read_rows
    n = 0
    top = feature_size if feature_size is not None else np.iinfo(np.int64).max
    for rows in read_rows(path, field_size, compression):
        id_ok = ((rows.ids >= 0) & (rows.ids < top)).all(1)
        label_ok = np.isin(rows.labels, (0, 1))
        ok = id_ok & label_ok & np.isfinite(rows.values).all(1)
        bad = []
        for i in np.flatnonzero(~ok):
            if not id_ok[i]:
                j = int(np.flatnonzero((rows.ids[i] < 0) | (rows.ids[i] >= top))[0])
                what = f"id {int(rows.ids[i, j])} (field {j}) is outside [0, {feature_size})"
            elif not label_ok[i]:
                what = f"label {rows.labels[i]:g} is not 0 or 1"
            else:
                what = "a value is not finite"
            bad.append(DataError(what, path=path, record=n + int(i)))
        yield Rows(rows.labels[ok], rows.ids[ok], rows.values[ok]), bad
        n += len(rows)


def check_declared_keys(path: str, schema, compression: str | None) -> None:
    """The file's first record holds a feature for every declared field. A bag is read with
    TensorFlow's RaggedFeature, for which a missing key is an empty bag: a declaration naming
    `M1x` where the records hold `M1` would train on nothing in that field, everywhere. Every
    ctrtrain writer writes each declared key, an empty bag as an empty list."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    from .schema import WEIGHTS_SUFFIX
    from .tfrecord import tf_compression
    try:
        first = [r.numpy() for r in tf.data.TFRecordDataset(path, tf_compression(compression))
                 .take(1)]
        held = {k for r in first for k in example_pb2.Example.FromString(r).features.feature}
    except (tf.errors.OpError, ValueError, DecodeError):
        return      # a damaged record: named where the file is read (_declared_rows)
    if first:
        wanted = {"label", *(f.name for f in schema.fields),
                  *(f.name + WEIGHTS_SUFFIX for f in schema.fields if f.weighted)}
        missing = sorted(wanted - held)
        if missing:
            raise DataError(f"the declared fields {missing} are not in the records (the first "
                            f"holds {sorted(held)}): check the declaration's names",
                            path=path, record=0)


def _declared_rows(path: str, schema, feature_size: int | None, compression: str | None):
    """file_rows of a declared schema: each row's label, every id of its categorical and
    multi_hot and sequence fields, its numeric values and bag weights (one finite weight per
    id)."""
    from .schema import FieldRows
    from .tfrecord import LACKING, read_field_blocks
    top = feature_size if feature_size is not None else np.iinfo(np.int64).max
    spans = schema.reserved_spans()
    n = 0
    keys = schema.bag_keys()
    for b in read_field_blocks(path, schema, compression, check_keys=True):
        labels = b["label"].numpy()[:, 0]
        why = [None] * len(labels)

        def flag(rows, what):
            for i in np.flatnonzero(rows):
                why[i] = why[i] or what(int(i))
        for j, name in enumerate(keys):     # read as an empty bag by training: named here
            flag(b[LACKING].numpy()[:, j], lambda i, name=name: f"has no feature {name} (a "
                 "declared field; an empty one is an empty list)")
        flag(~np.isin(labels, (0, 1)), lambda i: f"label {labels[i]:g} is not 0 or 1")
        for f in schema.fields:
            if f.kind == "numeric":
                x = b[f.name].numpy()[:, 0]
                flag(~np.isfinite(x), lambda i, f=f, x=x: f"{f.name} {x[i]} is not finite")
                continue
            v = b[f.name]
            if f.hash_buckets:      # strings: any value hashes into the field's ids
                if f.weighted:
                    _check_weights(b, f, v, flag, len(labels))
                continue
            if f.kind == "categorical":
                ids, owner = v.numpy()[:, 0], np.arange(len(labels))
            else:
                ids, owner = v.flat_values.numpy(), v.value_rowids().numpy()
            out = (ids < 0) | (ids >= top)
            first = {}
            for j in np.flatnonzero(out)[::-1]:
                first[int(owner[j])] = int(ids[j])
            flag(np.isin(np.arange(len(labels)), list(first)),
                 lambda i, f=f, first=first: f"id {first[i]} of {f.name} is outside "
                                             f"[0, {feature_size})")
            for lo, hi, name, what in spans:
                inside = {}
                for j in np.flatnonzero((ids >= lo) & (ids < hi))[::-1]:
                    inside[int(owner[j])] = int(ids[j])
                flag(np.isin(np.arange(len(labels)), list(inside)),
                     lambda i, f=f, inside=inside, lo=lo, hi=hi, name=name, what=what:
                     f"id {inside[i]} of {f.name} is among {name}'s {what} {lo}..{hi - 1} "
                     "(it would share their rows)")
            if f.weighted:
                _check_weights(b, f, v, flag, len(labels))
        ok = np.array([w is None for w in why], bool)
        bad = [DataError(w, path=path, record=n + i) for i, w in enumerate(why) if w]
        yield FieldRows(labels[ok], _good_ids(b, schema, ok)), bad
        n += len(labels)


def _good_ids(b, schema, ok) -> dict:
    """The id columns (FieldRows' layout) of a parsed block's good rows; hashed fields, whose
    ids are strings until hashed, left out."""
    import tensorflow as tf
    out = {}
    for f in schema.fields:
        if f.kind == "numeric" or f.hash_buckets:
            continue
        if f.kind == "categorical":
            out[f.name] = b[f.name].numpy()[ok, 0]
        else:
            kept = tf.ragged.boolean_mask(b[f.name], ok)
            out[f.name] = (kept.row_lengths().numpy(), kept.flat_values.numpy(), None)
    return out


def _check_weights(b, f, v, flag, n):
    """A weighted field's rows without one finite weight per id."""
    from .schema import WEIGHTS_SUFFIX
    w = b[f.name + WEIGHTS_SUFFIX]
    flag(w.row_lengths().numpy() != v.row_lengths().numpy(),
         lambda i: f"{f.name}{WEIGHTS_SUFFIX} does not have one weight per id of {f.name}")
    rows_bad = np.zeros(n, bool)
    rows_bad[w.value_rowids().numpy()[~np.isfinite(w.flat_values.numpy())]] = True
    flag(rows_bad, lambda i: f"a weight of {f.name} is not finite")


def first_bad_record(paths: list[str], *, fmt: str, field_size: int, feature_size: int | None,
                     compression: str | None = None, label_format: str = "01",
                     schema=None) -> DataError | None:
    """The first record of these files that training or prediction cannot use (as a
    DataError naming file and record or line), or None."""
    for path in paths:
        try:
            for _, bad in file_rows(path, fmt=fmt, field_size=field_size,
                                    feature_size=feature_size, compression=compression,
                                    label_format=label_format, schema=schema):
                if bad:
                    return bad[0]
        except DataError as e:
            return e
    return None


def describe(data_dir) -> str:
    m = read_manifest(data_dir, check=False)
    lines = [f"{Path(data_dir)}: {m.format}" + (f" ({m.compression})" if m.compression else "")
             + (", declared fields" if m.fields else ""),
             f"  records {m.records:,}  positives {m.positives:,} "
             f"({m.positives / max(m.records, 1):.1%})",
             f"  field_size {m.field_size}  feature_size {m.feature_size:,}",
             f"  files {len(m.files)}: " + ", ".join(f"{f.path} ({f.records:,})" for f in m.files[:4])
             + (" ..." if len(m.files) > 4 else "")]
    if m.skipped_rows:
        lines.append(f"  skipped rows {len(m.skipped_rows)} (listed in the manifest)")
    return "\n".join(lines)
