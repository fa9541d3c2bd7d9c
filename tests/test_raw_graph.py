"""data/raw_graph.py, featurize's transform in TensorFlow ops, against featurize itself: the
same raw rows give the same ids and values on every column kind, in the declared layout and
the fixed one (the real Criteo sample), and a cell featurize refuses fails the graph too."""

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from conftest import cli, ctrtrain_here
from ctrtrain.data.featurize import Vocabulary, featurize_file
from ctrtrain.data.raw_graph import RawGraph, crc32
from ctrtrain.input.pipeline import fields_batch, parse_fields_batch

# Awkward cells on purpose: empty numeric and categorical cells, spaces and an exponent in a
# number, values the vocabulary never saw (test rows), empty bags, empty items ('a||b'),
# bags longer than max_len, a history sharing the item column's vocabulary.
TRAIN = """label,price,year,city,item,tags,hist
1,12.5,1990,paris,i1,a|b,i1|i2
0,,1991,rome,i2,b,i2
1,3e2,1992,paris,i3,a|b|c|d|e,i1|i2|i3|i4|i5|i6
0, 7 ,1990,,i1,,
1,0.001,1993,oslo,i2,c||a,i3
0,-4,1994,rome,i3,b|c,i1|i3
"""
TEST = """label,price,year,city,item,tags,hist
1,5,2001,lima,i9,z|a,i9|i1
0,,1990,paris,,a|a|a|a|a|a|a,i2|i2|i2|i2|i2|i2|i2|i2
1,1e-3,1999,rome,i2,,
"""


def cells(path):
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
    return {c: tf.constant(frame[c].to_numpy(object).astype(str)) for c in frame.columns}


def records(directory):
    files = sorted(str(p) for p in directory.glob("*.tfrecord"))
    return tf.concat([b for b in tf.data.TFRecordDataset(files).batch(1000)], 0)


@pytest.mark.parametrize("options", [["--numeric-transform", "log-standard"],
                                     ["--numeric-transform", "minmax", "--max-len", "3"],
                                     ["--hash-buckets", "50"]])
def test_declared_fields_from_raw_cells_equal_featurizes(tmp_path, options):
    (tmp_path / "train.csv").write_text(TRAIN)
    (tmp_path / "test.csv").write_text(TEST)
    share = [] if "--hash-buckets" in options else ["--share-vocab", "hist=item"]
    ctrtrain_here("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "train",
                  "--numeric", "price,year", "--multi-hot", "tags", "--sequence", "hist",
                  "--min-count", 1, *share, *options)
    vocab_path = tmp_path / "train" / "vocab.json"
    ctrtrain_here("data", "featurize", tmp_path / "test.csv", "--out", tmp_path / "test",
                  "--vocab", vocab_path)
    vocab = Vocabulary.load(str(vocab_path))
    schema = vocab.fields()
    graph = RawGraph(vocab)
    for split in ("train", "test"):
        want = parse_fields_batch(records(tmp_path / split), schema, with_label=False)
        got = fields_batch(graph.parsed(cells(tmp_path / f"{split}.csv")), schema,
                           with_label=False)
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k].numpy(), want[k].numpy(), err_msg=f"{split} {k}")


@pytest.mark.parametrize("options", [["--min-count", "2"], ["--hash-buckets", "1000"]])
def test_the_fixed_schema_from_a_criteo_line_equals_featurizes(shared, tmp_path, options):
    """The real Criteo sample (13 numeric, 26 categorical columns, many empty cells), by
    vocabulary and by featurize's hash (crc32)."""
    src = shared / "criteo_head1000" / "train.txt"
    ctrtrain_here("data", "featurize", src, "--out", tmp_path / "f", *options)
    vocab = Vocabulary.load(str(tmp_path / "f" / "vocab.json"))
    want = next(featurize_file(str(src), vocab))
    frame = pd.read_csv(src, sep="\t", header=None, dtype=str, keep_default_na=False,
                        na_filter=False, names=[vocab.schema.label] + vocab.schema.fields,
                        quoting=3)
    got = RawGraph(vocab).fixed({c: tf.constant(frame[c].to_numpy(object).astype(str))
                                 for c in vocab.schema.fields})
    np.testing.assert_array_equal(got["ids"].numpy(), want.ids)
    np.testing.assert_array_equal(got["values"].numpy(), want.values)


def test_a_cell_featurize_refuses_fails_the_graph_naming_column_and_record(tmp_path):
    (tmp_path / "train.csv").write_text(TRAIN)
    ctrtrain_here("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "train",
                  "--numeric", "price,year", "--min-count", 1, "--numeric-transform", "none")
    graph = RawGraph(Vocabulary.load(str(tmp_path / "train" / "vocab.json")))
    rows = {"price": ["1", "abc"], "year": ["1990", "1991"], "city": ["a", "b"],
            "item": ["i1", "i2"], "tags": ["", ""], "hist": ["", ""]}
    for price, said in ((["1", "abc"], "column price: record 1 holds [\"abc\"] which is not a "
                                       "number"),
                        (["nan", "1"], "column price: record 0 holds [\"nan\"] which is not"),
                        (["1e300", "1"], "column price: record 0 holds [\"1e300\"], too large "
                                         "for --numeric-transform none")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=said.replace("[", r"\[")):
            graph.fixed({**{k: tf.constant(v) for k, v in rows.items()},
                         "price": tf.constant(price)})


def test_crc32_in_tensorflow_ops_is_zlibs():
    """The hash of the fixed schema's hash mode: empty, one byte, non-ASCII (UTF-8), a NUL
    inside, strings of different lengths in one batch."""
    import zlib
    words = ["", "a", "C1\x0068fd1e64", "Zürich", "東京", "x" * 300, "a\x00b", "05db9164"]
    got = crc32(tf.constant(words)).numpy()
    assert got.tolist() == [zlib.crc32(w.encode()) for w in words]


def test_predict_reads_raw_rows_through_the_models_graph_and_names_a_refused_cell(tmp_path):
    """`ctrtrain predict` on raw rows goes through the export's own transform (the raw
    signature's): a cell only the graph refuses (finite, but too large for the transform)
    is named by file, line and column, exit 2, and no output is left."""
    (tmp_path / "train.csv").write_text(TRAIN)
    ctrtrain_here("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "train",
                  "--numeric", "price,year", "--multi-hot", "tags", "--sequence", "hist",
                  "--min-count", 1, "--numeric-transform", "none")
    ctrtrain_here("train", "--train", tmp_path / "train", "--model-dir", tmp_path / "m",
                  "--epochs", 1, "--batch-size", 2, "--quiet")
    bad = tmp_path / "bad.csv"
    bad.write_text(TEST.replace(",1e-3,", ",1e300,"))
    code, _, err = cli("predict", "--model", tmp_path / "m" / "export", "--input", bad,
                       "--out", tmp_path / "p.csv")
    assert code == 2 and f"{bad}, line 4, field price: '1e300' is too large for " \
        "--numeric-transform none" in err, err
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.csv.tmp").exists()
    ctrtrain_here("predict", "--model", tmp_path / "m" / "export", "--input", tmp_path / "train.csv",
                  "--out", tmp_path / "p.csv")
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 1 + 6
