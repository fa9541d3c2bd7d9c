import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import cli, ctrtrain_here, run_cli


@pytest.fixture(scope="module")
def synth(synth_data):
    return synth_data(rows=300_000, feature_size=5_000)


def train_args(root, model_dir, *extra):
    return ["train", "--train", root / "tf" / "train", "--valid", root / "tf" / "valid",
            "--test", root / "tf" / "test", "--model-dir", model_dir, "--quiet", *extra]


@pytest.mark.slow
def test_reaches_the_bayes_optimal_auc_on_synthesized_data(synth, tmp_path):
    root, info = synth
    from ctrtrain.train import train
    from ctrtrain.train.config import TrainConfig
    r = train(TrainConfig(train_dir=str(root / "tf" / "train"), valid_dir=str(root / "tf" / "valid"),
                          test_dir=str(root / "tf" / "test"), model_dir=str(tmp_path / "m"),
                          epochs=1, batch_size=512, progress=False))
    bayes = info["splits"]["test"]["bayes_auc"]
    assert r["test"]["examples"] == 30_000
    # 240k training rows over 5k features: within 0.01 of the best any model can do.
    assert bayes - 0.01 < r["test"]["auc"] <= bayes + 0.005, (r["test"], bayes)
    assert r["test"]["logloss"] < info["splits"]["test"]["bayes_logloss"] + 0.01
    assert r["step"] == 240_000 // 512
    events = [json.loads(l) for l in open(tmp_path / "m" / "metrics.jsonl")]
    assert {"start", "train", "eval", "export"} <= {e["event"] for e in events}
    assert all(0 <= e["input_bound"] <= 1 for e in events if e["event"] == "train")
    assert list((tmp_path / "m" / "logs").iterdir()), "TensorBoard event files"


def _wait_for(pred, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.tf215
def test_killed_run_resumes_from_its_last_checkpoint(synth, tmp_path):
    root, _ = synth
    md = tmp_path / "m"
    args = train_args(root, md, "--steps", "240", "--checkpoint-every", "40", "--batch-size", "256",
                      "--log-every", "40", "--no-export")
    cmd = [sys.executable, "-m", "ctrtrain.cli", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = md / "metrics.jsonl"

    def checkpointed():
        if not metrics.exists():
            return False
        return any(json.loads(l).get("event") == "checkpoint" and json.loads(l)["step"] >= 80
                   for l in metrics.read_text().splitlines())
    try:
        assert _wait_for(checkpointed, 300), "no checkpoint before the kill"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    logged = [json.loads(l)["step"] for l in metrics.read_text().splitlines()
              if json.loads(l).get("event") == "checkpoint"]
    # The kill may land between a checkpoint's files and its log line: the newest on disk is
    # where training resumes.
    saved = max(int(p.name[5:-6]) for p in (md / "checkpoints").glob("ckpt-*.index"))
    assert saved in (max(logged), max(logged) + 40), (saved, logged)
    ctrtrain_here(*args)  # the same command again
    result = json.loads((md / "result.json").read_text())
    assert result["resumed_from"] == saved and result["step"] == 240
    starts = [json.loads(l) for l in metrics.read_text().splitlines() if '"start"' in l]
    assert starts[-1]["resumed"] is True and starts[-1]["step"] == saved
    # Same data position: an uninterrupted run ends at (nearly) the same model.
    ctrtrain_here(*train_args(root, tmp_path / "ref", "--steps", "240", "--checkpoint-every", "40",
                              "--batch-size", "256", "--no-export"))
    ref = json.loads((tmp_path / "ref" / "result.json").read_text())
    assert abs(ref["test"]["auc"] - result["test"]["auc"]) < 0.003


def test_resume_skips_to_the_same_batches(synth):
    from ctrtrain.input.pipeline import PipelineConfig, dataset_from_dir
    root, _ = synth
    cfg = PipelineConfig(batch_size=100, shuffle_buffer=1000, seed=7)
    full, _ = dataset_from_dir(root / "tf" / "train", cfg)
    skipped, _ = dataset_from_dir(root / "tf" / "train", cfg, skip_batches=2405)  # past an epoch
    want = [b["ids"].numpy() for _, b in zip(range(2408), full)][2405:]
    got = [b["ids"].numpy() for _, b in zip(range(3), skipped)]
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.tf215
def test_cache_parses_once_and_draws_every_record_each_epoch(synth):
    """`cache`: the records parsed once and held as tensors; each epoch a permutation of all
    of them, single records (not runs of a file's consecutive blocks), another each epoch, the
    same for a seed, so a resumed reader skips to the same batches; shuffle_buffer 0 keeps the
    read order; two readers sharded by record hold disjoint halves."""
    from ctrtrain.input.pipeline import PipelineConfig, dataset_from_dir
    root, _ = synth
    train, b = root / "tf" / "train", 1000

    def epoch(ds, batches):
        return np.concatenate([x["ids"].numpy() for _, x in zip(range(batches), ds)])
    stream, m = dataset_from_dir(train, PipelineConfig(batch_size=b, shuffle_buffer=0))
    n = m.records // b
    assert m.records % b == 0
    read_order = epoch(stream, n)
    position = {bytes(r): i for i, r in enumerate(read_order)}
    assert len(position) == m.records                                 # rows tell records apart
    cfg = PipelineConfig(batch_size=b, shuffle_buffer=1000, seed=7, cache=True)
    cached = iter(dataset_from_dir(train, cfg)[0])
    epochs = [epoch(cached, n) for _ in range(3)]
    for e in epochs:
        at = np.array([position[bytes(r)] for r in e])
        assert sorted(at) == list(range(m.records))                   # each record once
        assert np.mean(np.diff(at) == 1) < 0.01                       # single records
    assert not np.array_equal(epochs[0], epochs[1])
    resumed, _ = dataset_from_dir(train, cfg, skip_batches=n + 3)
    np.testing.assert_array_equal(next(iter(resumed))["ids"].numpy(),
                                  epochs[1][3 * b:4 * b])
    ordered, _ = dataset_from_dir(train, PipelineConfig(batch_size=b, shuffle_buffer=0,
                                                        cache=True))
    np.testing.assert_array_equal(epoch(ordered, n), read_order)
    halves = [epoch(dataset_from_dir(train, cfg, record_shard=(2, i))[0], n // 2) for i in (0, 1)]
    assert sorted(position[bytes(r)] for h in halves for r in h) == list(range(m.records))


def test_cache_through_the_data_service_is_refused_by_name():
    from ctrtrain.errors import ConfigError
    from ctrtrain.train.config import TrainConfig, check_config
    with pytest.raises(ConfigError, match="cache: through tf.data service"):
        check_config(TrainConfig(train_dir="d", model_dir="m", cache=True,
                                 data_service="grpc://localhost:5000"))


def test_a_resumed_run_through_the_data_service_skips_what_it_consumed(synth, tmp_path):
    """Through tf.data service a resumed run's service job starts the data anew; the consumer
    drops the batches it had consumed (training_dataset), so it goes on with the data after
    them, not the epoch's first part again (found by the data-service soak, issue 30). One
    dispatcher and one worker of TensorFlow's own, in this process."""
    import dataclasses

    import tensorflow as tf

    from ctrtrain.data.manifest import read_manifest
    from ctrtrain.train.config import TrainConfig
    from ctrtrain.train.inputs import training_dataset
    root, _ = synth
    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    worker = tf.data.experimental.service.WorkerServer(  # noqa: F841 (serves while alive)
        tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
    m = read_manifest(root / "tf" / "train")
    base = TrainConfig(str(root / "tf" / "train"), str(tmp_path / "a"), shuffle_buffer=0,
                       data_service=dispatcher.target, processing_mode="distributed_epoch")
    full = training_dataset(base, m, 100, 0, 0)
    want = [b["label"].numpy() for _, b in zip(range(40), full)][30:]
    resumed = training_dataset(dataclasses.replace(base, model_dir=str(tmp_path / "b")), m, 100,
                               30, 0)
    got = [b["label"].numpy() for _, b in zip(range(10), resumed)]
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_export_signature_and_batch_predict_in_order(synth, tmp_path):
    root, _ = synth
    md = tmp_path / "m"
    ctrtrain_here(*train_args(root, md, "--steps", "60"))
    export = sorted((md / "export").iterdir())[-1]
    show = subprocess.run([os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), "show",
                           "--dir", str(export), "--tag_set", "serve", "--signature_def",
                           "serving_default"], capture_output=True, text=True)
    assert show.returncode == 0, show.stderr
    assert "inputs['ids']" in show.stdout and "(-1, 39)" in show.stdout
    assert "outputs['prob']" in show.stdout and "DT_INT64" in show.stdout
    ctrtrain_here("predict", "--model", md / "export", "--input", root / "tf" / "test", "--out", tmp_path / "p.csv")
    ctrtrain_here("predict", "--model", md / "export", "--input", *sorted((root / "raw" / "test").glob("*.libsvm")),
                  "--out", tmp_path / "p.jsonl")
    csv = [l.split(",") for l in (tmp_path / "p.csv").read_text().splitlines()]
    jl = [json.loads(l) for l in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert csv[0] == ["row", "prob", "label"] and len(csv) - 1 == 30_000 == len(jl)
    # Row order: prediction i is the model's output for input row i.
    import tensorflow as tf
    from ctrtrain.data.libsvm import Rows, parse_libsvm
    rows = Rows.concat([parse_libsvm(p.read_bytes(), 39)[0]
                        for p in sorted((root / "raw" / "test").glob("*.libsvm"))], 39)
    serve = tf.saved_model.load(str(export)).signatures["serving_default"]
    direct = serve(ids=tf.constant(rows.ids[:500]), values=tf.constant(rows.values[:500]))["prob"].numpy()
    np.testing.assert_allclose([float(r[1]) for r in csv[1:501]], direct, atol=2e-6)
    np.testing.assert_allclose([j["prob"] for j in jl[:500]], direct, atol=2e-6)
    assert [int(r[2]) for r in csv[1:501]] == rows.labels[:500].astype(int).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl", "sgd", "momentum"])
def test_every_optimizer_learns(synth, tmp_path, optimizer):
    root, _ = synth
    lr = {"adagrad": "0.05", "ftrl": "0.05", "sgd": "0.05", "momentum": "0.02"}[optimizer]
    ctrtrain_here(*train_args(root, tmp_path / "m", "--steps", "150", "--optimizer", optimizer,
                              "--learning-rate", lr, "--no-export"))
    r = json.loads((tmp_path / "m" / "result.json").read_text())
    assert r["test"]["auc"] > 0.70, r["test"]


@pytest.mark.slow
def test_scale_lr_multiplies_the_step_by_the_replicas(synth, tmp_path):
    # One SGD step from the same start on the same global batch: the output bias starts at 0
    # (output_bias zero), so after the step it is -lr x its gradient, and scale_lr over 2
    # replicas doubles it.
    import tensorflow as tf
    root, _ = synth
    bias = {}
    for name, extra in (("plain", []), ("scaled", ["--scale-lr"])):
        md = tmp_path / name
        run_cli(*train_args(root, md, "--mode", "mirrored", "--devices", "2", "--steps", "1",
                            "--optimizer", "sgd", "--learning-rate", "0.1", "--no-export",
                            "--shuffle-buffer", "0", "--output-bias", "zero", *extra))
        start = json.loads((md / "metrics.jsonl").read_text().splitlines()[0])
        assert start["replicas"] == 2
        assert start["learning_rate"] == pytest.approx(0.2 if extra else 0.1)
        ckpt = tf.train.load_checkpoint(str(md / "checkpoints"))
        bias[name] = ckpt.get_tensor("model/bias/.ATTRIBUTES/VARIABLE_VALUE")
    assert bias["plain"] != 0
    assert bias["scaled"] == pytest.approx(2 * bias["plain"], rel=1e-4)


@pytest.mark.slow
def test_options_dropout_batchnorm_mixed_precision_cache_libsvm(synth, tmp_path):
    root, info = synth
    ctrtrain_here("train", "--train", root / "raw" / "train", "--test", root / "raw" / "test",
                  "--model-dir", tmp_path / "m", "--quiet", "--steps", "150", "--dropout", "0.2",
                  "--batch-norm", "--mixed-precision", "--cache", "--no-export")
    r = json.loads((tmp_path / "m" / "result.json").read_text())
    assert r["test"]["auc"] > 0.70 and np.isfinite(r["test"]["logloss"])


@pytest.mark.slow
def test_bad_settings_are_named(synth, tmp_path):
    root, _ = synth
    # Refusals, made in this process (conftest cli): the exit status and message.
    code, _, err = cli(*train_args(root, tmp_path / "m", "--batch-size", "10000000"))
    assert code == 2 and "larger than the training set" in err
    code, _, err = cli(*train_args(root, tmp_path / "m2", "--dropout", "1.5"))
    assert code == 2 and "drop rate" in err
    ctrtrain_here(*train_args(root, tmp_path / "m3", "--steps", "5", "--no-export"))
    code, _, err = cli(*train_args(root, tmp_path / "m3", "--steps", "5", "--embedding-size", "8"))
    assert code == 2 and "embedding_size" in err
    # The default (auto) chose dense for this 5,000-row table and recorded it; another
    # table_updates keeps other optimizer state: refused by name.
    recorded = json.loads((tmp_path / "m3" / "train_config.json").read_text())
    assert recorded["table_updates"] == "dense"
    # shuffle_buffer auto: the whole 240,000-record split (under 256 MB), recorded as a number.
    assert recorded["shuffle_buffer"] == 240_000
    code, _, err = cli(*train_args(root, tmp_path / "m3", "--steps", "8", "--table-updates", "lazy"))
    assert code == 2 and "table_updates='dense'" in err, err
    # batch_size / embedding_size auto on a split of 102,400 records or more: 1024 and 16.
    ctrtrain_here(*train_args(root, tmp_path / "m4", "--steps", "2", "--no-export",
                              "--batch-size", "auto", "--embedding-size", "auto"))
    recorded = json.loads((tmp_path / "m4" / "train_config.json").read_text())
    assert (recorded["batch_size"], recorded["embedding_size"]) == (1024, 16)


def test_batch_and_width_auto_follow_the_training_rows(tmp_path):
    """batch_size and embedding_size auto on a small split (fewer than 102,400 records):
    256 and 4, recorded as numbers, the epoch counted in batches of 256; the same command
    resumes (auto compares as what it resolved to)."""
    code, _, err = cli("data", "synth", "--rows", 3000, "--feature-size", 500, "--out",
                       tmp_path / "s")
    assert code == 0, err
    args = ("train", "--train", tmp_path / "s" / "train", "--model-dir", tmp_path / "m",
            "--batch-size", "auto", "--embedding-size", "auto", "--no-export", "--quiet")
    code, _, err = cli(*args)
    assert code == 0, err
    recorded = json.loads((tmp_path / "m" / "train_config.json").read_text())
    assert (recorded["batch_size"], recorded["embedding_size"]) == (256, 4)
    assert json.loads((tmp_path / "m" / "result.json").read_text())["step"] == 2400 // 256
    code, _, err = cli(*args, "--epochs", 2)
    assert code == 0, err
    assert json.loads((tmp_path / "m" / "result.json").read_text())["step"] == 2 * (2400 // 256)


@pytest.mark.slow
@pytest.mark.tf215
def test_criteo_sample_raw_to_prediction(shared, tmp_path):
    """Real rows: raw Criteo TSV -> split -> featurize -> convert -> train -> predict raw rows.
    The data tools run as the command (no TensorFlow in them); training and prediction in this
    process (`cli`): a new process would add only TensorFlow's import, three times."""
    src = shared / "criteo_head1000" / "train.txt"
    run_cli("data", "split", src, "--out", tmp_path / "split", "--by", "order",
            "--fractions", "0.8,0.0,0.2")
    run_cli("data", "featurize", tmp_path / "split" / "train.txt", "--out", tmp_path / "f-train",
            "--min-count", "2")
    run_cli("data", "featurize", tmp_path / "split" / "test.txt", "--out", tmp_path / "f-test",
            "--vocab", tmp_path / "f-train" / "vocab.json")
    run_cli("data", "convert", tmp_path / "f-train", "--out", tmp_path / "tf-train", "--shards", 2)
    run_cli("data", "convert", tmp_path / "f-test", "--out", tmp_path / "tf-test", "--shards", 1)
    ctrtrain_here("train", "--train", tmp_path / "tf-train", "--test", tmp_path / "tf-test",
                  "--model-dir", tmp_path / "m", "--batch-size", "64", "--epochs", "5", "--quiet")
    r = json.loads((tmp_path / "m" / "result.json").read_text())
    assert r["test"]["examples"] == 200
    raw_test = tmp_path / "split" / "test.txt"
    ctrtrain_here("predict", "--model", tmp_path / "m" / "export", "--input", raw_test,
                  "--out", tmp_path / "p.csv")
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert len(lines) == 201
    # The same rows through the featurized TFRecords give the same probabilities.
    ctrtrain_here("predict", "--model", tmp_path / "m" / "export", "--input", tmp_path / "tf-test",
                  "--out", tmp_path / "p2.csv")
    assert lines == (tmp_path / "p2.csv").read_text().splitlines()


@pytest.mark.slow
def test_early_stopping_and_checkpoint_retention(synth, tmp_path):
    root, _ = synth
    md = tmp_path / "m"
    # With a zero learning rate the validation AUC never improves: the second evaluation
    # without improvement stops the run.
    ctrtrain_here(*train_args(root, md, "--steps", "400", "--learning-rate", "0", "--eval-every", "40",
                              "--early-stopping", "2", "--checkpoint-every", "30", "--keep-checkpoints",
                              "2", "--no-export"))
    result = json.loads((md / "result.json").read_text())
    assert result["stopped_early"] is True and result["step"] == 120
    events = [json.loads(l) for l in (md / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "eval" and e["split"] == "valid"][:3] == [40, 80, 120]
    kept = sorted(p.name for p in (md / "checkpoints").glob("ckpt-*.index"))
    assert kept == ["ckpt-120.index", "ckpt-90.index"]


def test_a_diverging_run_stops_at_its_first_nonfinite_step_whatever_the_steps_per_call(synth, tmp_path):
    """Several steps run in one compiled call (--steps-per-execution): the call ends at the
    first non-finite loss, and the run fails naming the same step as one step a call does,
    with no checkpoint of the diverged model."""
    import re
    root, _ = synth
    where = {}
    for k in (1, 10):
        code, out, err = cli("train", "--train", root / "tf" / "train", "--model-dir",
                             tmp_path / f"m{k}", "--learning-rate", "1e5", "--steps", 60,
                             "--steps-per-execution", k, "--quiet")
        said = re.search(r"became (nan|inf) at step (\d+)", out + err)
        assert code == 2 and said, (code, out[-1500:], err[-1500:])
        where[k] = said.group(0)
        assert not list((tmp_path / f"m{k}").glob("ckpt-*.index"))
    assert where[1] == where[10] and int(where[1].split()[-1]) > 2, where   # within a call


def test_several_steps_a_call_train_the_same_model_as_one(synth, tmp_path):
    """--steps-per-execution 7 (calls cut short by log windows of 4 steps and the end at 45)
    against one step a call: the same losses and test metrics (no dropout: nothing random
    in the steps)."""
    root, _ = synth
    got = {}
    for k in (1, 7):
        code, out, err = cli(*train_args(root, tmp_path / f"m{k}", "--steps", 45,
                                         "--log-every", 4, "--dropout", 0,
                                         "--steps-per-execution", k, "--no-export"))
        assert code == 0, err[-2000:]
        events = [json.loads(line) for line in open(tmp_path / f"m{k}" / "metrics.jsonl")]
        losses = [e["loss"] for e in events if e["event"] == "train"]
        result = json.loads((tmp_path / f"m{k}" / "result.json").read_text())
        got[k] = (losses, result["step"], result["test"]["auc"], result["test"]["logloss"])
    assert len(got[1][0]) == 12 and got[1][1] == 45
    np.testing.assert_allclose(got[7][0], got[1][0], rtol=1e-6)
    assert got[7][1:] == pytest.approx(got[1][1:], rel=1e-6)


def test_processes_start_tensorflow_without_keras_and_keras_loads_on_use():
    """ctrtrain.tf_start: TensorFlow's eager import of Keras (a third of its start, unused by
    ctrtrain) is skipped in a process that imported ctrtrain first; `tf.keras` and `import
    keras` still load it when used, and CTRTRAIN_TF_KERAS=1 turns the hook off. A run's
    TensorBoard hparams summary does not import boto3 (for TensorBoard's s3 stub), which
    stays importable."""
    probe = ("import sys, pathlib, tempfile, ctrtrain, tensorflow as tf\n"
             "from ctrtrain.train.metrics_log import MetricsLog\n"
             "before = 'keras' in sys.modules\n"
             "d = pathlib.Path(tempfile.mkdtemp())\n"
             "log = MetricsLog(d, console=False, settings={'model': 'fm'})\n"
             "log.tensorboard.hparams({'rows': 10})\n"
             "unloaded = 'boto3' not in sys.modules\n"
             "import boto3   # installed (sagemaker-training's), importable after\n"
             "layer = tf.keras.layers.Dense(2)\n"
             "import keras\n"
             "print(before, unloaded, 'boto3.session' in sys.modules, any(d.rglob('*.v2')),\n"
             "      type(layer).__name__, 'keras' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["False", "True", "True", "True", "Dense", "True"], r.stdout
    hooked = ("import sys, ctrtrain.tf_start as s\n"
              "print(any(isinstance(f, s._KerasAfterTensorFlow) for f in sys.meta_path))\n")
    for off, want in (("0", "True"), ("1", "False")):
        r = subprocess.run([sys.executable, "-c", hooked], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "CTRTRAIN_TF_KERAS": off})
        assert r.stdout.strip() == want, (off, r.stdout, r.stderr[-2000:])
