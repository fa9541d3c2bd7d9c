"""Declared fields (data/schema.py): numeric and multi_hot fields beside categorical ones,
from `data synth` through training, export and `ctrtrain predict`, in one process and in
every distribution mode (the synchronous modes' comparisons with one process are made here;
parameter servers train them with every model in test_models.py); and what the previous
release wrote still trains and predicts the same."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cli, ctrtrain_here
from ctrtrain.data.schema import FieldRows, Schema
from ctrtrain.errors import DataError

DATA = Path(__file__).resolve().parent / "data"
PREVIOUS = DATA / "previous_release"


def ctrtrain(*args, cwd=None, timeout=600):
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "CTRTRAIN_NO_PROGRESS": "1"})
    return r


def ok(*args, **kw):
    r = ctrtrain(*args, **kw)
    assert r.returncode == 0, f"{args}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def here(*args):
    """`ctrtrain ARGS` in this process (conftest's cli) as a finished process would report it:
    a training or prediction run needs no process of its own (a new one adds TensorFlow's
    import, 3 CPU-s), the data tools run as the command."""
    code, out, err = cli(*args)
    return subprocess.CompletedProcess(args, code, out, err)


def ok_here(*args):
    r = here(*args)
    assert r.returncode == 0, f"{args}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def read_probs(path):
    with open(path) as f:
        return np.array([float(r["prob"]) for r in csv.DictReader(f)], np.float32)


def served_from_examples(export_base, files):
    """The SavedModel's `examples` signature on the files' serialized records, in order."""
    import tensorflow as tf

    from ctrtrain.train.export import latest_export
    serve = tf.saved_model.load(latest_export(export_base)).signatures["examples"]
    records = [r.numpy() for r in tf.data.TFRecordDataset([str(f) for f in files])]
    return serve(examples=tf.constant(records))["prob"].numpy()


def test_field_declarations_are_checked_by_name():
    good = [{"name": "user", "kind": "categorical"},
            {"name": "genres", "kind": "multi_hot", "max_len": 6, "pooling": "mean"},
            {"name": "hour", "kind": "numeric"}]
    s = Schema.from_json(good)
    assert [f.kind for f in s.fields] == ["categorical", "multi_hot", "numeric"]
    assert s.field_size == 3 and s.bag_width == 6
    assert Schema.from_json(s.to_json()) == s
    for fields, said in [
            ([{"name": "genres", "kind": "multi_hot"}], "needs max_len"),
            ([{"name": "g", "kind": "multi_hot", "max_len": 3, "pooling": "max"}], "pooling 'max'"),
            ([{"name": "age", "kind": "float"}], "kind 'float'"),
            ([{"name": "age", "kind": "numeric", "max_len": 2}], "multi_hot and sequence fields only"),
            ([{"name": "h", "kind": "sequence", "max_len": 2, "weighted": True}], "no weights"),
            ([{"name": "h", "kind": "sequence"}], "a sequence field needs max_len"),
            ([{"name": "a"}, {"name": "a"}], "declared twice"),
            ([{"name": "label"}], "name 'label'"),
            ([{"name": "g", "kind": "categorical", "bucket": 3}], "unknown key"),
            ([], "non-empty list"),
            ([{"name": "x", "kind": "numeric", "hash_buckets": 9, "hash_base": 0}],
             "not hashed"),
            ([{"name": "u", "hash_buckets": 9}], "hash_buckets and hash_base go together"),
            ([{"name": "u", "boundaries": [1, 2], "bucket_base": 0}],
             "apply to numeric fields only"),
            ([{"name": "x", "kind": "numeric", "boundaries": [2, 1], "bucket_base": 0}],
             "increasing order"),
            ([{"name": "x", "kind": "numeric", "boundaries": [1, "a"], "bucket_base": 0}],
             "finite numbers"),
            ([{"name": "x", "kind": "numeric", "boundaries": [1, 2]}], "bucket_base must be")]:
        with pytest.raises(DataError) as e:
            Schema.from_json(fields, where="m.json")
        assert said in str(e.value) and "m.json" in str(e.value), (fields, str(e.value))
    hashed = Schema.from_json([{"name": "u", "hash_buckets": 10, "hash_base": 90},
                               {"name": "g", "kind": "multi_hot", "max_len": 2,
                                "hash_buckets": 10, "hash_base": 95}])
    with pytest.raises(DataError, match="g's hashed ids 95..104 overlap u's"):
        hashed.check_ids(200)
    with pytest.raises(DataError, match="exceed feature_size 99"):
        Schema.from_json([{"name": "u", "hash_buckets": 10, "hash_base": 90}]).check_ids(99)
    bucketed = Schema.from_json([{"name": "u", "hash_buckets": 10, "hash_base": 90},
                                 {"name": "x", "kind": "numeric", "boundaries": [0, 1],
                                  "bucket_base": 98}])
    assert bucketed.field_size == 3 and Schema.from_json(bucketed.to_json()) == bucketed
    with pytest.raises(DataError, match="x's bucket ids 98..100 overlap u's"):
        bucketed.check_ids(200)


def test_field_examples_round_trip_through_tensorflow():
    """Written without TensorFlow, parsed by it into the batch layout the model reads: an
    empty bag pads to -1, a bag longer than max_len is cut to its first ids and a sequence to
    its last (the most recent), weights travel with ids."""
    import tensorflow as tf

    from ctrtrain.data.tfrecord import encode_field_examples
    from ctrtrain.input.pipeline import parse_fields_batch
    s = Schema.from_json([{"name": "user"}, {"name": "hour", "kind": "numeric"},
                          {"name": "genres", "kind": "multi_hot", "max_len": 3,
                           "weighted": True},
                          {"name": "tags", "kind": "multi_hot", "max_len": 2},
                          {"name": "history", "kind": "sequence", "max_len": 2}])
    rows = FieldRows(np.array([1, 0, 1], np.float32), {
        "user": np.array([5, 300, 2 ** 40]),
        "hour": np.array([0.5, -1, 3.25], np.float32),
        "genres": (np.array([2, 0, 4]), np.array([1, 2, 7, 8, 9, 10]),
                   np.array([.5, .25, 1, 2, 3, 4], np.float32)),
        "tags": (np.array([0, 1, 2]), np.array([40, 41, 42]), None),
        "history": (np.array([4, 1, 0]), np.array([90, 91, 92, 93, 94]), None)})
    b = parse_fields_batch(tf.constant(encode_field_examples(rows, s)), s)
    assert b["label"].numpy().tolist() == [1, 0, 1]
    assert b["ids"].numpy().tolist() == [[5], [300], [2 ** 40]]
    assert b["values"].numpy().tolist() == [[1], [1], [1]]
    assert b["numeric"].numpy().tolist() == [[0.5], [-1], [3.25]]
    assert b["bag_ids"].numpy().tolist() == [[1, 2, -1, -1, -1, 92, 93],
                                             [-1, -1, -1, 40, -1, 94, -1],
                                             [7, 8, 9, 41, 42, -1, -1]]
    assert b["bag_weights"].numpy().tolist() == [[.5, .25, 0, 0, 0, 1, 1], [0, 0, 0, 1, 0, 1, 0],
                                                 [1, 2, 3, 1, 1, 0, 0]]


def test_pooling_follows_the_declaration():
    """A bag's slot in the FM is its ids' rows, weighted, summed (mean: over the weights'
    sum; sqrtn: over the root of their squares' sum), computed here from the table."""
    import tensorflow as tf

    from ctrtrain.models.base import ModelConfig
    from ctrtrain.models.deepfm import DeepFM
    for pooling, norm in [("sum", lambda w: 1.0), ("mean", lambda w: w.sum()),
                          ("sqrtn", lambda w: np.sqrt((w ** 2).sum()))]:
        m = DeepFM(ModelConfig(feature_size=10, field_size=2, embedding_size=3,
                                deep_layers=(4,), numeric_fields=1, bags=((3, pooling),)))
        m.table.assign(tf.random.normal(m.table.shape, seed=1))
        table = m.table.numpy()
        w = np.array([0.5, 2.0], np.float32)
        feats = {"ids": tf.zeros([2, 0], tf.int64), "values": tf.zeros([2, 0]),
                 "numeric": tf.constant([[1.5], [0.0]]),
                 "bag_ids": tf.constant([[4, 7, -1], [-1, -1, -1]], tf.int64),
                 "bag_weights": tf.constant([[0.5, 2.0, 0.0], [0.0, 0.0, 0.0]])}
        logits, _ = m(feats)
        pooled = (table[4] * w[0] + table[7] * w[1]) / norm(w)
        slots = np.stack([table[10] * 1.5, pooled])            # numeric row: feature_size + 0
        first = slots[:, 0].sum()
        fm = 0.5 * ((slots[:, 1:].sum(0) ** 2) - (slots[:, 1:] ** 2).sum(0)).sum()
        deep = m.mlp(tf.constant(slots.reshape(1, -1)), False).numpy()[0, 0]
        assert np.isclose(logits.numpy()[0], first + fm + deep, atol=1e-5), pooling
        # An empty bag and a zero numeric: nothing but the bias and the MLP of zeros.
        zero = m.mlp(tf.zeros([1, 8]), False).numpy()[0, 0]
        assert np.isclose(logits.numpy()[1], zero, atol=1e-6), pooling
    # A data set of bags alone (no single field to tell the batch size).
    m = DeepFM(ModelConfig(feature_size=10, field_size=1, embedding_size=3, deep_layers=(4,),
                            bags=((2, "mean"),)))
    logits, _ = m({"ids": tf.zeros([3, 0], tf.int64), "values": tf.zeros([3, 0]),
                   "bag_ids": tf.constant([[1, 2], [-1, -1], [3, -1]], tf.int64),
                   "bag_weights": tf.constant([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])})
    assert logits.shape == [3]


@pytest.mark.tf215
def test_declared_fields_train_export_and_predict_the_same(declared, tmp_path):
    info = json.loads((declared / "synth.json").read_text())
    manifest = json.loads((declared / "train" / "manifest.json").read_text())
    kinds = [f["kind"] for f in manifest["fields"]]
    assert kinds == ["numeric"] * 2 + ["categorical"] * 5 + ["multi_hot"] * 2 + ["sequence"]
    md = tmp_path / "model"
    r = ok_here("train", "--train", declared / "train", "--valid", declared / "valid",
                "--test", declared / "test", "--model-dir", md, "--epochs", 2,
                "--batch-size", 256, "--predictions", "auto")
    result = json.loads((md / "result.json").read_text())
    bayes = info["splits"]["test"]["bayes_auc"]
    # Small data (24k rows): well above chance, below the bound (the 0.01 is for a
    # benchmark-sized set).
    assert 0.65 < result["test"]["auc"] < bayes + 0.01, (result["test"], bayes)
    assert "field_size=10" in r.stdout
    # The exported model reads the same records, as a directory or as its files.
    trained = read_probs(md / "predictions.csv")
    ctrtrain_here("predict", "--model", md / "export", "--input", declared / "test", "--out", tmp_path / "p.csv")
    np.testing.assert_allclose(read_probs(tmp_path / "p.csv"), trained, rtol=1e-5, atol=1e-6)
    files = sorted((declared / "test").glob("*.tfrecord"))
    ctrtrain_here("predict", "--model", md / "export", "--input", *files, "--out", tmp_path / "f.csv")
    np.testing.assert_allclose(read_probs(tmp_path / "f.csv"), trained, rtol=1e-5, atol=1e-6)
    # A serving client may send the records themselves (no label): the same probabilities.
    np.testing.assert_allclose(served_from_examples(md / "export", files), trained,
                               rtol=1e-5, atol=1e-6)
    # ... and what training refuses, the signature refuses too, naming the record (F38).
    import tensorflow as tf

    from ctrtrain.train.export import latest_export
    serve = tf.saved_model.load(latest_export(md / "export")).signatures["examples"]
    good = next(iter(tf.data.TFRecordDataset([str(files[0])]))).numpy()
    numeric, cat = (next(f["name"] for f in manifest["fields"] if f["kind"] == k)
                    for k in ("numeric", "categorical"))
    for name, feature, what in (
            (numeric, tf.train.Feature(float_list=tf.train.FloatList(value=[float("nan")])),
             "a value that is not finite"),
            (numeric, tf.train.Feature(float_list=tf.train.FloatList(value=[float("inf")])),
             "a value that is not finite"),
            (cat, tf.train.Feature(int64_list=tf.train.Int64List(value=[-5])),
             "an id outside the table"),
            # Finite, but it overflows the model: NaN answered before.
            (numeric, tf.train.Feature(float_list=tf.train.FloatList(value=[3e38])),
             "a score that is not finite")):
        ex = tf.train.Example.FromString(good)
        ex.features.feature[name].CopyFrom(feature)
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"record 1 of the request has {what}"):
            serve(examples=tf.constant([good, ex.SerializeToString()]))
    # A record without a bag's key would read as an empty bag: refused, while an empty list
    # (what featurize writes for an empty cell) is scored.
    bag = next(f["name"] for f in manifest["fields"] if f["kind"] == "multi_hot")
    ex = tf.train.Example.FromString(good)
    del ex.features.feature[bag].int64_list.value[:]
    assert serve(examples=tf.constant([good, ex.SerializeToString()]))["prob"].shape == [2]
    del ex.features.feature[bag]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"record 1 of the request has no feature {bag} "):
        serve(examples=tf.constant([good, ex.SerializeToString()]))
    # predict reads through the signature: the overflowing record is named as a row.
    ex = tf.train.Example.FromString(good)
    ex.features.feature[numeric].float_list.value[:] = [3e38]
    with tf.io.TFRecordWriter(str(tmp_path / "huge.tfrecord")) as w:
        w.write(good)
        w.write(ex.SerializeToString())
    bad = here("predict", "--model", md / "export", "--input", tmp_path / "huge.tfrecord",
               "--out", tmp_path / "h.csv")
    assert bad.returncode == 2 and "row 2 (1-based, in input order) has a score that is not " \
        "finite" in bad.stderr, bad.stderr[-2000:]
    assert not (tmp_path / "h.csv").exists()
    # -1 pads a bag: an id of -1 would vanish into the padding, unscored.
    ex = tf.train.Example.FromString(good)
    ex.features.feature[bag].int64_list.value[:] = [-1]
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"a negative id in {bag}"):
        serve(examples=tf.constant([good, ex.SerializeToString()]))
    # Data of other fields is refused by name, not predicted from.
    bad = here("predict", "--model", md / "export", "--input", PREVIOUS / "test",
               "--out", tmp_path / "x.csv")
    assert bad.returncode == 2 and "other fields" in bad.stderr and not (tmp_path / "x.csv").exists()


@pytest.fixture(scope="module")
def declared_single(declared, tmp_path_factory):
    """One process over the declared data, global batch 512, one epoch: the modes' yardstick."""
    from test_distributed import launch
    from trainutil import made_once
    return made_once(tmp_path_factory, "declared-single", lambda d: launch(
        d, "deepfm-single", declared, hyperparameters={"epochs": 1, "batch_size": 512})[0])[1]


def test_the_recipe_on_one_host_trains_what_the_command_trains(declared, declared_single,
                                                                 tmp_path):
    """The SageMaker recipe entry on a simulated host (its channels staged to the host, their
    manifests rewritten) and `ctrtrain train` over the same directories, same settings and
    seed: the same model. The host's manifest once counted no positives, so the recipe started
    the output bias at 0 instead of the data's prior (test AUC 0.726 vs 0.750 here)."""
    md = tmp_path / "model"
    ok_here("train", "--train", declared / "train", "--test", declared / "test",
            "--model-dir", md, "--epochs", 1, "--batch-size", 512, "--embedding-size", 16)
    result = json.loads((md / "result.json").read_text())
    assert result["step"] == declared_single["step"]
    assert result["test"]["auc"] == pytest.approx(declared_single["test"]["auc"], abs=1e-6)


def test_a_hosts_share_of_a_data_set_keeps_its_positive_rate(declared, tmp_path):
    """A ShardedByS3Key share's manifest: its files, and the set's positive rate over their
    records (positives are counted per set, not per file)."""
    from ctrtrain.data.manifest import read_manifest
    from ctrtrain.launch.channels import channel_files, materialize_file_channel
    from ctrtrain.launch.spec import Channel
    ch = Channel("training", str(declared / "train"), distribution="ShardedByS3Key")
    whole = read_manifest(ch.path)
    files = channel_files(ch)
    materialize_file_channel(ch, files[:1], tmp_path / "share")
    share = read_manifest(tmp_path / "share")
    assert [f.path for f in share.files] == [whole.files[0].path]
    assert 0 < share.records < whole.records and share.positives > 0
    assert abs(share.positives / share.records - whole.positives / whole.records) < 1e-3
    materialize_file_channel(ch, files, tmp_path / "all")
    assert read_manifest(tmp_path / "all").positives == whole.positives


@pytest.mark.slow
@pytest.mark.parametrize("example,hp", [
    ("deepfm-allreduce", {"batch_size": 256}),
    pytest.param("deepfm-allreduce", {"batch_size": 256, "sparse_reduce": "dense"},
                 marks=pytest.mark.tf215),
    pytest.param("deepfm-mirrored", {"batch_size": 256, "devices": 2}, marks=pytest.mark.tf215),
    pytest.param("deepfm-data-service", {"batch_size": 256}, marks=pytest.mark.tf215),
    pytest.param("horovod", {"batch_size": 256}, marks=pytest.mark.tf215_only)])
def test_declared_fields_in_synchronous_modes_match_one_process(declared, declared_single,
                                                               tmp_path, example, hp):
    """Real processes over localhost (or two devices of one), through the SageMaker recipe
    entry: the same steps and within 0.005 AUC of one process with
    the same global batch, with the table's gradients all-gathered or (sparse_reduce dense)
    all-reduced; each rank reads its own files. Horovod's ranks run TF 2.15 (.venv-hvd). The
    all-reduce (tables all-gathered, the default) and mirrored jobs also train every other
    model in turn in the same processes, in the 2.21 pass: with the parameter-server job of
    test_models.py, every model in each way variables are placed and gradients combined.
    Horovod combines a model's gradients as the all-reduce trainer does (with Horovod's ops
    for TensorFlow's collectives, whatever the model), so its job trains DeepFM; every model on
    TF 2.15 is test_models.py's 2.15-pass test. The tf.data-service job trains DeepFM only: it
    is the all-reduce trainer with its input read from the service, the same for every model."""
    import tensorflow as tf
    from test_distributed import hvd_python, launch
    from test_models import assert_family_trained, family
    python = hvd_python() if example == "horovod" else sys.executable
    with_family = example in ("deepfm-mirrored", "deepfm-allreduce") and \
        "sparse_reduce" not in hp and not tf.__version__.startswith("2.15")
    runs = {"deepfm": {"epochs": 1, "embedding_size": 16, **hp},    # as declared_single's
            **(family(**hp) if with_family else {})}
    done, job, out = launch(tmp_path, example, declared, python=python, runs=runs)
    r = done["deepfm"]["result"]
    assert r["replicas"] == 2 and r["global_batch"] == 512 and r["step"] == declared_single["step"], r
    assert abs(r["test"]["auc"] - declared_single["test"]["auc"]) < 0.005, \
        (r["test"], declared_single["test"])
    mode = {"deepfm-mirrored": "mirrored", "horovod": "horovod"}.get(example, "allreduce")
    assert r["mode"] == mode, r["mode"]
    if example in ("deepfm-allreduce", "horovod"):       # each rank its own files
        assert "file_shard=(2, 0)" in out and "file_shard=(2, 1)" in out
    if example == "horovod":
        assert "horovodrun" in job["exit_codes"]
    if example == "deepfm-data-service":
        assert {"dispatcher", "data_worker", "worker"} <= {p["role"] for p in job["processes"]}
    if with_family:
        assert_family_trained(done, mode)


def test_previous_release_data_and_models_work_unchanged(tmp_path):
    """A data set and a SavedModel written by the release before declared fields: its model
    predicts what it predicted then, and its data trains."""
    old = read_probs(PREVIOUS / "test_predictions.csv")
    ctrtrain_here("predict", "--model", PREVIOUS / "export", "--input", PREVIOUS / "test",
                  "--out", tmp_path / "p.csv")
    np.testing.assert_allclose(read_probs(tmp_path / "p.csv"), old, rtol=1e-5, atol=1e-6)
    md = tmp_path / "model"
    ctrtrain_here("train", "--train", PREVIOUS / "train", "--test", PREVIOUS / "test", "--model-dir", md,
                  "--epochs", 2, "--batch-size", 128, "--embedding-size", 4, "--deep-layers", "16,8")
    result = json.loads((md / "result.json").read_text())
    assert result["step"] == 36 and result["test"]["examples"] == 300
    assert not (md / "export" / "36" / "assets.extra" / "ctrtrain.json").read_text().count('"fields"')
    # Today's export of the fixed schema serves its records too, as `predict` scores them.
    ctrtrain_here("predict", "--model", md / "export", "--input", PREVIOUS / "test", "--out", tmp_path / "n.csv")
    np.testing.assert_allclose(
        served_from_examples(md / "export", sorted((PREVIOUS / "test").glob("*.tfrecord"))),
        read_probs(tmp_path / "n.csv"), rtol=1e-5, atol=1e-6)


def write_declared(directory: Path, schema: Schema, rows: FieldRows, feature_size: int):
    """A declared-fields data directory as the data tools write it."""
    from ctrtrain.data.manifest import FileEntry, Manifest
    from ctrtrain.data.tfrecord import ShardWriter
    directory.mkdir(parents=True)
    w = ShardWriter(str(directory / "part-0.tfrecord"))
    w.write_rows(rows, schema)
    n, size, sha = w.commit()
    Manifest("tfrecord", schema.field_size, feature_size,
             [FileEntry("part-0.tfrecord", n, size, sha)], positives=int(rows.labels.sum()),
             fields=schema.to_json()).write(directory)


def test_a_bad_declared_record_is_named_by_validate_and_training(tmp_path):
    s = Schema.from_json([{"name": "user"}, {"name": "hour", "kind": "numeric"},
                          {"name": "genres", "kind": "multi_hot", "max_len": 3,
                           "weighted": True}])
    n = 600
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, n)
    bad_row = 517
    lengths[bad_row] = 2
    ids = rng.integers(0, 50, int(lengths.sum()))
    ids[lengths[:bad_row].sum()] = 50          # outside the table of 50 ids
    weights = np.ones(len(ids), np.float32)
    rows = FieldRows((rng.random(n) < 0.3).astype(np.float32), {
        "user": rng.integers(0, 50, n), "hour": rng.random(n).astype(np.float32),
        "genres": (lengths, ids, weights)})
    write_declared(tmp_path / "d", s, rows, feature_size=50)
    v = ctrtrain("data", "validate", tmp_path / "d")
    assert v.returncode == 2, v.stdout + v.stderr
    assert "part-0.tfrecord" in v.stderr and f"record {bad_row}" in v.stderr \
        and "id 50 of genres is outside [0, 50)" in v.stderr, v.stderr
    t = here("train", "--train", tmp_path / "d", "--model-dir", tmp_path / "m",
             "--epochs", 1, "--batch-size", 64)
    assert t.returncode == 2 and f"record {bad_row}" in t.stderr and "genres" in t.stderr, t.stderr
    assert not (tmp_path / "m" / "export").exists()


@pytest.fixture(scope="module")
def movielens_csvs(tmp_path_factory, shared):
    """DeepCTR's MovieLens sample (200 rows of MovieLens-1M) split in two, as a user would."""
    import pandas as pd
    d = pd.read_csv(shared / "deepctr_samples" / "movielens_sample.txt")
    out = tmp_path_factory.mktemp("movielens")
    d[:140].to_csv(out / "train.csv", index=False)
    d[140:].to_csv(out / "test.csv", index=False)
    return out


def test_movielens_example_runs_end_to_end(movielens_csvs, tmp_path):
    """examples/movielens.sh: genres multi_hot, the rest categorical, rating >= 4 a click;
    featurize with the training CSV's vocabulary, train, evaluate, and the raw test CSV
    predicted through the model's vocabulary as training scored it."""
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(["bash", str(root / "examples" / "movielens.sh"),
                        str(movielens_csvs / "train.csv"), str(movielens_csvs / "test.csv"),
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "CTRTRAIN_NO_PROGRESS": "1", "EPOCHS": "3"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("test_auc=") and 0 <= float(last.split("=")[1]) <= 1, last
    m = json.loads((tmp_path / "out" / "train" / "manifest.json").read_text())
    kinds = {f["name"]: f["kind"] for f in m["fields"]}
    assert kinds == {"user_id": "categorical", "movie_id": "categorical", "gender": "categorical",
                     "age": "categorical", "occupation": "categorical", "zip": "categorical",
                     "hour": "categorical", "genres": "multi_hot"}
    genres = next(f for f in m["fields"] if f["name"] == "genres")
    assert genres["max_len"] == 4 and genres["pooling"] == "mean"   # the longest training bag
    # Labels from ratings: the sample's ratings >= 4 are the positives.
    import pandas as pd
    train = pd.read_csv(movielens_csvs / "train.csv")
    assert m["positives"] == int((train.rating >= 4).sum()) and m["records"] == 140
    # Two test rows hold 5 genres: kept in the file, counted and said.
    assert "genres: 2 rows hold more than max_len 4 values" in r.stdout
    md = tmp_path / "out" / "model"
    ok_here("predict", "--model", md / "export", "--input", tmp_path / "out" / "test.csv",
            "--out", tmp_path / "raw.csv")
    np.testing.assert_allclose(read_probs(tmp_path / "raw.csv"), read_probs(md / "predictions.csv"),
                               rtol=1e-6, atol=1e-7)


def test_featurize_numeric_and_multi_valued_columns_are_named_when_wrong(movielens_csvs,
                                                                         tmp_path):
    d = movielens_csvs
    ok("data", "featurize", d / "train.csv", "--out", tmp_path / "f", "--label-column", "rating",
       "--label-threshold", "4", "--multi-hot", "genres", "--numeric", "age",
       "--drop", "title,timestamp", "--min-count", "1")
    m = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert m["fields"][0] == {"name": "age", "kind": "numeric"}
    for args, said in [
            (["--multi-hot", "genre"], "--multi-hot names ['genre'], not in the header"),
            (["--numeric", "title"], "'Ed Wood (1994)' is not a number"),
            (["--vocab", tmp_path / "f" / "vocab.json", "--multi-hot", "genres"],
             "the vocabulary's")]:
        r = ctrtrain("data", "featurize", d / "train.csv", "--out", tmp_path / "bad",
                     "--label-column", "rating", "--label-threshold", "4", *args)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr[-800:])
        assert not (tmp_path / "bad").exists()


def test_featurize_a_history_column_as_a_sequence(movielens_csvs, tmp_path):
    """The movies rated just before each row (up to 4, oldest first: the site's recent
    activity) as a sequence field: --max-len caps it, and rows with a longer history are
    counted and said (the most recent kept when read)."""
    import pandas as pd
    d = pd.read_csv(movielens_csvs / "train.csv").sort_values("timestamp", kind="stable")
    movies = d.movie_id.astype(str).tolist()
    history = ["|".join(movies[max(0, i - 4):i]) for i in range(len(movies))]
    d["history"] = history
    d.to_csv(tmp_path / "train.csv", index=False)
    longest = max(len(h.split("|")) if h else 0 for h in history)
    r = ok("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "f",
           "--label-column", "rating", "--label-threshold", "4", "--multi-hot", "genres",
           "--sequence", "history", "--max-len", 2, "--drop", "title,timestamp",
           "--min-count", "1")
    m = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert m["fields"][-1] == {"name": "history", "kind": "sequence", "max_len": 2,
                               "pooling": "mean"}
    over = sum(len(h.split("|")) > 2 for h in history if h)
    assert longest > 2 and m["extra"]["longer_than_max_len"]["history"] == over
    assert f"history: {over} rows hold more than max_len 2 values" in r.stdout
    assert "read the last max_len" in r.stdout
    ok("data", "validate", tmp_path / "f")
    # --share-vocab: the history's movies take movie_id's ids (DIN's history and candidate
    # share embeddings): each row's history holds the ids of the 4 rows before it.
    common = ["--label-column", "rating", "--label-threshold", "4", "--multi-hot", "genres",
              "--sequence", "history", "--drop", "title,timestamp", "--min-count", "1"]
    ok("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "s", *common,
       "--share-vocab", "history=movie_id")
    from ctrtrain.data.featurize import Vocabulary, featurize_file
    vocab = Vocabulary.load(str(tmp_path / "s" / "vocab.json"))
    assert "history" not in vocab.values and set(vocab.values["movie_id"]) == set(movies)
    assert vocab.feature_size == json.loads(
        (tmp_path / "s" / "manifest.json").read_text())["feature_size"] < m["feature_size"]
    rows = next(featurize_file(str(tmp_path / "train.csv"), vocab))
    movie = rows.columns["movie_id"]
    lengths, flat, _ = rows.columns["history"]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for i in range(len(movie)):
        assert list(flat[starts[i]:starts[i + 1]]) == list(movie[max(0, i - 4):i]), i
    for args, said in [(["--share-vocab", "history=rating"], "history must be a --multi-hot or "
                         "--sequence column and rating a categorical one"),
                       (["--share-vocab", "history=movie_id", "--hash-buckets", 50],
                        "not with --hash-buckets"),
                       (["--share-vocab", "history"], "give COLUMN=OTHER_COLUMN pairs")]:
        r = ctrtrain("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "bad",
                     *common, *args)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr[-800:])
        assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_bench_train_compares_a_multi_hot_set_with_the_one_hot_reference(tmp_path):
    """`bench train --multi-hot-fields`: both sets trained in one run, compared in ids per
    second (small sizes: the figure itself comes from the full-size run in docs/)."""
    out = tmp_path / "b.json"
    ok("bench", "train", "--multi-hot-fields", 2, "--multi-hot-len", 4, "--rows", 8000,
       "--feature-size", 30_000, "--steps", 10, "--warmup", 2, "--repeats", 1,
       "--work-dir", tmp_path / "w", "--json", out, timeout=900)
    b = json.loads(out.read_text())
    one, multi = b["sets"]["one-hot"], b["sets"]["multi-hot 2x4"]
    assert one["ids_per_example"] == 39          # 13 numeric + 26 categorical, one id each
    # 13 + 24 single ids and 2 bags of 0 to 4 ids (2 on average): about 41.
    assert 39 < multi["ids_per_example"] < 43, multi["ids_per_example"]
    for s in (one, multi):
        assert s["ids_per_s"] == pytest.approx(s["examples_per_s"] * s["ids_per_example"])
    assert b["ids_per_s_ratio"] == pytest.approx(multi["ids_per_s"] / one["ids_per_s"])
    manifest = json.loads((Path(multi["data"]) / "manifest.json").read_text())
    assert [f["kind"] for f in manifest["fields"]].count("multi_hot") == 2


def test_fields_hashed_at_training_time_serve_raw_strings(movielens_csvs, tmp_path):
    """featurize --hash-buckets with a multi-valued column: the files keep the raw values and
    each field declares its hash; training, the raw-CSV prediction and a client's own
    tf.train.Example of raw strings sent to the `examples` signature all agree."""
    import pandas as pd
    import tensorflow as tf
    d = movielens_csvs
    ctrtrain_here("data", "featurize", d / "train.csv", "--out", tmp_path / "train", "--label-column",
                  "rating", "--label-threshold", "4", "--multi-hot", "genres", "--drop", "title,timestamp",
                  "--hash-buckets", 500)
    ctrtrain_here("data", "featurize", d / "test.csv", "--out", tmp_path / "test",
                  "--vocab", tmp_path / "train" / "vocab.json")
    ctrtrain_here("data", "validate", tmp_path / "test")
    m = json.loads((tmp_path / "train" / "manifest.json").read_text())
    hashed = {f["name"]: (f["hash_base"], f["hash_buckets"]) for f in m["fields"]}
    assert sorted(b for b, _ in hashed.values()) == list(range(0, 500 * len(hashed), 500))
    assert m["feature_size"] == 500 * len(hashed) and hashed["genres"][1] == 500
    md = tmp_path / "model"
    ctrtrain_here("train", "--train", tmp_path / "train", "--test", tmp_path / "test", "--model-dir", md,
                  "--epochs", 3, "--batch-size", 32, "--predictions", "auto")
    trained = read_probs(md / "predictions.csv")
    ctrtrain_here("predict", "--model", md / "export", "--input", d / "test.csv", "--out", tmp_path / "p.csv")
    np.testing.assert_allclose(read_probs(tmp_path / "p.csv"), trained, rtol=1e-6, atol=1e-7)
    # A client builds the Example from the raw row, as TF Serving users do.
    row = pd.read_csv(d / "test.csv", dtype=str).iloc[0]
    feats = {c: tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[c].encode()]))
             for c in ("user_id", "movie_id", "gender", "age", "occupation", "zip")}
    feats["genres"] = tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[g.encode() for g in row["genres"].split("|")]))
    example = tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()
    from ctrtrain.train.export import latest_export
    serve = tf.saved_model.load(latest_export(md / "export")).signatures["examples"]
    prob = serve(examples=tf.constant([example]))["prob"].numpy()[0]
    assert prob == pytest.approx(trained[0], rel=1e-5, abs=1e-6)


def test_declared_files_without_a_manifest_are_indexed_with_their_declaration(declared,
                                                                               tmp_path):
    """Records do not tell their declaration: `data index --fields` takes it (a data
    directory, a JSON file or the list) and writes the manifest the files' writer did."""
    import shutil
    src = json.loads((declared / "train" / "manifest.json").read_text())
    for f in src["files"]:
        shutil.copy(declared / "train" / f["path"], tmp_path / f["path"])
    r = ctrtrain("data", "index", tmp_path)
    assert r.returncode == 2 and "record 0 has no ids, values feature" in r.stderr
    assert "data index --fields" in r.stderr and not (tmp_path / "manifest.json").exists()
    (tmp_path.parent / "decl.json").write_text(json.dumps(src["fields"]))
    for spec in (declared / "train", tmp_path.parent / "decl.json", json.dumps(src["fields"])):
        ctrtrain_here("data", "index", tmp_path, "--fields", spec, "--overwrite")
        m = json.loads((tmp_path / "manifest.json").read_text())
        assert m["fields"] == src["fields"] and m["files"] == src["files"]
        assert m["positives"] == src["positives"]
        assert m["feature_size"] <= src["feature_size"]       # the largest id + 1
    ctrtrain_here("data", "validate", tmp_path)
    r = ctrtrain("data", "index", tmp_path, "--fields", declared / "train", "--overwrite",
                 "--feature-size", 10)
    assert r.returncode == 2 and "is outside [0, 10)" in r.stderr


def test_a_numeric_field_bucketized_into_an_id_trains_and_serves(declared, tmp_path):
    """A numeric field declared with boundaries keeps its value and also gets its bucket's
    id (TensorFlow's Bucketize: the boundaries at or below the value), an FM slot after the
    categorical ids; declared on the synthesized files through `data index --fields`."""
    import shutil

    import tensorflow as tf

    from ctrtrain.data.manifest import read_manifest
    from ctrtrain.input.pipeline import parse_fields_batch
    src = read_manifest(declared / "train")
    base = src.feature_size
    fields = [dict(f, boundaries=[-1.0, 0.0, 0.5, 1.0], bucket_base=base + 5 * j)
              if f["kind"] == "numeric" else f for j, f in enumerate(src.fields)]
    (tmp_path / "decl.json").write_text(json.dumps(fields))
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        for f in read_manifest(declared / split).files:
            shutil.copy(declared / split / f.path, tmp_path / split / f.path)
        ctrtrain_here("data", "index", tmp_path / split, "--fields", tmp_path / "decl.json",
                      "--feature-size", base + 10)
    m = read_manifest(tmp_path / "train")
    assert m.field_size == len(fields) + 2 and m.feature_size == base + 10

    records = [r.numpy() for r in tf.data.TFRecordDataset(m.paths(tmp_path / "train")).take(64)]
    b = parse_fields_batch(tf.constant(records), m.schema)
    n_cat = len(m.schema.of("categorical"))
    for j, f in enumerate(m.schema.bucketized()):
        x = b["numeric"].numpy()[:, j]
        want = np.searchsorted(f.boundaries, x, side="right") + f.bucket_base
        assert b["ids"].numpy()[:, n_cat + j].tolist() == want.tolist()
        assert len(set(want.tolist())) > 1

    ctrtrain_here("train", "--train", tmp_path / "train", "--test", tmp_path / "test", "--model-dir",
                  tmp_path / "m", "--epochs", 1, "--batch-size", 512)
    ctrtrain_here("predict", "--model", tmp_path / "m" / "export", "--input", tmp_path / "test", "--out",
                  tmp_path / "p.csv")
    test_files = read_manifest(tmp_path / "test").paths(tmp_path / "test")
    served = served_from_examples(tmp_path / "m" / "export", test_files)
    np.testing.assert_allclose(read_probs(tmp_path / "p.csv"), served, rtol=1e-5, atol=1e-6)
