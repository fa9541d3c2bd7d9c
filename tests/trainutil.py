"""Small real data sets for training tests, made once per session."""

from pathlib import Path

from ctrtrain.data.convert import libsvm_to_tfrecord
from ctrtrain.data.manifest import read_manifest
from ctrtrain.data.synth import SynthConfig, synthesize


def make_synth(root: Path, rows: int, feature_size: int, seed: int = 0) -> dict:
    """Synthesized splits as libsvm (root/raw/<split>) and TFRecord (root/tf/<split>)."""
    s = synthesize(root / "raw", SynthConfig(rows=rows, feature_size=feature_size, seed=seed),
                   processes=2)
    for split in ("train", "valid", "test"):
        m = read_manifest(root / "raw" / split)
        libsvm_to_tfrecord(m.paths(root / "raw" / split), root / "tf" / split,
                           field_size=m.field_size, feature_size=m.feature_size,
                           shards=4 if split == "train" else 2, processes=2)
    return s
