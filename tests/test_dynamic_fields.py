"""`ctrtrain train --dynamic-fields`: hashed categorical fields read as raw values, each
claiming a row of the field's buckets for itself (issue 57), on a stream of days whose ids are
born and retired every day (`data synth --days`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import cli, ctrtrain_here, run_cli

BUCKETS = 48      # per field: fewer than the large fields' live ids, so rows are given back
SMALL = ("--batch-size", 256, "--embedding-size", 4, "--deep-layers", "32,16")
DYNAMIC = ("--dynamic-fields", "all", "--dynamic-ttl", 40, *SMALL)


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    out = tmp_path_factory.mktemp("stream") / "days"
    ctrtrain_here("data", "synth", "--days", 2, "--rows", 6_000, "--ids", 2_000,
                  "--categorical-fields", 8, "--hash-buckets", BUCKETS, "--out", out)
    return out / "day-000", out / "day-001"


def checkpoint(md, step):
    import tensorflow as tf
    r = tf.train.load_checkpoint(str(md / "checkpoints" / f"ckpt-{step}"))
    return {k: r.get_tensor(k) for k in r.get_variable_to_shape_map() if "OBJECT_GRAPH" not in k}


MAP = "model/dynamic/"


def held_keys(ck) -> dict:
    """{key: slot} of the map as checkpointed."""
    keys = ck[MAP + "slots/.ATTRIBUTES/table-keys"]
    slots = ck[MAP + "slots/.ATTRIBUTES/table-values"]
    return dict(zip(keys.tolist(), slots.tolist()))


def test_a_dynamic_table_trains_within_its_buckets_and_serves_raw_values(stream, tmp_path):
    """In mode mirrored (two replicas of one process, one map assigned once a step for both;
    the resume test below trains one replica): a process of its own, whose CPU TensorFlow
    splits into two devices before it starts."""
    day0, day1 = stream
    md = tmp_path / "d0"
    run_cli("train", "--train", day0, "--test", day1, "--model-dir", md, "--epochs", 2,
            "--mode", "mirrored", "--devices", 2, *DYNAMIC)
    r = json.loads((md / "result.json").read_text())
    assert r["replicas"] == 2 and r["test"]["auc"] > 0.62, r
    ck = checkpoint(md, r["step"])
    seen, key = ck[MAP + "seen/.ATTRIBUTES/VARIABLE_VALUE"], ck[MAP + "key/.ATTRIBUTES/VARIABLE_VALUE"]
    # Memory is the buckets': 8 fields x 48 slots, one of each shared (and one more, where
    # unknown keys are counted); every held slot's key is in the map at that slot, and
    # nothing else is.
    assert seen.shape == (8 * BUCKETS + 1,)
    held = np.flatnonzero(seen[:-1] >= 0)
    assert 0 < len(held) <= 8 * (BUCKETS - 1)
    assert r["dynamic_rows"] == {"pool": 8 * BUCKETS, "held": len(held)}
    assert held_keys(ck) == {int(key[s]): int(s) for s in held}
    # More values were seen than the buckets hold: rows were given back and claimed again.
    stream_info = json.loads((day0.parent / "stream.json").read_text())
    assert stream_info["days"][0]["live_ids"] > 8 * BUCKETS
    # The export maps raw values as training did: predict's AUC is the run's test AUC.
    out = ctrtrain_here("predict", "--model", md / "export", "--input", day1,
                        "--out", tmp_path / "p.csv")
    assert f"AUC {r['test']['auc']:.4f}" in out, (out, r["test"])
    info = json.loads(next((md / "export").glob("*/assets.extra/ctrtrain.json")).read_text())
    assert info["dynamic_fields"] == [f"C{j}" for j in range(1, 9)]


def test_a_dynamic_model_serves_raw_rows(tmp_path):
    """Raw Criteo rows featurized with hash buckets (featurize keeps the raw values), every
    field dynamic: `predict` on the raw rows, through the export's own transform, scores
    what the run's test split scored."""
    from pathlib import Path
    lines = (Path(__file__).parent / "data" / "criteo_head1000" / "train.txt").read_text() \
        .splitlines(keepends=True)
    (tmp_path / "a.txt").write_text("".join(lines[:700]))
    (tmp_path / "b.txt").write_text("".join(lines[700:]))
    ctrtrain_here("data", "featurize", tmp_path / "a.txt", "--out", tmp_path / "a",
                  "--hash-buckets", 64, "--declared")
    ctrtrain_here("data", "featurize", tmp_path / "b.txt", "--out", tmp_path / "b",
                  "--vocab", tmp_path / "a" / "vocab.json")
    md = tmp_path / "m"
    out = ctrtrain_here("train", "--train", tmp_path / "a", "--test", tmp_path / "b",
                        "--model-dir", md, "--steps", 20, "--dynamic-fields", "all", *SMALL)
    r = json.loads((md / "result.json").read_text())
    assert r["dynamic_rows"]["held"] > 64, r["dynamic_rows"]      # more than a field's buckets
    pred = ctrtrain_here("predict", "--model", md / "export", "--input", tmp_path / "b.txt",
                         "--out", tmp_path / "p.csv")
    assert f"AUC {r['test']['auc']:.4f}" in pred and "rows: 300" in pred, (pred, out)


def test_a_dynamic_run_resumes_exactly_and_warm_starts_the_next_day(stream, tmp_path):
    day0, day1 = stream
    common = ("--train", day0, "--checkpoint-every", 3, "--no-export", *DYNAMIC)
    ctrtrain_here("train", "--model-dir", tmp_path / "whole", "--steps", 9, *common)
    ctrtrain_here("train", "--model-dir", tmp_path / "cut", "--steps", 3, *common)
    ctrtrain_here("train", "--model-dir", tmp_path / "cut", "--steps", 9, *common)
    # The run's config.yaml names the fields (not `all`) and re-runs as it is.
    written = (tmp_path / "whole" / "config.yaml").read_text()
    assert "dynamic_fields:\n  - C1\n" in written, written
    ctrtrain_here("train", "--config", tmp_path / "whole" / "config.yaml", "--model-dir",
                  tmp_path / "again", "--steps", 2, "--no-export")
    whole, cut = checkpoint(tmp_path / "whole", 9), checkpoint(tmp_path / "cut", 9)
    assert held_keys(whole) == held_keys(cut) and len(held_keys(whole)) > 100
    for k in whole:
        if "/slots/.ATTRIBUTES/table-" not in k:
            np.testing.assert_array_equal(whole[k], cut[k], err_msg=k)
    # The next day starts from the map and its rows: a key of day 0 keeps its row.
    out = ctrtrain_here("train", "--train", day1, "--model-dir", tmp_path / "d1", "--steps", 1,
                        "--warm-start", tmp_path / "whole", "--no-export", *DYNAMIC)
    assert "warm start from" in out
    after = held_keys(checkpoint(tmp_path / "d1", 1))
    kept = set(held_keys(whole)) & set(after)
    assert len(kept) > 100 and all(after[k] == held_keys(whole)[k] for k in kept)


def test_dynamic_fields_are_refused_where_they_cannot_hold(stream, tmp_path):
    day0, _ = stream
    code, _, err = cli("train", "--train", day0, "--model-dir", tmp_path / "a", "--steps", 2,
                       "--dynamic-fields", "C1,C99", *SMALL)
    assert code == 2 and "dynamic_fields: C99 is not a declared field" in err, err
    # A model trained with fixed buckets does not warm-start a dynamic one, nor the reverse.
    ctrtrain_here("train", "--train", day0, "--model-dir", tmp_path / "fixed", "--steps", 2,
                  "--no-export", *SMALL)
    code, _, err = cli("train", "--train", day0, "--model-dir", tmp_path / "c", "--steps", 2,
                       "--warm-start", tmp_path / "fixed", *DYNAMIC)
    assert code == 2 and "its model has dynamic_fields=None, this run ['C1', 'C2'" in err, err
    ctrtrain_here("train", "--train", day0, "--model-dir", tmp_path / "dynamic", "--steps", 2,
                  "--no-export", *DYNAMIC)
    code, _, err = cli("train", "--train", day0, "--model-dir", tmp_path / "d", "--steps", 2,
                       "--warm-start", tmp_path / "dynamic", *SMALL)
    assert code == 2 and "its model has dynamic_fields=['C1', 'C2'" in err, err


def distinct_values(day, shard=None) -> int:
    """Distinct (field, value) pairs in a day's records (every `shard` = (index, count)-th
    record only)."""
    import tensorflow as tf
    files = sorted(str(f) for f in day.glob("*.tfrecord"))
    spec = {f"C{j}": tf.io.FixedLenFeature([1], tf.string) for j in range(1, 9)}
    # One parse of every record (record by record in eager mode cost 20 CPU-s a day).
    batch = next(iter(tf.data.TFRecordDataset(files).batch(1 << 20).map(
        lambda r: tf.io.parse_example(r, spec))))
    n = len(batch["C1"])
    keep = np.arange(n) % shard[1] == shard[0] if shard else np.ones(n, bool)
    return sum(len(set(v.numpy()[keep, 0].tolist())) for v in batch.values())


@pytest.mark.slow
@pytest.mark.parametrize("example", ["deepfm-allreduce",
                                     pytest.param("horovod", marks=pytest.mark.tf215_only)])
def test_an_allreduce_job_keeps_one_map_of_every_ranks_values(tmp_path, example):
    """Two hosts, one rank each (MultiWorkerMirroredStrategy, or Horovod's ranks on TF
    2.15): every rank assigns the whole step's keys (all-gathered) in one order, so the map
    -- and the rows new values claim in each rank's copy of the table -- is the same
    everywhere. The chief's map holds the values both ranks read, not only its own half's."""
    import sys

    from test_distributed import hvd_python, launch
    python = hvd_python() if example == "horovod" else sys.executable
    out = tmp_path / "days"
    ctrtrain_here("data", "synth", "--days", 2, "--rows", 6_000, "--ids", 2_000,
                  "--categorical-fields", 8, "--out", out)      # buckets: twice the ids
    day0, day1 = out / "day-000", out / "day-001"
    r, job, log = launch(tmp_path, example, out, python=python, hyperparameters={
        "epochs": 1, "batch_size": 256, "dynamic_fields": "all"}, channels={
        "training": {"path": str(day0)}, "test": {"path": str(day1)}})
    assert r["replicas"] == 2 and r["mode"] == example.removeprefix("deepfm-"), r
    assert r["test"]["auc"] > 0.62, r["test"]
    every = distinct_values(day0)
    one_rank = max(distinct_values(day0, (0, 2)), distinct_values(day0, (1, 2)))
    # Batches dropped at the end cost a few rare values; one rank's half would hold far fewer.
    assert one_rank + 0.7 * (every - one_rank) < r["dynamic_rows"]["held"] <= every, \
        (r["dynamic_rows"], every, one_rank)


@pytest.mark.slow
def test_parameter_servers_partition_the_map_by_key(tmp_path):
    """Two workers and two servers: each server holds the keys k with k mod 2 = its index,
    in its part of every pool, updated by both workers' concurrent steps one at a time (a
    CriticalSection a server); the chief evaluates and exports through both parts."""
    from test_distributed import launch
    out = tmp_path / "days"
    ctrtrain_here("data", "synth", "--days", 2, "--rows", 6_000, "--ids", 2_000,
                  "--categorical-fields", 8, "--out", out)
    day0, day1 = out / "day-000", out / "day-001"
    r, job, log = launch(tmp_path, "deepfm-parameter-server", out, hyperparameters={
        "epochs": 2, "batch_size": 256, "dynamic_fields": "all"}, channels={
        "training": {"path": str(day0)}, "test": {"path": str(day1)}})
    assert (r["mode"], r["parameter_servers"], r["workers"]) == ("parameter_server", 2, 2), r
    assert r["test"]["auc"] > 0.62, r["test"]
    ck = checkpoint(tmp_path / "run" / "checkpoints", r["step"])
    held = 0
    for s in (0, 1):
        keys = ck[MAP + f"shards/{s}/slots/.ATTRIBUTES/table-keys"]
        slots = ck[MAP + f"shards/{s}/slots/.ATTRIBUTES/table-values"]
        key = ck[MAP + f"shards/{s}/key/.ATTRIBUTES/VARIABLE_VALUE"]
        seen = ck[MAP + f"shards/{s}/seen/.ATTRIBUTES/VARIABLE_VALUE"]
        assert len(keys) > 100 and np.all(keys % 2 == s), (s, keys[:10])
        # One slot a key: the concurrent steps never gave two keys one slot.
        assert len(set(slots.tolist())) == len(slots)
        np.testing.assert_array_equal(key[slots], keys)
        assert np.all(seen[slots] >= 0)
        held += len(keys)
    every = distinct_values(day0)
    assert 0.9 * every < r["dynamic_rows"]["held"] == held <= every, (r["dynamic_rows"], every)
    # The export serves raw values: predict's AUC is the run's test AUC.
    pred = ctrtrain_here("predict", "--model", tmp_path / "run" / "model" / "export",
                         "--input", day1, "--out", tmp_path / "p.csv")
    assert f"AUC {r['test']['auc']:.4f}" in pred, (pred, r["test"])


def test_bench_dynamic_scale_holds_more_ids_than_rows_in_its_pools(tmp_path):
    """The scale simulation, small: more ids are drawn than the pools have rows, the rows
    held never exceed the pools, and the report says so."""
    out = ctrtrain_here("bench", "dynamic-scale", "--ids", 60_000, "--fields", 2, "--pool",
                        2_000, "--steps", 60, "--batch-size", 512, "--json", tmp_path / "s.json")
    r = json.loads((tmp_path / "s.json").read_text())
    assert r["ids_drawn"] > 2 * 2_000 and "ids drawn over 60 steps" in out
    assert all(0 < w["held_rows"] <= 2 * 2_000 for w in r["windows"]), r["windows"]
    assert r["windows"][-1]["ids_drawn"] == r["ids_drawn"] and r["peak_resident_bytes"] > 0
    assert (tmp_path / "s.png").exists()
