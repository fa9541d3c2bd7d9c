"""ctrtrain: train click-through-rate models (DeepFM) fast, from one process to a cluster."""

__version__ = "0.1.0"

from . import tf_start

tf_start.install()
