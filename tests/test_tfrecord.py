import numpy as np
import pytest

from conftest import random_rows
from ctrtrain.data.libsvm import Rows
from ctrtrain.data.tfrecord import ShardWriter, encode_examples, read_rows
from ctrtrain.errors import DataError


@pytest.mark.tf215
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_written_records_read_back_with_tensorflow(tmp_path, compression):
    rows = random_rows(3000, feature_size=2 ** 40)
    rows.ids[0, :6] = [0, 127, 128, 16383, 16384, 2 ** 40 - 1]  # varint length boundaries
    path = str(tmp_path / "a.tfrecord")
    w = ShardWriter(path, compression)
    w.write_rows(rows)
    n, size, sha = w.commit()
    assert n == 3000 and size > 0 and len(sha) == 64
    back = Rows.concat(list(read_rows(path, 39, compression, batch=1000)), 39)
    np.testing.assert_array_equal(back.ids, rows.ids)
    np.testing.assert_array_equal(back.values, rows.values)
    np.testing.assert_array_equal(back.labels, rows.labels)


@pytest.mark.tf215
def test_encoding_matches_tensorflows_own_serialization():
    import tensorflow as tf
    rows = random_rows(5, f=3)
    for rec, i in zip(encode_examples(rows), range(5)):
        ex = tf.train.Example(features=tf.train.Features(feature={
            "label": tf.train.Feature(float_list=tf.train.FloatList(value=[rows.labels[i]])),
            "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=rows.ids[i])),
            "values": tf.train.Feature(float_list=tf.train.FloatList(value=rows.values[i]))}))
        parsed = tf.train.Example.FromString(rec)
        assert parsed == ex


def test_aborted_writer_leaves_nothing(tmp_path):
    path = str(tmp_path / "a.tfrecord")
    w = ShardWriter(path)
    w.write_rows(random_rows(10))
    w.abort()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.tf215
def test_truncated_file_names_the_record(tmp_path):
    path = tmp_path / "a.tfrecord"
    w = ShardWriter(str(path))
    w.write_rows(random_rows(100))
    w.commit()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 57 // 100])
    with pytest.raises(DataError) as e:
        list(read_rows(str(path), 39, batch=32))
    assert e.value.record == 56 and str(path) in str(e.value) and "truncated" in str(e.value)


def test_wrong_field_size_is_named(tmp_path):
    path = tmp_path / "a.tfrecord"
    w = ShardWriter(str(path))
    w.write_rows(random_rows(10, f=5))
    w.commit()
    with pytest.raises(DataError) as e:
        list(read_rows(str(path), 39))
    assert e.value.record == 0 and "schema" in str(e.value)
