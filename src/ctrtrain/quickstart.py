"""The README's main job: synthesize a data set, convert it, and (as later layers land) train."""

from __future__ import annotations

from pathlib import Path

from .data.convert import libsvm_to_tfrecord
from .data.manifest import read_manifest
from .data.synth import SynthConfig, synthesize
from .data.validate import describe, validate


def quickstart(work_dir: str = "runs/quickstart", rows: int = 200_000,
               feature_size: int = 100_000) -> dict:
    work = Path(work_dir)
    print(f"[1/3] synthesizing {rows:,} Criteo-like rows into {work / 'raw'}", flush=True)
    s = synthesize(work / "raw", SynthConfig(rows=rows, feature_size=feature_size), overwrite=True)
    print(f"      Bayes-optimal test AUC {s['splits']['test']['bayes_auc']:.4f}")
    print("[2/3] converting libsvm -> TFRecord shards", flush=True)
    for split in ("train", "valid", "test"):
        m = read_manifest(work / "raw" / split)
        libsvm_to_tfrecord(m.paths(work / "raw" / split), work / "tfrecord" / split,
                           field_size=m.field_size, feature_size=m.feature_size,
                           shards=4 if split == "train" else 2, overwrite=True)
    print("[3/3] validating against the manifests", flush=True)
    for split in ("train", "valid", "test"):
        validate(work / "tfrecord" / split)
        print(describe(work / "tfrecord" / split))
    return s
