"""The manifest a data directory carries, so that readers never guess (DESIGN.md 3.1)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from ..errors import DataError

MANIFEST_NAME = "manifest.json"


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

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)

    def paths(self, directory: str | os.PathLike) -> list[str]:
        return [str(Path(directory) / f.path) for f in self.files]

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["records"] = self.records
        return d

    @classmethod
    def from_json(cls, d: dict, where: str = "manifest") -> "Manifest":
        try:
            files = [FileEntry(**f) for f in d["files"]]
            fields = {f.name for f in dataclasses.fields(cls)}
            kwargs = {k: v for k, v in d.items() if k in fields and k != "files"}
            return cls(files=files, **kwargs)
        except (KeyError, TypeError) as e:
            raise DataError(f"not a valid ctrtrain manifest ({e})", path=where) from e

    def write(self, directory: str | os.PathLike) -> Path:
        """Written last and atomically: a directory with a manifest is complete."""
        path = Path(directory) / MANIFEST_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
        return path


def read_manifest(directory: str | os.PathLike) -> Manifest:
    path = Path(directory) / MANIFEST_NAME
    if not Path(directory).is_dir():
        raise DataError("data directory does not exist", path=str(directory))
    if not path.exists():
        raise DataError(f"no {MANIFEST_NAME}: not a ctrtrain data directory "
                        "(convert the data first with `ctrtrain data convert`)", path=str(directory))
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"manifest is not valid JSON: {e}", path=str(path)) from e
    return Manifest.from_json(d, where=str(path))


def sha256_file(path: str | os.PathLike, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()
