"""The manifest a data directory carries, so that readers never guess (docs/data.md, "Data layout")."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from ..errors import DataError

MANIFEST_NAME = "manifest.json"
# Put into a tool's output directory first and removed last, after its manifest: while it is
# there the directory holds an interrupted run's leftovers, however complete it looks.
INCOMPLETE_NAME = ".ctrtrain-incomplete"


@dataclasses.dataclass
class FileEntry:
    path: str          # relative to the manifest's directory
    records: int
    bytes: int
    sha256: str


@dataclasses.dataclass
class Manifest:
    format: str                       # "tfrecord" or "libsvm"
    field_size: int
    feature_size: int
    files: list[FileEntry]
    compression: str | None = None    # None or "gzip" (tfrecord only)
    label_format: str = "01"
    positives: int = 0
    skipped_rows: list[dict] = dataclasses.field(default_factory=list)
    vocabulary: str | None = None     # path of the featurization vocabulary, if any
    extra: dict = dataclasses.field(default_factory=dict)
    fields: list | None = None        # the declared fields (data/schema.py); None = the
                                      # fixed schema: field_size ids with values

    @property
    def schema(self):
        """The declared fields as a Schema, or None for the fixed schema."""
        from .schema import Schema
        return None if self.fields is None else Schema.from_json(self.fields)

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)

    def paths(self, directory: str | os.PathLike) -> list[str]:
        return [str(Path(directory) / f.path) for f in self.files]

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        if d["fields"] is None:
            del d["fields"]     # a fixed-schema manifest reads as the previous release wrote it
        d["records"] = self.records
        return d

    @classmethod
    def from_json(cls, d: dict, where: str = "manifest") -> "Manifest":
        """A manifest as written by ctrtrain, or a DataError naming the field that is not:
        every field's type is checked here, so no reader meets a "39" for 39."""
        def bad(field, why):
            return DataError(f"not a valid ctrtrain manifest: {why}", path=where, field=field)
        if not isinstance(d, dict):
            raise bad(None, "not a JSON object")
        for k in ("format", "field_size", "feature_size", "files"):
            if k not in d:
                raise bad(k, "missing")
        if d["format"] not in ("tfrecord", "libsvm"):
            raise bad("format", f"{_short(d['format'])} is not tfrecord or libsvm")
        for k in ("field_size", "feature_size"):
            if not _is_int(d[k]) or d[k] <= 0:
                raise bad(k, f"{_short(d[k])} is not a positive integer")
        if d.get("compression") not in (None, "gzip"):
            raise bad("compression", f"{_short(d['compression'])} is not null or gzip")
        if d.get("label_format", "01") not in ("01", "pm1"):
            raise bad("label_format", f"{_short(d['label_format'])} is not 01 or pm1")
        if not isinstance(d["files"], list):
            raise bad("files", "must be a list")
        files = []
        for i, f in enumerate(d["files"]):
            if not isinstance(f, dict) or set(f) != {"path", "records", "bytes", "sha256"}:
                raise bad(f"files[{i}]", "needs exactly path, records, bytes, sha256")
            path = f["path"]
            if not isinstance(path, str) or not path or os.path.isabs(path) \
                    or ".." in Path(path).parts:
                raise bad(f"files[{i}].path", f"{_short(path)} must be a relative path inside "
                          "the data directory (no absolute path, no '..')")
            for k in ("records", "bytes"):
                if not _is_int(f[k]) or f[k] < 0:
                    raise bad(f"files[{i}].{k}", f"{_short(f[k])} is not a non-negative integer")
            if not isinstance(f["sha256"], str):
                raise bad(f"files[{i}].sha256", "must be a string")
            files.append(FileEntry(**f))
        if not _is_int(d.get("positives", 0)):
            raise bad("positives", "must be an integer")
        vocab = d.get("vocabulary")
        if vocab is not None and (not isinstance(vocab, str) or "/" in vocab or vocab.startswith(".")):
            raise bad("vocabulary", f"{_short(vocab)} must be a file name in the data directory")
        if d.get("fields") is not None:
            from .schema import Schema
            declared = Schema.from_json(d["fields"], where=where)
            if d["format"] != "tfrecord":
                raise bad("fields", "declared fields are stored as TFRecord only")
            if declared.field_size != d["field_size"]:
                raise bad("field_size", f"{d['field_size']} but {declared.field_size} fields "
                          "are declared")
            declared.check_ids(d["feature_size"], where)
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in fields and k != "files"}
        try:
            return cls(files=files, **kwargs)
        except TypeError as e:
            raise bad(None, str(e)) from e

    def write(self, directory: str | os.PathLike) -> Path:
        """Written last and atomically: a directory with a manifest is complete."""
        path = Path(directory) / MANIFEST_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
        return path


def read_manifest(directory: str | os.PathLike, check: bool = True) -> Manifest:
    """The manifest of a data directory. With `check` (every reader), each listed file must
    exist with the manifest's size, and its record count must be possible for that size: a
    file cut short -- even at a record boundary -- or a count that is not true would
    otherwise train on less data, or more passes, than the manifest promises."""
    path = Path(directory) / MANIFEST_NAME
    if not Path(directory).is_dir():
        raise DataError("data directory does not exist", path=str(directory))
    refuse_incomplete(directory)
    if not path.exists():
        raise DataError(f"no {MANIFEST_NAME}: not a ctrtrain data directory "
                        "(convert the data first with `ctrtrain data convert`)", path=str(directory))
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise DataError(f"manifest is not valid JSON: {e}", path=str(path)) from e
    m = Manifest.from_json(d, where=str(path))
    if check:
        check_files(m, directory)
    return m


def refuse_incomplete(path: str | os.PathLike) -> None:
    """A data directory (or file) inside a tool's output that the tool never finished (killed,
    out of disk) is refused, not read in part. The parent is looked at too: split's files and
    synth's splits sit one level below the directory the tool prepared."""
    p = Path(path)
    for d in (p, p.parent) if p.is_dir() else (p.parent,):
        if (d / INCOMPLETE_NAME).exists():
            raise DataError("the output of a ctrtrain data tool that never finished (it was "
                            "stopped or failed): run that tool again with --overwrite",
                            path=str(d))


def check_readable(path: str | os.PathLike) -> None:
    """Opens the file: one that cannot be read (its mode) is named now (an OSError the CLI
    reports with the file), not when TensorFlow's reader reaches it mid-run."""
    with open(path, "rb"):
        pass


def check_files(m: Manifest, directory: str | os.PathLike) -> None:
    """Cheap checks of the files against the manifest (stat, and for text a line count):
    `ctrtrain data validate` does the full ones (checksums, every record)."""
    if m.format == "tfrecord" and m.compression is None and m.fields is None:
        lo, hi = record_size_bounds(m.field_size, m.feature_size)
    for entry, p in zip(m.files, m.paths(directory)):
        if not os.path.isfile(p):
            raise DataError("listed in the manifest but missing", path=p)
        check_readable(p)
        size = os.path.getsize(p)
        if size != entry.bytes:
            raise DataError(f"{size} bytes, the manifest says {entry.bytes}: the file was cut or "
                            "changed (run `ctrtrain data validate`)", path=p)
        if m.format == "libsvm":
            from .files import count_lines
            n = count_lines(p)
            if n != entry.records:
                raise DataError(f"{n} lines, the manifest says {entry.records} records", path=p)
        elif m.compression is None and m.fields is None:
            if not entry.records * lo <= size <= entry.records * hi:
                raise DataError(f"{size} bytes cannot hold the {entry.records} records the "
                                f"manifest says ({lo} to {hi} bytes each)", path=p)


def record_size_bounds(field_size: int, feature_size: int) -> tuple[int, int]:
    """Smallest and largest framed TFRecord of one example (label, ids, values): ids are
    varints, 1 byte for 0 up to the width of the largest id."""
    import numpy as np

    from .libsvm import Rows
    from .tfrecord import encode_examples
    sizes = []
    for top in (0, feature_size - 1):
        r = Rows(np.zeros(1, np.float32), np.full((1, field_size), top, np.int64),
                 np.zeros((1, field_size), np.float32))
        sizes.append(len(encode_examples(r)[0]) + 16)   # + length, its CRC and the data CRC
    return sizes[0], sizes[1]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v) -> str:
    """A bounded repr for messages: never expands a huge value (a YAML alias bomb)."""
    import reprlib
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlist, r.maxdict = 2, 60, 60, 4, 4
    return r.repr(v)


def sha256_file(path: str | os.PathLike, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def declared_fields(spec) -> list:
    """A declaration given by reference (a stream's, which has no manifest of its own): a data
    directory or manifest.json whose `fields` declare it, a JSON file holding the list, or the
    list itself (or its JSON text); checked as a manifest's is."""
    from .schema import Schema
    if isinstance(spec, str) and spec.strip().startswith("["):
        try:
            spec = json.loads(spec)
        except ValueError as e:
            raise DataError(f"is not a JSON list of field declarations ({e})", path="fields")
    if isinstance(spec, (list, tuple)):
        fields, where = list(spec), "fields"
    else:
        path = Path(spec) / MANIFEST_NAME if Path(spec).is_dir() else Path(spec)
        where = str(path)
        try:
            d = json.loads(path.read_text())
        except OSError as e:
            raise DataError(f"cannot read the field declarations: {e.strerror}", path=where)
        except ValueError as e:
            raise DataError(f"is not JSON ({e})", path=where)
        fields = d.get("fields") if isinstance(d, dict) else d
        if fields is None:
            raise DataError("declares no fields (the fixed schema: give field_size instead)",
                            path=where)
    Schema.from_json(fields, where=where)
    return fields
