"""DeepFM (Guo et al., 2017) as the public SageMaker DeepFM sample defines it.

logit = bias + sum_f w[id_f] x_f                           (first order)
      + 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2]          (FM second order, e_f = V[id_f] x_f)
      + MLP(concat_f e_f)                                  (deep part)

With numeric_input value a numeric field has no e_f: its value enters the MLP's input itself
(after the embeddings) and the first order as w_j x_j (models/base.py), not the FM term, as
DeepCTR's DenseFeat; with numeric_input both it keeps its e_f everywhere and its value also
follows the embeddings in the MLP's input. Wide & Deep, DCN-v2, xDeepFM, AutoInt and DIN read
it the same way.

w and V share the table (column 0 is w: engine/tables.py). The MLP reads the whole
[B, F, 1 + k] block through a first kernel whose rows facing column 0 (w) are held at zero (they
start at zero and the optimizer masks their gradient: CTRModel.gradient_terms), so the deep part
sees exactly the embeddings, as in DeepFM, and nothing slices
the block by column (the gradients of such slices cost more than the FM itself). DeepFM has no
attention: a sequence field is pooled as its declaration says, like a multi_hot one.
"""

from __future__ import annotations

from .base import CTRModel
from .blocks import first_and_fm, mlp_over_fields


class DeepFM(CTRModel):
    def build(self, cfg):
        self.mlp = mlp_over_fields(cfg, first_order=True)
        return [self.mlp]

    def terms(self, embedded, training):
        first, fm = first_and_fm(embedded.block)
        return [first, fm, self.mlp(embedded.deep_input(), training)[:, 0]]
