"""CTR models over one embedding engine (engine/), on tf.Module + tf.Variable (no Keras).

A model is one file (a `CTRModel` subclass, base.py) and an entry of `MODELS`: where its
class is, which of the shared model settings (train/config.py, section `model`) it reads, and
its own options, which become rows of the same settings table (flags, hyperparameters, config
file keys; the model reads them in `ModelConfig.options`). A setting a model does not read is
refused by name when given (train/config.py check_config). Importing this module does not
import TensorFlow (the settings table and the CLI's --help read it)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from ..values import boolean, choice, items, number

# The shared settings of a model with an MLP.
DEEP = ("embedding_size", "embedding_init", "deep_layers", "dropout", "batch_norm", "l2_dense",
        "xla", "mixed_precision", "numeric_input")


@dataclasses.dataclass(frozen=True)
class Option:
    """A model's own setting: a row of the settings table (train/config.py) in section
    `model`, a flag, a hyperparameter and a config file key like every other setting."""
    default: object
    help: str
    parse: Callable     # text or a native value -> the value, or ValueError (values.py)


@dataclasses.dataclass(frozen=True)
class Entry:
    where: str                  # "module:Class" in this package
    summary: str                # one line for --help and the docs
    reads: tuple[str, ...] = () # the shared model settings it reads
    options: dict = dataclasses.field(default_factory=dict)   # its own: {name: Option}
    # "module:function" (fields, options) -> its options as it uses them on data declaring
    # `fields` [(name, kind)]: what it picks where an option leaves it to the data. None: as given.
    resolve: str | None = None


MODELS = {
    "lr": Entry("lr:LR", "logistic regression: a weight per id"),
    "fm": Entry("fm:FM", "factorization machine: first order + pairwise embedding products",
                ("embedding_size", "embedding_init")),
    "deepfm": Entry("deepfm:DeepFM", "DeepFM: FM + an MLP over the embeddings", DEEP),
    "wide_deep": Entry("wide_deep:WideDeep", "Wide & Deep: a weight per id + an MLP over the "
                       "embeddings", DEEP),
    "dcn_v2": Entry("dcn_v2:DCNv2", "DCN-v2: a cross network and an MLP over the embeddings",
                    DEEP, {
                        "cross_layers": Option(3, "cross layers", number(int, 1)),
                        "cross_structure": Option(
                            "parallel", "parallel (cross network and MLP side by side) | "
                            "stacked (the MLP over the cross network's output)",
                            choice("parallel", "stacked")),
                        "cross_rank": Option(0, "rank of each cross layer's weights: 0 full "
                                             "(d x d), r > 0 low rank (U V^T, d x r each)",
                                             number(int, 0)),
                        "dcn_linear": Option(True, "a weight per id added to the logit, as in "
                                             "DeepCTR's DCN (the paper's has none)", boolean)}),
    "xdeepfm": Entry("xdeepfm:XDeepFM", "xDeepFM: a weight per id + a compressed interaction "
                     "network + an MLP over the embeddings", DEEP, {
                         "cin_layers": Option((128, 128), "feature maps of each CIN layer, e.g. "
                                              "128,128", items(number(int, 1)))}),
    "autoint": Entry("autoint:AutoInt", "AutoInt: multi-head self-attention over the fields",
                     ("embedding_size", "embedding_init", "l2_dense", "numeric_input"), {
                         "attention_layers": Option(3, "interacting (self-attention) layers",
                                                    number(int, 1)),
                         "attention_heads": Option(2, "heads per layer", number(int, 1)),
                         "attention_size": Option(8, "width of each head", number(int, 1)),
                         "attention_residual": Option(True, "add W_res e to each layer's "
                                                      "output", boolean)}),
    "dlrm": Entry("dlrm:DLRM", "DLRM: a bottom MLP over the numeric fields, dot products of "
                  "every two vectors, a top MLP (deep_layers)",
                  tuple(r for r in DEEP if r != "numeric_input"), {
                      "bottom_layers": Option((512, 256), "hidden widths of the bottom MLP over "
                                              "the declared numeric fields (k is appended)",
                                              items(number(int, 1)))}),
    "din": Entry("din:DIN", "DIN: a history (sequence field) weighed against the candidate by "
                 "target attention, then an MLP over the embeddings", DEEP, {
                     "din_sequence": Option("", "the history: a sequence field (default: the "
                                            "data's only one)", str),
                     "din_target": Option("", "the candidate the history is weighed against: a "
                                          "categorical field (default: X for a history named "
                                          "hist_X, X_hist or X_history)", str),
                     "din_attention_units": Option((80, 40), "hidden widths of the attention "
                                                   "unit (Dice), e.g. 80,40",
                                                   items(number(int, 1)))},
                 resolve="din:resolved_options"),
}


def model_class(name: str):
    from ..errors import ConfigError
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    module, cls = MODELS[name].where.split(":")
    return getattr(importlib.import_module(f".{module}", __name__), cls)


def resolve_options(name: str, options: dict, fields) -> dict:
    """The options of model `name` as it uses them on data declaring `fields` [(name, kind)]
    (Entry.resolve), or a ConfigError saying what the data lacks."""
    entry = MODELS[name]
    if entry.resolve is None:
        return dict(options)
    module, function = entry.resolve.split(":")
    return getattr(importlib.import_module(f".{module}", __name__), function)(fields, options)


def build_model(cfg):
    """The model `cfg.model` names, with its configuration (base.ModelConfig)."""
    return model_class(cfg.model)(cfg, name=cfg.model)
