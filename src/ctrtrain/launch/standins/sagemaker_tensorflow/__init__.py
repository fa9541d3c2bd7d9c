"""`from sagemaker_tensorflow import PipeModeDataset` on an image whose TensorFlow has no
build of AWS's package (sagemaker-tensorflow's newest is 2.14's): see pipemode.py."""

from .pipemode import PipeModeDataset, PipeModeDatasetException

__all__ = ["PipeModeDataset", "PipeModeDatasetException"]
