"""The README's main job on embedded defaults: synthesize -> convert -> validate -> train ->
evaluate -> export -> batch predict. Everything lands under one work directory."""

from __future__ import annotations

import shutil
from pathlib import Path

from .data.synth import SynthConfig, synthesize_tfrecord
from .data.validate import describe, validate

SPLITS = ("train", "valid", "test")


def quickstart(work_dir: str = "runs/quickstart", rows: int = 600_000,
               feature_size: int = 100_000, epochs: float = 1.0) -> dict:
    work = Path(work_dir)
    print(f"[1/5] synthesizing {rows:,} Criteo-like rows into {work / 'raw'}", flush=True)
    s = synthesize_tfrecord(work, SynthConfig(rows=rows, feature_size=feature_size),
                            tfrecord_dir="tfrecord", overwrite=True)
    bayes = s["splits"]["test"]["bayes_auc"]
    print(f"      Bayes-optimal test AUC {bayes:.4f}")
    print("[2/5] converted libsvm -> TFRecord shards; validating them", flush=True)
    for split in SPLITS:
        validate(work / "tfrecord" / split)
        print(describe(work / "tfrecord" / split))
    print(f"[3/5] training DeepFM for {epochs:g} epochs", flush=True)
    from .train import train
    from .train.config import TrainConfig
    model_dir = work / "model"
    shutil.rmtree(model_dir, ignore_errors=True)  # the demo starts afresh every time
    r = train(TrainConfig(train_dir=str(work / "tfrecord" / "train"),
                          valid_dir=str(work / "tfrecord" / "valid"),
                          test_dir=str(work / "tfrecord" / "test"), model_dir=str(model_dir),
                          epochs=epochs, log_every=100, eval_every=0))
    print(f"[4/5] test AUC {r['test']['auc']:.4f} (Bayes-optimal {bayes:.4f}, gap "
          f"{bayes - r['test']['auc']:.4f}), logloss {r['test']['logloss']:.4f}; "
          f"SavedModel in {r['export']}", flush=True)
    from .train.predict import predict
    out = work / "predictions.csv"
    n = predict(model_dir / "export", [str(work / "tfrecord" / "test")], out)
    print(f"[5/5] wrote {n:,} predictions to {out}")
    return {"synth": s, "train": r}
