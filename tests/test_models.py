"""The model family on one engine (models/): each model's logit is its paper's formula,
computed here from its variables; each trains, checkpoints, resumes exactly, exports and
predicts what training predicted; a setting a model does not read is refused by name."""

import json

import numpy as np
import pytest

from conftest import run_cli

tf = pytest.importorskip("tensorflow")

DATA = {"rows": 40_000, "feature_size": 2_000, "seed": 3}   # test_distributed.py's
MODELS = ["lr", "fm"]   # DeepFM: test_train.py, test_distributed.py and the others


def features(batch=4):
    """A batch of every field kind: 2 single ids with values, 1 numeric, 1 bag of up to 3."""
    rng = np.random.default_rng(0)
    return {"ids": tf.constant(rng.integers(0, 10, (batch, 2))),
            "values": tf.constant(rng.uniform(0.5, 1.5, (batch, 2)).astype(np.float32)),
            "numeric": tf.constant(rng.uniform(0, 2, (batch, 1)).astype(np.float32)),
            "bag_ids": tf.constant([[4, 7, -1], [-1, -1, -1], [1, 1, 2], [9, -1, -1]][:batch],
                                   tf.int64),
            "bag_weights": tf.constant([[0.5, 2.0, 0], [0, 0, 0], [1, 1, 1], [3, 0, 0]][:batch],
                                       tf.float32)}


def slots(table, f):
    """[B, 4, width]: each field's row times its value (the bag summed), from the table."""
    ids, values = f["ids"].numpy(), f["values"].numpy()
    out = []
    for b in range(ids.shape[0]):
        bag = sum((table[i] * w for i, w in zip(f["bag_ids"].numpy()[b], f["bag_weights"].numpy()[b])
                   if i >= 0), np.zeros(table.shape[1], np.float32))
        out.append([table[ids[b, 0]] * values[b, 0], table[ids[b, 1]] * values[b, 1],
                    table[10] * f["numeric"].numpy()[b, 0], bag])
    return np.array(out)


@pytest.mark.parametrize("name", MODELS)
def test_each_model_computes_its_papers_logit(name):
    from ctrtrain.models import build_model
    from ctrtrain.models.base import ModelConfig
    m = build_model(ModelConfig(feature_size=10, field_size=4, embedding_size=3, numeric_fields=1,
                                bags=((3, "sum"),), initial_bias=0.25, model=name, seed=1))
    m.table.assign(tf.random.normal(m.table.shape, seed=2))
    f = features()
    logits, l2 = m(f)
    s = slots(m.table.numpy(), f)
    first = s[:, :, 0].sum(1)
    if name == "lr":
        assert m.table.shape == (11, 1)
        want = 0.25 + first
    else:   # fm: + 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2]
        e = s[:, :, 1:]
        want = 0.25 + first + 0.5 * ((e.sum(1) ** 2) - (e ** 2).sum(1)).sum(1)
    np.testing.assert_allclose(logits.numpy(), want, rtol=1e-5, atol=1e-6)
    assert l2 == 0.0 and m.dense_variables() == [m.bias]


@pytest.mark.parametrize("setting, value", [("deep_layers", (400, 400)), ("dropout", 0.5),
                                            ("embedding_size", 8)])
def test_a_setting_the_model_does_not_read_is_refused_by_name(setting, value):
    from ctrtrain.errors import ConfigError
    from ctrtrain.train.config import TrainConfig, check_config
    with pytest.raises(ConfigError, match=f"^{setting}: model lr does not use it"):
        check_config(TrainConfig(train_dir="d", model_dir="m", model="lr", **{setting: value}))
    check_config(TrainConfig(train_dir="d", model_dir="m", model="deepfm", **{setting: value}))
    if setting != "embedding_size":
        with pytest.raises(ConfigError, match=f"^{setting}: model fm does not use it"):
            check_config(TrainConfig(train_dir="d", model_dir="m", model="fm", **{setting: value}))


def test_an_unknown_model_is_named(tmp_path):
    r = run_cli("train", "--train", tmp_path, "--model-dir", tmp_path / "m", "--model", "dnn",
                check=False)
    assert r.returncode == 2 and "'dnn' is not one of lr, fm, deepfm" in r.stderr


@pytest.fixture(scope="module")
def data(synth_data):
    return synth_data(**DATA)[0] / "tf"


def train(data, md, model, steps, *extra):
    run_cli("train", "--train", data / "train", "--test", data / "test", "--model-dir", md,
            "--model", model, "--steps", steps, "--batch-size", "256", "--checkpoint-every", "20",
            "--predictions", "auto", "--quiet", "--learning-rate", "0.01", *extra)
    return json.loads((md / "result.json").read_text())


def probs(csv):
    return np.array([float(line.split(",")[1]) for line in csv.read_text().splitlines()[1:]])


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_each_model_trains_resumes_exactly_exports_and_predicts_the_same(name, data, tmp_path):
    whole = train(data, tmp_path / "whole", name, 40)
    assert whole["test"]["auc"] > 0.6, whole["test"]
    # Stopped at a checkpoint, then the same command with more steps: the same model.
    train(data, tmp_path / "resumed", name, 20, "--no-export")
    resumed = train(data, tmp_path / "resumed", name, 40)
    assert resumed["resumed_from"] == 20 and resumed["step"] == 40
    np.testing.assert_allclose(probs(tmp_path / "resumed" / "predictions.csv"),
                               probs(tmp_path / "whole" / "predictions.csv"), atol=1e-6)
    # The exported model predicts what training's evaluation did.
    run_cli("predict", "--model", tmp_path / "whole" / "export", "--input", data / "test",
            "--out", tmp_path / "p.csv")
    np.testing.assert_allclose(probs(tmp_path / "p.csv"),
                               probs(tmp_path / "whole" / "predictions.csv"), atol=1e-6)
    info = json.loads(next((tmp_path / "whole" / "export").glob("*/assets.extra/ctrtrain.json"))
                      .read_text())
    assert info["model"] == name


@pytest.mark.slow
@pytest.mark.parametrize("example", ["deepfm-allreduce", "deepfm-parameter-server"])
@pytest.mark.parametrize("name", MODELS)
def test_each_model_trains_in_the_multi_process_modes(name, example, data, tmp_path):
    """Real launches: 2 all-reduce workers; 2 workers and 2 parameter servers holding the
    table in shards. The recipe takes the model as a hyperparameter, as SageMaker passes it."""
    from test_distributed import launch
    r, _, _ = launch(tmp_path, example, data, hyperparameters={
        "model": name, "steps": 60, "batch_size": 256, "learning_rate": 0.01})
    assert r["step"] == 60 and r["test"]["auc"] > 0.6, r["test"]
    info = json.loads(next((tmp_path / "run").glob("**/assets.extra/ctrtrain.json")).read_text())
    assert info["model"] == name and info["mode"] == r["mode"]
