"""DeepFM as the public SageMaker DeepFM sample defines it, on plain tf.Module.

logit = bias + sum_f w[id_f] x_f                           (first order)
      + 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2]          (FM second order, e_f = V[id_f] x_f)
      + MLP(concat_f e_f)                                  (deep part)

No Keras: Keras 3 breaks under ParameterServerStrategy (DESIGN.md 4), and tables must be able
to become sharded variables. w and V live in one table `fm_table[feature_size, 1 + k]`
(column 0 is w): the maths is the sample's, but a batch then pays for one lookup, one
de-duplication and one sparse update instead of two, which is most of a step's cost on a
large table. Rows are looked up with `tf.nn.embedding_lookup`, which also serves a list of
shards, so gradients stay IndexedSlices of the rows a batch touched.
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
    dropout: float = 0.0          # drop *rate* of the deep layers' outputs
    batch_norm: bool = False
    l2_reg: float = 1e-6          # on the looked-up rows and on the MLP kernels
    mixed_precision: bool = False # bfloat16 MLP compute, float32 master weights
    seed: int = 0


class DeepFM(tf.Module):
    def __init__(self, cfg: DeepFMConfig, table_creator=None, name: str = "deepfm"):
        super().__init__(name=name)
        self.cfg = cfg
        make_table = table_creator or (lambda name, shape, init: tf.Variable(init(shape), name=name))
        k = cfg.embedding_size
        init_v = tf.random_normal_initializer(0.0, 0.01, seed=cfg.seed)
        self.table = make_table("fm_table", (cfg.feature_size, 1 + k),
                                lambda shape: tf.concat([tf.zeros(shape[:1] + (1,)),
                                                         init_v(shape[:1] + (shape[1] - 1,))], 1))
        self.bias = tf.Variable(0.0, name="bias")
        self.kernels, self.biases, self.bn = [], [], []
        width = cfg.field_size * k
        glorot = tf.initializers.GlorotUniform(seed=cfg.seed + 1)
        for i, units in enumerate(list(cfg.deep_layers) + [1]):
            self.kernels.append(tf.Variable(glorot((width, units)), name=f"kernel_{i}"))
            self.biases.append(tf.Variable(tf.zeros([units]), name=f"bias_{i}"))
            if cfg.batch_norm and i < len(cfg.deep_layers):
                self.bn.append(_BatchNorm(units, name=f"bn_{i}"))
            width = units

    @property
    def embedding_tables(self):
        return [self.table]

    def dense_variables(self):
        bn = [v for b in self.bn for v in (b.gamma, b.beta)]
        return [self.bias] + self.kernels + self.biases + bn

    def __call__(self, ids, values, training: bool = False):
        """Returns (logits [B], l2 penalty of what this batch used)."""
        cfg = self.cfg
        x = tf.expand_dims(values, -1)                                   # [B, F, 1]
        rows = tf.nn.embedding_lookup(self.table, ids)                   # [B, F, 1 + k]
        scaled = rows * x
        first = tf.reduce_sum(scaled[:, :, 0], 1)
        emb = scaled[:, :, 1:]                                           # [B, F, k]
        summed = tf.reduce_sum(emb, 1)
        fm = 0.5 * tf.reduce_sum(tf.square(summed) - tf.reduce_sum(tf.square(emb), 1), 1)
        h = tf.reshape(emb, [-1, cfg.field_size * cfg.embedding_size])
        dtype = tf.bfloat16 if cfg.mixed_precision else tf.float32
        h = tf.cast(h, dtype)
        n_hidden = len(cfg.deep_layers)
        for i, (kern, b) in enumerate(zip(self.kernels, self.biases)):
            h = tf.matmul(h, tf.cast(kern, dtype)) + tf.cast(b, dtype)
            if i < n_hidden:
                if self.bn:
                    h = tf.cast(self.bn[i](tf.cast(h, tf.float32), training), dtype)
                h = tf.nn.relu(h)
                if training and cfg.dropout > 0:
                    h = tf.nn.dropout(h, rate=cfg.dropout)
        deep = tf.cast(h[:, 0], tf.float32)
        logits = self.bias + first + fm + deep
        l2 = 0.0
        if cfg.l2_reg:
            batch = tf.cast(tf.shape(ids)[0], tf.float32)
            l2 = cfg.l2_reg * (tf.reduce_sum(tf.square(rows)) / batch
                               + tf.add_n([tf.reduce_sum(tf.square(k)) for k in self.kernels]))
        return logits, l2


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
            self.mean.assign(self.momentum * self.mean + (1 - self.momentum) * mean)
            self.var.assign(self.momentum * self.var + (1 - self.momentum) * var)
        else:
            mean, var = self.mean, self.var
        return tf.nn.batch_normalization(h, mean, var, self.beta, self.gamma, self.eps)
