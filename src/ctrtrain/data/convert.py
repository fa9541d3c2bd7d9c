"""Conversion between libsvm text and TFRecord shards, in parallel, with a manifest; libffm
text into TFRecord shards of declared fields (data/libffm.py).

Shards hold equal record counts (to one record) so that key-based sharding across hosts is
balanced. Output appears only when complete: shards are renamed into place by their writers
and the manifest is written last; on any failure every file this run wrote is removed.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections import Counter
from pathlib import Path

from ..errors import DataError
from .files import (
    count_lines,
    finish_output_dir,
    list_inputs,
    prepare_output_dir,
    read_line_blocks,
    split_ranges,
    staged,
)
from .libffm import (
    FieldStats,
    check_declaration,
    is_libffm,
    parse_libffm,
    to_field_rows,
)
from .libsvm import BadRow, format_libsvm, parse_libsvm
from .manifest import MANIFEST_NAME, FileEntry, Manifest, read_manifest, sha256_file
from .parallel import processes_for, run_tasks
from .schema import FieldRows
from .tfrecord import SUFFIX, ShardWriter

BLOCK_LINES = 50_000


def shard_name(i: int, n: int, suffix: str) -> str:
    return f"part-{i:05d}-of-{n:05d}{suffix}"


def _libsvm_block(text, path, first_line, *, field_size, label_format, feature_size):
    rows, bad = parse_libsvm(text, field_size, path=path, first_line=first_line,
                             label_format=label_format, feature_size=feature_size)
    return rows, bad, {}


def _libffm_block(text, path, first_line, *, schema, label_format, feature_size):
    block, bad = parse_libffm(text, path=path, first_line=first_line, label_format=label_format,
                              feature_size=feature_size)
    rows, unfit, longer = to_field_rows(block, schema, path)
    return rows, sorted(bad + unfit, key=lambda b: b.line), longer


def _largest_id(rows) -> int:
    if isinstance(rows, FieldRows):
        return rows.largest_id()
    return int(rows.ids.max()) if len(rows) else -1


def _convert_shard(task):
    """Worker: parse the shard's line segments (`block`: text -> rows, bad rows, rows longer
    than a bag's max_len) and write one TFRecord file."""
    path, segments, block, schema, compression, max_bad = task
    writer = ShardWriter(path, compression)
    bad: list[BadRow] = []
    max_id, positives, longer = -1, 0, Counter()
    try:
        for seg in segments:
            for first, text in read_line_blocks(seg, BLOCK_LINES):
                rows, b, over = block(text, seg.path, first + 1)
                bad += b
                if len(bad) > max_bad:
                    writer.abort()
                    return {"error": bad[: max_bad + 1], "bad": len(bad)}
                writer.write_rows(rows, schema)
                max_id = max(max_id, _largest_id(rows))
                positives += int(rows.labels.sum())
                longer.update(over)
        records, size, sha = writer.commit()
    except BaseException:
        writer.abort()
        raise
    return {"file": FileEntry(os.path.basename(path), records, size, sha), "bad": bad,
            "max_id": max_id, "positives": positives, "longer": longer}


def _write_shards(files, counts, out, *, shards, processes, block, schema, compression,
                  max_bad_rows) -> list[dict]:
    """Each run of lines into one TFRecord shard; on any failure the output directory goes."""
    suffix = SUFFIX + (".gz" if compression == "gzip" else "")
    runs = split_ranges(files, counts, shards)
    tasks = [(str(out / shard_name(i, shards, suffix)), segs, block, schema, compression,
              max_bad_rows) for i, segs in enumerate(runs)]
    results = []
    try:
        for r in run_tasks(_convert_shard, tasks, processes, "convert",
                            [sum(s.lines for s in segs) for segs in runs]):
            results.append(r)
            if "error" in r:
                raise _too_many_bad(r["error"], max_bad_rows)
        bad = [b for r in results for b in r["bad"]]
        if len(bad) > max_bad_rows:
            raise _too_many_bad(bad, max_bad_rows)
        if not sum(r["file"].records for r in results):
            raise DataError(f"no valid rows: all {len(bad)} rows were bad (the first: "
                            f"{_too_many_bad(bad, 0)})", path=", ".join(files))
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return results


def _skipped(results) -> list[dict]:
    return [{"path": b.path, "line": b.line, "reason": b.reason}
            for r in results for b in r["bad"]]


def libsvm_to_tfrecord(inputs, out_dir, *, field_size: int, feature_size: int | None = None,
                       shards: int = 8, processes: int | None = None, compression: str | None = None,
                       label_format: str = "01", max_bad_rows: int = 0, overwrite: bool = False,
                       vocabulary_file: str | None = None) -> Manifest:
    """Converts libsvm text files into `shards` TFRecord files with a manifest. A featurization
    vocabulary travels with the data (copied beside the shards) so prediction can reuse it."""
    files = list_inputs(inputs)
    counts = [count_lines(f) for f in files]
    if sum(counts) == 0:
        raise DataError("input has no rows", path=", ".join(files))
    out = prepare_output_dir(out_dir, overwrite, [*inputs, *files] + ([vocabulary_file] if vocabulary_file else []))
    block = functools.partial(_libsvm_block, field_size=field_size, label_format=label_format,
                              feature_size=feature_size)
    results = _write_shards(files, counts, out, shards=max(1, min(shards, sum(counts))),
                            processes=processes_for(sum(counts), processes), block=block, schema=None,
                            compression=compression, max_bad_rows=max_bad_rows)
    max_id = max(r["max_id"] for r in results)
    if vocabulary_file:
        shutil.copy(vocabulary_file, out / os.path.basename(vocabulary_file))
    manifest = Manifest(
        format="tfrecord", field_size=field_size,
        feature_size=feature_size if feature_size is not None else max_id + 1,
        files=[r["file"] for r in results], compression=compression, label_format=label_format,
        positives=sum(r["positives"] for r in results), skipped_rows=_skipped(results),
        vocabulary=os.path.basename(vocabulary_file) if vocabulary_file else None,
        extra={"source": files, "feature_size_inferred": feature_size is None})
    manifest.write(out)
    finish_output_dir(out)
    return manifest


def _libffm_stats(task):
    """Worker: the field statistics and bad rows of a run of libffm lines."""
    segments, label_format, feature_size = task
    stats, bad = FieldStats(), []
    for seg in segments:
        for first, text in read_line_blocks(seg, BLOCK_LINES):
            block, b = parse_libffm(text, path=seg.path, first_line=first + 1,
                                    label_format=label_format, feature_size=feature_size)
            stats, bad = stats.merge(FieldStats.of(block, seg.path)), bad + b
    return {"stats": stats, "bad": bad}


def _declare_libffm(files, counts, processes, label_format, feature_size, max_bad_rows):
    """The fields libffm files declare (data/libffm.py), from one pass over them."""
    runs = split_ranges(files, counts, processes)
    found = list(run_tasks(_libffm_stats, [(segs, label_format, feature_size) for segs in runs],
                           processes, "fields", [sum(s.lines for s in segs) for segs in runs]))
    bad = [b for r in found for b in r["bad"]]
    if len(bad) > max_bad_rows:
        raise _too_many_bad(bad, max_bad_rows)
    stats = FieldStats()
    for r in found:
        stats = stats.merge(r["stats"])
    schema = stats.declare()
    if not schema.fields:
        raise DataError("no row holds a field:id:value pair", path=", ".join(files[:3]))
    return schema


def libffm_to_tfrecord(files, out_dir, *, like: Manifest | None = None,
                       feature_size: int | None = None, shards: int = 8,
                       processes: int | None = None, compression: str | None = None,
                       label_format: str = "01", max_bad_rows: int = 0,
                       overwrite: bool = False, like_path: str = "", protect=()) -> Manifest:
    """libffm text files into TFRecord shards of declared fields (data/libffm.py): declared
    from the files themselves (one pass of statistics first), or taken from `like`, the
    manifest of another split converted before. `protect`: more paths the output must not be
    (the directories the files were named by)."""
    counts = [count_lines(f) for f in files]
    if sum(counts) == 0:
        raise DataError("input has no rows", path=", ".join(files))
    out = prepare_output_dir(out_dir, overwrite, [*protect, *files])
    processes = processes_for(sum(counts), processes)
    shards = max(1, min(shards, sum(counts)))
    if like is not None:
        if like.schema is None:
            raise DataError("declares no fields: libffm splits convert --like a libffm "
                            "conversion", path=like_path)
        check_declaration(like.schema, like_path)
        schema = like.schema
        feature_size = feature_size or like.feature_size
    else:
        try:
            schema = _declare_libffm(files, counts, processes, label_format, feature_size,
                                     max_bad_rows)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
    block = functools.partial(_libffm_block, schema=schema, label_format=label_format,
                              feature_size=feature_size)
    results = _write_shards(files, counts, out, shards=shards, processes=processes, block=block,
                            schema=schema, compression=compression, max_bad_rows=max_bad_rows)
    longer = sum((r["longer"] for r in results), Counter())
    manifest = Manifest(
        format="tfrecord", field_size=schema.field_size,
        feature_size=feature_size or max(r["max_id"] for r in results) + 1,
        files=[r["file"] for r in results], compression=compression, label_format=label_format,
        positives=sum(r["positives"] for r in results), skipped_rows=_skipped(results),
        fields=schema.to_json(),
        extra={"source": files, "from": "libffm", "feature_size_inferred": feature_size is None,
               "longer_than_max_len": {f.name: longer.get(f.name, 0)
                                       for f in schema.of("multi_hot")}})
    manifest.write(out)
    finish_output_dir(out)
    return manifest


def check_text(path: str) -> None:
    """libsvm and libffm input is text lines: an empty file, or one whose first bytes hold a
    NUL or are not UTF-8 (a binary or a compressed file under a text name), is named as such
    before any format is guessed from it."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
        blank = not head.strip()
        while blank and (more := f.read(1 << 20)):    # blank so far: is the rest too?
            blank = not more.strip()
    if not head:
        raise DataError("is empty: no rows to convert", path=path)
    if blank:
        # Named as an empty file is: left to the format guess, a libffm file of blank lines
        # was taken for libsvm (its first line has no field:id:value pair) and asked for
        # --field-size.
        raise DataError("holds only blank lines: no rows to convert", path=path)
    nul = head.find(b"\0")
    try:
        head.decode("utf-8")
        bad = nul
    except UnicodeDecodeError as e:
        bad = min(x for x in (nul, e.start) if x >= 0) if e.start < len(head) - 4 else nul
    if bad >= 0:
        raise DataError(f"is not text (byte {bad} is 0x{head[bad]:02x}): libsvm and libffm "
                        "input is text lines", path=path)


def convert(inputs, out_dir, *, to: str = "tfrecord", field_size: int | None = None,
            feature_size: int | None = None, like: str | None = None, shards: int = 8,
            processes: int | None = None, gzip: bool = False, label_format: str = "01",
            max_bad_rows: int = 0, overwrite: bool = False) -> Manifest:
    """`ctrtrain data convert`: libsvm (files, or a data directory with its manifest and
    vocabulary) or libffm (told by its field:id:value pairs) to TFRecord shards, or a TFRecord data directory back to libsvm. Shapes come
    from the flags, else `like` (another split's manifest: splits then agree on the table),
    else the input's manifest, else the data (feature_size = largest id + 1)."""
    from .index import detect_format
    from .manifest import MANIFEST_NAME
    inputs = [str(i) for i in inputs]
    src = read_manifest(inputs[0]) if len(inputs) == 1 and \
        os.path.isfile(os.path.join(inputs[0], MANIFEST_NAME)) else None
    if to == "libsvm":
        if src is None or len(inputs) != 1:
            raise DataError("--to libsvm takes one TFRecord data directory (with its manifest; "
                            "`ctrtrain data index` writes one)", path=", ".join(inputs[:3]))
        return tfrecord_to_libsvm(inputs[0], out_dir, processes=processes, overwrite=overwrite)
    files = src.paths(inputs[0]) if src else list_inputs(inputs)
    for f in files:
        refuse_compressed_text(f)
    tfrecords = [f for f in files if detect_format(f)[0] == "tfrecord"]
    if tfrecords or (src and src.format == "tfrecord"):
        raise DataError("is TFRecord, not libsvm text: TFRecords in the fixed-field schema are "
                        "trained on as they are (`ctrtrain data index` writes their manifest)",
                        path=(tfrecords or files)[0])
    ref = read_manifest(like) if like else src
    for f in files:
        check_text(f)
    ffm = [is_libffm(f) for f in files]
    if any(ffm):
        if not all(ffm):
            raise DataError("libsvm and libffm files in one conversion: "
                            f"{files[ffm.index(False)]} is libsvm, {files[ffm.index(True)]} libffm")
        if field_size:
            raise DataError("--field-size does not apply to libffm: its fields are declared "
                            "from the data (or --like)", path=files[0])
        return libffm_to_tfrecord(files, out_dir, like=read_manifest(like) if like else None,
                                  feature_size=feature_size, shards=shards, processes=processes,
                                  compression="gzip" if gzip else None, label_format=label_format,
                                  max_bad_rows=max_bad_rows, overwrite=overwrite,
                                  like_path=str(like or ""), protect=inputs)
    field_size = field_size or (ref.field_size if ref else None)
    if field_size is None:
        raise DataError("--field-size is required when the input has no manifest (or --like)")
    feature_size = feature_size or (ref.feature_size if ref else None)
    vocab = os.path.join(inputs[0], src.vocabulary) if src and src.vocabulary else None
    return libsvm_to_tfrecord(files, out_dir, field_size=field_size, feature_size=feature_size,
                              shards=shards, processes=processes,
                              compression="gzip" if gzip else None, label_format=label_format,
                              max_bad_rows=max_bad_rows, overwrite=overwrite,
                              vocabulary_file=vocab)


def _too_many_bad(bad: list[BadRow], max_bad: int) -> DataError:
    first = sorted(bad, key=lambda b: (b.path, b.line))[0]
    err = first.as_error()
    if max_bad:
        err.args = (f"{err.args[0]} (more than --max-bad-rows {max_bad} bad rows)",)
    return err


def _tfrecord_shard_to_libsvm(task):
    src, dst, field_size, compression = task
    from .tfrecord import read_rows  # TensorFlow, only in this direction
    records = 0
    with staged(dst) as f:
        for rows in read_rows(src, field_size, compression):
            f.write(format_libsvm(rows))
            records += len(rows)
    return FileEntry(os.path.basename(dst), records, os.path.getsize(dst), sha256_file(dst))


def tfrecord_to_libsvm(data_dir, out_dir, *, processes: int | None = None,
                       overwrite: bool = False) -> Manifest:
    """Writes each TFRecord shard of a data directory back as one libsvm text file."""
    m = read_manifest(data_dir)
    if m.format != "tfrecord":
        raise DataError(f"expected a tfrecord data directory, found format {m.format!r}",
                        path=str(Path(data_dir) / MANIFEST_NAME))
    out = prepare_output_dir(out_dir, overwrite, [data_dir])
    tasks = [(src, str(out / (Path(f.path).name.split(SUFFIX)[0] + ".libsvm")), m.field_size,
              m.compression) for src, f in zip(m.paths(data_dir), m.files)]
    try:
        entries = list(run_tasks(_tfrecord_shard_to_libsvm, tasks, processes_for(m.records, processes),
                                  "to libsvm", [f.records for f in m.files]))
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    manifest = Manifest(format="libsvm", field_size=m.field_size, feature_size=m.feature_size,
                        files=entries, positives=m.positives, vocabulary=m.vocabulary,
                        extra={"source": str(data_dir)})
    manifest.write(out)
    finish_output_dir(out)
    return manifest


def refuse_compressed_text(path: str) -> None:
    """A gzip, bzip2 or xz file holding text (`train.ffm.gz`, `train.libsvm.bz2`) is refused,
    naming it (index.compressed_error): the converter reads plain text only (its workers seek
    to lines' byte offsets, which a compressed stream has not). A compressed file holding no
    text (a gzipped TFRecord) is left to the checks that follow; a zip or zstd archive is
    named as one (open_raw)."""
    from .index import compressed_error, sniff
    fmt, comp, head = sniff(path)
    if comp is not None and b"\0" not in head:    # a TFRecord's length prefix holds NULs
        raise compressed_error(path, fmt, comp, head)
