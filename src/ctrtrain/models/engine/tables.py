"""The embedding table every model reads: one variable, its lookup, and the pooling of bags.

One table `[feature_size + numeric fields, width]` holds every id's row; width is k, plus one
column in front (column 0) for a model with a first-order (linear) weight per id: FM, DeepFM,
Wide & Deep and LR (k = 0) read w and V with one lookup, one de-duplication and one sparse
update instead of two, which is most of a step's cost on a large table.

A batch's ids are de-duplicated once, in the forward pass: the distinct rows are looked up
(with `tf.nn.embedding_lookup`, which also serves a table partitioned into shards on parameter
servers) and spread to the batch locally, so the table's gradient arrives as IndexedSlices
already summed per distinct row (`unique_gradients`) and the optimizer need not de-duplicate
again. With Zipf-distributed ids a batch of 1024 x 39 ids touches only a few thousand rows.

Declared fields (data/schema.py) enter the same block, one slot per field:
  - a numeric field (numeric_input embedding) is a row of its own (after the data's ids:
    feature_size + j) scaled by its value, as the paper's dense features (and the fixed
    schema's value per id) are; with numeric_input value it has neither row nor slot, and
    the models read its value (Embedded.numeric, deep_input); with both, its row and slot
    and its value in deep_input too;
  - a multi_hot or sequence field is the pooled sum of its ids' rows times their weights
    (divided by the weights' sum for `mean`, by the root of their squares' sum for `sqrtn`; 0
    for an empty bag). Its ids join the batch's one de-duplication, so a bag costs O(its ids),
    and the padding (-1) is never looked up.
"""

from __future__ import annotations

import tensorflow as tf

from ... import kernels


def shards(var) -> list:
    """A ShardedVariable's shards, or [var]."""
    if not isinstance(var, tf.Variable) and hasattr(var, "variables"):
        return list(var.variables)
    return [var]


def rows_by_shard(var, rows) -> list:
    """[(shard, the `rows` [n] it holds, as its own rows; where they are in `rows`)] of a
    table (one shard) or a ShardedVariable's row blocks."""
    out, offset = [], 0
    for shard in shards(var):
        n = shard.shape[0]
        at = tf.where(tf.logical_and(rows >= offset, rows < offset + n))[:, 0]
        out.append((shard, tf.gather(rows, at) - offset, at))
        offset += n
    return out if len(out) > 1 else [(var, rows, None)]


class Embedded:
    """A batch's looked-up fields: `block` [B, F, width], each field's row times its value (a
    bag's pooled rows), fields in the data's order (single ids, numeric, bags); `numeric` the
    declared numeric fields' values [B, n] as the data holds them (None without any), whose
    slots in the block start at `numeric_at` (None: they have none), and which the deep part's
    input takes as they are where `append_values`. `lookup` (the table's _Lookup) lets a model read
    past the block: a single field's rows, a bag's rows unpooled, the block with a bag's slot
    replaced -- each straight from the batch's distinct rows, so that its gradient reaches them
    in one pass, not through slices of the block."""

    def __init__(self, block, first_order: bool, numeric=None, numeric_at: int | None = 0,
                 lookup=None, append_values: bool = False):
        self.block, self.first_order = block, first_order
        self.numeric, self.numeric_at = numeric, numeric_at   # numeric_at None: no slots
        self.append_values = append_values and numeric is not None
        self._lookup = lookup

    def categorical(self):
        """[B, F - n, width]: the block without the numeric fields' slots (for a model that
        reads the numeric values themselves)."""
        if self.numeric is None or self.numeric_at is None:
            return self.block
        a, b = self.numeric_at, self.numeric_at + self.numeric.shape[1]
        return tf.concat([self.block[:, :a], self.block[:, b:]], 1)

    def vectors(self):
        """[B, F, k]: the embeddings alone (without the first-order column). A split, not a
        slice: its gradient is one concat, where a strided slice's zero-fills and scatters
        (2.1 ms of DCN-v2's 29 ms step at the reference shapes)."""
        if not self.first_order:
            return self.block
        return tf.split(self.block, [1, self.block.shape[2] - 1], axis=2)[1]

    def flat(self):
        """[B, F * width]: the block as one row per example."""
        return tf.reshape(self.block, [-1, self.block.shape[1] * self.block.shape[2]])

    def with_values(self, x):
        """x [B, d] followed by the numeric values where they enter as values."""
        if not self.append_values:
            return x
        return tf.concat([x, self.numeric], 1)

    def deep_input(self):
        """[B, slots * width (+ n)]: an MLP's input, the block flat and the numeric values
        where they enter as values."""
        return self.with_values(self.flat())

    def field_row(self, i: int):
        """[B, width]: the i-th single field's row times its value (the block's slot i)."""
        at = self._lookup
        where = tf.reshape(at.where_single, [-1, at.values.shape[1]])[:, i]
        return at.gather(where, at.values[:, i])

    def bag_rows(self, j: int):
        """(rows [B, L, width], held [B, L]) of the j-th bag (multi_hot or sequence field, in
        field order) unpooled: its ids' rows in the order the data holds them, zeros where a
        row holds fewer than L ids (held False there). For a model that weighs a history's
        items itself (DIN's attention) instead of reading the declared pooling. The rows are
        the ones the pooled slot was made of, so their gradients reach the same table rows."""
        at = self._lookup
        start, length = sum(at.lengths[:j]), at.lengths[j]
        is_held = at.bag_ids[:, start:start + length] >= 0
        # Each position's row among the distinct rows (-1 at the padding), then those rows
        # times 1 (held) or 0.
        where = tf.scatter_nd(at.held, at.where_held + 1, tf.shape(at.bag_ids, out_type=tf.int64))
        where = tf.reshape(tf.maximum(where[:, start:start + length] - 1, 0), [-1])
        rows = at.gather(where, tf.reshape(tf.cast(is_held, tf.float32), [-1]))
        return tf.reshape(rows, [-1, length, at.table_rows.shape[1]]), is_held

    def with_bag(self, j: int, x):
        """[B, F, width]: the block with the j-th bag's slot holding x [B, width] instead of its
        pooled rows (DIN's interest in place of the history)."""
        at = self._lookup
        pooled = tf.split(at.pooled, len(at.lengths), axis=1)
        pooled[j] = x[:, None, :]
        return tf.concat([at.single] + pooled, 1)


class _Lookup:
    """What the table's lookup of a batch made, for Embedded's reads past the block."""

    def __init__(self, table_rows, where_single, values, single, fused: bool):
        self.table_rows, self.where_single, self.values = table_rows, where_single, values
        self.single, self.fused = single, fused     # single: [B, S, width] the single fields
        # Bags: bag_ids [B, C], held [V, 2], where_held [V] (each held id's row among the
        # distinct rows), lengths (max_len of each bag), pooled [B, bags, width].
        self.bag_ids = self.held = self.where_held = self.pooled = None
        self.lengths = ()

    def gather(self, where, values):
        """[N, width]: table_rows[where[n]] * values[n]."""
        if self.fused and values.dtype == tf.float32:
            return kernels.scaled_gather(self.table_rows, where, values)
        return tf.gather(self.table_rows, where) * values[:, None]


# The embeddings' initial standard deviation where the model does not say
# (models/base.py CTRModel.embedding_init): the field's model zoos' 1e-4.
EMBEDDING_INIT = 1e-4


class EmbeddingTable(tf.Module):
    unique_gradients = True  # sparse gradients have distinct indices (see module docstring)

    def __init__(self, cfg, first_order: bool, name: str = "embeddings"):
        """`cfg`: the model's (models/base.py ModelConfig). Create inside a strategy's scope to
        distribute the table; under ParameterServerStrategy with a variable partitioner it
        becomes a ShardedVariable (row blocks on several servers), which the lookup and the
        optimizer both accept."""
        super().__init__(name=name)
        self.cfg, self.first_order = cfg, first_order
        k = cfg.embedding_size
        self.width = int(first_order) + k
        std = EMBEDDING_INIT if cfg.embedding_init is None else cfg.embedding_init
        init_v = tf.random_normal_initializer(0.0, std, seed=cfg.seed)
        rows = cfg.feature_size + cfg.numeric_fields - cfg.numeric_slotless
        if first_order:
            init = lambda: tf.concat([tf.zeros([rows, 1]), init_v([rows, k])], 1)  # noqa: E731
        else:
            init = lambda: init_v([rows, k])  # noqa: E731
        self.table = tf.Variable(init, name="fm_table", shape=(rows, self.width), dtype=tf.float32)
        # The bag (multi_hot or sequence field) each column of bag_ids belongs to.
        self.bag_of_column = tuple(j for j, (max_len, _) in enumerate(cfg.bags)
                                   for _ in range(max_len))

    def renew(self, rows, step):
        """Rows given to new ids (a dynamic field's pool) set to a new row's values: the
        first-order weight 0, the embedding drawn as at the start, seeded by the run's seed,
        the step and the rows: the replicas of a synchronous step, which claim the same rows,
        draw the same; two asynchronous workers at one step (parameter servers), which claim
        others, draw differently."""
        k = self.width - int(self.first_order)
        std = EMBEDDING_INIT if self.cfg.embedding_init is None else self.cfg.embedding_init
        n = tf.shape(rows)[0]
        which = tf.math.floormod(tf.reduce_sum(tf.cast(rows, tf.int64)), 1 << 31)
        fresh = std * tf.random.stateless_normal(
            tf.stack([n, k]), tf.stack([tf.cast(self.cfg.seed, tf.int64),
                                        tf.cast(step, tf.int64) * (1 << 31) + which]))
        if self.first_order:
            fresh = tf.concat([tf.zeros([n, 1]), fresh], 1)
        for shard, own, at in rows_by_shard(self.table, rows):
            tf.raw_ops.ResourceScatterUpdate(resource=shard.handle, indices=own,
                                             updates=fresh if at is None else tf.gather(fresh, at))

    @property
    def variables_to_update(self):
        """The table's variables: itself, or its shards when partitioned (gradients and
        sparse updates address the shards; a ShardedVariable has no handle of its own)."""
        return shards(self.table)

    def __call__(self, features, read_rows=None) -> Embedded:
        """The batch's features (ids, values; with declared fields also numeric, bag_ids,
        bag_weights: data/schema.py) looked up. `read_rows(table, rows)`: the optimizer's
        lookup (updates.py Optimizer.read_rows: a catch-up optimizer applies skipped steps
        only when a row is next updated, and reads rows as they would be now); by default
        the rows as stored."""
        cfg, width = self.cfg, self.width
        ids, values = features["ids"], features["values"]
        numeric_at = ids.shape[1] if not cfg.numeric_slotless else None
        if cfg.numeric_fields and not cfg.numeric_slotless:
            numeric = features["numeric"]
            rows_of_numeric = tf.range(cfg.feature_size, cfg.feature_size + cfg.numeric_fields,
                                       dtype=ids.dtype)
            ids = tf.concat([ids, tf.zeros_like(numeric, ids.dtype) + rows_of_numeric], 1)
            values = tf.concat([values, numeric], 1)
        single = tf.reshape(ids, [-1])
        fused = kernels.usable_here()
        if cfg.bags:
            bag_ids = features["bag_ids"]
            if fused and bag_ids.dtype == tf.int64:
                held, held_ids = kernels.held(bag_ids)
            else:
                held = tf.where(bag_ids >= 0)                             # [V, 2] (row, column)
                held_ids = tf.gather_nd(bag_ids, held)
            lookup = tf.concat([single, held_ids], 0)
        else:
            lookup = single
        distinct, where = (kernels.unique(lookup) if fused and lookup.dtype == tf.int64
                           else tf.unique(lookup))
        table_rows = (read_rows(self.table, distinct) if read_rows is not None    # [U, width]
                      else tf.nn.embedding_lookup(self.table, distinct))
        if cfg.bags:
            # Explicit batch size: a data set of bags only has no single fields to infer it.
            batch = tf.shape(ids, out_type=tf.int64)[0]
            n_single = tf.size(single)
            where_single, shape = where[:n_single], tf.stack([batch, ids.shape[1], width])
        else:
            where_single, shape = where, [-1, ids.shape[1], width]
        if values.dtype == tf.float32 and fused:    # one pass, and a fused gradient
            scaled = tf.reshape(kernels.scaled_gather(table_rows, where_single,
                                                      tf.reshape(values, [-1])), shape)
        else:
            scaled = (tf.reshape(tf.gather(table_rows, where_single), shape)
                      * tf.expand_dims(values, -1))                    # [B, S, width]
        lookup = _Lookup(table_rows, where_single, values, scaled, fused)
        if cfg.bags:
            where_held, weights = where[n_single:], features["bag_weights"]
            if fused and weights.dtype == tf.float32:     # one pass, and a fused gradient
                pooled = kernels.bag_pool(table_rows, where_held, held, weights,
                                          self.bag_of_column, [p for _, p in cfg.bags])
            else:
                pooled = self._pooled(weights, held, tf.gather(table_rows, where_held), batch)
            scaled = tf.concat([scaled, pooled], 1)
            lookup.bag_ids, lookup.held, lookup.where_held = bag_ids, held, where_held
            lookup.pooled, lookup.lengths = pooled, tuple(max_len for max_len, _ in cfg.bags)
        return Embedded(scaled, self.first_order,
                        features["numeric"] if cfg.numeric_fields else None, numeric_at, lookup,
                        append_values=bool(cfg.numeric_appended))

    def _pooled(self, bag_weights, held, held_rows, batch):
        """[B, bags, width]: each bag's rows (one per held id, `held` its (row, column))
        weighted and pooled as the field declares."""
        n_bags = len(self.cfg.bags)
        w = tf.gather_nd(bag_weights, held)                               # [V]
        segment = held[:, 0] * n_bags + tf.gather(tf.constant(self.bag_of_column, tf.int64),
                                                   held[:, 1])
        pooled = tf.math.unsorted_segment_sum(held_rows * w[:, None], segment, batch * n_bags)
        poolings = [p for _, p in self.cfg.bags]
        if any(p != "sum" for p in poolings):
            wsum = tf.math.unsorted_segment_sum(w, segment, batch * n_bags)
            sqsum = tf.math.unsorted_segment_sum(tf.square(w), segment, batch * n_bags)
            by_bag = tf.constant([kernels.POOLINGS[p] for p in poolings])   # the kernel's codes
            kind = tf.tile(by_bag, tf.reshape(tf.cast(batch, tf.int32), [1]))
            denom = tf.where(kind == kernels.POOLINGS["mean"], wsum,
                             tf.where(kind == kernels.POOLINGS["sqrtn"], tf.sqrt(sqsum), 1.0))
            pooled = tf.math.divide_no_nan(pooled, denom[:, None])
        return tf.reshape(pooled, [-1, n_bags, self.width])
