"""TensorFlow without Keras at start-up: ctrtrain's processes start about 2 CPU-seconds sooner.

`import tensorflow` (2.16 and later) imports Keras 3 eagerly, "so that any function that
needs to happen at load time will trigger", for Keras' own optimizers in the SavedModel
registry; TensorFlow wraps that import in `try/except ImportError`. ctrtrain uses no Keras (its
models, optimizers, checkpoints and SavedModels are TensorFlow's own), yet every process of
it -- a `ctrtrain` command, each trainer, server and data worker of a job -- paid for Keras:
about 35% of the import (`import ctrtrain, tensorflow`: 5.4-5.8 -> 3.4-3.6 CPU-seconds, 2-core
AMD EPYC; docs/benchmarks.md "A process's start and first steps").

`install()` (run when the package is imported) adds an import hook that refuses the `keras`
package only while TensorFlow's own `__init__` runs, when ctrtrain was imported first. Keras
stays installed and importable: `tf.keras` and `import keras` load it on first use, as
TensorFlow's lazy loader always did, so a user's code beside ctrtrain's sees no difference.
`CTRTRAIN_TF_KERAS=1` turns the hook off.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

OFF = "CTRTRAIN_TF_KERAS"


class _KerasAfterTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name != "keras" or not _tensorflow_initializing():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        # TensorFlow also asks where keras is (importlib.util.find_spec, for its API's module
        # path): that gets the real location; only loading it fails.
        spec.loader = self
        return spec

    def create_module(self, spec):
        raise ImportError("keras is loaded on first use, not while TensorFlow starts "
                          f"(ctrtrain.tf_start; {OFF}=1 turns this off)")

    def exec_module(self, module):   # never reached: create_module refuses
        raise ImportError("keras")


def _tensorflow_initializing() -> bool:
    tf = sys.modules.get("tensorflow")
    return bool(tf is not None and getattr(getattr(tf, "__spec__", None), "_initializing", False))


def install() -> None:
    if os.environ.get(OFF) == "1" or "tensorflow" in sys.modules:
        return
    if not any(isinstance(f, _KerasAfterTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _KerasAfterTensorFlow())
