"""A job's entry point that trains several models in turn in the same processes (test_models.py):
each with the recipe's own configuration of this process (channels, mode, data service, its
part of the training data; recipes/deepfm.py) and the settings given for it, into a
checkpoint directory of its own. A multi-process job costs seconds of start-up per process
(a parameter-server job starts eight); this runs every model in one job's processes.

    --runs '{"lr": {"steps": 60, ...}, "fm": {...}}'     (hyperparameters, as SageMaker gives them)

The chief writes <SM_MODEL_DIR>/runs.json: each model's result.json and its export's
assets.extra/ctrtrain.json."""
import dataclasses
import json
import sys
from pathlib import Path

from ctrtrain.environment import Environment
from ctrtrain.recipes.deepfm import parse_hyperparameters, recipe_config
from ctrtrain.train import train


def main(argv) -> None:
    assert argv[0] == "--runs", argv
    env, out = Environment(), {}
    for name, settings in json.loads(argv[1]).items():
        hps = parse_hyperparameters([a for k, v in {"model": name, **settings}.items()
                                     for a in (f"--{k}", str(v))])
        cfg = recipe_config(env, hps)
        cfg = dataclasses.replace(cfg, model_dir=str(Path(cfg.model_dir) / name))
        r = train(cfg)
        print(f"trained {name}: step {r.get('step')}", flush=True)
        if r.get("chief", True):
            export = next(Path(r["export"]).glob("assets.extra/ctrtrain.json"))
            out[name] = {"result": json.loads((Path(cfg.model_dir) / "result.json").read_text()),
                         "export": json.loads(export.read_text())}
    if out:
        (env.model_dir / "runs.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
