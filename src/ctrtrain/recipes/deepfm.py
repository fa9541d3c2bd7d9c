"""The DeepFM recipe as a SageMaker-style entry point: data from SM_CHANNEL_TRAINING (and
VALIDATION / TEST if present), hyperparameters as `--key value` arguments, the SavedModel
written to SM_MODEL_DIR. Checkpoints go to <SM_OUTPUT_DIR>/../checkpoints so a re-launched
job resumes. This issue's scope is one training process (mode `single`); the distributed
modes come with the strategies that run them."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from pathlib import Path


def parse_hyperparameters(argv):
    from ..train.loop import TrainConfig
    d = TrainConfig("", "")
    p = argparse.ArgumentParser(prog="deepfm recipe")
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("train_dir", "model_dir", "valid_dir", "test_dir", "threads", "progress",
                      "SHAPE_FIELDS"):
            continue
        default = getattr(d, f.name)
        if isinstance(default, bool):
            p.add_argument(f"--{f.name}", type=lambda s: s.lower() in ("1", "true", "yes"),
                           default=default)
        elif isinstance(default, tuple):
            p.add_argument(f"--{f.name}", type=lambda s: tuple(int(x) for x in s.strip("[]()").split(",")),
                           default=default)
        elif default is None:
            p.add_argument(f"--{f.name}", type=int, default=None)
        else:
            p.add_argument(f"--{f.name}", type=type(default), default=default)
    return p.parse_args(argv)


def main(argv=None) -> int:
    env = os.environ
    if env.get("CTRTRAIN_ROLE") not in (None, "worker") or int(env.get("WORLD_SIZE", "1")) > 1:
        print("the deepfm recipe runs one training process (distribution mode 'single'); "
              "distributed modes are not available yet", file=sys.stderr)
        return 2
    hp = parse_hyperparameters(argv if argv is not None else sys.argv[1:])
    from ..train.loop import TrainConfig, train
    channel = lambda name: env.get(f"SM_CHANNEL_{name}")  # noqa: E731
    if not channel("TRAINING"):
        print("no training channel (SM_CHANNEL_TRAINING)", file=sys.stderr)
        return 2
    output = Path(env.get("SM_OUTPUT_DIR", "output"))
    ckpt_dir = output.parent / "checkpoints"
    cfg = TrainConfig(train_dir=channel("TRAINING"), valid_dir=channel("VALIDATION"),
                      test_dir=channel("TEST"), model_dir=str(ckpt_dir), progress=False,
                      **{k: v for k, v in vars(hp).items()})
    r = train(cfg)
    model_dir = Path(env.get("SM_MODEL_DIR", "model"))
    if r.get("export"):
        dest = model_dir / "export" / Path(r["export"]).name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(r["export"], dest)
    shutil.copy(ckpt_dir / "result.json", model_dir / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
