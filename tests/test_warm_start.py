"""`ctrtrain train --warm-start EARLIER_MODEL_DIR`: a new run on new data that starts from an
earlier run's model and optimizer state (the day-by-day retrain of issue 57)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import cli, ctrtrain_here

SMALL = ("--batch-size", 256, "--embedding-size", 4, "--deep-layers", "32,16")


@pytest.fixture(scope="module")
def days(synth_data):
    """Two "days" of the same hidden model: the synthesized train split (16,000 rows) and
    its valid split (2,000 rows), and the test split to judge both."""
    tf = synth_data(rows=20_000, feature_size=2_000)[0] / "tf"
    return tf / "train", tf / "valid", tf / "test"


def checkpoint(md, step):
    import tensorflow as tf
    r = tf.train.load_checkpoint(str(md / "checkpoints" / f"ckpt-{step}"))
    return {k: r.get_tensor(k) for k in r.get_variable_to_shape_map() if "OBJECT_GRAPH" not in k}


def test_a_warm_start_goes_on_from_the_earlier_model_and_its_optimizer(days, tmp_path):
    day1, day2, test = days
    ctrtrain_here("train", "--train", day1, "--test", test, "--model-dir", tmp_path / "d1",
                  "--epochs", 1, "--table-updates", "lazy", *SMALL)
    out = ctrtrain_here("train", "--train", day2, "--test", test, "--model-dir", tmp_path / "d2",
                        "--epochs", 1, "--table-updates", "lazy", "--warm-start", tmp_path / "d1",
                        *SMALL)
    assert f"warm start from {tmp_path / 'd1'} (ckpt-62" in out, out
    r = json.loads((tmp_path / "d2" / "result.json").read_text())
    # This run counts its own steps (2,000 rows of batch 256: 7), the optimizer's goes on.
    assert r["step"] == r["total_steps"] == 7 and r["resumed_from"] == 0
    assert r["warm_start"] == {"from": str(tmp_path / "d1"), "checkpoint": "ckpt-62", "step": 62}
    before, after = checkpoint(tmp_path / "d1", 62), checkpoint(tmp_path / "d2", 7)
    assert after["optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE"] == 62 + 7
    assert after["optimizer/lr_scale/.ATTRIBUTES/VARIABLE_VALUE"] == 1.0
    # Lazy table updates: the rows day 2 never read are day 1's, to the bit; those it read moved.
    table = "model/embeddings/table/.ATTRIBUTES/VARIABLE_VALUE"
    same = np.all(before[table] == after[table], axis=1)
    assert 0 < same.sum() < len(same), same.sum()
    moments = "optimizer/slots/0/moments/.ATTRIBUTES/VARIABLE_VALUE"   # the table's m and v
    np.testing.assert_array_equal(before[moments][same], after[moments][same])
    assert not np.array_equal(before[moments][~same], after[moments][~same])
    # The day-2 model knows day 1: above a run on day 2 alone.
    ctrtrain_here("train", "--train", day2, "--test", test, "--model-dir", tmp_path / "alone",
                  "--epochs", 1, "--table-updates", "lazy", *SMALL)
    alone = json.loads((tmp_path / "alone" / "result.json").read_text())
    assert r["test"]["auc"] > alone["test"]["auc"] + 0.005, (r["test"], alone["test"])


def test_a_warm_started_run_resumes_exactly(days, tmp_path):
    """Stopped after 3 of its steps and run again, a warm-started run (catch-up table
    updates: they read the optimizer's step count) ends where the undisturbed one does."""
    day1, day2, test = days
    ctrtrain_here("train", "--train", day1, "--model-dir", tmp_path / "d1", "--steps", 20,
                  "--table-updates", "catchup", *SMALL)
    common = ("--train", day2, "--table-updates", "catchup", "--warm-start", tmp_path / "d1",
              "--checkpoint-every", 3, "--no-export", *SMALL)
    ctrtrain_here("train", "--model-dir", tmp_path / "whole", "--steps", 8, *common)
    ctrtrain_here("train", "--model-dir", tmp_path / "cut", "--steps", 3, *common)
    out = ctrtrain_here("train", "--model-dir", tmp_path / "cut", "--steps", 8, *common)
    assert "resuming from the checkpoint at step 3" in out, out
    whole, cut = checkpoint(tmp_path / "whole", 8), checkpoint(tmp_path / "cut", 8)
    assert whole["optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE"] == 28
    for k in whole:
        np.testing.assert_array_equal(whole[k], cut[k], err_msg=k)


def test_a_warm_start_is_refused_where_it_cannot_hold(days, tmp_path):
    day1, day2, _ = days
    ctrtrain_here("train", "--train", day1, "--model-dir", tmp_path / "d1", "--steps", 5,
                  "--no-export", *SMALL)
    # Another model shape: named, nothing trained.
    code, out, err = cli("train", "--train", day2, "--model-dir", tmp_path / "wide", "--steps", 5,
                         "--warm-start", tmp_path / "d1", "--batch-size", 256,
                         "--embedding-size", 8, "--deep-layers", "32,16")
    assert code == 2 and "its model has embedding_size=4, this run 8" in err, err
    assert not (tmp_path / "wide" / "checkpoints").exists()
    # No checkpoint where it points.
    code, out, err = cli("train", "--train", day2, "--model-dir", tmp_path / "x", "--steps", 5,
                         "--warm-start", tmp_path / "nothing", *SMALL)
    assert code == 2 and f"warm_start {tmp_path / 'nothing'}: no checkpoint there" in err, err
    # A directory holding its own run is resumed, never silently warm-started over.
    code, out, err = cli("train", "--train", day1, "--model-dir", tmp_path / "d1", "--steps", 10,
                         "--warm-start", tmp_path / "d1", *SMALL)
    assert code == 2 and "did not start from it" in err and "--fresh" in err, err


@pytest.mark.slow
def test_an_allreduce_job_starts_from_the_model_channel(days, tmp_path):
    """SageMaker-style: the earlier model (a run's checkpoints directory, as a job's
    /opt/ml/checkpoints is) given as the `model` channel of a 2-host all-reduce job; every rank
    starts from it, and the job's result names it."""
    from test_distributed import launch
    day1, day2, test = days
    ctrtrain_here("train", "--train", day1, "--model-dir", tmp_path / "d1", "--steps", 20,
                  "--batch-size", 256, "--embedding-size", 16, "--no-export")
    r, job, out = launch(tmp_path, "deepfm-allreduce", test.parent, hyperparameters={
        "steps": 3, "batch_size": 256}, channels={
        "training": {"path": str(day2)}, "test": {"path": str(test)},
        "model": {"path": str(tmp_path / "d1")}})
    assert r["replicas"] == 2 and r["step"] == 3 and r["mode"] == "allreduce", r
    assert r["warm_start"] == {"from": "/opt/ml/input/data/model", "checkpoint": "ckpt-20",
                               "step": 20}, r["warm_start"]
    assert out.count("warm start from /opt/ml/input/data/model (ckpt-20") == 1, out  # the chief
    final = checkpoint(tmp_path / "run" / "checkpoints", 3)
    assert final["optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE"] == 23


def test_a_grown_vocabulary_keeps_each_values_row(tmp_path):
    """Day 2 featurized with day 1's vocabulary grown by its new values (`featurize --vocab
    --grow`): the ids after the first grown column move, and the warm start moves each value's
    row, with its optimizer state, to the value's new id; new values start as new rows."""
    from pathlib import Path
    lines = (Path(__file__).parent / "data" / "criteo_head1000" / "train.txt").read_text() \
        .splitlines(keepends=True)
    (tmp_path / "raw1.txt").write_text("".join(lines[:600]))
    (tmp_path / "raw2.txt").write_text("".join(lines[600:]))
    ctrtrain_here("data", "featurize", tmp_path / "raw1.txt", "--out", tmp_path / "f1",
                  "--min-count", 2)
    ctrtrain_here("data", "featurize", tmp_path / "raw2.txt", "--out", tmp_path / "f2",
                  "--vocab", tmp_path / "f1" / "vocab.json", "--grow", "--min-count", 2)
    v1, v2 = (json.loads((tmp_path / f / "vocab.json").read_text()) for f in ("f1", "f2"))
    assert v2["feature_size"] > v1["feature_size"]
    for c, values in v1["values"].items():      # every earlier value keeps its place
        assert v2["values"][c][:len(values)] == values
    common = ("--table-updates", "lazy", "--no-export", *SMALL)
    ctrtrain_here("train", "--train", tmp_path / "f1", "--model-dir", tmp_path / "d1",
                  "--steps", 6, *common)
    ctrtrain_here("train", "--train", tmp_path / "f2", "--model-dir", tmp_path / "d2",
                  "--steps", 1, "--warm-start", tmp_path / "d1", *common)
    r = json.loads((tmp_path / "d2" / "result.json").read_text())
    assert r["warm_start"]["vocabulary"]["rows_kept"] == v1["feature_size"], r["warm_start"]
    before, after = checkpoint(tmp_path / "d1", 6), checkpoint(tmp_path / "d2", 1)
    table = "model/embeddings/table/.ATTRIBUTES/VARIABLE_VALUE"
    moments = "optimizer/slots/0/moments/.ATTRIBUTES/VARIABLE_VALUE"
    assert after[table].shape[0] == v2["feature_size"]
    from ctrtrain.data.featurize import Vocabulary
    old_id = Vocabulary.load(str(tmp_path / "f2" / "vocab.json")).ids_from(
        Vocabulary.load(str(tmp_path / "f1" / "vocab.json")))
    kept = old_id >= 0
    assert kept.sum() == v1["feature_size"] and not np.array_equal(old_id[kept],
                                                                     np.flatnonzero(kept))
    # The one step of day 2 updated a batch's rows (lazy): every other earlier value's row
    # is its day-1 row, at its new id, with its optimizer state.
    same = np.all(after[table][kept] == before[table][old_id[kept]], axis=1)
    assert 100 < same.sum() < kept.sum(), same.sum()
    np.testing.assert_array_equal(after[moments][kept][same],
                                  before[moments][old_id[kept][same]])
    # A new value's row starts as a new row does: no optimizer state but the step's own.
    fresh = ~kept
    touched = np.any(after[moments][fresh] != 0, axis=1)
    assert fresh.sum() > 0 and touched.sum() < fresh.sum()
