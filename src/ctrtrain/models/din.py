"""DIN, the Deep Interest Network (Zhou et al., 2018, "Deep Interest Network for Click-Through
Rate Prediction").

q      = e_target                                   (the candidate: a categorical field's row)
v_U    = sum_j a(e_j, q) e_j                        (the user's history, a sequence field, each
                                                     item weighed against the candidate by the
                                                     local activation unit: blocks.
                                                     TargetAttention, Dice, no softmax)
logit  = bias + MLP([e_1, ..., v_U, ..., e_F])      (every field's embedding, the history's
                                                     replaced by v_U; other bags pooled as
                                                     declared; with numeric_input value
                                                     the numeric values after them)

Needs declared fields (docs/fields.md) with a sequence field. Options: `din_sequence` (the
history; default: the data's only sequence field), `din_target` (the candidate; default: the
categorical field the history's name names: `hist_item` or `item_hist` -> `item`),
`din_attention_units` (the activation unit's hidden widths, 80,40 as the paper and DeepCTR).
The MLP is the model's deep_layers with ReLU (DeepCTR's default; the paper uses PReLU or Dice
there too), and no linear part, as the paper and DeepCTR's DIN.
"""

from __future__ import annotations

import tensorflow as tf

from ..errors import ConfigError
from .base import CTRModel
from .blocks import MLP, TargetAttention


def din_fields(fields, options) -> tuple[int, int, str, str]:
    """(the target's slot among the single ids, the history's index among the bags, their
    names) from the declared fields [(name, kind)] and the options, or a ConfigError naming
    what is missing."""
    sequences = [n for n, kind in fields if kind == "sequence"]
    categorical = [n for n, kind in fields if kind == "categorical"]
    bags = [n for n, kind in fields if kind in ("multi_hot", "sequence")]
    if not sequences:
        raise ConfigError("model din needs a sequence field, the user's history (docs/fields.md: "
                          "declared fields); this data declares "
                          + ("none" if not fields else ", ".join(f"{n} ({k})" for n, k in fields)))
    history = _pick("din_sequence", options["din_sequence"], sequences, "sequence",
                    sequences[0] if len(sequences) == 1 else None,
                    f"name the history among the sequence fields {', '.join(sequences)}")
    named = [n for n in categorical if history in (f"hist_{n}", f"{n}_hist", f"{n}_history")]
    target = _pick("din_target", options["din_target"], categorical, "categorical",
                   named[0] if named else None,
                   f"name the categorical field the history {history} is weighed against "
                   f"(one of {', '.join(categorical) or 'none'})")
    return categorical.index(target), bags.index(history), target, history


def resolved_options(fields, options) -> dict:
    """The options as DIN uses them on data declaring `fields`: the history and the candidate
    named, where the options leave them to the data (models/__init__.py Entry.resolve)."""
    *_, target, history = din_fields(fields, options)
    return {**options, "din_sequence": history, "din_target": target}


def _pick(option: str, given: str, of_kind: list, kind: str, default, ask: str) -> str:
    """The field an option names, if the data has it as `kind`; else `default` where there is
    one; else a ConfigError asking (`ask`) for the option."""
    if given and given not in of_kind:
        raise ConfigError(f"{option}: {given!r} is not a {kind} field of the data (its {kind} "
                          f"fields: {', '.join(of_kind) or 'none'})")
    if given or default is not None:
        return given or default
    raise ConfigError(f"{option}: {ask}")


class DIN(CTRModel):
    first_order = False

    def build(self, cfg):
        self.target, self.history, *_ = din_fields(cfg.fields, self.options)
        k = cfg.embedding_size
        self.attention = TargetAttention(k, self.options["din_attention_units"],
                                         seed=cfg.seed + 2)
        self.mlp = MLP(cfg.slots * k + cfg.numeric_appended, list(cfg.deep_layers) + [1], cfg.rates(),
                       cfg.batch_norm, seed=cfg.seed + 1, mixed_precision=cfg.mixed_precision,
                       xla=cfg.xla)
        return [self.attention, self.mlp]

    def terms(self, embedded, training):
        rows, held = embedded.bag_rows(self.history)
        interest = self.attention(embedded.field_row(self.target), rows, held, training)
        block = embedded.with_bag(self.history, interest)         # [B, F, k]
        flat = tf.reshape(block, [-1, block.shape[1] * block.shape[2]])
        return [self.mlp(embedded.with_values(flat), training)[:, 0]]
