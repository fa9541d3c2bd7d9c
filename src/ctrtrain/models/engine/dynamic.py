"""Raw 64-bit ids onto a pool of table rows that new ids claim and old ones give back: the
id map of a dynamic field (issue 57: an id space that never stops growing).

A fixed table gives every id a row known in advance (a vocabulary, or a hash bucket that it
shares with every id hashed alike). A dynamic field instead maps each raw id (a hash of the
raw value, any int64) to a row of its own, claimed when the id is first seen -- or, with
`admit` N, when it has been seen N times; until then it reads the pool's shared row 0 and
only its count is kept -- and given back when the pool is full and a new id needs one: the
least frequently seen row goes first, among those not read by the batch at hand, and rows
not seen for `ttl` steps go before any other. The pool is `rows` rows of the one embedding
table (base .. base + rows - 1, as a hashed field's buckets are), so the table's optimizer,
its sharding over parameter servers, its checkpoints and export serve it unchanged; what a
row claimed by a new id held before is reset by its caller (the rows `assign` returns).

This is the managed-collision design (TorchRec's MCH modules, Monolith's collisionless
tables, DeepRec's admission and eviction) over TensorFlow's own MutableHashTable: the id ->
slot map is checkpointed with the model (tf.train.Checkpoint tracks it), and the memory is
the pool's, a cap the user sets, whatever the number of ids the stream brings.

Per slot three variables: the key holding it, its count (times seen while it held the
slot), and the step it was last seen (-1: free). Every choice is deterministic (ties go to
the lower slot), so processes that assign the same batches in the same order agree.
"""

from __future__ import annotations

import tensorflow as tf

_FREE = -1          # `seen` of a free slot
_NEVER = -(2 ** 62)  # priority of a slot that cannot be given: slot 0, or read by this batch


class DynamicIds(tf.Module):
    def __init__(self, rows: int, base: int = 0, admit: int = 1, ttl: int = 0,
                 name: str = "dynamic_ids"):
        super().__init__(name=name)
        if rows < 2:
            raise ValueError("a dynamic field's pool needs at least 2 rows (row 0 is shared)")
        self.rows, self.base, self.admit, self.ttl = int(rows), int(base), int(admit), int(ttl)
        self.slots = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, -1,
                                                             name="slots")
        self.pending = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, 0,
                                                               name="pending") \
            if self.admit > 1 else None
        self.key = tf.Variable(tf.zeros([rows], tf.int64), trainable=False, name="key")
        self.count = tf.Variable(tf.zeros([rows], tf.int64), trainable=False, name="count")
        self.seen = tf.Variable(tf.fill([rows], tf.constant(_FREE, tf.int64)), trainable=False,
                                name="seen")
        # Slots never held yet: fresh .. rows - 1. Until the pool first fills, new ids take
        # them in order, O(new ids) a step; then every claim ranks the whole pool, O(rows).
        self.fresh = tf.Variable(tf.constant(1, tf.int64), trainable=False, name="fresh")

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """Table rows of `keys` without changing anything (evaluation, serving): an id with no
        row of its own reads row 0 of the pool."""
        slot = self.slots.lookup(tf.cast(keys, tf.int64))
        return self.base + tf.maximum(slot, 0)

    def assign(self, keys: tf.Tensor, step) -> tuple[tf.Tensor, tf.Tensor]:
        """(table rows of `keys`, the rows claimed by new ids in this call): counts and
        last-seen steps updated, new ids admitted into free or given-back slots. The caller
        resets the claimed rows (their vectors and optimizer state) before reading them."""
        step = tf.cast(step, tf.int64)
        flat = tf.reshape(tf.cast(keys, tf.int64), [-1])
        unique, where, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
        counts = tf.cast(counts, tf.int64)
        slot = tf.reshape(self.slots.lookup(unique), [-1])   # a known rank, for the masks
        found = slot >= 0
        held = tf.boolean_mask(slot, found)
        self.count.scatter_add(tf.IndexedSlices(tf.boolean_mask(counts, found), held))
        self.seen.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(held), step), held))
        new, new_counts = tf.boolean_mask(unique, ~found), tf.boolean_mask(counts, ~found)
        if self.pending is not None:
            so_far = tf.reshape(self.pending.lookup(new), [-1]) + new_counts
            ready = so_far >= self.admit
            self.pending.insert(tf.boolean_mask(new, ~ready), tf.boolean_mask(so_far, ~ready))
            self.pending.remove(tf.boolean_mask(new, ready))
            new, new_counts = tf.boolean_mask(new, ready), tf.boolean_mask(so_far, ready)
        claimed = self._claim(new, new_counts, step)
        rows = self.base + tf.maximum(tf.gather(tf.reshape(self.slots.lookup(unique), [-1]),
                                                where), 0)
        return tf.reshape(rows, tf.shape(keys)), self.base + claimed

    def _claim(self, new: tf.Tensor, new_counts: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        """Slots for the new ids, as many as can be given; returns them."""
        k = tf.size(new, out_type=tf.int64)
        chosen = tf.cond(self.fresh + k <= self.rows, lambda: self._fresh(k),
                         lambda: self._ranked(k, step))
        n = tf.size(chosen)
        given = tf.gather(self.key, chosen)
        was_held = tf.gather(self.seen, chosen) != _FREE
        self.slots.remove(tf.boolean_mask(given, was_held))
        keys, counts = new[:n], new_counts[:n]
        self.slots.insert(keys, chosen)
        self.key.scatter_update(tf.IndexedSlices(keys, chosen))
        self.count.scatter_update(tf.IndexedSlices(counts, chosen))
        self.seen.scatter_update(tf.IndexedSlices(tf.fill([n], step), chosen))
        return chosen

    def _fresh(self, k: tf.Tensor) -> tf.Tensor:
        first = self.fresh.read_value()
        with tf.control_dependencies([first]):
            self.fresh.assign_add(k)
        return tf.range(first, first + k)

    def _ranked(self, k: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        """Up to k slots by priority, once no slot is fresh."""
        self.fresh.assign(self.rows)
        seen, count = self.seen.read_value(), self.count.read_value()
        free = tf.equal(seen, _FREE)
        expired = tf.logical_and(~free, step - seen > self.ttl) if self.ttl else \
            tf.zeros_like(free)
        # Free slots first, then expired ones (the least seen first), then the least seen;
        # never slot 0 nor a slot this batch reads.
        priority = tf.where(free, tf.constant(2 ** 61, tf.int64),
                            tf.where(expired, 2 ** 60 - count, -count))
        blocked = tf.logical_or(tf.equal(tf.range(self.rows, dtype=tf.int64), 0),
                                tf.logical_and(~free, tf.equal(seen, step)))
        priority = tf.where(blocked, tf.constant(_NEVER, tf.int64), priority)
        best = tf.math.top_k(tf.cast(priority, tf.float64),
                             k=tf.cast(tf.minimum(k, self.rows), tf.int32), sorted=True)
        usable = best.values > float(_NEVER)
        return tf.cast(tf.boolean_mask(best.indices, usable), tf.int64)

    def live(self, step=None) -> tf.Tensor:
        """Slots held by an id (with `step` and a ttl: seen within the ttl)."""
        held = tf.not_equal(self.seen, _FREE)
        if step is not None and self.ttl:
            held = tf.logical_and(held, tf.cast(step, tf.int64) - self.seen <= self.ttl)
        return tf.reduce_sum(tf.cast(held, tf.int64))
