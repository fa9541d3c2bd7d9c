"""featurize's transform of raw cells in TensorFlow ops, for a model that serves raw columns.

`RawGraph(vocab)` takes one string tensor [B] per raw column (named as the vocabulary's
schema names it, cells exactly as the file holds them) and gives what featurize would have
written for those rows, as training reads it back:
  - `parsed(cells)`: the declared fields as `tf.io.parse_example` gives them for
    `vocab.fields()` (numeric and categorical [B, 1], a bag a RaggedTensor, hashed fields
    their raw strings), for input/pipeline.py `fields_batch`;
  - `fixed(cells)`: the fixed schema's `ids` and `values` [B, F] (vocabulary mode).
The rules are featurize's (data/featurize.py), one by one: a categorical value's id is its
column's base + its 1-based rank in the vocabulary, 0 for a value it does not hold (a
shared column looks up its categorical's); a multi-valued cell is split by the separator,
empty items dropped (a bag is cut to max_len where training reads it, not here); a numeric
cell is parsed as a float64, '' is missing (0 after the transform), and the transform,
statistics and rounding to 5 decimals are scale_numeric's, then float32. A cell featurize
refuses (not a number, not finite, too large for the transform) fails the call with an
InvalidArgumentError naming the column and the record. tests/test_raw_graph.py holds the
two to the same output on every column kind.

Not here: the fixed schema's hash mode, whose crc32 of `column NUL value` has no TensorFlow
op (declared fields hash with TensorFlow's Fingerprint64, which serves as is).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# A decimal number as pandas' to_numeric reads one (featurize's parser): optional sign,
# digits with an optional point, an optional exponent, spaces around. 'nan', 'inf' and hex
# are refused there too.
NUMBER = r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*"
FLOAT32_MAX = float(np.finfo(np.float32).max)


class RawGraph(tf.Module):
    def __init__(self, vocab):
        super().__init__()
        if vocab.mode == "hash" and not vocab.declared:
            raise ValueError("the fixed schema's hash mode (crc32) has no TensorFlow op")
        self.vocab = vocab
        s = vocab.schema
        self.columns = list(s.fields)
        self._base = dict(zip(s.categorical + s.lists, vocab.bases()))
        self._tables = {}
        if vocab.mode == "vocab":
            for col, values in vocab.values.items():
                self._tables[col] = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                    tf.constant(values or [""], tf.string),
                    tf.range(1, max(len(values), 1) + 1, dtype=tf.int64) * int(bool(values))),
                    default_value=0)

    def _ids(self, col: str, values):
        """A categorical or multi-valued column's ids of `values` (strings, any shape):
        base + 1-based rank in its (or its shared column's) vocabulary, 0 when unknown. In
        hash mode the strings themselves: training's parser hashes them."""
        if self.vocab.mode == "hash":
            return values
        table = self._tables[self.vocab.schema.shared.get(col, col)]
        return self._base[col] + table.lookup(values)

    def _number(self, col: str, cells):
        """scale_numeric of one numeric column's cells [B], float32."""
        v = self.vocab
        missing = tf.equal(cells, "")
        ok = missing | tf.strings.regex_full_match(cells, NUMBER)
        first = tf.argmax(tf.cast(~ok, tf.int32), output_type=tf.int64)
        check = tf.debugging.Assert(tf.reduce_all(ok), [tf.strings.format(
            "ctrtrain: column " + col + ": record {} holds {} which is not a number",
            [first, cells[first:first + 1]])])
        with tf.control_dependencies([check]):
            x = tf.strings.to_number(tf.where(missing, "0", cells), tf.float64)
        raw = x
        if v.numeric_transform.startswith("log"):
            x = tf.sign(x) * tf.math.log1p(tf.abs(x))
        stats = v.numeric_stats.get(col, {})
        if v.numeric_transform in ("standard", "log-standard"):
            x = (x - stats["mean"]) / stats["std"]
        elif v.numeric_transform == "minmax":
            width = stats["max"] - stats["min"]
            x = (x - stats["min"]) / (width if width > 0 else 1.0)
        x = tf.where(missing, tf.zeros_like(x), x)
        # What featurize refuses: 1e400 (inf as float64), or a value the transform carries
        # past float32.
        bad = ~tf.math.is_finite(raw) | (tf.abs(x) > FLOAT32_MAX)
        first = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
        check = tf.debugging.Assert(~tf.reduce_any(bad), [tf.strings.format(
            "ctrtrain: column " + col + ": record {} holds {}, too large for --numeric-transform "
            + v.numeric_transform, [first, cells[first:first + 1]])])
        with tf.control_dependencies([check]):
            return tf.cast(tf.round(x * 1e5) / 1e5, tf.float32)   # np.round(x, 5)

    def _bag(self, col: str, cells):
        items = tf.strings.split(cells, self.vocab.schema.separator)
        items = tf.ragged.boolean_mask(items, tf.not_equal(items, ""))
        return tf.ragged.map_flat_values(lambda v: self._ids(col, v), items)

    def parsed(self, cells: dict) -> dict:
        """The declared fields of these rows, as parse_example gives them for vocab.fields()."""
        s = self.vocab.schema
        out = {c: self._number(c, cells[c])[:, None] for c in s.numeric}
        out.update({c: self._ids(c, cells[c])[:, None] for c in s.categorical})
        out.update({c: self._bag(c, cells[c]) for c in s.lists})
        return out

    def fixed(self, cells: dict) -> dict:
        """The fixed schema's ids and values [B, F] of these rows (vocabulary mode)."""
        s = self.vocab.schema
        rows = tf.shape(cells[self.columns[0]])[0]
        k = len(s.numeric)
        ids = [tf.fill([rows], tf.constant(j, tf.int64)) for j in range(k)]
        ids += [self._ids(c, cells[c]) for c in s.categorical]
        values = [self._number(c, cells[c]) for c in s.numeric]
        values += [tf.ones([rows], tf.float32) for _ in s.categorical]
        return {"ids": tf.stack(ids, 1), "values": tf.stack(values, 1)}
