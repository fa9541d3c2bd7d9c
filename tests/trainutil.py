"""Small real data sets for training tests, made once per session."""

from pathlib import Path

from ctrtrain.data.synth import SynthConfig, synthesize_tfrecord


def make_synth(root: Path, rows: int, feature_size: int, seed: int = 0) -> dict:
    """Synthesized splits as libsvm (root/raw/<split>) and TFRecord (root/tf/<split>)."""
    return synthesize_tfrecord(root, SynthConfig(rows=rows, feature_size=feature_size, seed=seed),
                               shards={"train": 4}, processes=2)
