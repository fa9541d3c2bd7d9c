"""ctrtrain: train click-through-rate models (DeepFM) fast, from one process to a cluster.

The Python API (docs/api.md): `ctrtrain.train(...)`, `ctrtrain.evaluate(...)` and
`ctrtrain.predict(...)`, with the settings of the commands of the same names. Importing the
package imports no TensorFlow: each function imports what it runs when called."""

__version__ = "0.1.0"

from . import tf_start

tf_start.install()

# `ctrtrain.train` is the training package (ctrtrain/train/); called, it is the API's train
# (api.TrainPackage). The package's __init__ imports nothing.
from . import train  # noqa: E402
from .api import TrainPackage, evaluate, predict  # noqa: E402
from .errors import ConfigError, CtrError, DataError  # noqa: E402

train.__class__ = TrainPackage

__all__ = ["train", "evaluate", "predict", "CtrError", "ConfigError", "DataError", "__version__"]
