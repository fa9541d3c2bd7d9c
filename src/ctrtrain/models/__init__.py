"""CTR models over one embedding engine (engine/), on tf.Module + tf.Variable (no Keras).

A model is one file (a `CTRModel` subclass, base.py) and an entry of `MODELS`: where its
class is, and which of the shared model settings (train/config.py, section `model`) it reads.
A setting a model does not read is refused by name when given (train/config.py
check_config). Importing this module does not import TensorFlow (the CLI's --help lists the
models from it)."""

from __future__ import annotations

import dataclasses
import importlib

# The shared settings of a model with an MLP.
DEEP = ("embedding_size", "deep_layers", "dropout", "batch_norm", "l2_dense", "xla",
        "mixed_precision")


@dataclasses.dataclass(frozen=True)
class Entry:
    where: str                  # "module:Class" in this package
    summary: str                # one line for --help and the docs
    reads: tuple[str, ...] = () # the shared model settings it reads


MODELS = {
    "lr": Entry("lr:LR", "logistic regression: a weight per id"),
    "fm": Entry("fm:FM", "factorization machine: first order + pairwise embedding products",
                ("embedding_size",)),
    "deepfm": Entry("deepfm:DeepFM", "DeepFM: FM + an MLP over the embeddings", DEEP),
}


def model_class(name: str):
    from ..errors import ConfigError
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    module, cls = MODELS[name].where.split(":")
    return getattr(importlib.import_module(f".{module}", __name__), cls)


def build_model(cfg):
    """The model `cfg.model` names, with its configuration (base.ModelConfig)."""
    return model_class(cfg.model)(cfg, name=cfg.model)
