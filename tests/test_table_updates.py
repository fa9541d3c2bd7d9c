"""table_updates: catchup gives the dense optimizer's parameters at the cost of the rows a batch
touches (models/engine/). Checked through the real training step (build_training: DeepFM,
its row reads, the optimizer), on a small table with long-tailed ids, so that rows sit idle for
many steps between updates."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

# The update arithmetic of the training step, on the ops of each TensorFlow version.
pytestmark = pytest.mark.tf215

from ctrtrain.models.base import ModelConfig  # noqa: E402
from ctrtrain.train.step import build_training, settle_function  # noqa: E402

ROWS, FIELDS = 1000, 5


def batches(n: int, batch: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        ids = (rng.zipf(1.5, (batch, FIELDS)) - 1) % ROWS       # a long tail: most rows idle
        values = rng.uniform(0.5, 1.5, (batch, FIELDS)).astype(np.float32)
        label = (rng.random(batch) < 0.3).astype(np.float32)
        yield {"ids": tf.constant(ids, tf.int64), "values": tf.constant(values),
               "label": tf.constant(label)}


def train(table_updates: str, optimizer: str, steps: int, lr: float, decay_at=None, **params):
    """`decay_at`: after that step, every row settled (as an evaluation does) and the
    learning rate divided by 10 (lr_decay_on_plateau 0.1)."""
    tf.random.set_seed(0)
    # Rows of 0.01 (the scale these comparisons were written at): from 1e-4 FTRL's lazy and
    # dense tables stay within 1e-3 of each other over 150 steps.
    cfg = ModelConfig(ROWS, FIELDS, embedding_size=4, deep_layers=(8,), seed=0, l2_dense=1e-3,
                      embedding_init=0.01)
    model, opt, step, variables = build_training(
        cfg, optimizer, lr, optimizer_params={"table_updates": table_updates, **params})
    touched = np.zeros(ROWS, bool)
    for i, batch in enumerate(batches(steps)):
        step(batch)
        touched[batch["ids"].numpy().ravel()] = True
        if i + 1 == decay_at:
            settle_function(opt)()
            opt.lr_scale.assign(opt.lr_scale * 0.1)
    settle_function(opt)()
    return [v.numpy() for v in variables], touched


CASES = [("adam", 0.01, {}), ("adam", 0.01, {"epsilon": 1e-8, "beta2": 0.99}),
         ("adam", 0.01, {"epsilon": 1e-3}), ("adam", 0.01, {"epsilon": 1e-3, "beta2": 0.99}),
         ("momentum", 0.05, {"momentum": 0.9}), ("adagrad", 0.1, {}), ("ftrl", 0.1, {}),
         ("sgd", 0.1, {}),
         # with the table's L2, whose skipped steps momentum, SGD and Adagrad catch up too
         ("momentum", 0.05, {"table_l2": 1e-2}), ("sgd", 0.1, {"table_l2": 1e-2}),
         ("adagrad", 0.1, {"table_l2": 1e-2})]


@pytest.mark.parametrize("optimizer,lr,params", CASES, ids=lambda c: str(c))
def test_catchup_gives_the_dense_update(optimizer, lr, params):
    """The MLP within 1e-4 (a hundredth of an Adam step here); the table's elements within
    5e-5 but for 1 in 1000, and all within 5e-4. Those few are elements whose gradient is at
    float32 noise (around 1e-9, near eps): Adam's m/(sqrt(v)+eps) turns that noise into a visible
    step in any two runs that sum the same gradient in a different order."""
    dense, touched = train("dense", optimizer, 150, lr, **params)
    catchup, _ = train("catchup", optimizer, 150, lr, **params)
    assert 0.2 < touched.mean() < 0.9       # the table has idle and never-touched rows
    for d, c in zip(dense[1:], catchup[1:]):
        np.testing.assert_allclose(c, d, rtol=0, atol=1e-4)
    table_diff = np.abs(dense[0] - catchup[0])
    assert np.quantile(table_diff, 0.999) < 5e-5, np.quantile(table_diff, 0.999)
    assert table_diff.max() < 5e-4, table_diff.max()


@pytest.mark.parametrize("optimizer,lr,params", [
    ("adam", 0.01, {}), ("adam", 0.01, {"epsilon": 1e-3}), ("adagrad", 0.1, {"table_l2": 1e-2})],
    ids=lambda c: str(c))
def test_catchup_stays_exact_across_a_learning_rate_decay(optimizer, lr, params):
    """A decay on a plateau (after an evaluation has settled every row): rows idle across it
    catch up at the new rate, as the dense update moved them; and the decay changes the model
    (the comparison can fail). FTRL's catch-up is not exact across it (the rows a step after
    the decay touches are rebuilt at the new rate, where the dense update used the old one's
    weights): lr_decay_on_plateau refuses FTRL, momentum and SGD with catch-up."""
    dense, _ = train("dense", optimizer, 150, lr, decay_at=60, **params)
    catchup, _ = train("catchup", optimizer, 150, lr, decay_at=60, **params)
    for d, c in zip(dense[1:], catchup[1:]):
        np.testing.assert_allclose(c, d, rtol=0, atol=1e-4)
    table_diff = np.abs(dense[0] - catchup[0])
    assert np.quantile(table_diff, 0.999) < 5e-5 and table_diff.max() < 5e-4
    undecayed, _ = train("dense", optimizer, 150, lr, **params)
    assert np.abs(undecayed[0] - dense[0]).max() > 1e-3


@pytest.mark.parametrize("optimizer", ["adam", "momentum", "ftrl"])
def test_lazy_updates_differ_from_dense(optimizer):
    """The comparison above can fail: lazy updates skip exactly what catchup restores."""
    lr = {"adam": 0.01, "momentum": 0.05, "ftrl": 0.1}[optimizer]
    dense, _ = train("dense", optimizer, 150, lr)
    lazy, _ = train("lazy", optimizer, 150, lr)
    assert max(np.abs(a - b).max() for a, b in zip(dense, lazy)) > 1e-3


def test_adam_catchup_with_table_l2_is_within_its_stated_bound():
    """With the table's L2, Adam's skipped steps have no closed form: catchup approximates
    them (Adam._idle_l2). The bound stated in docs/training.md, at the default learning rate over
    150 steps of long-tailed ids: median table difference from dense under 2e-4 and the 99th
    percentile under 6e-3 (lazy updates: 6e-3 and 3e-2), the MLP within 5e-3."""
    for l2 in (1e-4, 1e-3):
        dense, _ = train("dense", "adam", 150, 1e-3, table_l2=l2)
        catchup, _ = train("catchup", "adam", 150, 1e-3, table_l2=l2)
        lazy, _ = train("lazy", "adam", 150, 1e-3, table_l2=l2)
        diff, lazy_diff = np.abs(dense[0] - catchup[0]), np.abs(dense[0] - lazy[0])
        assert np.median(diff) < 2e-4 and np.quantile(diff, 0.99) < 6e-3, l2
        assert np.median(diff) < np.median(lazy_diff) / 10, l2
        assert max(np.abs(d - c).max() for d, c in zip(dense[1:], catchup[1:])) < 5e-3


def test_table_l2_is_the_samples_penalty_on_every_row():
    """l2 * tf.nn.l2_loss(table): a row no batch touches shrinks by lr * l2 * row per SGD
    step, in dense mode and (caught up when read) in catchup mode; lazy mode leaves it."""
    steps, lr, l2 = 20, 0.1, 0.5
    ids = np.ones(64, np.int64)     # only row 1 is ever touched
    cfg = ModelConfig(ROWS, 1, embedding_size=2, deep_layers=(4,), seed=0)
    for mode in ("dense", "catchup", "lazy"):
        model, opt, step, _ = build_training(cfg, "sgd", lr, optimizer_params={
            "table_updates": mode, "table_l2": l2})
        start = model.table.numpy()
        for _ in range(steps):
            step({"ids": tf.constant(ids[:, None]), "values": tf.ones([64, 1]),
                  "label": tf.zeros([64])})
        settle_function(opt)()
        expected = start[5] * ((1 - lr * l2) ** steps if mode != "lazy" else 1.0)
        np.testing.assert_allclose(model.table.numpy()[5], expected, rtol=1e-5)


def test_output_bias_starts_at_the_positive_rate():
    from ctrtrain.train.config import TrainConfig, model_config
    cfg = TrainConfig(train_dir="x", model_dir="y")
    assert model_config(cfg, 10, 2, positive_rate=0.002).initial_bias == pytest.approx(
        np.log(0.002 / 0.998))
    assert model_config(cfg, 10, 2, positive_rate=None).initial_bias == 0.0
    cfg.output_bias = "zero"
    assert model_config(cfg, 10, 2, positive_rate=0.002).initial_bias == 0.0


@pytest.mark.slow
def test_rare_positive_data_starts_calibrated(tmp_path):
    """On 0.2%-positive data a few steps from a zero bias predict far above the base rate
    (the early steps spend themselves moving the bias from 0.5); from the prior they do not."""
    import json

    from conftest import ctrtrain_here
    from ctrtrain.data.synth import SynthConfig, synthesize
    synthesize(tmp_path / "d", SynthConfig(rows=30_000, feature_size=3_000, base_rate=0.002),
               processes=1)
    means = {}
    for bias in ("prior", "zero"):
        md = tmp_path / bias
        ctrtrain_here("train", "--train", tmp_path / "d" / "train", "--test", tmp_path / "d" / "test",
                      "--model-dir", md, "--steps", "5", "--batch-size", "256", "--no-export",
                      "--quiet", "--output-bias", bias, "--predictions", "auto")
        probs = [float(line.split(",")[1]) for line in
                 (md / "predictions.csv").read_text().splitlines()[1:]]
        means[bias] = sum(probs) / len(probs)
    rate = json.loads((tmp_path / "d" / "synth.json").read_text())["splits"]["train"]["positive_rate"]
    assert means["prior"] < 2 * rate, (means, rate)
    assert means["zero"] > 4 * rate, (means, rate)


def test_auto_is_dense_on_small_tables_and_catchup_on_large_or_under_parameter_servers():
    from ctrtrain.train.config import AUTO_DENSE_ROWS, TrainConfig, resolve_table_updates

    def resolved(rows, **kw):
        cfg = TrainConfig(train_dir="x", model_dir="y", **kw)
        assert cfg.table_updates == "auto"          # the default
        return resolve_table_updates(cfg, rows)
    assert resolved(AUTO_DENSE_ROWS) == "dense"
    assert resolved(AUTO_DENSE_ROWS + 1) == "catchup"
    assert resolved(1000, mode="allreduce") == "dense"
    assert resolved(1000, mode="parameter_server") == "catchup"
    cfg = TrainConfig(train_dir="x", model_dir="y", table_updates="lazy")
    assert resolve_table_updates(cfg, 10) == "lazy"      # a choice is kept


def test_auto_shuffles_the_whole_split_up_to_its_byte_budget(tmp_path):
    """shuffle_buffer auto: every record of a training split of at most 256 MB (gzip counted
    at 4x), else 10,000; a Pipe stream (no files) 10,000; a number given is kept. On a real
    split: `ctrtrain data synth`'s, whose manifest gives the records."""
    import dataclasses
    from conftest import ctrtrain_here
    from ctrtrain.data.manifest import read_manifest
    from ctrtrain.train.config import (AUTO_SHUFFLE_BYTES, AUTO_SHUFFLE_RECORDS, TrainConfig,
                                       resolve_shuffle_buffer)
    ctrtrain_here("data", "synth", "--out", tmp_path / "d", "--rows", 3000, "--feature-size", 500)
    m = read_manifest(tmp_path / "d" / "train")

    def resolved(m, **kw):
        cfg = TrainConfig(train_dir="x", model_dir="y", **kw)
        return resolve_shuffle_buffer(cfg, m)

    def sized(m, total, compression=None):
        files = [dataclasses.replace(f, bytes=total // len(m.files)) for f in m.files]
        return dataclasses.replace(m, files=files, compression=compression)

    assert TrainConfig(train_dir="x", model_dir="y").shuffle_buffer == "auto"   # the default
    assert resolved(m) == m.records == 2400
    assert resolved(sized(m, AUTO_SHUFFLE_BYTES)) == m.records
    assert resolved(sized(m, AUTO_SHUFFLE_BYTES + 2 * len(m.files))) == AUTO_SHUFFLE_RECORDS
    assert resolved(sized(m, AUTO_SHUFFLE_BYTES // 4, "gzip")) == m.records
    assert resolved(sized(m, AUTO_SHUFFLE_BYTES // 2, "gzip")) == AUTO_SHUFFLE_RECORDS
    assert resolved(dataclasses.replace(m, files=[])) == AUTO_SHUFFLE_RECORDS     # Pipe
    assert resolved(m, shuffle_buffer=500) == 500 and resolved(m, shuffle_buffer=0) == 0
