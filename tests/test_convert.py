import os

import numpy as np
import pytest

from conftest import cli, random_rows, run_cli
from ctrtrain.data.convert import libsvm_to_tfrecord, tfrecord_to_libsvm
from ctrtrain.data.libsvm import Rows, format_libsvm
from ctrtrain.data.manifest import read_manifest, sha256_file
from ctrtrain.data.tfrecord import read_rows
from ctrtrain.errors import DataError


def write_inputs(d, sizes, seed=0):
    d.mkdir(parents=True, exist_ok=True)
    paths, parts = [], []
    for i, n in enumerate(sizes):
        rows = random_rows(n, seed=seed + i)
        p = d / f"in{i}.libsvm"
        p.write_bytes(format_libsvm(rows))
        paths.append(str(p))
        parts.append(rows)
    return paths, Rows.concat(parts, 39)


def read_all(data_dir):
    m = read_manifest(data_dir)
    return Rows.concat([r for p in m.paths(data_dir) for r in read_rows(p, m.field_size, m.compression)], 39)


@pytest.mark.tf215
@pytest.mark.parametrize("processes,compression", [(1, None), (2, "gzip")])
def test_round_trip_is_lossless_and_shards_are_balanced(tmp_path, processes, compression):
    paths, rows = write_inputs(tmp_path / "in", [1234, 1, 2345])
    m = libsvm_to_tfrecord(paths, tmp_path / "tf", field_size=39, feature_size=10_000, shards=7,
                           processes=processes, compression=compression)
    counts = [f.records for f in m.files]
    assert sum(counts) == 3580 and max(counts) - min(counts) <= 1
    assert m.positives == int(rows.labels.sum()) and m.feature_size == 10_000
    for f, p in zip(m.files, m.paths(tmp_path / "tf")):
        assert sha256_file(p) == f.sha256 and os.path.getsize(p) == f.bytes
    back = read_all(tmp_path / "tf")  # shards keep the global row order
    np.testing.assert_array_equal(back.ids, rows.ids)
    np.testing.assert_array_equal(back.values, rows.values)
    m2 = tfrecord_to_libsvm(tmp_path / "tf", tmp_path / "back", processes=processes)
    text = b"".join(open(p, "rb").read() for p in m2.paths(tmp_path / "back"))
    original = b"".join(open(p, "rb").read() for p in paths)
    assert text == original  # canonical libsvm -> TFRecord -> libsvm is byte-identical


def test_same_output_for_any_process_count(tmp_path):
    paths, _ = write_inputs(tmp_path / "in", [3000])
    a = libsvm_to_tfrecord(paths, tmp_path / "a", field_size=39, shards=4, processes=1)
    b = libsvm_to_tfrecord(paths, tmp_path / "b", field_size=39, shards=4, processes=2)
    assert [f.sha256 for f in a.files] == [f.sha256 for f in b.files]
    assert a.extra["feature_size_inferred"] and a.feature_size == int(read_all(tmp_path / "a").ids.max()) + 1


def test_bad_row_fails_and_leaves_no_output(tmp_path):
    paths, _ = write_inputs(tmp_path / "in", [500, 500])
    lines = open(paths[1], "rb").read().split(b"\n")
    lines[41] = lines[41].replace(b":", b" ", 1)
    open(paths[1], "wb").write(b"\n".join(lines))
    with pytest.raises(DataError) as e:
        libsvm_to_tfrecord(paths, tmp_path / "tf", field_size=39, shards=3, processes=2)
    assert e.value.path == paths[1] and e.value.line == 42
    assert not (tmp_path / "tf").exists()


def test_skip_policy_counts_and_reports(tmp_path):
    paths, rows = write_inputs(tmp_path / "in", [300])
    lines = open(paths[0], "rb").read().split(b"\n")
    lines[9] = b"1 2:1"
    lines[99] = b"3 " + lines[99][2:]
    open(paths[0], "wb").write(b"\n".join(lines))
    with pytest.raises(DataError):
        libsvm_to_tfrecord(paths, tmp_path / "x", field_size=39, max_bad_rows=1)
    m = libsvm_to_tfrecord(paths, tmp_path / "tf", field_size=39, max_bad_rows=2, shards=2)
    assert m.records == 298
    assert [(s["line"], s["path"]) for s in m.skipped_rows] == [(10, paths[0]), (100, paths[0])]


def test_cli_convert_errors_name_the_line(tmp_path):
    p = tmp_path / "bad.libsvm"
    p.write_text("1 1:1 2:1\n0 1:1 2:x\n")
    r = run_cli("data", "convert", p, "--out", tmp_path / "o", "--field-size", 2, check=False)
    assert r.returncode == 2
    assert f"{p}, line 2" in r.stderr and "not numeric" in r.stderr
    assert not (tmp_path / "o").exists()


def test_cli_refuses_to_mix_outputs(tmp_path):
    paths, _ = write_inputs(tmp_path / "in", [10])
    run_cli("data", "convert", paths[0], "--out", tmp_path / "o", "--field-size", 39)
    r = run_cli("data", "convert", paths[0], "--out", tmp_path / "o", "--field-size", 39, check=False)
    assert r.returncode == 2 and "not empty" in r.stderr
    run_cli("data", "convert", paths[0], "--out", tmp_path / "o", "--field-size", 39, "--overwrite")


@pytest.mark.parametrize("name,compress,said", [
    ("train.ffm.gz", "gzip", "a gzip-compressed libffm file"),
    ("train.libsvm.gz", "gzip", "a gzip-compressed libsvm file"),
    ("train.ffm.xz", "lzma", "an xz-compressed libffm file")])
def test_compressed_text_is_refused_by_its_name_not_called_tfrecord(tmp_path, name, compress,
                                                                    said):
    """A compressed libffm or libsvm file was called "TFRecord" (any gzip file is, to the
    format guess): named for what it is, with what to do."""
    import importlib
    text = "1 0:1:1 1:5:1\n0 0:2:1 1:6:1\n" if ".ffm" in name else "1 1:1 2:1\n0 3:1 4:1\n"
    src = tmp_path / name
    src.write_bytes(importlib.import_module(compress).compress(text.encode()))
    code, _, err = cli("data", "convert", src, "--out", tmp_path / "o", "--field-size", 2)
    assert code == 2
    assert f"{src}: {said}: decompress it first" in err, err
    assert "TFRecord" not in err
    assert not (tmp_path / "o").exists()
    # The TFRecords convert writes compressed are still told apart, and named so.
    out = tmp_path / "tf"
    plain = tmp_path / "plain.libsvm"
    plain.write_text("1 1:1 2:1\n")
    assert cli("data", "convert", plain, "--out", out, "--field-size", 2, "--gzip")[0] == 0
    shard = next(out.glob("*.tfrecord.gz"))
    code, _, err = cli("data", "convert", shard, "--out", tmp_path / "o2")
    assert code == 2 and f"{shard}: is TFRecord, not libsvm text" in err


def test_a_libffm_file_of_blank_lines_has_no_rows(tmp_path):
    """A libffm file of only blank lines was taken for libsvm and asked for --field-size: it
    has no rows, said as an empty file's is."""
    empty, blank = tmp_path / "empty.ffm", tmp_path / "blank.ffm"
    empty.write_text("")
    blank.write_text("\n\n  \n\t\n")
    code, _, err = cli("data", "convert", empty, "--out", tmp_path / "o")
    assert code == 2 and f"{empty}: is empty: no rows to convert" in err
    code, _, err = cli("data", "convert", blank, "--out", tmp_path / "o")
    assert code == 2 and f"{blank}: holds only blank lines: no rows to convert" in err, err
    assert "--field-size" not in err
    assert not (tmp_path / "o").exists()


def test_a_libffm_file_opening_with_a_blank_line_is_sniffed_as_libffm(tmp_path):
    """A libffm file whose first line is blank was sniffed as libsvm (only the first line was
    looked at): asked for --field-size, and `data index` said its first line held no id:value
    pair. Blank lines are skipped when sniffing: the blank line is a bad row like any other
    (named, or skipped with --max-bad-rows) and the rest converts as libffm."""
    ffm = tmp_path / "day.ffm"
    ffm.write_text("\n1 0:1:1 1:5:1\n0 0:2:1 1:6:1\n")
    code, _, err = cli("data", "convert", ffm, "--out", tmp_path / "o")
    assert code == 2 and f"{ffm}, line 1: empty line" in err and "--field-size" not in err, err
    assert not (tmp_path / "o").exists()
    code, _, err = cli("data", "index", ffm)
    assert code == 2 and f"{ffm}: is libffm text" in err, err
    code, out, err = cli("data", "convert", ffm, "--out", tmp_path / "o", "--max-bad-rows", 1)
    assert code == 0, err
    m = read_manifest(tmp_path / "o")
    assert m.records == 2 and [f["name"] for f in m.fields] == ["f0", "f1"]


def test_a_data_tools_processes_follow_its_rows_unless_asked(monkeypatch):
    """A worker costs about what 100,000 rows do: smaller inputs stay in one process."""
    from ctrtrain.data.parallel import processes_for
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert [processes_for(n, None) for n in (0, 99_999, 100_000, 250_000, 10**9)] == [1, 1, 1, 2, 8]
    assert processes_for(10, 3) == 3                 # asked: honoured
