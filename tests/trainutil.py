"""Synthesized data sets for training tests, made once per session."""

from pathlib import Path

from ctrtrain.data.synth import SynthConfig, synthesize_tfrecord


def make_synth(root: Path, rows: int, feature_size: int, seed: int = 0) -> dict:
    """Synthesized splits as libsvm (root/raw/<split>) and TFRecord (root/tf/<split>)."""
    return synthesize_tfrecord(root, SynthConfig(rows=rows, feature_size=feature_size, seed=seed),
                               shards={"train": 4}, processes=2)


class SynthCache:
    """Data sets made once per test session and shared by every test that only reads them
    (conftest's `synth_data` fixture): the same (rows, feature_size, seed) is one directory."""

    def __init__(self, tmp_path_factory):
        self._factory = tmp_path_factory
        self._made: dict[tuple, tuple[Path, dict]] = {}

    def __call__(self, rows: int, feature_size: int, seed: int = 0) -> tuple[Path, dict]:
        key = (rows, feature_size, seed)
        if key not in self._made:
            root = self._factory.mktemp(f"synth-{rows}-{feature_size}-{seed}")
            self._made[key] = root, make_synth(root, rows, feature_size, seed)
        return self._made[key]
