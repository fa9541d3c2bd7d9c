"""`ctrtrain evaluate` (docs/evaluate.md): gAUC and ECE against hand-computed examples; on a
small CSV featurized and trained as a user would, AUC and logloss equal scikit-learn's on the
probabilities `predict` writes, from TFRecord and from the raw CSV; gAUC, ECE and the unknown
shares against a brute-force count; the JSON and the PNG; the refusals; and predict's
headline on labeled input."""

import json

import numpy as np
import pytest

from conftest import cli, ctrtrain_here
from ctrtrain.metrics import calibration_bins, expected_calibration_error, group_auc


def sklearn():
    """scikit-learn's metrics, the reference (requirements/main.txt; imported here, not at the
    top: the TF 2.15 environment, which collects this file, has no scikit-learn)."""
    from sklearn import metrics
    return metrics


def test_group_auc_by_hand():
    # Group a: labels 1 0 0, scores .9 .4 .6: the positive outranks both negatives, AUC 1.
    # Group b: labels 1 1 0 0, scores .2 .7 .5 .7: pairs (pos, neg) .2<.5 0, .2<.7 0, .7>.5 1,
    #   .7=.7 1/2, so AUC 1.5/4 = 0.375.
    # Group c: two negatives, group d: one positive: no AUC, skipped.
    # gAUC = (3 * 1 + 4 * 0.375) / (3 + 4) = 4.5 / 7.
    groups = ["a", "a", "a", "b", "b", "b", "b", "c", "c", "d"]
    labels = [1, 0, 0, 1, 1, 0, 0, 0, 0, 1]
    scores = [.9, .4, .6, .2, .7, .5, .7, .1, .3, .8]
    r = group_auc(labels, scores, groups)
    assert r["gauc"] == pytest.approx(4.5 / 7, abs=1e-15)
    assert r == {"gauc": r["gauc"], "groups": 4, "groups_counted": 2, "rows_counted": 7,
                 "skipped_all_negative": 1, "skipped_all_positive": 1}
    # The order of the rows and the kind of group key do not matter.
    perm = np.random.default_rng(0).permutation(len(groups))
    codes = {"a": 7, "b": -1, "c": 3, "d": 0}
    again = group_auc(np.array(labels)[perm], np.array(scores)[perm],
                      np.array([codes[g] for g in groups])[perm])
    assert again == r
    # No group of both classes: no gAUC.
    assert np.isnan(group_auc([1, 0], [.5, .5], ["x", "y"])["gauc"])


def test_group_auc_against_sklearn_per_group():
    sklearn_metrics = sklearn()
    rng = np.random.default_rng(3)
    g, y = rng.integers(0, 9, 400), rng.integers(0, 2, 400)
    s = np.round(rng.random(400), 1)    # ties
    num = den = 0.0
    for u in np.unique(g):
        m = g == u
        if 0 < y[m].sum() < m.sum():
            num += m.sum() * sklearn_metrics.roc_auc_score(y[m], s[m])
            den += m.sum()
    assert group_auc(y, s, g)["gauc"] == pytest.approx(num / den, abs=1e-12)


def test_expected_calibration_error_by_hand():
    # 4 bins of width 0.25:
    #   [0, .25):  .1 .2       labels 0 1   mean .15, rate .5   gap .35, weight 2/8
    #   [.25, .5): .3          label 0      mean .3,  rate 0    gap .3,  weight 1/8
    #   [.5, .75): .6 .7       labels 1 1   mean .65, rate 1    gap .35, weight 2/8
    #   [.75, 1]:  .75 1 .95   labels 0 1 1 mean .9,  rate 2/3  gap 7/30, weight 3/8 (1 in the last)
    # ECE = (2 * .35 + .3 + 2 * .35 + 3 * 7/30) / 8 = 2.4 / 8 = 0.3.
    probs = [.1, .2, .3, .6, .7, .75, 1.0, .95]
    labels = [0, 1, 0, 1, 1, 0, 1, 1]
    assert expected_calibration_error(labels, probs, bins=4) == pytest.approx(0.3, abs=1e-12)
    c = calibration_bins(labels, probs, bins=4)
    assert c["count"].tolist() == [2, 1, 2, 3]
    np.testing.assert_allclose(c["mean_prediction"], [.15, .3, .65, .9])
    np.testing.assert_allclose(c["positive_rate"], [.5, 0, 1, 2 / 3])
    # 10 bins by default; empty bins add nothing. One bin, mean .5, half positive: 0.
    # .05 (label 0) and .95 (label 1) in bins 0 and 9: each gap .05, weight 1/2: 0.05.
    assert expected_calibration_error([0, 1, 1, 0], [.5, .5, .5, .5]) == 0.0
    assert expected_calibration_error([0, 1], [.05, .95]) == pytest.approx(0.05, abs=1e-12)
    assert calibration_bins([0], [.5])["count"].size == 10


def _write_csv(path, rows, users, categories, seed):
    """label, user_id, category, price: clicks depend on the user, the category and the price."""
    rng = np.random.default_rng(seed)
    u, c = rng.integers(0, users, rows), rng.integers(0, categories, rows)
    price = np.round(rng.lognormal(2, 1, rows), 2)
    logit = np.sin(u * 1.7) * 1.5 + np.cos(c * 2.3) - 0.3 * np.log(price) - 0.2
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    with open(path, "w") as f:
        f.write("label,user_id,category,price\n")
        for i in range(rows):
            f.write(f"{label[i]},u{u[i]},c{c[i]},{price[i]}\n")
    return u, c, label


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small CSV featurized with declared fields (TFRecord) and a model trained on it (5
    epochs, 45 steps: predictions spread over most calibration bins). The test CSV holds 10
    users and 1 category the training rows lack (unknown values)."""
    d = tmp_path_factory.mktemp("evaluate")
    _write_csv(d / "train.csv", 2400, 60, 8, seed=1)
    u, c, label = _write_csv(d / "test.csv", 800, 70, 9, seed=2)
    ctrtrain_here("data", "featurize", d / "train.csv", "--out", d / "feat" / "train",
                  "--numeric", "price", "--declared", "--min-count", 1)
    ctrtrain_here("data", "featurize", d / "test.csv", "--out", d / "feat" / "test",
                  "--vocab", d / "feat" / "train" / "vocab.json")
    ctrtrain_here("train", "--train", d / "feat" / "train", "--model-dir", d / "m",
                  "--epochs", 5, "--batch-size", 256, "--quiet")    # 45 steps, a few seconds
    return {"dir": d, "model": d / "m" / "export", "users": u, "categories": c, "labels": label}


def _predictions(path):
    rows = np.loadtxt(path, delimiter=",", skiprows=1)
    return rows[:, 1], rows[:, 2]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["tfrecord", "raw"])
def test_evaluate_equals_sklearn_on_predicts_probabilities(trained, source):
    sklearn_metrics = sklearn()
    d = trained["dir"]
    data = d / "feat" / "test" if source == "tfrecord" else d / "test.csv"
    out = d / source
    out.mkdir()
    code, printed, err = cli("evaluate", "--model", trained["model"], "--input", data,
                             "--group", "user_id", "--json", out / "report.json")
    assert code == 0, err
    r = json.loads((out / "report.json").read_text())
    ctrtrain_here("predict", "--model", trained["model"], "--input", data, "--out",
                  out / "pred.csv")
    probs, labels = _predictions(out / "pred.csv")
    np.testing.assert_array_equal(labels, trained["labels"])
    assert r["rows"] == 800 and r["positives"] == int(labels.sum())
    assert abs(r["auc"] - sklearn_metrics.roc_auc_score(labels, probs)) < 1e-9
    assert abs(r["logloss"] - sklearn_metrics.log_loss(labels, probs)) < 1e-9
    assert r["positive_rate"] == pytest.approx(labels.mean(), abs=1e-12)
    assert r["mean_prediction"] == pytest.approx(probs.mean(), abs=1e-7)

    # gAUC by brute force: each group's sklearn AUC weighted by its rows. From the raw CSV
    # the groups are the user_id values; from the TFRecords the field's ids, where the 10
    # users the vocabulary lacks share the unknown id (one group).
    users = trained["users"]
    key = np.where(users < 60, users, -1) if source == "tfrecord" else users
    num = den = 0.0
    groups = counted = 0
    for g in np.unique(key):
        m = key == g
        groups += 1
        if 0 < labels[m].sum() < m.sum():
            num += m.sum() * sklearn_metrics.roc_auc_score(labels[m], probs[m])
            den += m.sum()
            counted += 1
    g = r["gauc"]
    assert g["group"] == "user_id" and g["groups"] == groups == (61 if source == "tfrecord" else 70)
    assert g["groups_counted"] == counted and g["rows_counted"] == den
    assert abs(g["gauc"] - num / den) < 1e-9
    assert g["source"] == ("categorical field id" if source == "tfrecord" else "raw column")

    # ECE by brute force over 10 equal-width bins.
    cal = r["calibration"]
    b = np.minimum((probs * 10).astype(int), 9)
    ece = sum((b == k).sum() / 800 * abs(probs[b == k].mean() - labels[b == k].mean())
              for k in range(10) if (b == k).any())
    assert cal["bins"] == 10 and abs(cal["ece"] - ece) < 1e-6
    assert [t["count"] for t in cal["table"]] == np.bincount(b, minlength=10).tolist()
    assert np.count_nonzero(np.bincount(b, minlength=10)) >= 5, "a test of a few bins only"
    assert cal["mean_prediction"] == r["mean_prediction"]
    assert cal["positive_rate"] == r["positive_rate"]
    assert cal["ratio"] == pytest.approx(r["mean_prediction"] / r["positive_rate"])

    # Unknown values: rows of the users and the category the training rows lack.
    shares = r["unknown_share"]
    assert set(shares) == {"user_id", "category"}
    assert shares["user_id"]["rows"] == int((users >= 60).sum()) > 0
    assert shares["category"]["rows"] == int((trained["categories"] >= 8).sum()) > 0
    assert shares["user_id"]["share"] == pytest.approx((users >= 60).mean())
    assert r["unknown_share_note"]

    # The plot beside the JSON, a PNG; the table names the figures.
    assert r["plot"] == str(out / "report.png")
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for word in ("AUC", "logloss", "gAUC (user_id)", "ECE (10 bins)", "positive rate",
                 "mean prediction", "user_id", "category", "800 rows"):
        assert word in printed, (word, printed)
    assert f"{r['auc']:.4f}" in printed
    # Predict prints the headline on labeled input.
    code, printed, _ = cli("predict", "--model", trained["model"], "--input", data, "--out",
                           out / "again.csv")
    assert code == 0 and f"AUC {r['auc']:.4f}  logloss {r['logloss']:.4f}" in printed
    assert "labeled rows: 800" in printed


@pytest.mark.slow
def test_tfrecord_and_raw_rows_give_the_same_figures(trained, tmp_path):
    """The raw CSV read through the model's vocabulary is the featurized split: the same
    AUC, logloss and calibration; --plot elsewhere, --bins, and no JSON without --json."""
    d = trained["dir"]
    code, a, err = cli("evaluate", "--model", trained["model"], "--input", d / "feat" / "test",
                       "--bins", 5, "--json", tmp_path / "a.json", "--plot", tmp_path / "a-plot.png")
    assert code == 0, err
    code, b, err = cli("evaluate", "--model", trained["model"], "--input", d / "test.csv",
                       "--bins", 5, "--batch-size", 100)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-plot.png", "a.json"]
    r = json.loads((tmp_path / "a.json").read_text())
    assert r["gauc"] is None and r["calibration"]["bins"] == 5
    assert len(r["calibration"]["table"]) == 5 and r["plot"] == str(tmp_path / "a-plot.png")
    # The tables agree line by line but for the input's name.
    assert a.splitlines()[1:8] == b.splitlines()[1:8]


@pytest.mark.slow
def test_refusals_name_the_file_or_column_and_write_nothing(trained, tmp_path):
    d = trained["dir"]
    model = trained["model"]
    # Raw rows without a label column.
    lines = (d / "test.csv").read_text().splitlines()
    (tmp_path / "nolabel.csv").write_text("\n".join(",".join(l.split(",")[1:]) for l in lines) + "\n")
    code, _, err = cli("evaluate", "--model", model, "--input", tmp_path / "nolabel.csv",
                       "--json", tmp_path / "r.json")
    assert code == 2 and "nolabel.csv" in err and "no label column" in err \
        and "evaluate needs labeled rows" in err, err
    # Featurized without labels: the manifest says so.
    ctrtrain_here("data", "featurize", tmp_path / "nolabel.csv", "--out", tmp_path / "unlab",
                  "--vocab", d / "feat" / "train" / "vocab.json", "--no-label")
    code, _, err = cli("evaluate", "--model", model, "--input", tmp_path / "unlab",
                       "--json", tmp_path / "r.json")
    assert code == 2 and str(tmp_path / "unlab") in err and "unlabeled" in err, err
    # A --group the raw CSV has no column of: named, with the columns there are.
    code, _, err = cli("evaluate", "--model", model, "--input", d / "test.csv", "--group",
                       "session", "--json", tmp_path / "r.json")
    assert code == 2 and "'session'" in err and "label, user_id, category, price" in err, err
    # ... nor a categorical field: named, with the categorical fields.
    code, _, err = cli("evaluate", "--model", model, "--input", d / "feat" / "test",
                       "--group", "price", "--json", tmp_path / "r.json")
    assert code == 2 and "'price'" in err and "numeric field" in err \
        and "user_id, category" in err, err
    # libsvm rows have no names to group by.
    (tmp_path / "rows.libsvm").write_text("1 1:1 2:1 3:1\n0 1:1 2:1 3:1\n")
    code, _, err = cli("evaluate", "--model", model, "--input", tmp_path / "rows.libsvm",
                       "--group", "user_id")
    assert code == 2 and "no column names" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nolabel.csv", "rows.libsvm", "unlab"]
    # Predict on unlabeled rows prints no headline.
    code, printed, err = cli("predict", "--model", model, "--input", tmp_path / "nolabel.csv",
                             "--out", tmp_path / "p.csv", "--no-label")
    assert code == 0 and "AUC" not in printed, err
    code, printed, err = cli("predict", "--model", model, "--input", tmp_path / "unlab",
                             "--out", tmp_path / "q.csv")
    assert code == 0 and "AUC" not in printed, err


@pytest.mark.slow
def test_a_model_without_vocabulary_on_libsvm(tmp_path):
    """Synthesized libsvm rows (no vocabulary, no column names): AUC and logloss are still
    scikit-learn's on predict's probabilities; unknown values are not counted, and why is said;
    --group is refused."""
    sklearn_metrics = sklearn()
    ctrtrain_here("data", "synth", "--out", tmp_path / "d", "--rows", 3000, "--feature-size", 500)
    ctrtrain_here("train", "--train", tmp_path / "d" / "train", "--model-dir", tmp_path / "m",
                  "--epochs", 1, "--batch-size", 256, "--quiet")
    files = sorted((tmp_path / "d" / "test").glob("*.libsvm"))
    model = tmp_path / "m" / "export"
    ctrtrain_here("evaluate", "--model", model, "--input", *files, "--json", tmp_path / "r.json")
    ctrtrain_here("predict", "--model", model, "--input", *files, "--out", tmp_path / "p.csv")
    r = json.loads((tmp_path / "r.json").read_text())
    probs, labels = _predictions(tmp_path / "p.csv")
    assert r["input_format"] == "libsvm" and r["rows"] == len(labels) == 300
    assert abs(r["auc"] - sklearn_metrics.roc_auc_score(labels, probs)) < 1e-9
    assert abs(r["logloss"] - sklearn_metrics.log_loss(labels, probs)) < 1e-9
    assert r["unknown_share"] is None and "no featurization vocabulary" in r["unknown_share_note"]
    assert (tmp_path / "r.png").exists()
    code, _, err = cli("evaluate", "--model", model, "--input", *files, "--group", "C1")
    assert code == 2 and "libsvm rows have no column names" in err and str(files[0]) in err, err
