"""Hyperparameter search (issue 56): `ctrtrain tune --search space.yaml --trials N` runs an
Optuna study whose trials are training runs, read back here with `optuna.load_study`: each
trial's value is its run directory's result.json figure, its parameters lie in the declared
ranges, a pruned trial's run stopped early and cleanly (a complete run directory, marked
pruned); the same command resumes the study (the trials done untouched, a trial left RUNNING
by a killed process tried again); the table, the plot and the best trial's configuration
file are written; a bad space file is refused by file and key before anything runs."""

import csv
import json
import os

import pytest

from conftest import cli, ctrtrain_here

# A trial is 40 steps of a tiny DeepFM, evaluated every 10 (4 evaluations: at 10, 20, 30 and
# the final one at 40). A learning rate of 0 leaves the model as initialized (validation AUC
# about 0.5), far below a trained one: the median pruner, from the first complete trial on,
# prunes such a trial at its first evaluation. With this seed, the first trial draws 0.02 and
# the second 0 (Optuna's TPE, pinned in requirements/main.txt).
SPACE = """\
metric: valid_auc
sampler: {seed: 1}
pruner: {startup_trials: 1}
space:
  optimizer.learning_rate: [0.0, 0.02]
  model.dropout: {type: float, low: 0.0, high: 0.3}
  model.embedding_size: {type: int, low: 2, high: 8, step: 2}
"""
TRAINING = ["--batch-size", 128, "--steps", 40, "--eval-every", 10, "--log-every", 10,
            "--early-stopping", 0, "--deep-layers", 16, "--no-export"]


@pytest.fixture(scope="module")
def data(synth_data):
    return synth_data(rows=8000, feature_size=4000)[0] / "tf"   # test_best_model.py's


def search(data, space, work, trials):
    return ctrtrain_here("tune", "--search", space, "--trials", trials, "--train",
                         data / "train", "--valid", data / "valid", *TRAINING,
                         "--work-dir", work)


def load(work):
    import optuna
    return optuna.load_study(study_name="ctrtrain-search", storage=f"sqlite:///{work}/study.db")


def result_of(trial) -> dict:
    return json.loads(open(os.path.join(trial.user_attrs["run_dir"], "result.json")).read())


@pytest.mark.slow
def test_a_search_is_an_optuna_study_of_runs_and_resumes(data, tmp_path):
    import optuna
    from optuna.trial import TrialState as S

    from ctrtrain.train.config import load_config_file
    space, work = tmp_path / "space.yaml", tmp_path / "search"
    space.write_text(SPACE)
    out = search(data, space, work, 3)
    assert out.count("\ntrial ") == 3     # a line per trial
    study = load(work)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    trials = study.trials
    assert [t.number for t in trials] == [0, 1, 2]
    assert {t.state for t in trials} == {S.COMPLETE, S.PRUNED}, [t.state for t in trials]
    for t in trials:
        r = result_of(t)
        # The trial's value is its run's validation figure, the one result.json holds.
        assert t.value == pytest.approx(r["valid"]["auc"], abs=1e-12)
        p = t.params
        assert p["optimizer.learning_rate"] in (0.0, 0.02)
        assert 0.0 <= p["model.dropout"] <= 0.3 and p["model.embedding_size"] in (2, 4, 6, 8)
        cfg = load_config_file(os.path.join(t.user_attrs["run_dir"], "config.yaml"))
        assert (cfg["learning_rate"], cfg["embedding_size"]) == \
            (p["optimizer.learning_rate"], p["model.embedding_size"])
        assert cfg["dropout"] == pytest.approx(p["model.dropout"])
        steps = sorted(t.intermediate_values)        # a report per evaluation, by index
        assert steps == list(range(len(steps)))
        assert t.intermediate_values[steps[-1]] == pytest.approx(t.value, abs=1e-12)
        if t.state == S.COMPLETE:
            assert r["step"] == 40 and r["stopped_by"] is None and len(steps) == 4
        else:
            # Stopped at an evaluation as early stopping stops a run: complete and marked.
            assert r["step"] < 40 and r["stopped_early"] and r["stopped_by"] == "pruned"
            assert len(steps) == r["step"] // 10 < 4
            events = open(os.path.join(t.user_attrs["run_dir"], "metrics.jsonl")).read()
            assert '"stop_requested"' in events and '"summary"' in events
    untrained = [t for t in trials if t.params["optimizer.learning_rate"] == 0.0
                 and any(c.state == S.COMPLETE and c.number < t.number for c in trials)]
    assert untrained and all(t.state == S.PRUNED for t in untrained)

    # The table (and its CSV), the plot, the best trial's settings as a config file.
    rows = list(csv.DictReader(open(work / "trials.csv")))
    assert [(int(r["number"]), r["state"], float(r["valid_auc"]), r["run_dir"]) for r in rows] \
        == [(t.number, t.state.name, pytest.approx(t.value, abs=1e-12),
             t.user_attrs["run_dir"]) for t in trials]
    assert [float(r["model.dropout"]) for r in rows] == \
        pytest.approx([t.params["model.dropout"] for t in trials])
    assert (work / "trials.png").read_bytes()[:4] == b"\x89PNG"
    best = study.best_trial
    assert best.state == S.COMPLETE
    written = load_config_file(work / "best.yaml")
    assert written["learning_rate"] == best.params["optimizer.learning_rate"]
    assert written["embedding_size"] == best.params["model.embedding_size"]
    assert written["dropout"] == pytest.approx(best.params["model.dropout"])
    assert (written["batch_size"], written["steps"], written["monitor"]) == (128, 40, "auc")
    assert written["train_dir"] == str(data / "train") and "model_dir" not in written

    # A trial left RUNNING, as by a killed search's process: the resumed search marks it
    # FAIL and tries its parameters again; the trials done stay as they were.
    killed = study.ask()     # its parameters drawn, as a trial's are before it trains
    killed.suggest_categorical("optimizer.learning_rate", [0.0, 0.02])
    killed.suggest_float("model.dropout", 0.0, 0.3)
    killed.suggest_int("model.embedding_size", 2, 8, step=2)
    assert killed.number == 3
    before = [(t.number, t.state, t.value, t.params, t.intermediate_values, t.datetime_complete)
              for t in trials]
    mtimes = [os.stat(os.path.join(t.user_attrs["run_dir"], "result.json")).st_mtime_ns
              for t in trials]
    out = search(data, space, work, 4)
    assert "(3 done: resuming)" in out and out.count("\ntrial ") == 1, out
    after = load(work).trials
    assert [(t.number, t.state, t.value, t.params, t.intermediate_values, t.datetime_complete)
            for t in after[:3]] == before
    assert [os.stat(os.path.join(t.user_attrs["run_dir"], "result.json")).st_mtime_ns
            for t in after[:3]] == mtimes
    assert after[3].state == S.FAIL and "interrupted" in after[3].user_attrs
    retry = after[4]
    assert len(after) == 5 and retry.state in (S.COMPLETE, S.PRUNED)
    assert retry.user_attrs["retry_of"] == 3 and retry.params == after[3].params
    assert retry.value == pytest.approx(result_of(retry)["valid"]["auc"], abs=1e-12)
    assert len(list(csv.DictReader(open(work / "trials.csv")))) == 5


@pytest.mark.parametrize("space, says", [
    ("space:\n  model.hidden_units: [\"256,128\", \"400,400\"]\n",
     "space: model.hidden_units: unknown setting 'hidden_units' (did you mean deep_layers?)"),
    ("space:\n  optimizer.learning_rate: {type: float, low: 1.0e-2, high: 1.0e-4}\n",
     "space: optimizer.learning_rate: low 0.01 must be below high 0.0001"),
    ("space:\n  optimizer.learning_rate: {type: float, low: 0, high: 0.1, log: true}\n",
     "space: optimizer.learning_rate: log: low 0.0 must be above 0"),
    ("space:\n  model.embedding_size: {type: float, low: 4, high: 16}\n",
     "space: model.embedding_size: embedding_size takes whole numbers: give type int"),
    ("space:\n  model.dropout: {type: float, low: 0.1, high: 1.5}\n",
     "space: model.dropout: high 1.5: 1.5 is not a drop rate in [0, 1)"),
    ("space:\n  schedule.learning_rate: {type: float, low: 0.1, high: 0.2}\n",
     "space: schedule.learning_rate: learning_rate belongs in section optimizer"),
    ("space:\n  model.dropout: {type: uniform, low: 0.1, high: 0.2}\n",
     "space: model.dropout: type 'uniform' is not one of float, int, categorical"),
    ("space:\n  model.cross_layers: [1, 2]\n",
     "space: model.cross_layers: 1: model deepfm does not use it, nor any model searched"),
    ("space:\n  model.dropout: [\"0.1,0.1\"]\n  model.deep_layers: [[8, 8, 8], [8, 4, 2]]\n",
     "space: model.dropout: '0.1,0.1': dropout: 2 rates for 3 deep layers"),
    ("space:\n  data.train_dir: [a, b]\n",
     "space: data.train_dir: train_dir cannot be searched"),
    ("metric: valid_accuracy\nspace:\n  model.dropout: [0.1]\n",
     "metric: 'valid_accuracy' is not one of valid_auc, valid_logloss, valid_loss"),
    ("space:\n  model.dropout: [0.1]\npruner: hyperband\n",
     "pruner: type: 'hyperband' is not one of median, none"),
])
def test_a_bad_space_is_refused_by_file_and_key_before_anything_runs(tmp_path, space, says):
    path = tmp_path / "space.yaml"
    path.write_text(space)
    code, out, err = cli("tune", "--search", path, "--train", tmp_path / "train", "--valid",
                         tmp_path / "valid", "--work-dir", tmp_path / "work")
    assert code == 2 and f"{path}: {says}" in err, err
    assert not (tmp_path / "work").exists()


def test_each_mode_of_tune_refuses_the_other_modes_flags(tmp_path):
    code, _, err = cli("tune", "--search", tmp_path / "s.yaml", "--rows", 100, "--out", "x")
    assert code == 2 and "--rows, --out: the thread and batch tuning's" in err, err
    code, _, err = cli("tune", "--model", "fm", "--trials", 3)
    assert code == 2 and "--model, --trials: --search's" in err, err


def test_a_model_setting_is_drawn_for_the_models_that_read_it():
    """Optuna's conditional parameters: a model's option in the trials of that model only;
    settings valid together (a dropout per layer, the layers) pass the check."""
    from optuna.trial import FixedTrial

    from ctrtrain.search.space import parse_space
    from ctrtrain.search.study import check_space, trial_base
    space = parse_space({"space": {"model.cross_layers": [1, 2], "model.model": ["fm", "dcn_v2"],
                                   "model.dropout": ["0.1,0.1", "0.2,0.2,0.2"],
                                   "model.deep_layers": [[16, 8], [16, 8, 4]]}}, "space.yaml")
    check_space(space, trial_base({"train_dir": "t", "valid_dir": "v"}, space))
    drawn = {"model.model": "dcn_v2", "model.cross_layers": 2, "model.dropout": "0.1,0.1",
             "model.deep_layers": "16,8"}
    assert space.draw(FixedTrial(drawn), "deepfm") == drawn
    assert space.draw(FixedTrial({**drawn, "model.model": "fm"}), "deepfm") == \
        {"model.model": "fm"}       # fm reads neither cross layers nor an MLP


def test_a_work_dir_holding_another_spaces_search_is_refused(tmp_path):
    import optuna
    work = tmp_path / "work"
    work.mkdir()
    study = optuna.create_study(study_name="ctrtrain-search", storage=f"sqlite:///{work}/study.db")
    study.set_user_attr("space", "{}")
    study.set_user_attr("space_file", "other.yaml")
    (tmp_path / "space.yaml").write_text(SPACE)
    code, _, err = cli("tune", "--search", tmp_path / "space.yaml", "--train", tmp_path / "t",
                       "--valid", tmp_path / "v", "--work-dir", work)
    assert code == 2 and "holds the search of another space (started with other.yaml)" in err
    assert load(work).trials == []
