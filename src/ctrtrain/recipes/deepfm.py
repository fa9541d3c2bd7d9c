"""The DeepFM recipe as a SageMaker-style entry point: data from SM_CHANNEL_TRAINING (and
VALIDATION / TEST if present), hyperparameters as `--key value` arguments, the SavedModel
written to SM_MODEL_DIR. Checkpoints go to <SM_OUTPUT_DIR>/../checkpoints (SageMaker's
/opt/ml/checkpoints, shared by every host of the job) so a re-launched job resumes.

Every distribution mode runs this same entry point: the mode comes from the environment
(CTRTRAIN_MODE, TF_CONFIG or horovodrun's ranks; train/runtime.py), this process's part of the
training channel from the sharding plan (data/sharding.py), and tf.data service from
CTRTRAIN_DATA_SERVICE. Only the chief exports.

A training channel in Pipe mode is streamed from its FIFOs (input/pipe.py); a stream has no
manifest, so the job gives `field_size` and `feature_size` (and `data_format` for libsvm), and
`steps` when several processes read. Validation and test channels are read as File channels."""

from __future__ import annotations

import argparse
import dataclasses
import json
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
                      "SHAPE_FIELDS", "mode", "read_plan", "data_service", "processing_mode",
                      "input_mode"):
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
    # Thread settings (0 = automatic: the launcher's share of the host, or the tuned values).
    for name in ("intra_op_threads", "inter_op_threads", "data_threads"):
        p.add_argument(f"--{name}", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    from .. import heartbeat
    heartbeat.beat(force=True)   # alive before TensorFlow's start-up (seconds of silence)
    env = os.environ
    hp = parse_hyperparameters(argv if argv is not None else sys.argv[1:])
    from ..data.sharding import plan_from_env
    from ..errors import CtrError
    from ..train.loop import TrainConfig, train
    from ..train.runtime import detect_mode
    from ..train.threads import ThreadConfig
    from ..usage import print_usage
    channel = lambda name: env.get(f"SM_CHANNEL_{name}")  # noqa: E731
    mode = detect_mode(env)
    modes = {k: v.get("TrainingInputMode") for k, v in
             json.loads(env.get("SM_INPUT_DATA_CONFIG", "{}")).items()}
    evaluated = sorted(k for k, v in modes.items() if v == "Pipe" and not k.startswith("train"))
    if evaluated:
        print(f"channels {evaluated} are Pipe mode: the deepfm recipe evaluates from File "
              "channels (ctrtrain data directories)", file=sys.stderr)
        return 2
    plan = None if mode in ("single", "mirrored", "parameter_server") else plan_from_env("training", env)
    train_channel = plan.channel if plan else "training"
    train_dir = channel(train_channel.upper())
    if not train_dir:
        print(f"no training channel (SM_CHANNEL_{train_channel.upper()})", file=sys.stderr)
        return 2
    output = Path(env.get("SM_OUTPUT_DIR", "output"))
    ckpt_dir = output.parent / "checkpoints"
    hps = vars(hp)
    threads = ThreadConfig(hps.pop("intra_op_threads"), hps.pop("inter_op_threads"),
                           hps.pop("data_threads"))
    cfg = TrainConfig(train_dir=train_dir, valid_dir=channel("VALIDATION"),
                      test_dir=channel("TEST"), model_dir=str(ckpt_dir), progress=False,
                      input_mode=modes.get(train_channel) or "File",
                      mode=mode, read_plan=plan, data_service=env.get("CTRTRAIN_DATA_SERVICE"),
                      processing_mode=env.get("CTRTRAIN_DATA_SERVICE_MODE", "parallel_epochs"),
                      threads=threads, **hps)
    if plan:
        print(f"reading {plan}", flush=True)
    try:
        r = train(cfg)
    except CtrError as e:    # the user's to fix: the message names the place, no traceback
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    finally:
        print_usage()
    if not r.get("chief", True):
        return 0
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
