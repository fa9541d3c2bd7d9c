"""AutoInt (Song et al., 2019): fields interact through stacked multi-head self-attention.

e_m = V[id_m] x_m  ->  L interacting layers (blocks.SelfAttention: heads of softmax(<W_Q e_m,
W_K e_k>) over the fields, concatenated, plus the residual W_res e_m, ReLU)  ->
logit = bias + w^T concat_m(e_m^(L))    (then the numeric values, with numeric_input value: the
                                        numeric fields have no e_m, their values meet w alone)

Options: `attention_layers` (L), `attention_heads`, `attention_size` (each head's width),
`attention_residual`. As the paper's AutoInt: no linear part and no MLP (AutoInt+ adds an MLP;
DeepCTR's AutoInt adds a linear part over the ids, and an MLP unless dnn_hidden_units is
empty: bench quality runs it with none).
"""

from __future__ import annotations

import tensorflow as tf

from .base import CTRModel
from .blocks import MLP, SelfAttention


class AutoInt(CTRModel):
    first_order = False

    def build(self, cfg):
        o = self.options
        width, self.layers = cfg.embedding_size, []
        for i in range(o["attention_layers"]):
            self.layers.append(SelfAttention(width, o["attention_heads"], o["attention_size"],
                                             o["attention_residual"], seed=cfg.seed + 2 + i,
                                             name=f"attention_{i}"))
            width = o["attention_heads"] * o["attention_size"]
        self.out = MLP(cfg.slots * width + cfg.numeric_appended, [1], seed=cfg.seed + 1, name="out")
        return self.layers + [self.out]

    def terms(self, embedded, training):
        e = embedded.block                              # [B, m, k]: no first-order column
        for layer in self.layers:
            e = layer(e)
        attended = tf.reshape(e, [-1, e.shape[1] * e.shape[2]])
        return [self.out(embedded.with_values(attended))[:, 0]]
