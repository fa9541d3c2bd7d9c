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

import json
import os
import shutil
import sys
from pathlib import Path


THREAD_SETTINGS = ("intra_op_threads", "inter_op_threads", "data_threads")
# Set by the job, not by hyperparameters: the data and model locations come from the
# channels and SM_* directories, the mode from the distribution.
FROM_THE_JOB = ("train_dir", "valid_dir", "test_dir", "model_dir", "mode")


def parse_hyperparameters(argv) -> tuple[dict, dict]:
    """(settings, thread settings) from `--name value` pairs, as SageMaker passes
    hyperparameters, parsed by the configuration table (train/config.py): unknown names and
    bad values are errors naming them; the public DeepFM sample's names (num_epochs,
    log_steps) are aliases."""
    from ..errors import ConfigError
    from ..train.config import parse_value
    if len(argv) % 2 or any(not a.startswith("--") for a in argv[::2]):
        raise ConfigError(f"hyperparameters must be --name value pairs, got {argv[:6]}")
    settings, threads = {}, {}
    for key, value in zip(argv[::2], argv[1::2]):
        name = key[2:].replace("-", "_")
        if name in THREAD_SETTINGS:
            threads[name] = int(value)
            continue
        if name in FROM_THE_JOB:
            raise ConfigError(f"hyperparameter {name}: set by the job (its channels, output "
                              "and distribution), not a hyperparameter")
        name, parsed = parse_value(name, value)
        settings[name] = parsed
    return settings, threads


def main(argv=None) -> int:
    from .. import heartbeat
    heartbeat.beat(force=True)   # alive before TensorFlow's start-up (seconds of silence)
    env = os.environ
    from ..data.sharding import plan_from_env
    from ..errors import CtrError
    try:
        hps, thread_hps = parse_hyperparameters(argv if argv is not None else sys.argv[1:])
    except CtrError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from ..train import train
    from ..train.config import TrainConfig
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
    threads = ThreadConfig(thread_hps.get("intra_op_threads", 0),
                           thread_hps.get("inter_op_threads", 0), thread_hps.get("data_threads", 0))
    if hps.get("predictions") == "auto":      # beside the model: it travels with model.tar.gz
        hps["predictions"] = str(Path(env.get("SM_MODEL_DIR", "model")) / "predictions.csv")
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
