"""DeepFM as the public SageMaker DeepFM sample defines it, on plain tf.Module.

logit = bias + sum_f w[id_f] x_f                           (first order)
      + 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2]          (FM second order, e_f = V[id_f] x_f)
      + MLP(concat_f e_f)                                  (deep part)

No Keras: Keras 3 breaks under ParameterServerStrategy (DESIGN.md 4), and tables must be able
to become sharded variables. w and V live in one table `fm_table[feature_size, 1 + k]`
(column 0 is w): the maths is the sample's, but a batch then pays for one lookup, one
de-duplication and one sparse update instead of two, which is most of a step's cost on a
large table. A batch's ids are de-duplicated once, in the forward pass: the distinct rows are
looked up (with `tf.nn.embedding_lookup`, which also serves sharded tables) and spread to the
batch locally, so the table's gradient arrives as IndexedSlices already summed per distinct
row (`unique_gradients`) and the optimizer need not de-duplicate again. With Zipf-distributed
ids a batch of 1024 x 39 ids touches only a few thousand rows.

Nothing slices the [B, F, 1 + k] block by column (the gradients of such slices cost more than
the FM itself): the first-order and FM terms slice the small per-example sums [B, 1 + k], and
the MLP reads the whole block through a first kernel whose rows facing column 0 (w) are held at
zero by a constant mask, so the deep part sees exactly the embeddings, as in DeepFM.

Declared fields (data/schema.py) enter the same block, one slot per field:
  - a numeric field is a row of its own (after the data's ids: feature_size + j) scaled by its
    value, as the paper's dense features (and the fixed schema's value per id) are;
  - a multi_hot field is the pooled sum of its ids' rows times their weights (divided by the
    weights' sum for `mean`, by the root of their squares' sum for `sqrtn`; 0 for an empty
    bag): one field of the FM, first-order weight included. DeepFM has no attention, so a
    sequence field is pooled the same way, as its declaration says. Its ids join the batch's one
    de-duplication, so a bag costs O(its ids), and the padding (-1) is never looked up.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass
class DeepFMConfig:
    feature_size: int
    field_size: int
    embedding_size: int = 16
    deep_layers: tuple[int, ...] = (256, 128, 64)
    dropout: float | tuple[float, ...] = 0.0   # drop *rate* of the deep layers' outputs (or
                                               # one per layer)
    batch_norm: bool = False
    l2_dense: float = 0.0         # l2_dense * tf.nn.l2_loss(kernel) per MLP kernel (the table's
                                  # L2 is its optimizer's: models/optimizers.py)
    mixed_precision: bool = False # bfloat16 MLP compute, float32 master weights
    xla: bool = False             # XLA-compile the MLP (the sparse part has dynamic shapes)
    seed: int = 0
    initial_bias: float = 0.0     # the output bias at the start: logit of the positive rate
    numeric_fields: int = 0       # declared numeric fields: rows feature_size .. + this
    bags: tuple[tuple[int, str], ...] = ()   # (max_len, pooling) of each multi_hot or
                                             # sequence field, in field order

    def rates(self) -> tuple[float, ...]:
        d = self.dropout
        return tuple(d) if isinstance(d, (tuple, list)) else (float(d),) * len(self.deep_layers)


class DeepFM(tf.Module):
    unique_gradients = True  # sparse gradients have distinct indices (see module docstring)

    def __init__(self, cfg: DeepFMConfig, name: str = "deepfm"):
        """Create inside a strategy's scope to distribute the variables; under
        ParameterServerStrategy with a variable partitioner the table becomes a ShardedVariable
        (row blocks on several servers), which the lookup and the optimizer both accept."""
        super().__init__(name=name)
        self.cfg = cfg
        k = cfg.embedding_size
        init_v = tf.random_normal_initializer(0.0, 0.01, seed=cfg.seed)
        rows = cfg.feature_size + cfg.numeric_fields
        self.table = tf.Variable(
            lambda: tf.concat([tf.zeros([rows, 1]), init_v([rows, k])], 1),
            name="fm_table", shape=(rows, 1 + k), dtype=tf.float32)
        # The bag (multi_hot or sequence field) each column of bag_ids belongs to.
        self.bag_of_column = tf.constant(
            [j for j, (max_len, _) in enumerate(cfg.bags) for _ in range(max_len)], tf.int64)
        # Starting at the data's base rate, early steps are calibrated on rare-positive data
        # instead of spending themselves on moving the bias from 0.5.
        self.bias = tf.Variable(float(cfg.initial_bias), name="bias")
        self.kernels, self.biases, self.bn = [], [], []
        width = cfg.field_size * (1 + k)
        self.input_mask = tf.constant(
            ([0.0] + [1.0] * k) * cfg.field_size, shape=[width, 1], dtype=tf.float32)
        glorot = tf.initializers.GlorotUniform(seed=cfg.seed + 1)
        for i, units in enumerate(list(cfg.deep_layers) + [1]):
            init = glorot((width, units))
            if i == 0:
                init = init * self.input_mask
            self.kernels.append(tf.Variable(init, name=f"kernel_{i}"))
            self.biases.append(tf.Variable(tf.zeros([units]), name=f"bias_{i}"))
            if cfg.batch_norm and i < len(cfg.deep_layers):
                self.bn.append(_BatchNorm(units, name=f"bn_{i}"))
            width = units
        self._mlp = tf.function(self._mlp_eager, jit_compile=True) if cfg.xla else self._mlp_eager

    @property
    def embedding_tables(self):
        """The table's variables: itself, or its shards when partitioned (gradients and
        sparse updates address the shards; a ShardedVariable has no handle of its own)."""
        return shards(self.table)

    def dense_variables(self):
        bn = [v for b in self.bn for v in (b.gamma, b.beta)]
        return [v for var in [self.bias] + self.kernels + self.biases + bn for v in shards(var)]

    def __call__(self, features, training: bool = False, row_correction=None):
        """Returns (logits [B], the MLP kernels' L2 penalty) of a batch's features (ids,
        values; with declared fields also numeric, bag_ids, bag_weights: data/schema.py).
        `row_correction(table, rows)`: the optimizer's offset of stored rows from their
        current values (a catch-up optimizer applies skipped steps only when a row is next
        updated), read without gradient."""
        cfg = self.cfg
        k1 = 1 + cfg.embedding_size
        ids, values = features["ids"], features["values"]
        if cfg.numeric_fields:
            numeric = features["numeric"]
            rows_of_numeric = tf.range(cfg.feature_size, cfg.feature_size + cfg.numeric_fields,
                                       dtype=ids.dtype)
            ids = tf.concat([ids, tf.zeros_like(numeric, ids.dtype) + rows_of_numeric], 1)
            values = tf.concat([values, numeric], 1)
        single = tf.reshape(ids, [-1])
        if cfg.bags:
            bag_ids = features["bag_ids"]
            held = tf.where(bag_ids >= 0)                                 # [V, 2] (row, column)
            lookup = tf.concat([single, tf.gather_nd(bag_ids, held)], 0)
        else:
            lookup = single
        distinct, where = tf.unique(lookup)
        table_rows = tf.nn.embedding_lookup(self.table, distinct)        # [U, 1 + k]
        if row_correction is not None and isinstance(self.table, tf.Variable):
            offset = row_correction(self.table, distinct, stored=table_rows)
            if offset is not None:
                table_rows = table_rows - tf.stop_gradient(offset)
        if cfg.bags:
            # Explicit batch size: a data set of bags only has no single fields to infer it.
            batch = tf.shape(ids, out_type=tf.int64)[0]
            n_single = tf.size(single)
            rows = tf.reshape(tf.gather(table_rows, where[:n_single]),
                              tf.stack([batch, ids.shape[1], k1]))
        else:
            rows = tf.reshape(tf.gather(table_rows, where), [-1, ids.shape[1], k1])
        scaled = rows * tf.expand_dims(values, -1)                       # [B, S, 1 + k]
        if cfg.bags:
            scaled = tf.concat([scaled, self._pooled(features["bag_weights"], held,
                                                     tf.gather(table_rows, where[n_single:]),
                                                     batch)], 1)
        summed = tf.reduce_sum(scaled, 1)                                # [B, 1 + k]
        first = summed[:, 0]
        fm = 0.5 * tf.reduce_sum((tf.square(summed) - tf.reduce_sum(tf.square(scaled), 1))[:, 1:], 1)
        deep = self._mlp(tf.reshape(scaled, [-1, cfg.field_size * k1]), training)
        logits = self.bias + first + fm + deep
        l2 = 0.0
        if cfg.l2_dense:
            l2 = cfg.l2_dense * tf.add_n([tf.nn.l2_loss(k) for k in self.kernels])
        return logits, l2


    def _pooled(self, bag_weights, held, held_rows, batch):
        """[B, bags, 1 + k]: each bag's rows (one per held id, `held` its (row, column))
        weighted and pooled as the field declares."""
        n_bags = len(self.cfg.bags)
        w = tf.gather_nd(bag_weights, held)                               # [V]
        segment = held[:, 0] * n_bags + tf.gather(self.bag_of_column, held[:, 1])
        pooled = tf.math.unsorted_segment_sum(held_rows * w[:, None], segment, batch * n_bags)
        poolings = [p for _, p in self.cfg.bags]
        if any(p != "sum" for p in poolings):
            wsum = tf.math.unsorted_segment_sum(w, segment, batch * n_bags)
            sqsum = tf.math.unsorted_segment_sum(tf.square(w), segment, batch * n_bags)
            norm = {"sum": None, "mean": 0, "sqrtn": 1}
            by_bag = tf.constant([norm[p] if norm[p] is not None else -1 for p in poolings])
            kind = tf.tile(by_bag, tf.reshape(tf.cast(batch, tf.int32), [1]))
            denom = tf.where(kind == 0, wsum, tf.where(kind == 1, tf.sqrt(sqsum), 1.0))
            pooled = tf.math.divide_no_nan(pooled, denom[:, None])
        return tf.reshape(pooled, [-1, n_bags, 1 + self.cfg.embedding_size])

    def _mlp_eager(self, h, training: bool):
        cfg = self.cfg
        dtype = tf.bfloat16 if cfg.mixed_precision else tf.float32
        h = tf.cast(h, dtype)
        n_hidden = len(cfg.deep_layers)
        for i, (kern, b) in enumerate(zip(self.kernels, self.biases)):
            if i == 0:
                kern = kern * self.input_mask  # the deep part never reads w
            h = tf.matmul(h, tf.cast(kern, dtype)) + tf.cast(b, dtype)
            if i < n_hidden:
                if self.bn:
                    h = tf.cast(self.bn[i](tf.cast(h, tf.float32), training), dtype)
                h = tf.nn.relu(h)
                rate = cfg.rates()[i]
                if training and rate > 0:
                    h = tf.nn.dropout(h, rate=rate)
        return tf.cast(h[:, 0], tf.float32)


def shards(var) -> list:
    """A ShardedVariable's shards, or [var]."""
    if not isinstance(var, tf.Variable) and hasattr(var, "variables"):
        return list(var.variables)
    return [var]


class _BatchNorm(tf.Module):
    def __init__(self, units: int, momentum: float = 0.99, eps: float = 1e-3, name=None):
        super().__init__(name=name)
        self.gamma = tf.Variable(tf.ones([units]), name="gamma")
        self.beta = tf.Variable(tf.zeros([units]), name="beta")
        self.mean = tf.Variable(tf.zeros([units]), trainable=False, name="moving_mean")
        self.var = tf.Variable(tf.ones([units]), trainable=False, name="moving_var")
        self.momentum, self.eps = momentum, eps

    def __call__(self, h, training):
        if training:
            mean, var = tf.nn.moments(h, [0])
            # On the handle: under a mirrored strategy each replica keeps moving statistics of
            # its own batches (the chief's are exported), as the optimizer updates its copy.
            for stat, batch_value in ((self.mean, mean), (self.var, var)):
                tf.raw_ops.AssignVariableOp(
                    resource=stat.handle,
                    value=self.momentum * stat + (1 - self.momentum) * batch_value)
        else:
            mean, var = self.mean, self.var
        return tf.nn.batch_normalization(h, mean, var, self.beta, self.gamma, self.eps)
