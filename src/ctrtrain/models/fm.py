"""Factorization machine (Rendle, 2010), degree 2:

logit = bias + sum_f w[id_f] x_f + 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2],  e_f = V[id_f] x_f

the pairwise products <e_i, e_j> of every two fields in O(F k). w and V share the table
(column 0 is w: engine/tables.py)."""

from __future__ import annotations

from .base import CTRModel
from .blocks import first_and_fm


class FM(CTRModel):
    # The pairwise term alone, each gradient the product of other fields' embeddings: from
    # 1e-4 (the deep models' start, base.py) it leaves the saddle at 0 later -- 0.0115 below
    # the Bayes-optimal AUC after one epoch against 0.008 from 0.01 (test_model_bayes.py's
    # pairwise crosses). libFM starts at 0.1.
    embedding_init = 0.01

    def terms(self, embedded, training):
        first, fm = first_and_fm(embedded.block)
        return [first, fm]
