"""TensorBoard's files as Keras's TensorBoard callback lays them out (issue 56): sibling runs
logs/train, logs/validation, logs/test sharing tag names (so `tensorboard --logdir
<model_dir>/logs` overlays the splits), the training loss at every log window, no constant
as a curve, and the run's settings in the hparams plugin. Read back from the event files."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ctrtrain_here


def read_runs(logs):
    """{run: {tag: [(step, value)]}} of the scalars in logs/<run>, and the hparams (a dict) in
    logs itself (None without)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata
    from tensorboard.util import tensor_util
    runs, hparams = {}, None
    for d in [logs, *sorted(p for p in logs.iterdir() if p.is_dir())]:
        acc = EventAccumulator(str(d), size_guidance={"tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            if tag == metadata.SESSION_START_INFO_TAG:
                info = metadata.parse_session_start_info_plugin_data(
                    acc.PluginTagToContent(metadata.PLUGIN_NAME)[tag])
                hparams = {k: getattr(v, v.WhichOneof("kind")) for k, v in info.hparams.items()}
            else:
                runs.setdefault(d.name, {})[tag] = [
                    (e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                    for e in acc.Tensors(tag)]
    return runs, hparams


def points(series):
    """(steps, values) of a tag's [(step, value)]."""
    return [s for s, _ in series], [v for _, v in series]


def test_the_log_writes_each_split_to_its_run_and_the_settings_once(tmp_path):
    """Straight through MetricsLog: which event goes where, and what does not go at all."""
    from ctrtrain.train.metrics_log import MetricsLog
    log = MetricsLog(tmp_path, console=False, settings={
        "learning_rate": 0.01, "deep_layers": (8, 4), "lr_decay_on_plateau": 0.5,
        "steps": None, "fields": [{"name": "a"}]})
    log.event("start", step=0, total_steps=30, resumed=False, threads={"data": 2}, mode="single",
              records=960, learning_rate=0.01, feature_size=100)
    for step in (10, 20, 30):
        log.event("train", step=step, loss=0.7 - step / 100, steps=10, seconds=0.1,
                  examples_per_s=1000.0 + step, input_wait_s=0.01, compute_s=0.09,
                  input_bound=0.1)
        log.event("checkpoint", step=step)
        log.event("eval", step=step, split="valid", auc=0.6 + step / 1000, logloss=0.5,
                  examples=100, positive_rate=0.25)
        if step == 10:
            log.event("lr_decay", step=step, learning_rate=0.005)
    log.event("eval", step=30, split="valid", auc=0.63, logloss=0.5, examples=100,
              positive_rate=0.25)       # the evaluation after an early stop: the same model
    log.event("eval", step=20, split="test", auc=float("nan"), logloss=0.4, examples=100,
              positive_rate=0.25)
    log.event("summary", step=30, examples_per_s=1020.0, input_bound=0.1, valid_auc=0.63)
    log.close()
    runs, hp = read_runs(tmp_path / "logs")
    assert set(runs) == {"train", "validation", "test"}
    assert points(runs["train"]["loss"]) == ([10, 20, 30], pytest.approx([0.6, 0.5, 0.4]))
    assert points(runs["train"]["learning_rate"]) == ([10, 20, 30],
                                                     pytest.approx([0.01, 0.005, 0.005]))
    assert set(runs["train"]) == {"loss", "examples_per_s", "input_bound", "learning_rate"}
    assert points(runs["validation"]["auc"]) == ([10, 20, 30], pytest.approx([0.61, 0.62, 0.63]))
    assert set(runs["test"]) == {"loss"} and points(runs["test"]["loss"]) == \
        ([20], pytest.approx([0.4]))     # no NaN point
    assert hp == {"learning_rate": pytest.approx(0.01), "deep_layers": "8,4",
                  "lr_decay_on_plateau": 0.5, "total_steps": 30, "mode": "single",
                  "records": 960, "feature_size": 100}
    # Another process of a job writes nothing.
    MetricsLog(tmp_path / "other", console=False, enabled=False).close()
    assert not (tmp_path / "other").exists()


def test_the_hparams_summary_does_not_load_keras(tmp_path):
    """tensorboard's `hparams.api` imports Keras (2 s a process; ctrtrain starts TensorFlow
    without it, tf_start.py): the log writes through the module under it."""
    probe = ("import sys, ctrtrain, pathlib\n"
             "from ctrtrain.train.metrics_log import MetricsLog\n"
             f"log = MetricsLog(pathlib.Path({str(tmp_path)!r}), False, settings={{'seed': 1}})\n"
             "log.event('start', step=0, total_steps=5)\n"
             "log.close()\n"
             "print('keras' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["False"]
    assert read_runs(tmp_path / "logs")[1] == {"seed": 1, "total_steps": 5}


@pytest.mark.slow
def test_a_real_run_overlays_train_and_validation_in_sibling_runs(synth_data, tmp_path):
    data = synth_data(rows=8000, feature_size=4000)[0] / "tf"     # test_best_model.py's
    md = tmp_path / "m"
    # 6,400 rows in batches of 128: 50 steps an epoch, 100 steps, a window of 10.
    ctrtrain_here("train", "--train", data / "train", "--valid", data / "valid", "--test",
                  data / "test", "--model-dir", md, "--batch-size", 128, "--epochs", 2,
                  "--embedding-size", 8, "--log-every", 10, "--eval-every", 25,
                  "--early-stopping", 0, "--no-export", "--quiet")
    result = json.loads((md / "result.json").read_text())
    runs, hp = read_runs(md / "logs")
    assert set(runs) == {"train", "validation", "test"}
    assert sorted(p.name for p in (md / "logs").iterdir() if p.is_dir()) == \
        ["test", "train", "validation"]
    # One tag for one metric in every run: TensorBoard draws them in one chart.
    assert {"loss"} <= set(runs["train"]) & set(runs["validation"]) & set(runs["test"])
    assert set(runs["validation"]) == set(runs["test"]) == {"loss", "auc"}
    assert set(runs["train"]) == {"loss", "examples_per_s", "input_bound"}   # no lr decay
    # The training loss: one point per log window, each the window's mean.
    windows = result["windows"]
    assert points(runs["train"]["loss"]) == ([w["step"] for w in windows],
                                             pytest.approx([w["loss"] for w in windows]))
    assert [w["step"] for w in windows] == list(range(10, 101, 10))
    evals = [json.loads(x) for x in (md / "metrics.jsonl").read_text().splitlines()]
    valid = [(e["step"], e["auc"]) for e in evals if e["event"] == "eval" and e["split"] == "valid"]
    assert points(runs["validation"]["auc"]) == ([25, 50, 75, 100],
                                                 pytest.approx([a for _, a in valid]))
    # The test split once, at the end: the model tested (its step), its figures.
    model_step = result.get("selected", {}).get("step", result["step"])
    assert points(runs["test"]["auc"]) == ([model_step], pytest.approx([result["test"]["auc"]]))
    # No constant as a curve: every train and validation tag has points that differ.
    for run in ("train", "validation"):
        for tag, series in runs[run].items():
            assert len(series) > 3 and np.ptp([v for _, v in series]) > 0, (run, tag, series)
    # The settings, once, in the hparams plugin, with what the start found.
    assert hp["batch_size"] == 128 and hp["log_every"] == 10 and hp["model"] == "deepfm"
    assert hp["embedding_size"] == 8 and hp["deep_layers"] == "256,128,64"
    assert hp["train_dir"] == str(data / "train") and hp["records"] == 6400
    assert hp["total_steps"] == 100 and hp["global_batch"] == 128
    assert not {"model_dir", "quiet", "export", "cross_layers"} & set(hp)
