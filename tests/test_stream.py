"""`ctrtrain data synth --days D`: a stream of days whose ids are born, retired and drift,
with each day's Bayes-optimal AUC known (data/stream.py)."""

from __future__ import annotations

import json

import numpy as np
from conftest import cli, ctrtrain_here

from ctrtrain.data.stream import HiddenStream, StreamConfig


def test_ids_are_born_retired_for_good_and_drift():
    cfg = StreamConfig(days=5, rows=5_000, ids=5_000, categorical_fields=6, birth=0.1,
                       death=0.05, drift=0.3)
    stream = HiddenStream(cfg)
    churning = [f for f in stream.fields if f.churns]
    assert churning and len(churning) < len(stream.fields)   # Criteo's small fields keep theirs
    retired_before = [np.zeros(0, int) for _ in stream.fields]
    w0 = [f.w[:f.born].copy() for f in stream.fields]
    live = cfg.ids
    for d in range(cfg.days):
        ids, labels, p, record = stream.day(d)
        assert record["live_ids"] == live + record["born"] - record["retired"]
        live = record["live_ids"]
        if d:
            # A churning field of n live ids births round(0.1 n) and retires round(0.05 n).
            assert record["born"] > record["retired"] > 0
        for j, f in enumerate(stream.fields):
            assert f.alive[ids[:, j]].all()                        # only live ids appear
            assert not np.isin(ids[:, j], retired_before[j]).any()  # a retired id, never again
            retired_before[j] = np.flatnonzero(~f.alive)
        assert 0.15 < labels.mean() < 0.4 and 0.7 < record["bayes_auc"] < 0.95, record
    assert record["ids_ever"] > cfg.ids
    assert all(len(retired_before[stream.fields.index(f)]) for f in churning)
    # What an id means drifts: after 4 days at 0.3 a day, its weight keeps 0.7^2 of its
    # variance: a correlation of about 0.49 with day 0's, not 1 and not 0.
    f = max(stream.fields, key=lambda f: f.born)
    kept = np.flatnonzero(f.alive[:len(w0[stream.fields.index(f)])])
    r = np.corrcoef(w0[stream.fields.index(f)][kept], f.w[kept])[0, 1]
    assert 0.35 < r < 0.63, r


def test_the_same_seed_writes_the_same_stream_and_a_model_trains_on_it(tmp_path):
    args = ("data", "synth", "--days", 3, "--rows", 8_000, "--ids", 6_000,
            "--categorical-fields", 8, "--seed", 3)
    out = ctrtrain_here(*args, "--out", tmp_path / "a")
    ctrtrain_here(*args, "--out", tmp_path / "b")
    assert "day-002 rows     8,000" in out and "Bayes-optimal AUC" in out, out
    info = json.loads((tmp_path / "a" / "stream.json").read_text())
    assert [d["day"] for d in info["days"]] == [0, 1, 2]
    for d in range(3):
        ma, mb = (json.loads((tmp_path / s / f"day-{d:03d}" / "manifest.json").read_text())
                  for s in "ab")
        assert ma["files"] == mb["files"] and ma["files"][0]["records"] == 8_000
        assert all(f["hash_buckets"] > 0 for f in ma["fields"])     # hashed at training time
        assert ma["feature_size"] == info["feature_size"] == sum(info["hash_buckets"])
    # Trained on day 0, judged on day 1: a model learns the stream, below its Bayes bound.
    ctrtrain_here("train", "--train", tmp_path / "a" / "day-000", "--test",
                  tmp_path / "a" / "day-001", "--model-dir", tmp_path / "m", "--epochs", 2,
                  "--batch-size", 256)
    auc = json.loads((tmp_path / "m" / "result.json").read_text())["test"]["auc"]
    assert 0.6 < auc < info["days"][1]["bayes_auc"], auc


def test_a_stream_refuses_what_it_does_not_write(tmp_path):
    code, _, err = cli("data", "synth", "--out", tmp_path / "s", "--days", 2,
                       "--sequence-fields", 1)
    assert code == 2 and "--sequence-fields: not in a stream of days" in err, err
    code, _, err = cli("data", "synth", "--out", tmp_path / "s", "--days", 2, "--birth", 1.5)
    assert code == 2 and "--birth" in err, err
    assert not (tmp_path / "s").exists()
