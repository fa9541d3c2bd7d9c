"""Data sets and runs made once per test session, for all the suite's workers."""

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from ctrtrain.data.synth import SynthConfig, synthesize_tfrecord


def made_once(tmp_path_factory, name: str, make: Callable[[Path], object]) -> tuple[Path, object]:
    """(directory, value) of make(directory) -> a JSON value, run once per test session for
    every worker: the suite
    runs on two workers (pytest-xdist) that take tests as they come, so a fixture of a module
    or of the session ran on both, and each made its data sets and baseline runs (6-14 CPU-s
    a set, a launch more). The first worker to need NAME makes it in a directory beside the
    workers' own temporary ones, under a lock; the other waits and reads the value. A make
    that failed leaves nothing: the next one starts again."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "made-once"
    root.mkdir(exist_ok=True)
    directory, value = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not value.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            made = make(directory)
            value.write_text(json.dumps(made))
        return directory, json.loads(value.read_text())


def make_synth(root: Path, rows: int, feature_size: int, seed: int = 0) -> dict:
    """Synthesized splits as libsvm (root/raw/<split>) and TFRecord (root/tf/<split>)."""
    return synthesize_tfrecord(root, SynthConfig(rows=rows, feature_size=feature_size, seed=seed),
                               shards={"train": 4})


class SynthCache:
    """Data sets made once per test session and shared by every test that only reads them
    (conftest's `synth_data` fixture): the same (rows, feature_size, seed) is one directory."""

    def __init__(self, tmp_path_factory):
        self._factory = tmp_path_factory

    def __call__(self, rows: int, feature_size: int, seed: int = 0) -> tuple[Path, dict]:
        return made_once(self._factory, f"synth-{rows}-{feature_size}-{seed}",
                         lambda root: make_synth(root, rows, feature_size, seed))
