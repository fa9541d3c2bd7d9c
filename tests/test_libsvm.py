import numpy as np
import pytest

from conftest import random_rows
from ctrtrain.data.libsvm import Rows, _parse_slow, format_libsvm, parse_libsvm
from ctrtrain.errors import DataError


def test_fast_and_slow_paths_agree():
    rows = random_rows(500)
    text = format_libsvm(rows)
    fast, bad = parse_libsvm(text, 39)
    assert bad == []
    slow, idx, bad2 = _parse_slow(text, 39, "x", 1)
    assert bad2 == [] and idx.tolist() == list(range(500))
    np.testing.assert_array_equal(fast.ids, slow[:, 1::2])
    np.testing.assert_array_equal(fast.values, slow[:, 2::2].astype(np.float32))
    np.testing.assert_array_equal(fast.ids, rows.ids)
    np.testing.assert_array_equal(fast.values, rows.values)
    np.testing.assert_array_equal(fast.labels, rows.labels)


def test_messy_whitespace_and_crlf_still_parse_exactly():
    text = b"1  3:0.5 7:1\r\n0 2:1\t9:2.25\n1 4:1 5:1"  # no final newline either
    rows, bad = parse_libsvm(text, 2)
    assert bad == []
    assert rows.ids.tolist() == [[3, 7], [2, 9], [4, 5]]
    assert rows.values.tolist() == [[0.5, 1], [1, 2.25], [1, 1]]
    assert rows.labels.tolist() == [1, 0, 1]


@pytest.mark.parametrize("line,reason", [
    (b"1 3:0.5 7", "has no ':'"),
    (b"1 3:0.5 x:1", "not numeric"),
    (b"1 3:0.5", "expected 2 id:value pairs, found 1"),
    (b"1 3:0.5 7:1 8:1", "expected 2 id:value pairs, found 3"),
    (b"", "empty line"),
    (b"2 3:0.5 7:1", "label 2 is not one of"),
    (b"1 3:0.5 -7:1", "is not a non-negative integer"),
    (b"1 3:0.5 7.5:1", "is not a non-negative integer"),
    (b"1 3:0.5 5.0:1", "id '5.0' is not a non-negative integer"),      # was read as id 5
    (b"1 1e3:0.5 7:1", "id '1e3' is not a non-negative integer"),      # was read as id 1000
    ("1 3:0.5\u20037:1".encode(), "holds the character U+2003"),       # an em space
    (b"1 3:0.5 100:1", "outside [0, 100)"),
    (b"1 3:nan 7:1", "not numeric"),
        (b"1 3:1e39 7:1", "outside float32"),
        (b"1 3:inf 7:1", "not numeric"),
])
def test_malformed_line_is_named(line, reason):
    text = b"0 1:1 2:1\n1 1:1 2:1\n" + line + b"\n0 1:1 2:1\n"
    rows, bad = parse_libsvm(text, 2, path="f.libsvm", first_line=10, feature_size=100)
    assert len(rows) == 3, "only the bad line is left out"
    assert len(bad) == 1
    assert bad[0].line == 12 and bad[0].path == "f.libsvm"
    assert reason in bad[0].reason
    err = bad[0].as_error()
    assert isinstance(err, DataError) and "f.libsvm" in str(err) and "line 12" in str(err)


def test_libfm_labels_need_declaring():
    text = b"-1 1:1\n1 2:1\n"
    _, bad = parse_libsvm(text, 1)
    assert len(bad) == 1 and "label -1" in bad[0].reason
    rows, bad = parse_libsvm(text, 1, label_format="pm1")
    assert bad == [] and rows.labels.tolist() == [0, 1]


def test_formatter_reads_back_exactly_for_any_float32():
    v = np.array([[0.1, 1e-8, 3.4028235e38, -2.5, 1.0, 123456.789]], np.float32)
    rows = Rows(np.array([1], np.float32), np.arange(6).reshape(1, 6), v)
    back, bad = parse_libsvm(format_libsvm(rows), 6)
    assert bad == []
    np.testing.assert_array_equal(back.values, v)
    # Short decimals take the vectorized path and give canonical text.
    assert format_libsvm(random_rows(2, f=2)).count(b"\n") == 2
