"""The Python API (docs/api.md) as a user writes it: `ctrtrain.train(...)`, then
`ctrtrain.evaluate(...)`, then `ctrtrain.predict(...)` on the README's quick start (a CSV made
from a real sample, split and featurized), each against the command with the same settings
run in this process; a bad setting refused by name, as the command refuses it; `import
ctrtrain` without TensorFlow."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, cli, ctrtrain_here
from test_readme import my_csv

# The settings of both runs: keywords of ctrtrain.train, flags of `ctrtrain train`. Tiny: two
# epochs of ~150 rows, a small MLP.
SETTINGS = {"model": "deepfm", "epochs": 2, "batch_size": 64, "deep_layers": (16,),
            "quiet": True}
# ... and these from a configuration file, given to both.
CONFIG = "model:\n  embedding_size: 4\nschedule:\n  seed: 3\n"


def flags(settings: dict) -> list[str]:
    out = []
    for k, v in settings.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        else:
            out += [flag, ",".join(map(str, v)) if isinstance(v, tuple) else str(v)]
    return out


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory):
    """The README's quick start's data: my.csv split, then featurized (vocabulary from the
    training split)."""
    d = tmp_path_factory.mktemp("api")
    my_csv(d / "my.csv")
    ctrtrain_here("data", "split", d / "my.csv", "--out", d / "split")
    ctrtrain_here("data", "featurize", d / "split" / "train.csv", "--out", d / "feat" / "train",
                  "--numeric", "age", "--multi-hot", "genres", "--drop", "title,timestamp")
    for split in ("valid", "test"):
        ctrtrain_here("data", "featurize", d / "split" / f"{split}.csv", "--out",
                      d / "feat" / split, "--vocab", d / "feat" / "train" / "vocab.json")
    (d / "train.yaml").write_text(CONFIG)
    return d


def test_train_evaluate_predict_as_the_commands_do(quick_start, tmp_path):
    import ctrtrain
    d = quick_start
    feat = {s: str(d / "feat" / s) for s in ("train", "valid", "test")}

    result = ctrtrain.train(train=feat["train"], valid=feat["valid"], test=feat["test"],
                            model_dir=tmp_path / "api", config=d / "train.yaml", **SETTINGS)
    ctrtrain_here("train", "--train", feat["train"], "--valid", feat["valid"], "--test",
                  feat["test"], "--model-dir", tmp_path / "cli", "--config", d / "train.yaml",
                  *flags(SETTINGS))
    written = json.loads((tmp_path / "api" / "result.json").read_text())
    assert result == written            # what the command writes to result.json
    by_cli = json.loads((tmp_path / "cli" / "result.json").read_text())
    assert result.keys() == by_cli.keys()
    records = json.loads((d / "feat" / "train" / "manifest.json").read_text())["records"]
    assert result["step"] == by_cli["step"] == 2 * (records // 64) > 2   # whole batches
    for split in ("valid", "test"):
        assert result[split]["examples"] == by_cli[split]["examples"] > 5
        assert result[split]["auc"] == pytest.approx(by_cli[split]["auc"], abs=1e-6)
    config = (tmp_path / "api" / "config.yaml").read_text()
    assert config == (tmp_path / "cli" / "config.yaml").read_text().replace("/cli", "/api")
    model = tmp_path / "api" / "export"

    # evaluate: the report `ctrtrain evaluate --json` writes, on the raw test rows.
    report = ctrtrain.evaluate(model=model, input=d / "split" / "test.csv", group="user_id",
                               json=tmp_path / "api-eval.json")
    ctrtrain_here("evaluate", "--model", model, "--input", d / "split" / "test.csv",
                  "--group", "user_id", "--json", tmp_path / "cli-eval.json")
    by_cli = json.loads((tmp_path / "cli-eval.json").read_text())
    assert report["auc"] == by_cli["auc"] and report["rows"] == by_cli["rows"]
    assert json.loads((tmp_path / "api-eval.json").read_text()) == {
        **report, "plot": str(tmp_path / "api-eval.png")}
    # The raw rows score as the featurized test split did in training.
    assert report["auc"] == pytest.approx(result["test"]["auc"], abs=1e-6)

    # predict: the probabilities, in input order, as `ctrtrain predict` writes them.
    probs = ctrtrain.predict(model=model, input=feat["test"])
    ctrtrain_here("predict", "--model", model, "--input", feat["test"], "--out",
                  tmp_path / "cli.csv")
    rows = (tmp_path / "cli.csv").read_text().splitlines()
    assert rows[0] == "row,prob,label"
    expected = np.array([line.split(",")[1] for line in rows[1:]], dtype=np.float32)
    assert probs.dtype == np.float32 and probs.shape == (result["test"]["examples"],)
    np.testing.assert_array_equal(probs, expected)
    again = ctrtrain.predict(model, [feat["test"]], tmp_path / "api.csv")
    np.testing.assert_array_equal(again, probs)
    assert (tmp_path / "api.csv").read_text() == (tmp_path / "cli.csv").read_text()

    # A user's process starts TensorFlow as a command does: without Keras (tf_start).
    probe = ("import sys, ctrtrain\n"
             f"p = ctrtrain.predict({str(model)!r}, {str(d / 'split' / 'test.csv')!r})\n"
             "print(len(p), 'tensorflow' in sys.modules, 'keras' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.stdout.split() == [str(report["rows"]), "True", "False"]


@pytest.mark.parametrize("settings, command_flags, message", [
    ({"batch_size": 0}, ["--batch-size", "0"], "batch_size: 0 must be >= 1"),
    ({"model": "nope"}, ["--model", "nope"], "model: 'nope' is not one of lr, fm, deepfm"),
    ({"epochs": "two"}, ["--epochs", "two"], "epochs: 'two' is not a number"),
    ({"batchsize": 64}, ["--batchsize", "64"], "unknown setting 'batchsize'"),
])
def test_a_bad_setting_is_refused_by_name_as_the_command_refuses_it(
        tmp_path, settings, command_flags, message):
    import ctrtrain
    with pytest.raises(ctrtrain.ConfigError, match=f"^{message}"):
        ctrtrain.train(train=tmp_path, model_dir=tmp_path / "m", **settings)
    code, _, err = cli("train", "--train", tmp_path, "--model-dir", tmp_path / "m",
                       *command_flags)
    assert code == 2
    name = "--" + next(iter(settings)).replace("_", "-")
    if "unknown" in message:
        assert f"unrecognized arguments: {name}" in err
    else:                               # the same words after the setting's name
        assert f"argument {name}: {message.split(': ', 1)[1]}" in err
    assert not (tmp_path / "m").exists()


def test_refusals_before_anything_runs(tmp_path):
    import ctrtrain
    with pytest.raises(ctrtrain.ConfigError, match="^model_dir is required"):
        ctrtrain.train(train=tmp_path)
    with pytest.raises(ctrtrain.ConfigError, match="^train_dir: given twice"):
        ctrtrain.train(train=tmp_path, train_dir=tmp_path, model_dir=tmp_path / "m")
    (tmp_path / "bad.yaml").write_text("schedule:\n  epochs: -1\n")
    with pytest.raises(ctrtrain.ConfigError, match="^epochs: -1 must be > 0"):
        ctrtrain.train(config=tmp_path / "bad.yaml", train=tmp_path, model_dir=tmp_path / "m")
    with pytest.raises(ctrtrain.ConfigError, match="^embedding_size: model lr does not use it"):
        ctrtrain.train(train=tmp_path, model_dir=tmp_path / "m", model="lr", embedding_size=8)
    with pytest.raises(ctrtrain.ConfigError, match="^bins: 0 must be >= 1"):
        ctrtrain.evaluate(model=tmp_path, input=tmp_path, bins=0)
    with pytest.raises(ctrtrain.ConfigError, match="^no_label: 'maybe' is not true or false"):
        ctrtrain.predict(model=tmp_path, input=tmp_path, no_label="maybe")
    assert not (tmp_path / "m").exists()


def test_import_ctrtrain_imports_no_tensorflow():
    """`import ctrtrain` stays cheap: TensorFlow (and NumPy) load when a function runs;
    the Keras hook is installed, as for a command."""
    probe = ("import sys, ctrtrain, inspect\n"
             "from ctrtrain.tf_start import _KerasAfterTensorFlow\n"
             "print(sorted(m for m in ('tensorflow', 'numpy', 'pandas', 'yaml') "
             "if m in sys.modules))\n"
             "print(any(isinstance(f, _KerasAfterTensorFlow) for f in sys.meta_path))\n"
             "print(inspect.signature(ctrtrain.train))\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.stdout.splitlines() == ["[]", "True", "(config=None, **settings) -> 'dict'"]
