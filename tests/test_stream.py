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


def test_day_directories_read_as_one_source(tmp_path, synth_data):
    """`--train day-000 day-001`: several data directories of the same kind as one source,
    their files by absolute path and their counts summed; directories of other kinds refused
    by name."""
    import pytest

    from ctrtrain.data.index import resolve_source
    from ctrtrain.data.manifest import read_manifest
    from ctrtrain.data.stream import synthesize_days
    from ctrtrain.errors import DataError
    synthesize_days(tmp_path / "s", StreamConfig(days=2, rows=1_000, ids=2_000))
    days = [str(tmp_path / "s" / f"day-00{d}") for d in (0, 1)]
    m, root = resolve_source(days)
    parts = [read_manifest(d) for d in days]
    assert m.records == 2_000 and m.positives == sum(p.positives for p in parts)
    assert m.paths(root) == [f"{d}/part-00000.tfrecord" for d in days]
    assert m.fields == parts[0].fields
    other = synth_data(rows=20_000, feature_size=2_000)[0] / "tf" / "train"
    with pytest.raises(DataError, match="differs from .* in field_size"):
        resolve_source([days[0], str(other)])


def test_bench_continual_trains_each_arm_and_tests_it_on_the_next_day(tmp_path):
    from ctrtrain.data.stream import synthesize_days
    synthesize_days(tmp_path / "s", StreamConfig(days=3, rows=3_000, ids=3_000))
    out = ctrtrain_here("bench", "continual", "--stream", tmp_path / "s", "--arms",
                        "warm,scratch", "--batch-size", 256, "--embedding-size", 8,
                        "--work-dir", tmp_path / "w",
                        "--json", tmp_path / "c.json")
    report = json.loads((tmp_path / "c.json").read_text())
    rows = {(r["day"], r["arm"]): r for r in report["rows"]}
    assert sorted(rows) == [(0, "scratch"), (0, "warm"), (1, "scratch"), (1, "warm")]
    assert rows[0, "warm"]["test_auc"] == rows[0, "scratch"]["test_auc"]   # one run
    assert rows[1, "scratch"]["train_rows"] == 6_000 and rows[1, "warm"]["train_rows"] == 3_000
    warm = json.loads((tmp_path / "w" / "runs" / "warm" / "day-001" / "result.json").read_text())
    assert warm["warm_start"]["from"] == str(tmp_path / "w" / "runs" / "warm" / "day-000")
    for r in report["rows"]:
        assert 0.55 < r["test_auc"] < r["bayes_auc"] and r["table_rows"] == 6_000, r
        assert r["table_bytes"] == 6_000 * (8 + 1) * 4 * 3, r    # the rows, Adam's m and v
    assert "| mean / total |" in out and (tmp_path / "c.png").stat().st_size > 0
