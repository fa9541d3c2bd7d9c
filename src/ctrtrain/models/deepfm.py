"""DeepFM (Guo et al., 2017) as the public SageMaker DeepFM sample defines it.

logit = bias + sum_f w[id_f] x_f                           (first order)
      + 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2]          (FM second order, e_f = V[id_f] x_f)
      + MLP(concat_f e_f)                                  (deep part)

w and V share the table (column 0 is w: engine/tables.py). The MLP reads the whole
[B, F, 1 + k] block through a first kernel whose rows facing column 0 (w) are held at zero by a
constant mask, so the deep part sees exactly the embeddings, as in DeepFM, and nothing slices
the block by column (the gradients of such slices cost more than the FM itself). DeepFM has no
attention: a sequence field is pooled as its declaration says, like a multi_hot one.
"""

from __future__ import annotations

import tensorflow as tf

from .base import CTRModel
from .blocks import MLP, first_and_fm


class DeepFM(CTRModel):
    def build(self, cfg):
        k1 = 1 + cfg.embedding_size
        mask = tf.constant(([0.0] + [1.0] * cfg.embedding_size) * cfg.field_size,
                           shape=[cfg.field_size * k1, 1], dtype=tf.float32)
        self.mlp = MLP(cfg.field_size * k1, list(cfg.deep_layers) + [1], cfg.rates(),
                       cfg.batch_norm, seed=cfg.seed + 1, input_mask=mask,
                       mixed_precision=cfg.mixed_precision, xla=cfg.xla)
        return [self.mlp]

    def terms(self, embedded, training):
        first, fm = first_and_fm(embedded.block)
        return [first, fm, self.mlp(embedded.flat(), training)[:, 0]]
