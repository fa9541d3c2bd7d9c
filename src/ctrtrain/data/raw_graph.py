"""featurize's transform of raw cells in TensorFlow ops, for a model that serves raw columns.

`RawGraph(vocab)` takes one string tensor [B] per raw column (named as the vocabulary's
schema names it, cells exactly as the file holds them) and gives what featurize would have
written for those rows, as training reads it back:
  - `parsed(cells)`: the declared fields as `tf.io.parse_example` gives them for
    `vocab.fields()` (numeric and categorical [B, 1], a bag a RaggedTensor, hashed fields
    their raw strings), for input/pipeline.py `fields_batch`;
  - `fixed(cells)`: the fixed schema's `ids` and `values` [B, F].
The rules are featurize's (data/featurize.py), one by one: a categorical value's id is its
column's base + its 1-based rank in the vocabulary, 0 for a value it does not hold (a
shared column looks up its categorical's); a multi-valued cell is split by the separator,
empty items dropped (a bag is cut to max_len where training reads it, not here); a numeric
cell is parsed as a float64, '' is missing (0 after the transform), and the transform,
statistics and rounding to 5 decimals are scale_numeric's, then float32. A cell featurize
refuses (not a number, not finite, too large for the transform) fails the call with an
InvalidArgumentError naming the column and the record. tests/test_raw_graph.py holds the
two to the same output on every column kind.

Hashing: declared fields keep the raw strings, hashed by training's parser (TensorFlow's
Fingerprint64); the fixed schema's hash mode hashes at featurize, zlib's crc32 of `column NUL
value`, which TensorFlow has no op for: `crc32` below computes it in TensorFlow's bitwise ops.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# A decimal number as pandas' to_numeric reads one (featurize's parser): optional sign,
# digits with an optional point, an optional exponent, spaces around. 'nan', 'inf' and hex
# are refused there too.
NUMBER = r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*"
FLOAT32_MAX = float(np.finfo(np.float32).max)
KEY_SEP = "\x00"      # between a column's name and its value: the table's keys, the hashed ones


def _crc32_table() -> np.ndarray:
    """zlib's CRC-32 table (the reflected polynomial 0xEDB88320), one entry per byte value."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    return np.array(table, np.int64)


CRC32_TABLE = _crc32_table()


def crc32(strings):
    """zlib.crc32 of each string of a [N] string tensor (its UTF-8 bytes), int64 [N]: a
    table-driven loop over the longest string's bytes, each string's own length masking the
    rest. A serving batch's cells are short (a few dozen bytes)."""
    lengths = tf.strings.length(strings)
    width = tf.reduce_max(tf.concat([lengths, [1]], 0))
    data = tf.transpose(tf.cast(tf.io.decode_raw(strings, tf.uint8, fixed_length=width),
                                tf.int64))                                  # [width, N]
    table = tf.constant(CRC32_TABLE)

    def step(i, crc):
        byte = tf.bitwise.bitwise_and(tf.bitwise.bitwise_xor(crc, data[i]), 0xFF)
        nxt = tf.bitwise.bitwise_xor(tf.gather(table, byte), tf.bitwise.right_shift(crc, 8))
        return i + 1, tf.where(i < lengths, nxt, crc)

    start = tf.fill(tf.shape(lengths), tf.constant(0xFFFFFFFF, tf.int64))
    _, crc = tf.while_loop(lambda i, _: i < width, step, [tf.constant(0), start])
    return tf.bitwise.bitwise_xor(crc, 0xFFFFFFFF)


def _refuse(cols: list, text, bad, why: str):
    """An Assert that no cell of `text` [B, len(cols)] is `bad`, naming the first bad one:
    "ctrtrain: column C: record N holds ["cell"]<why>" (train/predict.py reads it back), C the
    first column, in the columns' order, that holds one."""
    col = tf.argmax(tf.cast(tf.reduce_any(bad, 0), tf.int32), output_type=tf.int64)
    first = tf.argmax(tf.cast(bad[:, col], tf.int32), output_type=tf.int64)
    said = tf.strings.join([
        tf.gather(tf.constant([f"ctrtrain: column {c}: record " for c in cols]), col),
        tf.strings.as_string(first), " holds ",
        tf.strings.format("{}", [text[first:first + 1, col]]), why])
    return tf.debugging.Assert(~tf.reduce_any(bad), [said])


class RawGraph(tf.Module):
    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab
        s = vocab.schema
        self.columns = list(s.fields)
        self._base = dict(zip(s.categorical + s.lists, vocab.bases()))
        if vocab.mode == "vocab":
            # One table for every column, keyed `column NUL value`: a SavedModel traces each
            # table's three resource functions when it is saved, so a table a column cost
            # Criteo's export (26 columns) about 0.7 of its 2.3 CPU-s. A column name holds no NUL,
            # so the key's first NUL ends the column whatever the value holds. ("", 0), the
            # default's own value, keeps a vocabulary without values from an empty table.
            keys, ranks = [""], [0]
            for col, values in vocab.values.items():
                keys += [col + KEY_SEP + v for v in values]
                ranks += range(1, len(values) + 1)
            self._ranks = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant(keys, tf.string), tf.constant(ranks, tf.int64)), default_value=0)

    def _ids(self, col: str, values):
        """A multi-valued column's ids of `values` (strings, any shape): base + _found. In
        hash mode with declared fields the strings themselves (training's parser hashes them)."""
        if self.vocab.mode == "hash" and self.vocab.declared:
            return values
        return self._base[col] + self._found([col], values)

    def _found(self, cols: list, values):
        """Each value's bucket (hash mode: featurize's crc32 of `column NUL value`) or 1-based
        rank in its column's (or shared column's) vocabulary, 0 when unknown; `values`' last
        axis holds one column of `cols` each, or, for one column, any shape."""
        if self.vocab.mode == "hash":
            keyed = tf.constant([c + KEY_SEP for c in cols]) + values
            return tf.reshape(crc32(tf.reshape(keyed, [-1])), tf.shape(keyed)) % \
                self.vocab.hash_buckets
        owners = [self.vocab.schema.shared.get(c, c) for c in cols]
        return self._ranks.lookup(tf.constant([o + KEY_SEP for o in owners]) + values)

    # The single-valued columns go through the ops below all at once, [B, columns]: one op of
    # each kind instead of one per column (Criteo's 13 numeric and 26 categorical columns: the
    # transform's tracing took 0.7 of its export's 1.6 CPU-s), the same arithmetic on every
    # cell.

    def _categorical(self, cols: list, cells: dict):
        """The ids of single-valued categorical columns' cells [B, len(cols)], as _ids."""
        values = tf.stack([cells[c] for c in cols], 1)
        if self.vocab.mode == "hash" and self.vocab.declared:
            return values
        return tf.constant([self._base[c] for c in cols], tf.int64) + self._found(cols, values)

    def _numeric(self, cols: list, cells: dict):
        """scale_numeric of numeric columns' cells, [B, len(cols)] float32."""
        v = self.vocab
        text = tf.stack([cells[c] for c in cols], 1)
        missing = tf.equal(text, "")
        ok = missing | tf.strings.regex_full_match(text, NUMBER)
        with tf.control_dependencies([_refuse(cols, text, ~ok, " which is not a number")]):
            x = tf.strings.to_number(tf.where(missing, "0", text), tf.float64)
        raw = x
        if v.numeric_transform.startswith("log"):
            x = tf.sign(x) * tf.math.log1p(tf.abs(x))
        stats = [v.numeric_stats.get(c, {}) for c in cols]

        def per_column(values):
            return tf.constant(values, tf.float64)
        if v.numeric_transform in ("standard", "log-standard"):
            x = (x - per_column([s["mean"] for s in stats])) / per_column([s["std"] for s in stats])
        elif v.numeric_transform == "minmax":
            widths = [s["max"] - s["min"] for s in stats]
            x = (x - per_column([s["min"] for s in stats])) / \
                per_column([w if w > 0 else 1.0 for w in widths])
        x = tf.where(missing, tf.zeros_like(x), x)
        # What featurize refuses: 1e400 (inf as float64), or a value the transform carries
        # past float32.
        bad = ~tf.math.is_finite(raw) | (tf.abs(x) > FLOAT32_MAX)
        with tf.control_dependencies([_refuse(cols, text, bad, ", too large for "
                                              "--numeric-transform " + v.numeric_transform)]):
            return tf.cast(tf.round(x * 1e5) / 1e5, tf.float32)   # np.round(x, 5)

    def _bag(self, col: str, cells):
        items = tf.strings.split(cells, self.vocab.schema.separator)
        items = tf.ragged.boolean_mask(items, tf.not_equal(items, ""))
        return tf.ragged.map_flat_values(lambda v: self._ids(col, v), items)

    def parsed(self, cells: dict) -> dict:
        """The declared fields of these rows, as parse_example gives them for vocab.fields()."""
        s = self.vocab.schema
        out = {}
        if s.numeric:
            numbers = self._numeric(s.numeric, cells)
            out.update({c: numbers[:, j:j + 1] for j, c in enumerate(s.numeric)})
        if s.categorical:
            ids = self._categorical(s.categorical, cells)
            out.update({c: ids[:, j:j + 1] for j, c in enumerate(s.categorical)})
        out.update({c: self._bag(c, cells[c]) for c in s.lists})
        return out

    def fixed(self, cells: dict) -> dict:
        """The fixed schema's ids and values [B, F] of these rows."""
        s = self.vocab.schema
        rows = tf.shape(cells[self.columns[0]])[0]
        k, n = len(s.numeric), len(s.categorical)
        ids, values = [], []
        if k:   # a numeric column's id is its index; its value the scaled number
            ids.append(tf.tile(tf.range(k, dtype=tf.int64)[None], [rows, 1]))
            values.append(self._numeric(s.numeric, cells))
        if n:
            ids.append(self._categorical(s.categorical, cells))
            values.append(tf.ones([rows, n], tf.float32))
        return {"ids": tf.concat(ids, 1), "values": tf.concat(values, 1)}
