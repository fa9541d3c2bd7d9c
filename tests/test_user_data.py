"""A user's own data and settings, as a user brings them: TFRecord files of another pipeline
(no manifest; files, globs, directories), splits converted apart, the public DeepFM sample's
hyperparameters as written, schedules in epochs, a configuration file, predictions from
`train`, throughput on their data."""

import csv
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import run_cli
from test_bad_input import cli, refused


@pytest.fixture(scope="module")
def data(synth_data):
    return synth_data(rows=8000, feature_size=2000, seed=6)[0]


@pytest.fixture(scope="module")
def loose(data, tmp_path_factory):
    """The training TFRecords as another pipeline leaves them: *.tfrecords, no manifest."""
    d = tmp_path_factory.mktemp("loose")
    m = json.loads((data / "tf" / "train" / "manifest.json").read_text())
    for i, f in enumerate(m["files"]):
        shutil.copy(data / "tf" / "train" / f["path"], d / f"tr-{i}.tfrecords")
    t = json.loads((data / "tf" / "test" / "manifest.json").read_text())
    shutil.copy(data / "tf" / "test" / t["files"][0]["path"], d / "test.tfrecords")
    return d


def result(md):
    return json.loads((md / "result.json").read_text())


def test_tfrecords_without_a_manifest_train_as_files_globs_or_directories(tmp_path, data, loose):
    records = json.loads((data / "tf" / "train" / "manifest.json").read_text())["records"]
    for i, spec in enumerate([loose / "tr-0.tfrecords", str(loose / "tr-*.tfrecords")]):
        code, out, err = cli("train", "--train", spec, "--test", loose / "test.tfrecords",
                             "--model-dir", tmp_path / f"m{i}", "--steps", 5, "--batch-size", 256,
                             "--quiet")
        assert code == 0, err
        assert "indexing" in out and result(tmp_path / f"m{i}")["test"]["examples"] > 0
    start = [json.loads(x) for x in (tmp_path / "m1" / "metrics.jsonl").read_text().splitlines()][0]
    assert start["records"] == records and start["field_size"] == 39
    # An unquoted glob, as a shell expands it: several paths after --train (and --test).
    files = sorted(loose.glob("tr-*.tfrecords"))
    code, out, err = cli("train", "--train", *files, "--test", loose / "test.tfrecords", files[0],
                         "--model-dir", tmp_path / "m2", "--steps", 5, "--batch-size", 256, "--quiet")
    assert code == 0, err
    start2 = [json.loads(x) for x in (tmp_path / "m2" / "metrics.jsonl").read_text().splitlines()][0]
    assert start2["records"] == records and start2["field_size"] == 39
    first = json.loads((data / "tf" / "train" / "manifest.json").read_text())["files"][0]["records"]
    assert result(tmp_path / "m2")["test"]["examples"] == \
        result(tmp_path / "m1")["test"]["examples"] + first
    assert yaml.safe_load((tmp_path / "m2" / "config.yaml").read_text())["data"]["train_dir"] == \
        [str(f) for f in files]
    # A file twice (overlapping globs) would be read twice an epoch; a manifest's directory
    # is read with other directories only (several days: tests/test_stream.py), not with
    # files.
    err = refused("train", "--train", *files, files[1], "--model-dir", tmp_path / "m3",
                  match="the file is given twice")
    assert str(files[1]) in err
    err = refused("train", "--train", data / "tf" / "train", files[0], "--model-dir",
                  tmp_path / "m3", match="data directories (with manifests) and other paths in "
                  "one source: give directories only, or files only")
    assert str(files[0]) in err
    # A directory of them, indexed once, then read like any data directory.
    d = tmp_path / "dir"
    d.mkdir()
    for f in loose.glob("tr-*.tfrecords"):
        shutil.copy(f, d)
    code, out, err = cli("data", "index", d)
    assert code == 0, err
    m = json.loads((d / "manifest.json").read_text())
    assert m["records"] == records and m["format"] == "tfrecord" and m["field_size"] == 39
    code, _, err = cli("data", "validate", d)
    assert code == 0, err
    # convert reads libsvm: a TFRecord given to it is named as such, not parsed as text.
    refused("data", "convert", loose / "tr-0.tfrecords", "--field-size", 39, "--out",
            tmp_path / "o", match="is TFRecord, not libsvm text")


def write_libsvm(path, rows):
    path.write_text("".join(f"{y} " + " ".join(f"{i}:1" for i in ids) + "\n" for y, ids in rows))


def test_splits_agree_on_the_table_or_the_split_is_refused_by_name(tmp_path):
    rng = np.random.default_rng(0)
    write_libsvm(tmp_path / "train.libsvm", [(int(rng.integers(2)), rng.integers(0, 50, 3))
                                             for _ in range(600)])
    write_libsvm(tmp_path / "test.libsvm", [(1, [1, 2, 80])] + [(0, [1, 2, 3])] * 99)
    for s in ("train", "test"):
        code, _, err = cli("data", "convert", tmp_path / f"{s}.libsvm", "--field-size", 3,
                           "--out", tmp_path / s, "--shards", 1)
        assert code == 0, err
    refused("train", "--train", tmp_path / "train", "--test", tmp_path / "test", "--model-dir",
            tmp_path / "m", "--steps", 2, "--batch-size", 64,
            match=f"{tmp_path / 'test'}: ids up to 80 do not fit the model's table of 50 rows")
    refused("data", "convert", tmp_path / "test.libsvm", "--like", tmp_path / "train", "--out",
            tmp_path / "test2", match="line 1: pair 3: id 80 is outside [0, 50)")
    code, _, err = cli("data", "convert", tmp_path / "test.libsvm", "--like", tmp_path / "train",
                       "--feature-size", 100, "--out", tmp_path / "test3")
    assert code == 0, err


def test_help_shows_every_default_and_the_sample_settings_are_accepted(tmp_path, data):
    r = run_cli("train", "--help")
    for text in ("(default: 0.001)", "(default: auto)", "(default: 256,128,64)",
                 "(default: 1e-07)", "--adam-beta1", "--l2-embedding", "--eval-every",
                 "(default: 1000)", "--config"):
        assert text in r.stdout, text
    code, out, err = cli("train", "--train", data / "tf" / "train", "--model-dir", tmp_path / "m",
                         "--steps", 5, "--batch-size", 128, "--deep-layers", "64,32,16",
                         "--dropout", "0.5,0.5,0.5", "--optimizer", "Adam", "--adam-epsilon",
                         "1e-8", "--l2-embedding", "1e-5", "--l2-dense", "0", "--quiet")
    assert code == 0, err
    resolved = yaml.safe_load((tmp_path / "m" / "config.yaml").read_text())
    assert resolved["model"]["dropout"] == [0.5, 0.5, 0.5]
    assert resolved["optimizer"]["adam_epsilon"] == 1e-8 and resolved["optimizer"]["optimizer"] == "adam"
    refused("train", "--train", data / "tf" / "train", "--model-dir", tmp_path / "m2",
            "--deep-layers", "64,32", "--dropout", "0.5,0.5,0.5", match="3 rates for 2 deep layers")


@pytest.mark.slow
def test_recipe_takes_the_sample_hyperparameters_as_written(tmp_path, data):
    from test_distributed import channels
    from test_launch import spec_from_example
    hp = {"num_epochs": 1, "batch_size": 512, "deep_layers": "64,32", "dropout": "0.5,0.5",
          "optimizer": "Adam", "learning_rate": 0.001, "l2_reg": 0.0001, "log_steps": 5,
          "embedding_size": 8}
    spec = spec_from_example(tmp_path, "deepfm-single", channels=channels(data / "tf"),
                             hyperparameters=hp)
    r = run_cli("launch", spec)
    assert "[train] step 5" in r.stdout
    # The job's processes print no TensorFlow start-up banner (issue 56; `launch -v` would).
    assert not any(b in r.stdout + r.stderr for b in ("oneDNN", "absl::InitializeLog")), r.stdout
    resolved = yaml.safe_load((tmp_path / "run" / "checkpoints" / "config.yaml").read_text())
    assert resolved["schedule"]["epochs"] == 1 and resolved["schedule"]["log_every"] == 5
    assert resolved["model"]["embedding_size"] == 8 and resolved["model"]["dropout"] == [0.5, 0.5]
    spec = spec_from_example(tmp_path, "deepfm-single", channels=channels(data / "tf"),
                             hyperparameters={**hp, "batch_norm_decay": 0.9},
                             output_dir=str(tmp_path / "run2"))
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2 and "unknown setting 'batch_norm_decay'" in r.stderr


@pytest.mark.slow
def test_schedules_in_epochs_config_files_and_test_predictions(tmp_path, data):
    steps_per_epoch = json.loads((data / "tf" / "train" / "manifest.json").read_text())[
        "records"] // 256
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({
        "data": {"train_dir": str(data / "tf" / "train"), "valid_dir": str(data / "tf" / "valid"),
                 "test_dir": str(data / "tf" / "test")},
        "schedule": {"epochs": 2, "batch_size": 256, "eval_every": "0.5 epochs",
                     "log_every": "1 epoch"},
        "output": {"model_dir": str(tmp_path / "m"), "predictions": "auto", "quiet": True}}))
    code, out, err = cli("train", "--config", tmp_path / "train.yaml")
    assert code == 0, err
    events = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    evals = [e["step"] for e in events if e["event"] == "eval" and e["split"] == "valid"]
    half = round(0.5 * steps_per_epoch)
    assert evals[:3] == [half, 2 * half, 3 * half]
    assert [e["step"] for e in events if e["event"] == "train"] == [steps_per_epoch, 2 * steps_per_epoch]
    r = result(tmp_path / "m")
    assert "summary:" in out and "examples/s after warm-up" in out and "test AUC" in out
    # The test split's predictions, at full precision, equal to `ctrtrain predict`'s.
    rows = list(csv.DictReader(open(tmp_path / "m" / "predictions.csv")))
    assert len(rows) == r["test"]["examples"]
    code, _, err = cli("predict", "--model", tmp_path / "m" / "export", "--input",
                       data / "tf" / "test", "--out", tmp_path / "p.csv")
    assert code == 0, err
    again = list(csv.DictReader(open(tmp_path / "p.csv")))
    np.testing.assert_allclose([float(x["prob"]) for x in rows], [float(x["prob"]) for x in again],
                               rtol=1e-6)
    assert max(len(x["prob"].split(".")[-1]) for x in again) > 6   # not rounded to 6 decimals
    # The written configuration re-runs the same training (flags override it).
    code, _, err = cli("train", "--config", tmp_path / "m" / "config.yaml", "--model-dir",
                       tmp_path / "m2", "--quiet")
    assert code == 0, err
    assert result(tmp_path / "m2")["test"]["auc"] == pytest.approx(r["test"]["auc"], abs=1e-6)
    code, _, err = cli("train", "--config", tmp_path / "m" / "config.yaml", "--model-dir",
                       tmp_path / "m3", "--steps", 7)
    assert code == 0, err
    assert result(tmp_path / "m3")["step"] == 7


@pytest.mark.slow
def test_bench_train_measures_the_users_data_beside_the_estimator_sample(tmp_path, loose):
    """With --estimator-python, the SageMaker sample's TF1 Estimator (estimator_runner.py, in
    .venv-hvd: tf.estimator is gone from TF 2.16 on) is measured on the same data, in the
    same round as ctrtrain's run, after a warm-up that fills its 500,000-record input buffer
    (or reads the data once, when smaller)."""
    from test_distributed import hvd_python
    estimator_python = hvd_python()
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", "bench", "train", "--data",
                        str(loose / "tr-*.tfrecords"), "--steps", "20", "--warmup", "5",
                        "--repeats", "1", "--work-dir", str(tmp_path / "w"), "--json", str(out),
                        "--estimator-python", str(estimator_python)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    b = json.loads(out.read_text())
    ref = b["variants"]["reference"]
    assert "tr-*.tfrecords" in b["data"] and ref["examples_per_s"] > 0
    est = b["estimator_sample"]
    assert est["tensorflow"].startswith("2.15") and est["examples_per_s"] > 0
    assert ref["ratio_to_estimator_sample"] == pytest.approx(ref["examples_per_s"] / est["examples_per_s"])
    assert b["order"] == ["train reference", "dense reference", "estimator"]
    assert est["warmup_steps"] == -(-min(b["config"]["rows"], 500_000) // 1024), est
    assert est["measured_steps"] == 20 and isinstance(est["curve"], list)


@pytest.mark.slow
@pytest.mark.tf215   # the parameter-server trainer's test on TF 2.15: its smallest real job
def test_parameter_servers_honour_early_stopping_and_report_input_time(tmp_path, data):
    from test_distributed import PS_HP, PS_ONE_HOST, channels
    from test_launch import spec_from_example
    ch = {**channels(data / "tf"), "validation": {"path": str(data / "tf" / "valid")}}
    hp = {**PS_HP, "epochs": 10, "log_every": 10, "eval_every": 10, "early_stopping": 2,
          "learning_rate": 0}
    spec = spec_from_example(tmp_path, "deepfm-parameter-server", channels=ch, hyperparameters=hp,
                             **PS_ONE_HOST)
    r = run_cli("launch", spec, timeout=600)
    res = json.loads((tmp_path / "run" / "model" / "result.json").read_text())
    assert res["stopped_early"] and res["step"] == 30 < res["total_steps"], res["step"]
    assert res["input_wait_s"] > 0 and res["compute_s"] > 0 and 0 < res["input_bound"] < 1
    assert all("input_bound" in w for w in res["windows"])
    assert "early_stop" in (tmp_path / "run" / "checkpoints" / "metrics.jsonl").read_text()
    # The best model (the first evaluation's: nothing moves at learning rate 0) is restored
    # from the parameter servers' variables, tested and exported (issue 31).
    sel = res["selected"]
    assert sel["step"] == 10 and sel["best"] and sel["last"]["step"] == 30
    assert "restore_best" in (tmp_path / "run" / "checkpoints" / "metrics.jsonl").read_text()
    meta = json.loads(next((tmp_path / "run").rglob("assets.extra/ctrtrain.json")).read_text())
    assert meta["step"] == 10 and meta["trained_steps"] == 30
    assert r.returncode == 0
