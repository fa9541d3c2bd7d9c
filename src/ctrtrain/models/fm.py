"""Factorization machine (Rendle, 2010), degree 2:

logit = bias + sum_f w[id_f] x_f + 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2],  e_f = V[id_f] x_f

the pairwise products <e_i, e_j> of every two fields in O(F k). w and V share the table
(column 0 is w: engine/tables.py)."""

from __future__ import annotations

from .base import CTRModel
from .blocks import first_and_fm


class FM(CTRModel):
    def terms(self, embedded, training):
        first, fm = first_and_fm(embedded.block)
        return [first, fm]
