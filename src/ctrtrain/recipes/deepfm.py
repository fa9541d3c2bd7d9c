"""The DeepFM recipe as a SageMaker-style entry point: data from SM_CHANNEL_TRAINING (and
VALIDATION / TEST if present; MODEL, an earlier job's checkpoints directory to warm-start
from), hyperparameters as `--key value` arguments, the SavedModel
written to SM_MODEL_DIR. Checkpoints go to <SM_OUTPUT_DIR>/../checkpoints (SageMaker's
/opt/ml/checkpoints, shared by every host of the job) so a re-launched job resumes.

Every distribution mode runs this same entry point: the mode comes from the environment
(CTRTRAIN_MODE, TF_CONFIG or horovodrun's ranks: ctrtrain/environment.py), this process's part of the
training channel from the sharding plan (data/sharding.py), and tf.data service from
CTRTRAIN_DATA_SERVICE. Only the chief exports.

A training channel in Pipe mode is streamed from its FIFOs (input/pipe.py); a stream has no
manifest, so the job gives `field_size` and `feature_size` (and `data_format` for libsvm), and
`steps` when several processes read. Validation and test channels are read as File channels."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


# Set by the job, not by hyperparameters: the data and model locations come from the
# channels and SM_* directories, the mode from the distribution.
FROM_THE_JOB = ("train_dir", "valid_dir", "test_dir", "model_dir", "mode", "warm_start")
# The channel of an earlier model to start from (SageMaker's name for it in incremental
# training): the earlier job's checkpoints directory, a ctrtrain model directory.
EARLIER_MODEL = "model"


def parse_hyperparameters(argv) -> dict:
    """The settings given as `--name value` pairs, as SageMaker passes
    hyperparameters, parsed by the configuration table (train/config.py): unknown names and
    bad values are errors naming them; the public DeepFM sample's names (num_epochs,
    log_steps) are aliases."""
    from ..errors import ConfigError
    from ..train.config import parse_value
    if len(argv) % 2 or any(not a.startswith("--") for a in argv[::2]):
        raise ConfigError(f"hyperparameters must be --name value pairs, got {argv[:6]}")
    settings = {}
    for key, value in zip(argv[::2], argv[1::2]):
        name = key[2:].replace("-", "_")
        if name in FROM_THE_JOB:
            raise ConfigError(f"hyperparameter {name}: set by the job (its channels, output "
                              "and distribution), not a hyperparameter")
        name, parsed = parse_value(name, value)
        settings[name] = parsed
    return settings


def main(argv=None) -> int:
    from .. import heartbeat
    heartbeat.beat(force=True)   # alive before TensorFlow's start-up (seconds of silence)
    from ..environment import Environment
    from ..errors import CtrError
    from ..usage import print_usage
    try:
        env = Environment()
        hps = parse_hyperparameters(argv if argv is not None else sys.argv[1:])
        cfg = recipe_config(env, hps)
    except CtrError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from ..train import train
    if cfg.read_plan:
        print(f"reading {cfg.read_plan}", flush=True)
    try:
        r = train(cfg)
    except CtrError as e:    # the user's to fix: the message names the place, no traceback
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    finally:
        print_usage()
    if not r.get("chief", True):
        return 0
    if r.get("export"):
        dest = env.model_dir / "export" / Path(r["export"]).name
        if dest.exists():
            from ..data.files import remove_tree
            remove_tree(dest)
        shutil.copytree(r["export"], dest)
    shutil.copy(Path(cfg.model_dir) / "result.json", env.model_dir / "result.json")
    return 0


def recipe_config(env, hps: dict):
    """The training configuration of this process of the job: its channels, its part of the
    training data, the job's mode and data service, the hyperparameters."""
    from ..errors import ConfigError
    from ..train.config import TrainConfig
    pipe_evaluated = sorted(n for n, c in env.channels.items()
                            if c.input_mode == "Pipe" and not n.startswith("train"))
    if pipe_evaluated:
        raise ConfigError(f"channels {pipe_evaluated} are Pipe mode: the deepfm recipe evaluates "
                          "from File channels (ctrtrain data directories)")
    plan = env.read_plan("training") if env.mode.ranked else None
    train_channel = env.channel(plan.channel if plan else "training")
    if not train_channel or not train_channel.path:
        raise ConfigError(f"no training channel (SM_CHANNEL_{(plan.channel if plan else 'training').upper()})")
    if hps.get("predictions") == "auto":      # beside the model: it travels with model.tar.gz
        hps["predictions"] = str(env.model_dir / "predictions.csv")
    # Checkpoints in SageMaker's /opt/ml/checkpoints (beside output/), shared by the hosts.
    ckpt_dir = env.output_dir.parent / "checkpoints"
    valid, test = env.channel("validation"), env.channel("test")
    earlier = env.channel(EARLIER_MODEL)
    if earlier and earlier.input_mode == "Pipe":
        raise ConfigError(f"channel {EARLIER_MODEL} (the model to start from) is Pipe mode: "
                          "give it as a File channel")
    if earlier and earlier.path:
        hps["warm_start"] = earlier.path
    return TrainConfig(train_dir=train_channel.path, valid_dir=valid.path if valid else None,
                       test_dir=test.path if test else None, model_dir=str(ckpt_dir),
                       progress=False, input_mode=train_channel.input_mode, mode=env.mode.value,
                       read_plan=plan, data_service=env.data_service,
                       processing_mode=env.data_service_mode, **hps)


if __name__ == "__main__":
    from ..shutdown import end_process
    from ..tf_start import own_process
    own_process()
    end_process(main())
