"""DCN-v2 (Wang et al., 2021, "DCN V2: Improved Deep & Cross Network").

x0 = concat_f e_f (the embeddings, e_f = V[id_f] x_f; a numeric field's row scaled by its value,
     or with numeric_input value its value itself, after the embeddings, as DeepCTR's DCN;
     with both, the scaled row and the value after the embeddings)
cross layer l: x_{l+1} = x0 * (W_l x_l + b_l) + x_l          (W_l d x d, or U_l V_l^T of rank r)
parallel: logit = bias + [linear] + w^T [x_L ; MLP(x0)]      (the default)
stacked:  logit = bias + [linear] + MLP(x_L), the MLP ending in one linear unit
linear = sum_f w[id_f] x_f (a weight per id: the table's column 0), with `dcn_linear`

Options: `cross_layers` (L), `cross_structure`, `cross_rank` (0: full rank; r > 0: the paper's
low-rank cross, without DCN-Mix's mixture of experts), `dcn_linear`. As the paper defines it,
the model has no first-order (linear) term, nor has FuxiCTR's DCNv2; DeepCTR's DCN adds one
over the ids. This follows DeepCTR by default, the model `bench quality` compares with: on
MovieLens-100K, over eight seeds, the paper's form ends 0.0024 test AUC below DeepCTR's DCN,
with the linear term 0.0009 (its validation AUC peaks an epoch later; the test AUC at each
epoch is the same: docs/quality.md, "DCN-v2's linear term"). `--no-dcn-linear` (dcn_linear:
false) is the paper's model. The default structure, parallel, is FuxiCTR's and DeepCTR's (the
paper reports both; neither wins on every data set).
"""

from __future__ import annotations

import tensorflow as tf

from .base import CTRModel
from .blocks import MLP, CrossNetwork, first_order, mlp_over_fields


class DCNv2(CTRModel):
    # The cross layers multiply x0 element-wise, so from the zoos' N(0, 1e-4) rows a layer's
    # output is about 1e-8 and they learn from almost nothing at first; from 0.01 DCN-v2
    # reaches DeepCTR's DCN under the SageMaker sample's settings on bank (docs/quality.md,
    # "DCN-v2's initial scale").
    embedding_init = 0.01

    @property
    def first_order(self):
        """The table holds the linear term's weights (column 0) with `dcn_linear`."""
        return self.options["dcn_linear"]

    def build(self, cfg):
        o = self.options
        width = cfg.slots * cfg.embedding_size + cfg.numeric_appended
        self.stacked = o["cross_structure"] == "stacked"
        self.cross = CrossNetwork(width, o["cross_layers"], o["cross_rank"], seed=cfg.seed + 2)
        # Stacked, the MLP reads x_L (the embeddings alone); parallel, the block, the weights'
        # column held at zero in its first kernel.
        self.mlp = mlp_over_fields(cfg, first_order=self.first_order and not self.stacked,
                                   out=1 if self.stacked else None)
        if self.stacked:
            return [self.cross, self.mlp]
        self.out = MLP(width + cfg.deep_layers[-1], [1], seed=cfg.seed + 3, name="out")
        return [self.cross, self.mlp, self.out]

    def terms(self, embedded, training):
        vectors = embedded.vectors()
        x0 = tf.reshape(vectors, [-1, vectors.shape[1] * vectors.shape[2]])
        x0 = embedded.with_values(x0)
        linear = [first_order(embedded.block)] if self.first_order else []
        crossed = self.cross(x0)
        if self.stacked:
            return linear + [self.mlp(crossed, training)[:, 0]]
        both = tf.concat([crossed, self.mlp(embedded.deep_input(), training)], 1)
        return linear + [self.out(both)[:, 0]]
