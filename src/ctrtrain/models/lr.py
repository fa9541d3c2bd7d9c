"""Logistic regression: logit = bias + sum_f w[id_f] x_f.

The table is one column wide (the first-order weight alone, engine/tables.py); its L2 and
sparse-aware updates are the engine's, as for every model. A multi_hot field adds its pooled
weights, a numeric field its own weight times its value."""

from __future__ import annotations

import tensorflow as tf

from .base import CTRModel


class LR(CTRModel):
    embeds = False

    def terms(self, embedded, training):
        return [tf.reduce_sum(embedded.block, [1, 2])]     # the block is [B, F, 1]
