"""The exported model's `raw` signature (train/export.py, data/raw_graph.py): a plain
TensorFlow process that never imports ctrtrain loads the SavedModel and scores raw rows, cells
as the file holds them, equal to `ctrtrain predict` on the same file; and the same rows as a
TensorFlow Serving client sends them (tensorflow-serving-api's PredictRequest) fit the
signature and score the same."""

import json
import subprocess
import sys

import numpy as np

from conftest import ctrtrain_here

# What a serving team writes: the SavedModel, the rows as strings, one tensor per column.
CLIENT = r"""
import csv, json, sys
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
out = []
for model, path, sep in json.loads(sys.argv[1]):
    serve = tf.saved_model.load(model).signatures["raw"]
    names = serve.structured_input_signature[1]
    with open(path, newline="") as f:
        if sep == "\t":     # Criteo's TSV has no header: the vocabulary names its columns
            vocab = json.load(open(model + "/assets.extra/vocab.json"))["schema"]
            header = [vocab["label"]] + vocab["numeric"] + vocab["categorical"]
            rows = list(csv.reader(f, delimiter=sep, quoting=csv.QUOTE_NONE))
        else:
            header, *rows = list(csv.reader(f))
    cells = {n: tf.constant([r[header.index(n)] if header.index(n) < len(r) else ""
                             for r in rows]) for n in names}
    prob = serve(**cells)["prob"].numpy()
    # The same rows as TensorFlow Serving's client sends them: a PredictRequest of the raw
    # columns, over the wire (serialized) and read back as the server reads it. The server
    # checks the inputs' names against the signature's (all of them, no others), then
    # each tensor against its spec.
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "ctr", "raw"
    for n, t in cells.items():
        request.inputs[n].CopyFrom(tf.make_tensor_proto(t.numpy()))
    got = predict_pb2.PredictRequest.FromString(request.SerializeToString())
    assert set(got.inputs) == set(names), (set(got.inputs) ^ set(names))
    tensors = {n: tf.constant(tf.make_ndarray(p)) for n, p in got.inputs.items()}
    assert all(names[n].is_compatible_with(t) for n, t in tensors.items())
    served = serve(**tensors)["prob"].numpy()
    assert (served == prob).all(), (served, prob)
    out.append(prob.tolist())
assert not any(m.startswith("ctrtrain") for m in sys.modules)
print(json.dumps(out))
"""


def predicted(path) -> np.ndarray:
    lines = path.read_text().splitlines()
    col = lines[0].split(",").index("prob")
    return np.array([float(line.split(",")[col]) for line in lines[1:]])


def test_a_plain_tensorflow_client_scores_raw_rows_as_predict_does(shared, tmp_path):
    import shutil
    ml = shared / "deepctr_samples" / "movielens_sample.txt"
    criteo = tmp_path / "criteo.txt"
    shutil.copy(shared / "criteo_head1000" / "train.txt", criteo)
    cases = {   # name: (raw file, featurize options)
        "movielens": (ml, ["--label-column", "rating", "--label-threshold", 4, "--multi-hot",
                           "genres", "--drop", "title,timestamp", "--min-count", 1]),
        "movielens_hashed": (ml, ["--label-column", "rating", "--label-threshold", 4,
                                  "--multi-hot", "genres", "--drop", "title,timestamp",
                                  "--hash-buckets", 300]),
        "criteo": (criteo, ["--min-count", 2]),
        "criteo_hashed": (criteo, ["--hash-buckets", 1000]),     # featurize's crc32
    }
    jobs, want = [], []
    for name, (raw, options) in cases.items():
        ctrtrain_here("data", "featurize", raw, "--out", tmp_path / name, *options)
        md = tmp_path / f"{name}-model"
        ctrtrain_here("train", "--train", tmp_path / name, "--model-dir", md, "--epochs", 1,
                      "--batch-size", 32, "--quiet")
        export = next((md / "export").iterdir())
        ctrtrain_here("predict", "--model", export, "--input", raw, "--out",
                      tmp_path / f"{name}.csv")
        want.append(predicted(tmp_path / f"{name}.csv"))
        jobs.append([str(export), str(raw), "\t" if name.startswith("criteo") else ","])
    r = subprocess.run([sys.executable, "-c", CLIENT, json.dumps(jobs)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for name, got, expected in zip(cases, json.loads(r.stdout.splitlines()[-1]), want):
        assert len(got) == len(expected) > 100, name
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6, err_msg=name)
