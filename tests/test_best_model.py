"""The exported model is the best one (issue 31): with a validation split a run evaluates it
every epoch, keeps the best model by the monitored metric, stops two evaluations without a
better one, and tests and exports the best model, not the last. Real training runs on a small
table that over-fits within a few epochs at a high learning rate."""

import json
import sys

import numpy as np
import pytest

from conftest import ctrtrain_here, run_cli


@pytest.fixture(scope="module")
def small(synth_data):
    """6,400 training rows over a 4,000-row table: the validation AUC peaks within 2 epochs
    (at width 16, which `train` gives)."""
    return synth_data(rows=8000, feature_size=4000)[0] / "tf"


def train(data, md, *extra, valid=True):
    args = ["train", "--train", data / "train", "--test", data / "test", "--model-dir", md,
            "--batch-size", "128", "--embedding-size", "16", "--learning-rate", "0.01",
            *(["--valid", data / "valid"] if valid else []), *extra]
    r = run_cli(*args, timeout=600)
    events = [json.loads(line) for line in (md / "metrics.jsonl").read_text().splitlines()]
    return r, json.loads((md / "result.json").read_text()), events


def evals(events, split):
    return [(e["step"], e) for e in events if e["event"] == "eval" and e["split"] == split]


def assert_best_tested_and_exported(res, events, meta):
    """Evaluated every epoch, stopped 2 evaluations after the best validation AUC, and the
    best model's figures are the final ones: its validation AUC, and a final test evaluation
    equal to the test split's evaluation at that step during training (--eval-test)."""
    valid = evals(events, "valid")
    epoch = 6400 // res["global_batch"]      # steps: 50 in one process, 25 with 2 replicas
    assert [s for s, _ in valid][:3] == [epoch, 2 * epoch, 3 * epoch]
    midway = [(s, e) for s, e in valid if s < res["step"]] + [valid[-1]]
    best_step, best = max(midway, key=lambda se: se[1]["auc"])
    sel = res["selected"]
    assert res["stopped_early"] and res["step"] == best_step + 2 * epoch < res["total_steps"]
    assert sel["step"] == best_step and sel["best"] and sel["epoch"] == best_step / epoch
    assert sel["valid"]["auc"] == res["valid"]["auc"] == pytest.approx(best["auc"], abs=1e-9)
    assert sel["last"]["step"] == res["step"] and sel["last"]["valid"]["auc"] < best["auc"]
    test_then = dict(evals(events, "test"))[best_step]
    assert res["test"]["auc"] == pytest.approx(test_then["auc"], abs=1e-7)
    assert res["test"]["logloss"] == pytest.approx(test_then["logloss"], rel=1e-6)
    assert meta["step"] == best_step and meta["trained_steps"] == res["step"]
    return best_step, epoch


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "mirrored"])
def test_the_best_validation_auc_is_tested_and_exported(small, tmp_path, mode):
    md = tmp_path / "m"
    r, res, events = train(small, md, "--epochs", "30", "--eval-test", "--mode", mode)
    meta = json.loads(next((md / "export").glob("*/assets.extra/ctrtrain.json")).read_text())
    best_step, epoch = assert_best_tested_and_exported(res, events, meta)
    # The export is named after the step of the model it holds, the only version there.
    assert [d.name for d in (md / "export").iterdir()] == [str(best_step)]
    # The export's predictions of the test split are the best model's.
    ctrtrain_here("predict", "--model", md / "export", "--input", small / "test",
                  "--out", tmp_path / "p.csv")
    from ctrtrain.metrics import roc_auc
    rows = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)
    assert roc_auc(rows[:, 2], rows[:, 1]) == pytest.approx(res["test"]["auc"], abs=1e-6)
    assert f"model: step {best_step} (epoch {best_step // epoch}), the best validation auc" \
        in r.stdout
    assert "no validation set" not in r.stdout
    # The last state is the checkpoint a resumed run continues from; the best one is beside it.
    assert (md / "checkpoints" / f"ckpt-{res['step']}.index").exists()
    assert json.loads((md / "best" / "best.json").read_text())["step"] == best_step


@pytest.mark.slow
@pytest.mark.parametrize("example", ["deepfm-allreduce",
                                     pytest.param("horovod", marks=pytest.mark.tf215_only)])
def test_multi_process_jobs_evaluate_every_epoch_and_export_the_best(small, tmp_path, example):
    """2 all-reduce workers (or Horovod ranks, TF 2.15) through the SageMaker recipe with a
    validation channel: the chief evaluates each epoch while the other rank waits, both decay
    the learning rate and stop at the same step, and the best model is exported."""
    from test_distributed import channels, hvd_python, launch
    python = hvd_python() if example == "horovod" else sys.executable
    ch = {**channels(small), "validation": {"path": str(small / "valid")}}
    res, job, out = launch(tmp_path, example, small, python=python, channels=ch,
                           hyperparameters={"epochs": 30, "batch_size": 64,
                                            "learning_rate": 0.01, "eval_test": True,
                                            "lr_decay_on_plateau": 0.5},
                           instance_groups=[{"name": "train", "hosts": 2,
                                             "processes_per_host": 1}])
    assert res["replicas"] == 2 and res["global_batch"] == 128
    events = [json.loads(line) for line in
              (tmp_path / "run" / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    meta = json.loads(next((tmp_path / "run").rglob("assets.extra/ctrtrain.json")).read_text())
    assert_best_tested_and_exported(res, events, meta)
    # The chief's decision to halve the rate reached every rank (or the job would have hung
    # in a collective), as did its decision to stop.
    assert [e["learning_rate"] for e in events if e["event"] == "lr_decay"][:1] == \
        pytest.approx([0.005])


def test_logloss_monitored_without_early_stopping(small, tmp_path):
    md = tmp_path / "m"
    _, res, events = train(small, md, "--epochs", "5", "--monitor", "logloss",
                           "--early-stopping", "0")
    valid = evals(events, "valid")
    assert not res["stopped_early"] and [s for s, _ in valid] == [50, 100, 150, 200, 250]
    best_step = min(valid, key=lambda se: se[1]["logloss"])[0]
    assert best_step < 250 and res["selected"]["step"] == best_step
    assert res["selected"]["monitor"] == "logloss"


def test_without_a_validation_split_the_last_model_and_a_note(small, tmp_path):
    r, res, events = train(small, tmp_path / "m", "--epochs", "2", valid=False)
    assert "no validation set: the last model is exported; `ctrtrain data split` makes one" \
        in r.stdout
    assert "selected" not in res and res["test"]["examples"] == 800
    assert not (tmp_path / "m" / "best").exists()


def test_export_best_off_exports_the_last(small, tmp_path):
    md = tmp_path / "m"
    _, res, events = train(small, md, "--epochs", "4", "--early-stopping", "0",
                           "--no-export-best")
    sel = res["selected"]
    assert sel["step"] == res["step"] == 200 and sel["last"]["step"] == 200
    assert not (md / "best").exists()


@pytest.mark.parametrize("optimizer,updates,refused", [
    ("ftrl", "catchup", True), ("momentum", "auto", True), ("ftrl", "lazy", False),
    ("adam", "catchup", False), ("adagrad", "auto", False)])
def test_lr_decay_refused_where_the_catch_up_holds_the_rate(optimizer, updates, refused):
    from ctrtrain.errors import ConfigError
    from ctrtrain.train.config import TrainConfig, check_config
    cfg = TrainConfig(train_dir="t", model_dir="m", optimizer=optimizer, table_updates=updates,
                      lr_decay_on_plateau=0.1)
    if refused:
        with pytest.raises(ConfigError, match=f"lr_decay_on_plateau: optimizer {optimizer}'s"):
            check_config(cfg)
    else:
        check_config(cfg)


def test_the_learning_rate_decays_on_a_plateau(small, tmp_path):
    """--lr-decay-on-plateau 0.1: after each evaluation without a better validation AUC the
    rate is a tenth, logged; the run still stops and exports the best."""
    _, res, events = train(small, tmp_path / "m", "--epochs", "30", "--lr-decay-on-plateau",
                           "0.1", "--early-stopping", "3")
    decays = [e for e in events if e["event"] == "lr_decay"]
    assert 1 <= len(decays) <= 2 and res["stopped_early"]
    assert [d["learning_rate"] for d in decays] == pytest.approx([1e-3, 1e-4][:len(decays)],
                                                                  rel=1e-5)
    assert res["selected"]["best"] and res["selected"]["step"] < res["step"]


@pytest.mark.slow
def test_a_resumed_run_stops_where_the_undisturbed_one_stopped(small, tmp_path):
    """A run stopped after its best evaluation (here: fewer epochs) and resumed keeps counting
    the evaluations without improvement from its best (evaluations_since): it stops at the
    undisturbed run's step and exports the same best model. It counted from 0 before, and
    trained on (found by `bench chaos`: a retried job trained 2.3x the undisturbed steps)."""
    calm = tmp_path / "calm"
    _, res, _ = train(small, calm, "--epochs", "30")
    best_step, epoch = res["selected"]["step"], 50
    assert res["stopped_early"] and res["step"] == best_step + 2 * epoch
    resumed = tmp_path / "resumed"
    train(small, resumed, "--epochs", str(best_step // epoch + 1), "--checkpoint-every", "10")
    _, again, events = train(small, resumed, "--epochs", "30")
    assert again["resumed_from"] == best_step + epoch
    assert again["stopped_early"] and again["step"] == res["step"]
    assert again["selected"]["step"] == best_step
    assert again["test"]["auc"] == pytest.approx(res["test"]["auc"], abs=1e-6)
