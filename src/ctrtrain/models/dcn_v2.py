"""DCN-v2 (Wang et al., 2021, "DCN V2: Improved Deep & Cross Network").

x0 = concat_f e_f (the embeddings, e_f = V[id_f] x_f; a numeric field's row scaled by its value)
cross layer l: x_{l+1} = x0 * (W_l x_l + b_l) + x_l          (W_l d x d, or U_l V_l^T of rank r)
parallel: logit = bias + w^T [x_L ; MLP(x0)]                  (the default)
stacked:  logit = bias + MLP(x_L), the MLP ending in one linear unit

Options: `cross_layers` (L), `cross_structure`, `cross_rank` (0: full rank; r > 0: the paper's
low-rank cross, without DCN-Mix's mixture of experts). As the paper defines it, the model has
no first-order (linear) term: DeepCTR's DCN adds a linear part over the ids, FuxiCTR's DCNv2
does not; this follows the paper and FuxiCTR. The default structure, parallel, is FuxiCTR's
and DeepCTR's (the paper reports both; neither wins on every data set).
"""

from __future__ import annotations

import tensorflow as tf

from .base import CTRModel
from .blocks import MLP, CrossNetwork, mlp_over_fields


class DCNv2(CTRModel):
    first_order = False

    def build(self, cfg):
        o = self.options
        width = cfg.field_size * cfg.embedding_size
        self.stacked = o["cross_structure"] == "stacked"
        self.cross = CrossNetwork(width, o["cross_layers"], o["cross_rank"], seed=cfg.seed + 2)
        # Stacked, the MLP reads x_L, as wide as the embeddings it reads in parallel.
        self.mlp = mlp_over_fields(cfg, first_order=False, out=1 if self.stacked else None)
        if self.stacked:
            return [self.cross, self.mlp]
        self.out = MLP(width + cfg.deep_layers[-1], [1], seed=cfg.seed + 3, name="out")
        return [self.cross, self.mlp, self.out]

    def terms(self, embedded, training):
        x0 = embedded.flat()
        crossed = self.cross(x0)
        if self.stacked:
            return [self.mlp(crossed, training)[:, 0]]
        both = tf.concat([crossed, self.mlp(x0, training)], 1)
        return [self.out(both)[:, 0]]
