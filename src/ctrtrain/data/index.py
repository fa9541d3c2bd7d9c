"""Data from another pipeline: TFRecord files in the fixed-field schema (`label`, `ids[F]`,
`values[F]`) or libsvm text, with no manifest. `index_files` reads them once and makes the
manifest a reader needs -- format recognised from the bytes, field_size from the records,
record counts, positives, sizes and checksums, feature_size = largest id + 1 unless given --
so `train`, `predict` and `bench` take directories, files or globs alike (`resolve_source`),
and `ctrtrain data index` writes that manifest into the directory once."""

from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path


from ..errors import DataError
from .manifest import MANIFEST_NAME, FileEntry, Manifest, read_manifest, sha256_file

GLOB_CHARS = "*?["


# The stream types open_raw decompresses with, by the names a manifest and messages use.
COMPRESSIONS = {"GzipFile": "gzip", "BZ2File": "bzip2", "LZMAFile": "xz"}
_A = {"gzip": "a gzip", "bzip2": "a bzip2", "xz": "an xz"}
SNIFF_BYTES = 1 << 16


def sniff(path: str) -> tuple[str, str | None, bytes]:
    """(format, compression, the first SNIFF_BYTES decompressed) of a data file: "tfrecord"
    when its bytes start a TFRecord frame, else "libsvm" (text: libffm and raw rows are told
    from it by the callers that read them). The compression is what open_raw decompresses
    (None, "gzip", "bzip2", "xz"), and the frame is looked for in the decompressed bytes: a
    gzipped CSV or libsvm file is compressed text, not a gzipped TFRecord."""
    from .raw import UNDECOMPRESSED, open_raw, undecompressed_error
    from .tfrecord import is_tfrecord_head
    try:
        with open_raw(path) as f:
            comp = COMPRESSIONS.get(type(f).__name__)
            head = f.read(SNIFF_BYTES)
    except UNDECOMPRESSED as e:
        raise undecompressed_error(e, path) from None
    return ("tfrecord" if is_tfrecord_head(head) else "libsvm"), comp, head


def detect_format(path: str) -> tuple[str, str | None]:
    """(format, compression) of a data file from its first bytes (sniff)."""
    return sniff(path)[:2]


def text_format(head: bytes) -> str | None:
    """"libffm" or "libsvm" as the first non-blank line of a text's first bytes reads, else
    None (rows of another kind: a CSV or Criteo TSV table)."""
    from .libffm import is_libffm_line
    line = next((x for x in head.split(b"\n") if x.strip()), b"")
    if is_libffm_line(line):
        return "libffm"
    return "libsvm" if b":" in line and b"\t" not in line else None


def compressed_error(path: str, fmt: str, comp: str, head: bytes) -> DataError:
    """The refusal of a compressed file no reader here takes: text (libsvm and libffm are read
    as plain text, at lines' byte offsets, which a compressed stream has not), or a TFRecord
    compressed other than by gzip (TensorFlow's reader takes gzip only). Named for what it
    holds, with what to do."""
    if fmt == "tfrecord":
        return DataError(f"{_A[comp]}-compressed TFRecord file: TFRecords are read plain or "
                         "gzip-compressed; recompress it with gzip", path=path)
    kind = text_format(head)
    if kind is None:
        return DataError(f"{_A[comp]}-compressed file of text rows, not libsvm or libffm: a "
                         "raw table is featurized first (`ctrtrain data featurize` reads it "
                         "compressed)", path=path)
    return DataError(f"{_A[comp]}-compressed {kind} file: decompress it first (libsvm and "
                     "libffm input is read as plain text)", path=path)


def check_readable_compression(path: str) -> tuple[str, str | None]:
    """detect_format, refusing (compressed_error) what is compressed but not a gzipped
    TFRecord."""
    fmt, comp, head = sniff(path)
    if comp is not None and (fmt, comp) != ("tfrecord", "gzip"):
        raise compressed_error(path, fmt, comp, head)
    return fmt, comp


def _tfrecord_field_size(path: str, compression: str | None) -> int:
    import tensorflow as tf
    from .tfrecord import tf_compression
    for raw in tf.data.TFRecordDataset(path, compression_type=tf_compression(compression)).take(1):
        ex = tf.train.Example.FromString(raw.numpy())
        feats = ex.features.feature
        missing = [k for k in ("label", "ids", "values") if k not in feats]
        if missing:
            raise DataError(f"record 0 has no {', '.join(missing)} feature: not the fixed-field "
                            "schema (label[1], ids[F], values[F]); files of declared fields "
                            "need their declaration (`ctrtrain data index --fields`)",
                            path=path, record=0)
        return len(feats["ids"].int64_list.value)
    raise DataError("file holds no record", path=path)


def _libsvm_field_size(path: str) -> int:
    with open(path, "rb") as f:
        first = f.readline()
    n = len(first.split()) - 1
    if n < 1:
        raise DataError("first line holds no id:value pair", path=path, line=1)
    return n


def index_files(files: list[str], *, names: list[str] | None = None,
                feature_size: int | None = None, label_format: str = "01",
                fields: list | None = None) -> Manifest:
    """A manifest of these files (each read once; a bad record is named). `names`: how the
    manifest lists them (relative names inside a directory), default the paths as given.
    `fields`: the TFRecords' declared fields (data/schema.py), which records do not tell."""
    if not files:
        raise DataError("no data files given")
    kinds = {f: check_readable_compression(f) for f in files}
    fmts = {k[0] for k in kinds.values()}
    comps = {k[1] for k in kinds.values()}
    if len(fmts) > 1 or len(comps) > 1:
        raise DataError("files of different formats in one data set: "
                        + ", ".join(f"{Path(f).name} ({k[0]}{' gzip' if k[1] else ''})"
                                    for f, k in list(kinds.items())[:4]))
    fmt, comp = fmts.pop(), comps.pop()
    from .libffm import is_libffm
    if fmt == "libsvm" and is_libffm(files[0]):
        raise DataError("is libffm text (field:id:value pairs): `ctrtrain data convert` makes "
                        "it TFRecords of declared fields, which train", path=files[0])
    schema = None
    if fields is not None:
        from .schema import Schema
        if fmt != "tfrecord":
            raise DataError(f"is {fmt}: declared fields are stored as TFRecord", path=files[0])
        schema = Schema.from_json(fields, where="--fields")
        field_size = schema.field_size
    else:
        field_size = (_tfrecord_field_size if fmt == "tfrecord" else
                      lambda p, c: _libsvm_field_size(p))(files[0], comp)
    entries, positives, max_id, longer = [], 0, -1, {}
    for f, name in zip(files, names or files):
        n, top, pos = _scan(f, fmt, field_size, comp, label_format, schema, longer)
        max_id, positives = max(max_id, top), positives + pos
        entries.append(FileEntry(name, n, os.path.getsize(f), sha256_file(f)))
    if sum(e.records for e in entries) == 0:
        raise DataError("the files hold no records", path=", ".join(files[:3]))
    if feature_size is not None and max_id >= feature_size:
        raise DataError(f"id {max_id} is outside [0, {feature_size})", path=", ".join(files[:3]))
    hashed = max((f.hash_base + f.hash_buckets for f in schema.fields if f.hash_buckets),
                 default=0) if schema else 0
    m = Manifest(fmt, field_size, feature_size or max(max_id + 1, hashed), entries,
                 compression=comp, label_format=label_format, positives=positives,
                 fields=fields,
                 extra={"indexed": True, "feature_size_inferred": feature_size is None,
                        **({"longer_than_max_len": longer} if longer else {})})
    if schema:
        schema.check_ids(m.feature_size, "--fields")
    return m


def _scan(path, fmt, field_size, compression, label_format, schema=None, longer=None):
    """(records, largest id, positives) of one file; the first bad record is an error.
    `longer`: per bag field (declared, without hashing), the count of rows holding more ids
    than its max_len, added to (as featurize and convert report them)."""
    from .validate import file_rows
    n, top, pos = 0, -1, 0
    for rows, bad in file_rows(path, fmt=fmt, field_size=field_size, feature_size=None,
                               compression=compression, label_format=label_format,
                               schema=schema):
        if bad:
            raise bad[0]
        if len(rows):
            largest = rows.largest_id() if schema else int(rows.ids.max())
            top, pos = max(top, largest), pos + int(rows.labels.sum())
        if schema is not None and longer is not None:
            for f in schema.lists():
                if f.name in rows.columns:
                    longer[f.name] = longer.get(f.name, 0) + int(
                        (rows.columns[f.name][0] > f.max_len).sum())
        n += len(rows)
    return n, top, pos


def expand(spec: str) -> list[str]:
    """A file, a glob, or a directory's data files (no manifest), sorted."""
    from .files import list_inputs
    if any(c in spec for c in GLOB_CHARS) and not os.path.exists(spec):
        found = sorted(p for p in glob.glob(spec) if os.path.isfile(p))
        if not found:
            raise DataError("the pattern matches no file", path=spec)
        return found
    return list_inputs([spec])


def source_paths(spec) -> list[str]:
    """A data source as its paths: one (a directory, a file or a glob) or several, as a shell
    expands an unquoted glob (`--train data/*.tfrecord`) or a config file lists them."""
    if isinstance(spec, (str, os.PathLike)):
        return [str(spec)]
    return [str(s) for s in spec]


def describe_source(spec) -> str:
    """A source for messages: its paths, space-separated as they were typed."""
    return " ".join(source_paths(spec))


def resolve_source(spec, *, feature_size: int | None = None,
                   label_format: str = "01") -> tuple[Manifest, str]:
    """(manifest, directory its paths are relative to) of a data directory, files or globs
    (one path, or several: source_paths). A directory with a manifest is read as it is;
    anything else is indexed now (print a hint: `ctrtrain data index` does it once)."""
    specs = source_paths(spec)
    if not specs:
        raise DataError("no data path given")
    with_manifest = [s for s in specs
                     if os.path.isdir(s) and os.path.exists(os.path.join(s, MANIFEST_NAME))]
    if with_manifest:
        if len(specs) == 1:
            return read_manifest(specs[0]), specs[0]
        if len(with_manifest) == len(specs):
            return combined_manifest(specs), "/"
        other = next(s for s in specs if s not in with_manifest)
        raise DataError("data directories (with manifests) and other paths in one source: "
                        "give directories only, or files only", path=other)
    files = [os.path.abspath(f) for s in specs for f in expand(s)]
    seen: set[str] = set()
    for f in files:
        if f in seen:    # its rows would be read twice an epoch
            raise DataError("the file is given twice (overlapping paths or globs)", path=f)
        seen.add(f)
    key = (tuple(files), tuple(os.path.getmtime(f) for f in files), feature_size, label_format)
    if key not in _INDEXED:
        print(f"indexing {len(files)} file(s) of {describe_source(spec)} (no manifest; "
              "`ctrtrain data index` writes one once)", flush=True)
        _INDEXED[key] = index_files(files, feature_size=feature_size, label_format=label_format)
    return _INDEXED[key], "/"


def combined_manifest(directories: list[str]) -> Manifest:
    """Several data directories read as one source (a day's directory each: `--train day-000
    day-001`): their files by absolute path, their records and positives summed. They must
    hold the same kind of data: format, fields, compression and labels; the table is the
    largest feature_size among them."""
    manifests = [read_manifest(d) for d in directories]
    first, where = manifests[0], directories[0]
    for d, m in zip(directories[1:], manifests[1:]):
        for key in ("format", "field_size", "fields", "compression", "label_format"):
            if getattr(m, key) != getattr(first, key):
                raise DataError(f"its data differs from {where}'s in {key} "
                                f"({getattr(m, key)!r} against {getattr(first, key)!r}): "
                                "directories read as one source hold the same kind of data",
                                path=d)
    vocabularies = {os.path.abspath(os.path.join(d, m.vocabulary))
                    for d, m in zip(directories, manifests) if m.vocabulary}
    if len(vocabularies) > 1:
        raise DataError("the directories were featurized with different vocabularies "
                        f"({', '.join(sorted(vocabularies))}): their ids mean different values",
                        path=where)
    files = [dataclasses.replace(f, path=os.path.abspath(os.path.join(d, f.path)))
             for d, m in zip(directories, manifests) for f in m.files]
    return dataclasses.replace(
        first, files=files, feature_size=max(m.feature_size for m in manifests),
        positives=sum(m.positives for m in manifests),
        skipped_rows=[r for m in manifests for r in m.skipped_rows],
        vocabulary=vocabularies.pop() if vocabularies else None, extra={})


_INDEXED: dict = {}   # this process's indexes (evaluation reads a split many times)


def source_files(spec) -> list[str]:
    """The data files of a source (resolve_source), as paths to open."""
    m, root = resolve_source(spec)
    return m.paths(root)


def write_index(spec: str, *, feature_size: int | None = None, label_format: str = "01",
                overwrite: bool = False, fields: list | None = None) -> Path:
    """`ctrtrain data index`: a manifest written beside the files (one directory)."""
    files = [os.path.abspath(f) for f in expand(spec)]
    parents = {str(Path(f).parent) for f in files}
    if len(parents) != 1:
        raise DataError("the files are in several directories; index each directory")
    directory = Path(parents.pop())
    if (directory / MANIFEST_NAME).exists() and not overwrite:
        raise DataError(f"already has a {MANIFEST_NAME} (pass --overwrite to replace it)",
                        path=str(directory))
    m = index_files(files, names=[Path(f).name for f in files], feature_size=feature_size,
                    label_format=label_format, fields=fields)
    m.write(directory)
    return directory / MANIFEST_NAME
