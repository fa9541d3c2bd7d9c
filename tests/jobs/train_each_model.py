"""A job's entry point that makes several training runs in turn in the same processes
(test_models.py): each with the recipe's own configuration of this process (channels, mode,
data service, its part of the training data; recipes/deepfm.py) and the settings given for it,
into a checkpoint directory of its own. A multi-process job costs seconds of start-up per
process (a parameter-server job starts eight); this trains every model in one job's processes.

    --runs '{"lr": {"steps": 30, ...}, "deepfm-1-epoch": {"model": "deepfm", ...}}'

A run's model is its `model` setting, else its name. The chief writes <SM_MODEL_DIR>/runs.json:
each run's result.json, its first "start" event (metrics.jsonl) and its export's
assets.extra/ctrtrain.json."""
import dataclasses
import json
import sys
from pathlib import Path

from ctrtrain.tf_start import own_process

# One of the job's own trainers, as the recipe's processes are (recipes/deepfm.py): TensorFlow's
# objects, imported next, frozen out of the collector's passes over its runs.
own_process()

from ctrtrain.environment import Environment  # noqa: E402
from ctrtrain.recipes.deepfm import parse_hyperparameters, recipe_config  # noqa: E402
from ctrtrain.train import train  # noqa: E402


def main(argv) -> None:
    assert argv[0] == "--runs", argv
    env, out = Environment(), {}
    for name, settings in json.loads(argv[1]).items():
        hps = parse_hyperparameters([a for k, v in {"model": name, **settings}.items()
                                     for a in (f"--{k}", str(v))])
        cfg = recipe_config(env, hps)
        if cfg.read_plan:     # as the recipe prints it
            print(f"reading {cfg.read_plan}", flush=True)
        md = Path(cfg.model_dir) / name
        r = train(dataclasses.replace(cfg, model_dir=str(md)))
        print(f"trained {name}: step {r.get('step')}", flush=True)
        if r.get("chief", True):
            events = (json.loads(line) for line in (md / "metrics.jsonl").read_text().splitlines())
            out[name] = {"result": json.loads((md / "result.json").read_text()),
                         "start": next(e for e in events if e.get("event") == "start"),
                         "export": json.loads(next(Path(r["export"]).glob(
                             "assets.extra/ctrtrain.json")).read_text())}
    if out:
        (env.model_dir / "runs.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    from ctrtrain.shutdown import end_process
    main(sys.argv[1:])
    end_process(0)
