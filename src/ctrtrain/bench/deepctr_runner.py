"""DeepCTR's implementation of a ctrtrain model (params["model"]: deepfm -> DeepFM, wide_deep
-> WDL, dcn_v2 -> DCN with matrix cross layers, as DeepCTR builds DCN-v2, xdeepfm -> xDeepFM,
autoint -> AutoInt) on a data set exported by `ctrtrain bench quality`, in DeepCTR's own
environment (scripts/deepctr_env.sh: deepctr 0.9.4 on tf-keras). Run by path with that
environment's python: it imports numpy, TensorFlow and DeepCTR only, never ctrtrain.

    python deepctr_runner.py PARAMS_JSON   ->  one JSON line per epoch on stdout

With params["speed"] ({"warmup": W, "steps": S}, from `ctrtrain bench train`) it trains only:
W batches of the training array, then S more timed (one Keras `fit` each, as DeepCTR users
train), and prints one JSON line with examples/s over the S steps.

The model is built as people use DeepCTR on Criteo-style data: a field whose id never changes
(a numeric column: one id, its value varying) is a DenseFeat of its value; every other field
is a SparseFeat of its id, all fields sharing one table of feature_size rows (as ctrtrain's
model does), with DeepCTR's dense (whole-table) L2 and Keras 2's dense Adam. DeepCTR's DCN
adds a linear part over the ids, which the paper's DCN-v2 (and ctrtrain's) has not.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def auc(y, p) -> float:
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p))
    sp = p[order]
    i = 0
    while i < len(sp):                      # average ranks of ties
        j = i
        while j + 1 < len(sp) and sp[j + 1] == sp[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = y == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def logloss(y, p) -> float:
    p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def build(params: dict, train: dict):
    """DeepCTR's model for params["model"] over the training arrays' fields, compiled; and
    the function that maps a split's arrays to its inputs."""
    import tensorflow as tf
    from deepctr import models
    from deepctr.feature_column import DenseFeat, SparseFeat, get_feature_names

    ids = train["ids"]
    constant = [bool((ids[:, f] == ids[0, f]).all()) for f in range(ids.shape[1])]
    columns = []
    for f, is_dense in enumerate(constant):
        if is_dense:
            columns.append(DenseFeat(f"d{f}", 1))
        else:
            columns.append(SparseFeat(f"s{f}", vocabulary_size=params["feature_size"],
                                      embedding_dim=params["embedding_size"], dtype="int64",
                                      embedding_name="table"))

    def inputs(d):
        return {(f"d{f}" if c else f"s{f}"): (d["values"][:, f] if c else d["ids"][:, f])
                for f, c in enumerate(constant)}

    half = params["l2"] / 2    # ctrtrain's l2 is the sample's l2 * l2_loss(w) = l2/2 * sum(w^2)
    common = dict(dnn_hidden_units=tuple(params["deep_layers"]), l2_reg_linear=half,
                  l2_reg_embedding=half, l2_reg_dnn=half, dnn_dropout=params["dropout"],
                  seed=params["seed"], task="binary")
    name = params.get("model", "deepfm")
    if name == "deepfm":
        model = models.DeepFM(columns, columns, **common)
    elif name == "wide_deep":
        model = models.WDL(columns, columns, **common)
    elif name == "dcn_v2":
        options = params["options"]
        if options["cross_structure"] != "parallel" or options["cross_rank"]:
            raise SystemExit("DeepCTR's DCN is parallel and full rank (DCNMix is its low rank)")
        model = models.DCN(columns, columns, cross_num=options["cross_layers"],
                           cross_parameterization="matrix", l2_reg_cross=half, **common)
    elif name == "xdeepfm":     # the paper's CIN (and ctrtrain's): no half split, no ReLU
        model = models.xDeepFM(columns, columns,
                               cin_layer_size=tuple(params["options"]["cin_layers"]),
                               cin_split_half=False, cin_activation="linear", l2_reg_cin=half,
                               **common)
    elif name == "autoint":     # the paper's AutoInt (and ctrtrain's): no MLP
        o = params["options"]
        common.update(dnn_hidden_units=())
        model = models.AutoInt(columns, columns, att_layer_num=o["attention_layers"],
                               att_embedding_size=o["attention_size"],
                               att_head_num=o["attention_heads"], att_res=o["attention_residual"],
                               **common)
    else:
        raise SystemExit(f"DeepCTR has no {name}")
    model.compile(tf.keras.optimizers.Adam(params["learning_rate"]), "binary_crossentropy")
    assert set(get_feature_names(columns)) == set(inputs(train))
    # A SparseFeat is its id's embedding: a categorical value other than 1 is not used.
    sparse = ~np.array(constant)
    values = train["values"]
    ignored = float((values[:, sparse] != 1).mean()) if sparse.any() else 0.0
    return model, inputs, ignored


def speed(params: dict, train: dict, model, inputs) -> dict:
    """Examples/s of S timed batches after W warm-up ones (params["speed"])."""
    batch, w, s = params["batch_size"], params["speed"]["warmup"], params["speed"]["steps"]
    if len(train["labels"]) < (w + s) * batch:
        raise SystemExit(f"{(w + s) * batch} training rows needed, {len(train['labels'])} given")

    def fit(lo, hi):
        part = {k: v[lo * batch:hi * batch] for k, v in train.items()}
        model.fit(inputs(part), part["labels"], batch_size=batch, epochs=1, verbose=0,
                  shuffle=False)

    fit(0, w)
    t0 = time.perf_counter()
    fit(w, w + s)
    seconds = time.perf_counter() - t0
    return {"examples_per_s": s * batch / seconds, "step_ms": 1000 * seconds / s}


def main(params: dict) -> None:
    import tensorflow as tf
    tf.random.set_seed(params["seed"])
    np.random.seed(params["seed"])
    splits = ("train",) if "speed" in params else ("train", "valid", "test")
    data = {s: dict(np.load(params[s])) for s in splits}
    model, inputs, ignored = build(params, data["train"])
    if "speed" in params:
        print(json.dumps({**speed(params, data["train"], model, inputs),
                          "tensorflow": tf.__version__}), flush=True)
        return
    x_train, y_train = inputs(data["train"]), data["train"]["labels"]
    for epoch in range(1, params["epochs"] + 1):
        t0 = time.perf_counter()
        model.fit(x_train, y_train, batch_size=params["batch_size"], epochs=1, verbose=0,
                  shuffle=True)
        seconds = time.perf_counter() - t0
        out = {"epoch": epoch, "seconds": seconds, "examples_per_s": len(y_train) / seconds,
               "sparse_values_not_one": ignored}
        for split in ("valid", "test"):
            p = model.predict(inputs(data[split]), batch_size=8192, verbose=0)[:, 0]
            y = data[split]["labels"]
            out[split] = {"auc": auc(y, p), "logloss": logloss(y, p)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
