"""Wide & Deep (Cheng et al., 2016): logit = bias + wide + deep, trained jointly.

wide = sum_f w[id_f] x_f   (a weight per id: the table's column 0)
deep = MLP(concat_f e_f)    (the embeddings, e_f = V[id_f] x_f)

The paper's wide part also reads cross-product transformations a person chooses; here, as in
DeepCTR's WDL and FuxiCTR's WideDeep, it reads the ids (a cross of two columns can be a field
of its own: `ctrtrain data featurize` hashes any column). The paper updates the wide part with
FTRL and the deep part with AdaGrad; here one optimizer updates both (DeepCTR's and FuxiCTR's
choice), the table's rows sparse-aware like every model's.
"""

from __future__ import annotations

from .base import CTRModel
from .blocks import first_order, mlp_over_fields


class WideDeep(CTRModel):
    def build(self, cfg):
        self.mlp = mlp_over_fields(cfg, first_order=True)
        return [self.mlp]

    def terms(self, embedded, training):
        return [first_order(embedded.block), self.mlp(embedded.deep_input(), training)[:, 0]]
