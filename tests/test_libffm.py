"""libffm text (`label field:id:value ...`, several pairs per field allowed) into declared
fields (data/libffm.py): `data convert` declares them from the data or takes another split's,
training reads the TFRecords, `predict` reads libffm lines as convert does, and bad lines are
named by file and line with nothing written that looks complete."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ctrtrain_here
from ctrtrain.data.libffm import FieldStats, parse_libffm, to_field_rows

ROLES = ["user_id", "movie_id", "gender", "age", "occupation", "zip"]


def ctrtrain(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "ctrtrain.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "CTRTRAIN_NO_PROGRESS": "1"})


def ok(*args, **kw):
    r = ctrtrain(*args, **kw)
    assert r.returncode == 0, f"{args}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def movielens_libffm(shared, out: Path) -> tuple[Path, Path, int]:
    """The MovieLens sample as FFM users write it: one field per column (field 6 the genres,
    each genre a pair of value 1/n, written before the other columns as some tools do), a
    global id per (column, value), label rating >= 4; the first 150 rows train, the rest
    test. Also the number of ids (the table's size, which the test split's ids need)."""
    with open(shared / "deepctr_samples" / "movielens_sample.txt") as f:
        rows = list(csv.DictReader(f))
    ids: dict[tuple, int] = {}

    def idx(col, v):
        return ids.setdefault((col, v), len(ids))
    lines = []
    for r in rows:
        genres = r["genres"].split("|")
        pairs = [f"6:{idx('genres', g)}:{1 / len(genres):.6g}" for g in genres]
        pairs += [f"{j}:{idx(c, r[c])}:1" for j, c in enumerate(ROLES)]
        lines.append(f"{int(float(r['rating']) >= 4)} " + " ".join(pairs) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.ffm").write_text("".join(lines[:150]))
    (out / "test.ffm").write_text("".join(lines[150:]))
    return out / "train.ffm", out / "test.ffm", len(ids)


def test_pairs_group_by_field_in_line_order():
    text = b"1 2:7:0.5 0:3:1 2:9:1 1:4:1\n0 0:5:1 1:4:1\n"
    block, bad = parse_libffm(text, path="x.ffm")
    assert not bad
    schema = FieldStats.of(block).declare()
    assert [f.to_json() for f in schema.fields] == [
        {"name": "f0", "kind": "categorical"}, {"name": "f1", "kind": "categorical"},
        {"name": "f2", "kind": "multi_hot", "max_len": 2, "pooling": "sum", "weighted": True}]
    rows, unfit, longer = to_field_rows(block, schema, "x.ffm")
    assert not unfit and longer == {"f2": 0}
    assert rows.columns["f0"].tolist() == [3, 5] and rows.columns["f1"].tolist() == [4, 4]
    lengths, bag, weights = rows.columns["f2"]
    assert lengths.tolist() == [2, 0] and bag.tolist() == [7, 9]
    assert weights.tolist() == [0.5, 1.0]


def test_statistics_of_blocks_merge_to_the_whole_files():
    """The declaration does not depend on how the lines were cut among workers: a field
    that one block lacks (0 pairs in its rows) is multi_hot in the whole."""
    lines = [b"1 0:1:1 1:2:1\n", b"0 0:1:1\n", b"1 0:3:1 1:4:1 1:5:1\n"]
    whole = FieldStats.of(parse_libffm(b"".join(lines))[0]).declare()
    merged = FieldStats()
    for line in lines:
        merged = merged.merge(FieldStats.of(parse_libffm(line)[0]))
    assert merged.declare() == whole
    assert [f.kind for f in whole.fields] == ["categorical", "multi_hot"]
    assert whole.fields[1].max_len == 2 and not whole.fields[1].weighted


@pytest.mark.parametrize("line,reason", [
    ("1 0:3 1:4:1", "pair 1 '0:3' is not field:id:value"),
    ("1 0:3:1 a:4:1", "field and id must be non-negative integers"),
    ("1 0:-3:1", "field and id must be non-negative integers"),
    ("1 0:3:x", "value is not a number"),
    ("1 0:3:1e39", "float32's range"),
    ("2 0:3:1", "label '2' is not one of"),
    ("", "empty line"),
    ("1 0:3:1\u20031:4:1", "holds the character U+2003 where pairs are separated by spaces"),
])
def test_malformed_lines_are_named(line, reason):
    text = f"1 0:1:1\n{line}\n0 0:2:1\n".encode()
    block, bad = parse_libffm(text, path="in.ffm", first_line=10)
    assert len(block) == 2 and [b.line for b in bad] == [11]
    assert reason in bad[0].reason


def test_libffm_converts_trains_and_predicts_from_its_own_lines(shared, tmp_path):
    train, test, n_ids = movielens_libffm(shared, tmp_path / "raw")
    ctrtrain_here("data", "convert", train, "--out", tmp_path / "tr", "--shards", 3, "--processes", 2,
                  "--feature-size", n_ids)
    m = json.loads((tmp_path / "tr" / "manifest.json").read_text())
    kinds = {f["name"]: f for f in m["fields"]}
    assert [kinds[f"f{j}"]["kind"] for j in range(6)] == ["categorical"] * 6
    assert kinds["f6"] == {"name": "f6", "kind": "multi_hot", "pooling": "sum",
                           "weighted": True, "max_len": kinds["f6"]["max_len"]}
    assert kinds["f6"]["max_len"] >= 3
    # One process, one shard: the same declaration.
    ctrtrain_here("data", "convert", train, "--out", tmp_path / "tr1", "--shards", 1, "--processes", 1,
                  "--feature-size", n_ids)
    assert json.loads((tmp_path / "tr1" / "manifest.json").read_text())["fields"] == m["fields"]

    # The test split --like the training one (a user, movie or zip unseen in training is just
    # another id of the table: libffm ids are global).
    ctrtrain_here("data", "convert", test, "--out", tmp_path / "te", "--like", tmp_path / "tr")
    ctrtrain_here("data", "validate", tmp_path / "tr")
    ctrtrain_here("data", "validate", tmp_path / "te")
    te = json.loads((tmp_path / "te" / "manifest.json").read_text())
    assert te["fields"] == m["fields"] and te["feature_size"] == m["feature_size"]
    assert sum(f["records"] for f in te["files"]) == 50

    ctrtrain_here("train", "--train", tmp_path / "tr", "--test", tmp_path / "te", "--model-dir",
                  tmp_path / "m", "--epochs", 2, "--batch-size", 16, "--seed", 1)
    ctrtrain_here("predict", "--model", tmp_path / "m" / "export", "--input", test, "--out",
                  tmp_path / "from_text.csv")
    ctrtrain_here("predict", "--model", tmp_path / "m" / "export", "--input", tmp_path / "te", "--out",
                  tmp_path / "from_records.csv")
    a = (tmp_path / "from_text.csv").read_text()
    assert a == (tmp_path / "from_records.csv").read_text()
    assert len(a.splitlines()) == 51


def test_a_bad_libffm_line_is_named_and_nothing_is_written(tmp_path):
    good = "".join(f"{i % 2} 0:{i % 7}:1 1:{10 + i % 5}:1 1:{20 + i % 3}:0.5\n" for i in range(40))
    src = tmp_path / "in.ffm"
    src.write_text(good + "1 0:3:1 1:12\n" + good)
    r = ctrtrain("data", "convert", src, "--out", tmp_path / "out", "--processes", 2)
    assert r.returncode == 2, r.stderr
    assert f"{src}, line 41: pair 2 '1:12' is not field:id:value" in r.stderr
    assert not (tmp_path / "out").exists()
    assert src.read_text().count("\n") == 81          # the input is untouched

    # --max-bad-rows skips it, says so, and lists it in the manifest.
    r = ok("data", "convert", src, "--out", tmp_path / "out", "--max-bad-rows", 1)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert sum(f["records"] for f in m["files"]) == 80
    assert m["skipped_rows"][0]["line"] == 41 and "line 41" in r.stderr

    # A split whose rows the training declaration cannot hold, --like it: named by line.
    other = tmp_path / "other.ffm"
    other.write_text("1 0:3:1 1:12:1\n0 0:3:1 0:4:1 1:12:1\n1 0:3:1 2:5:1\n")
    r = ctrtrain("data", "convert", other, "--out", tmp_path / "o", "--like", tmp_path / "out")
    assert r.returncode == 2
    assert f"{other}, line 2: field f0 holds 2 pairs: it is declared categorical" in r.stderr
    assert not (tmp_path / "o").exists()
    r = ctrtrain("data", "convert", other, "--out", tmp_path / "o", "--like", tmp_path / "out",
                 "--max-bad-rows", 2)
    assert r.returncode == 0, r.stderr
    assert "line 3: field 2 is not declared (the data declares fields f0..f1)" in r.stderr

    # Trained on directly, libffm text is refused with the way to train it.
    r = ctrtrain("train", "--train", src, "--model-dir", tmp_path / "m")
    assert r.returncode == 2 and "is libffm text" in r.stderr and "data convert" in r.stderr
    assert not (tmp_path / "m" / "export").exists()


def test_predict_names_a_libffm_line_the_model_cannot_read(tmp_path):
    """predict reads libffm lines as convert --like does: a row that does not fit the
    model's fields is an error naming it, never a prediction from part of the row."""
    lines = "".join(f"{i % 2} 0:{i % 4}:1 1:{4 + i % 3}:1\n" for i in range(64))
    (tmp_path / "a.ffm").write_text(lines)
    ctrtrain_here("data", "convert", tmp_path / "a.ffm", "--out", tmp_path / "d", "--shards", 1)
    ctrtrain_here("train", "--train", tmp_path / "d", "--model-dir", tmp_path / "m", "--epochs", 1,
                  "--batch-size", 16)
    (tmp_path / "b.ffm").write_text("1 0:1:1 1:5:1\n0 0:1:1 1:5:1 1:6:1\n")
    r = ctrtrain("predict", "--model", tmp_path / "m" / "export", "--input", tmp_path / "b.ffm",
                 "--out", tmp_path / "p.csv")
    assert r.returncode == 2
    assert "b.ffm, line 2: field f1 holds 2 pairs" in r.stderr
    assert not (tmp_path / "p.csv").exists()
