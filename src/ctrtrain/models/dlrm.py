"""DLRM (Naumov et al., 2019, "Deep Learning Recommendation Model for Personalization and
Recommendation Systems").

z      = bottom MLP(the numeric fields' values)      (ReLU on every layer, its last k wide)
v      = [z, e_1, ..., e_S]                          (e_s = V[id_s] x_s: the categorical fields,
                                                      multi-valued ones pooled)
logit  = bias + top MLP([z, <v_i, v_j> for i < j])  (the dot interaction, no self-products)

The numeric fields enter through the bottom MLP, not through rows of the table. Without
declared numeric fields (the fixed schema, whose values scale ids' rows) there is no bottom
MLP: the top MLP reads the dot products of the embeddings alone. Option `bottom_layers`: the
bottom MLP's hidden widths (the embedding width k is appended, as the paper requires for
the dot products). The top MLP is the model's `deep_layers` with one linear output unit.
DeepCTR has no DLRM; FuxiCTR's DLRM (interaction "dot") is the same model.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .base import CTRModel
from .blocks import MLP


class DLRM(CTRModel):
    first_order = False

    def build(self, cfg):
        k, n = cfg.embedding_size, cfg.numeric_fields
        self.bottom = None
        if n:
            self.bottom = MLP(n, list(self.options["bottom_layers"]) + [k], seed=cfg.seed + 2,
                              linear_last=False, name="bottom")
        count = cfg.field_size - n + (1 if n else 0)       # vectors that interact
        i, j = np.triu_indices(count, 1)
        self.pairs = tf.constant(i * count + j, tf.int32)   # in the flattened [count, count]
        width = len(i) + (k if n else 0)
        self.top = MLP(width, list(cfg.deep_layers) + [1], cfg.rates(), cfg.batch_norm,
                       seed=cfg.seed + 1, mixed_precision=cfg.mixed_precision, xla=cfg.xla,
                       name="top")
        return [b for b in (self.bottom, self.top) if b is not None]

    def terms(self, embedded, training):
        vectors = embedded.categorical()                               # [B, S, k]
        if self.bottom is not None:
            z = self.bottom(embedded.numeric, training)                # [B, k]
            vectors = tf.concat([z[:, None, :], vectors], 1)
        count = vectors.shape[1]
        dots = tf.reshape(tf.matmul(vectors, vectors, transpose_b=True), [-1, count * count])
        top = tf.gather(dots, self.pairs, axis=1)
        if self.bottom is not None:
            top = tf.concat([z, top], 1)
        return [self.top(top, training)[:, 0]]
