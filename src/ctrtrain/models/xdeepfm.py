"""xDeepFM (Lian et al., 2018): logit = bias + linear + CIN + DNN.

linear = sum_f w[id_f] x_f                 (the table's column 0)
CIN    = w_c^T [p^1; ...; p^T]            (blocks.CIN over the embeddings e_f = V[id_f] x_f:
                                           explicit interactions of bounded degree, vector-wise)
DNN    = MLP(concat_f e_f)                 (implicit interactions)

Option `cin_layers`: the feature maps H_k of each CIN layer. `mixed_precision` computes the
CIN in bfloat16 as well as the MLP. The CIN follows the paper (every
layer's maps feed the output and the next layer, no activation); DeepCTR's default splits
each hidden layer's maps in half and applies ReLU (bench quality runs DeepCTR with the paper's
choices: split_half False, a linear activation).
"""

from __future__ import annotations

from .base import CTRModel
from .blocks import CIN, MLP, first_order, mlp_over_fields


class XDeepFM(CTRModel):
    def build(self, cfg):
        layers = self.options["cin_layers"]
        self.cin = CIN(cfg.slots, layers, seed=cfg.seed + 2,
                       mixed_precision=cfg.mixed_precision)
        self.cin_out = MLP(sum(layers), [1], seed=cfg.seed + 3, name="cin_out")
        self.mlp = mlp_over_fields(cfg, first_order=True)
        return [self.cin, self.cin_out, self.mlp]

    def terms(self, embedded, training):
        return [first_order(embedded.block),
                self.cin_out(self.cin(embedded.vectors()))[:, 0],
                self.mlp(embedded.deep_input(), training)[:, 0]]
