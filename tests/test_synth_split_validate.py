
import dataclasses
import json
import re

import pytest

from conftest import cli, run_cli
from ctrtrain.data.files import list_inputs
from ctrtrain.data.libsvm import Rows, parse_libsvm
from ctrtrain.data.manifest import read_manifest
from ctrtrain.data.split import split_text
from ctrtrain.data.synth import HiddenModel, SynthConfig, synthesize
from ctrtrain.data.validate import validate
from ctrtrain.errors import DataError
from ctrtrain.metrics import roc_auc


def test_synth_is_deterministic_and_reports_the_true_bayes_auc(tmp_path):
    cfg = SynthConfig(rows=6000, feature_size=5000, seed=3)
    a = synthesize(tmp_path / "a", cfg, processes=1)
    b = synthesize(tmp_path / "b", cfg, processes=2)
    for split in ("train", "valid", "test"):
        ma, mb = read_manifest(tmp_path / "a" / split), read_manifest(tmp_path / "b" / split)
        assert [f.sha256 for f in ma.files] == [f.sha256 for f in mb.files]
    assert a["splits"] == b["splits"]
    synthesize(tmp_path / "c", SynthConfig(rows=6000, feature_size=5000, seed=4), processes=1)
    assert read_manifest(tmp_path / "c" / "test").files[0].sha256 != \
        read_manifest(tmp_path / "a" / "test").files[0].sha256
    assert sum(a["cardinalities"]) + 13 == 5000 and a["field_size"] == 39
    # Recompute the test split's Bayes AUC from the rows on disk and the hidden model.
    m = read_manifest(tmp_path / "a" / "test")
    rows = Rows.concat([parse_libsvm(open(p, "rb").read(), 39, feature_size=5000)[0]
                        for p in m.paths(tmp_path / "a" / "test")], 39)
    p = HiddenModel(cfg).probability(rows.ids, rows.values)
    assert len(rows) == 600
    assert abs(roc_auc(rows.labels, p) - a["splits"]["test"]["bayes_auc"]) < 1e-12
    assert 0.65 < a["splits"]["test"]["bayes_auc"] < 0.95
    assert 0.15 < a["splits"]["train"]["positive_rate"] < 0.35


def test_synth_third_order_and_history_parts_are_what_they_say(tmp_path):
    """The third-order part is the sum over triples of categorical fields, the history part each history's
    summed relevance to the candidate (C1), both checked by brute force on sampled rows; each
    part's share of the logit has the configured std; the rest of the hidden model is the same
    without them."""
    import itertools

    import numpy as np

    from ctrtrain.data.synth import _anova3
    vx = np.random.default_rng(0).normal(size=(3, 6, 2))
    brute = [sum((vx[r, i] * vx[r, j] * vx[r, m]).sum()
                 for i, j, m in itertools.combinations(range(6), 3)) for r in range(3)]
    assert np.allclose(_anova3(vx), brute)

    cfg = SynthConfig(rows=100, feature_size=3000, numeric_fields=2, categorical_fields=4,
                      sequence_fields=1, sequence_len=3, cross3_std=0.5, attention_std=0.7)
    m = HiddenModel(cfg)
    ids, values, bags = m.sample_features(np.random.default_rng(1), 4000)
    lin, fm, cross3, attention = m._parts(ids, values, bags)
    rows = range(5)
    assert np.allclose(cross3[:5], [
        sum((m.t[ids[r, i]] * m.t[ids[r, j]] * m.t[ids[r, k]]).sum()
            for i, j, k in itertools.combinations(range(2, 6), 3)) for r in rows])
    lengths, history = bags[0]
    ends = np.cumsum(lengths)
    for r in rows:
        kept = history[ends[r] - lengths[r]:ends[r]][-3:]   # the last sequence_len ids
        relevance = [max(0.0, m.q[ids[r, 2]] @ m.q[h]) for h in kept]
        assert np.isclose(attention[r], sum(relevance))
    assert np.isclose(m.scales[2] * cross3.std(), 0.5, rtol=0.1)
    assert np.isclose(m.scales[3] * attention.std(), 0.7, rtol=0.1)
    plain = HiddenModel(dataclasses.replace(cfg, cross3_std=0.0, attention_std=0.0))
    assert plain.t is None and plain.q is None
    assert np.array_equal(plain.w, m.w) and np.array_equal(plain.v, m.v)
    # Refused by name through the CLI, exit status 2, before anything is written.
    out = tmp_path / "refused"
    r = run_cli("data", "synth", "--out", str(out), "--rows", "3000", "--feature-size", "3000",
                "--attention-std", "0.5", check=False)
    assert r.returncode == 2 and "attention_std" in r.stderr and "sequence_fields" in r.stderr
    assert not out.exists()


def test_synth_with_fewer_fields(tmp_path):
    """A small all-categorical layout (9 fields, a few thousand ids), through the CLI."""
    run_cli("data", "synth", "--out", tmp_path / "s", "--rows", "3000", "--feature-size", "7000",
            "--numeric-fields", "0", "--categorical-fields", "9", "--processes", "1")
    info = json.loads((tmp_path / "s" / "synth.json").read_text())
    assert info["field_size"] == 9 and sum(info["cardinalities"]) == 7000
    m = read_manifest(tmp_path / "s" / "train")
    assert m.field_size == 9 and m.feature_size == 7000
    rows = Rows.concat([parse_libsvm(open(p, "rb").read(), 9, feature_size=7000)[0]
                        for p in m.paths(tmp_path / "s" / "train")], 9)
    assert (rows.values == 1).all() and max(len(set(rows.ids[:, j])) for j in range(9)) > 100
    assert 0.6 < info["splits"]["test"]["bayes_auc"] < 0.99
    r = run_cli("data", "synth", "--out", tmp_path / "bad", "--rows", "100",
                "--numeric-fields", "14", check=False)
    assert r.returncode == 2 and "numeric_fields" in r.stderr


def test_split_by_hash_and_order(tmp_path, shared):
    src = shared / "criteo_head1000" / "train.txt"
    s = split_text([str(src)], tmp_path / "h", by="hash", seed=1)
    assert sum(s["rows"].values()) == 1000 and 700 < s["rows"]["train"] < 900
    split_text([str(src)], tmp_path / "h2", by="hash", seed=1)
    assert (tmp_path / "h" / "test.txt").read_bytes() == (tmp_path / "h2" / "test.txt").read_bytes()
    o = split_text([str(src)], tmp_path / "o", by="order", fractions=(0.5, 0.25, 0.25))
    assert o["rows"] == {"train": 500, "valid": 250, "test": 250}
    assert (tmp_path / "o" / "train.txt").read_text().split("\n")[0] == src.read_text().split("\n")[0]
    csv = shared / "deepctr_samples" / "criteo_sample.txt"
    header = csv.read_text().split("\n")[0]
    # As a user runs it: no --header; a CSV table's header is found and copied to every split
    # (it used to become a data row of one split, and the others could not be featurized).
    run_cli("data", "split", csv, "--out", tmp_path / "c")
    c = json.loads((tmp_path / "c" / "split.json").read_text())
    for name in ("train", "valid", "test"):
        assert (tmp_path / "c" / f"{name}.txt").read_text().split("\n")[0] == header
        run_cli("data", "featurize", tmp_path / "c" / f"{name}.txt", "--out", tmp_path / f"f-{name}",
                *(["--vocab", tmp_path / "f-train" / "vocab.json"] if name != "train" else []))
    assert sum(c["rows"].values()) == 200 and c["header"] is True
    assert split_text([str(src)], tmp_path / "tsv")["header"] is False
    with pytest.raises(DataError):
        split_text([str(src)], tmp_path / "bad", fractions=(0.5, 0.6, 0.1))


@pytest.mark.parametrize("by", ["hash", "order"])
def test_split_of_a_gzipped_csv_is_the_split_of_its_text(tmp_path, shared, by):
    """`data split train.csv.gz` splits the rows, as featurize reads them (it split the
    compressed bytes, into `train.gz` files no reader could use): the same outputs as the
    plain file's, named `.csv` and written uncompressed, each with the header."""
    import gzip
    text = (shared / "deepctr_samples" / "criteo_sample.txt").read_bytes()
    (tmp_path / "train.csv").write_bytes(text)
    (tmp_path / "train.csv.gz").write_bytes(gzip.compress(text))
    for name in ("train.csv", "train.csv.gz"):
        code, out, err = cli("data", "split", tmp_path / name, "--out", tmp_path / f"s-{name}",
                             "--by", by)
        assert code == 0, err
    plain, packed = tmp_path / "s-train.csv", tmp_path / "s-train.csv.gz"
    assert sorted(p.name for p in packed.iterdir()) == \
        ["split.json", "test.csv", "train.csv", "valid.csv"]
    for name in ("train.csv", "valid.csv", "test.csv"):
        assert (packed / name).read_bytes() == (plain / name).read_bytes()
        assert (packed / name).read_bytes().startswith(text.split(b"\n")[0] + b"\n")
    summary = json.loads((packed / "split.json").read_text())
    assert summary["rows"] == json.loads((plain / "split.json").read_text())["rows"]
    assert sum(summary["rows"].values()) == 200 and summary["header"] is True


def test_validate_catches_tampering_and_range(tmp_path):
    synthesize(tmp_path / "s", SynthConfig(rows=2000, feature_size=3000), processes=1)
    run_cli("data", "convert", tmp_path / "s" / "train", "--out", tmp_path / "tf", "--shards", 2)
    assert validate(tmp_path / "tf")["records"] == 1600
    m = read_manifest(tmp_path / "tf")
    # ids outside a (wrongly) declared feature_size are reported with their record.
    m.feature_size = 100
    m.write(tmp_path / "tf")
    with pytest.raises(DataError) as e:
        validate(tmp_path / "tf")
    assert "record" in str(e.value) and "outside" in str(e.value)
    m.feature_size = 3000
    m.write(tmp_path / "tf")
    p = m.paths(tmp_path / "tf")[1]
    data = bytearray(open(p, "rb").read())
    data[100] ^= 0xFF
    open(p, "wb").write(bytes(data))
    r = run_cli("data", "validate", tmp_path / "tf", check=False)
    assert r.returncode == 2 and "sha256" in r.stderr and p in r.stderr
    # A shard copied in after indexing (F28): the manifest does not list it, no reader reads
    # it, and validate said nothing. Named now.
    import shutil
    shutil.copy(m.paths(tmp_path / "tf")[0], tmp_path / "tf" / "part-00002-of-00002.tfrecord")
    with pytest.raises(DataError) as e:
        validate(tmp_path / "tf")
    assert any("part-00002-of-00002.tfrecord: a data file the manifest does not list" in p
               for p in e.value.report["problems"]), e.value.report["problems"]


def test_missing_and_empty_inputs_are_named(tmp_path):
    with pytest.raises(DataError) as e:
        list_inputs([str(tmp_path / "nope")])
    assert "nope" in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as e:
        list_inputs([str(tmp_path / "empty")])
    assert "no data files" in str(e.value)
    r = run_cli("data", "validate", tmp_path / "empty", check=False)
    assert r.returncode == 2 and "manifest" in r.stderr


def test_cli_help_reads_well():
    r = run_cli("--help")
    for cmd in ("data", "bench", "quickstart"):
        assert cmd in r.stdout
    r = run_cli("data", "--help")
    for tool in ("synth", "featurize", "convert", "validate", "split", "inspect"):
        assert tool in r.stdout


def test_synth_on_a_table_too_small_for_criteos_fields_is_refused_by_name(tmp_path):
    """Criteo's small fields keep their size and each large one gets at least 2 ids: on a table
    of 100 ids for 13 numeric and 26 categorical fields one field was left with a negative
    count of ids (a numpy broadcast error); now a refusal naming the field and a size that
    works, exit status 2, nothing written."""
    out = tmp_path / "small"
    code, _, err = cli("data", "synth", "--out", out, "--rows", 200, "--feature-size", 100)
    assert code == 2 and "feature_size 100 is too small for 26 categorical fields" in err, err
    least = int(re.search(r"(\d+) is the next that works", err).group(1))
    assert not out.exists()
    assert cli("data", "synth", "--out", out, "--rows", 200, "--feature-size", least)[0] == 0
