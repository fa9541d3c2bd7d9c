import numpy as np
import pytest

from conftest import cli, ctrtrain_here, run_cli
from ctrtrain.data.featurize import Vocabulary, build_vocabulary, featurize, featurize_file
from ctrtrain.data.libsvm import Rows
from ctrtrain.data.manifest import read_manifest
from ctrtrain.errors import DataError


def test_criteo_tsv_with_stripped_trailing_fields(shared, tmp_path):
    src = shared / "criteo_head1000" / "train.txt"
    raw_lines = src.read_text().split("\n")[:1000]
    short = [i for i, l in enumerate(raw_lines) if len(l.split("\t")) < 40]
    assert len(short) == 498  # the sample's real-world mess is there
    v = build_vocabulary([str(src)], min_count=2)
    rows = Rows.concat(list(featurize_file(str(src), v)), 39)
    assert len(rows) == 1000 and int(rows.labels.sum()) == 205
    assert rows.ids.min() >= 0 and rows.ids.max() < v.feature_size
    assert (rows.ids[:, :13] == np.arange(13)).all()
    # Stripped trailing fields are missing values: every such row's last categorical is the
    # same "missing" id as an explicitly empty one.
    last_field = rows.ids[short, 38]
    empty_id = v.bases()[-1] + v._index["C26"].get("", 0)
    assert (last_field == empty_id).all()
    # Each categorical field's ids stay inside its own block; index 0 of a block is OOV.
    bases = v.bases() + [v.feature_size]
    for j in range(26):
        assert ((rows.ids[:, 13 + j] >= bases[j]) & (rows.ids[:, 13 + j] < bases[j + 1])).all()


def test_a_criteo_file_cut_mid_row_is_warned_of(shared, tmp_path):
    """F26: a Criteo TSV whose copy stopped mid-row ends in a line with no line end and fewer
    than 40 cells, read as a row of missing values without a word. A warning names the line
    (not a refusal: the real sample ends so too, its last row's empty fields stripped); the
    same file with its last line ended says nothing. Once, though featurize reads the file
    twice (the vocabulary, then the rows)."""
    lines = (shared / "criteo_head1000" / "train.txt").read_text().split("\n")[:21]
    cut = tmp_path / "day.txt"
    cut.write_text("\n".join(lines[:20]) + "\n" + "\t".join(lines[20].split("\t")[:10]))
    code, _, err = cli("data", "featurize", cut, "--out", tmp_path / "f", "--format", "criteo")
    assert code == 0, err[-2000:]
    assert "day.txt, line 21: the last line has no line end and 10 of 40 cells" in err, err[-2000:]
    assert err.count("no line end") == 1, err[-2000:]
    cut.write_text(cut.read_text() + "\n")
    code, _, err = cli("data", "featurize", cut, "--out", tmp_path / "g", "--format", "criteo")
    assert code == 0 and "no line end" not in err, err[-2000:]


def _gzip(src, dst):
    """`gzip -c src > dst`, as a user compresses a raw file."""
    import gzip
    import shutil
    with open(src, "rb") as f, gzip.open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    return dst


def test_gzipped_raw_files_featurize_as_their_text(shared, tmp_path):
    """Reliability probe: a gzipped Criteo TSV (`day_0.gz`, `train.txt.gz`) or CSV was sniffed,
    its header and its last line checked on its compressed bytes: the TSV refused or read as a
    CSV by chance, false cut-line warnings with line numbers of the compressed bytes. Every
    look into a raw file reads its text: the same output, vocabulary and warning (the real
    Criteo sample ends in a last line with no line end and 38 cells: line 1000) as the
    original, and the output named after the original."""
    tsv = shared / "criteo_head1000" / "train.txt"
    csv = shared / "deepctr_samples" / "criteo_sample.txt"
    for src, gz, name, warning in (
            (tsv, tmp_path / "train.txt.gz", "train.libsvm", "line 1000: the last line has no "
                                                             "line end and 38 of 40 cells"),
            (tsv, tmp_path / "train.gz", "train.libsvm", "line 1000: the last line"),
            (csv, tmp_path / "criteo_sample.txt.gz", "criteo_sample.libsvm", None)):
        _gzip(src, gz)
        outs = {}
        for f in (src, gz):
            out = tmp_path / f"out-{gz.name}" / ("gz" if f == gz else "text")
            code, _, err = cli("data", "featurize", f, "--out", out, "--min-count", "2")
            assert code == 0, err[-2000:]
            if warning:
                assert f"{f.name}, {warning}" in err and err.count("no line end") == 1, err
            else:
                assert "no line end" not in err, err
            outs[f] = out
        a, b = outs[src], outs[gz]
        assert (a / name).read_bytes() == (b / name).read_bytes()
        assert (a / "vocab.json").read_text() == (b / "vocab.json").read_text()
        assert read_manifest(a).records == read_manifest(b).records
    # A test split featurized under the training vocabulary reads the gzipped file alike.
    code, _, err = cli("data", "featurize", tmp_path / "train.gz", "--out", tmp_path / "test",
                       "--vocab", tmp_path / "out-train.gz" / "text" / "vocab.json")
    assert code == 0 and err.count("train.gz, line 1000: the last line") == 1, err
    assert (tmp_path / "test" / "train.libsvm").read_bytes() == \
        (tmp_path / "out-train.gz" / "text" / "train.libsvm").read_bytes()


def test_a_gzipped_file_cut_mid_row_is_warned_of_once_at_its_text_line(shared, tmp_path):
    """A gzipped Criteo TSV and CSV whose text stops mid-row: one warning naming the line of
    the text (not of the compressed bytes); with the last line ended, none. A gzip stream that
    itself stops short is refused by name."""
    lines = (shared / "criteo_head1000" / "train.txt").read_text().split("\n")[:301]
    text = tmp_path / "day.txt"
    text.write_text("\n".join(lines[:300]) + "\n" + "\t".join(lines[300].split("\t")[:10]))
    rows = (shared / "deepctr_samples" / "criteo_sample.txt").read_text().split("\n")[:151]
    table = tmp_path / "sample.csv"
    table.write_text("\n".join(rows[:150]) + "\n" + ",".join(rows[150].split(",")[:7]))
    for src, warning in ((text, "line 301: the last line has no line end and 10 of 40 cells"),
                         (table, "line 151: the last line has no line end and 7 of 40 cells")):
        gz = _gzip(src, tmp_path / f"{src.name}.gz")
        code, _, err = cli("data", "featurize", gz, "--out", tmp_path / f"f-{src.name}")
        assert code == 0, err[-2000:]
        assert f"{gz.name}, {warning}" in err and err.count("no line end") == 1, err[-2000:]
        src.write_text(src.read_text() + "\n")
        _gzip(src, gz)
        code, _, err = cli("data", "featurize", gz, "--out", tmp_path / f"g-{src.name}")
        assert code == 0 and "no line end" not in err, err[-2000:]
    whole = gz.read_bytes()
    gz.write_bytes(whole[:len(whole) // 2])
    code, _, err = cli("data", "featurize", gz, "--out", tmp_path / "h")
    assert code == 2 and f"{gz.name}: cannot decompress" in err and "cut short" in err, err
    assert not (tmp_path / "h").exists()


def test_vocabulary_reuse_gives_stable_ids_and_oov(shared, tmp_path):
    src = shared / "criteo_head1000" / "train.txt"
    m = featurize([str(src)], tmp_path / "train", min_count=3)
    assert m.vocabulary == "vocab.json" and m.records == 1000
    v = Vocabulary.load(str(tmp_path / "train" / "vocab.json"))
    # A "test split" with a value never seen in training maps to the field's OOV id.
    line = src.read_text().split("\n")[0].split("\t")
    line[15] = "deadbeef"
    test = tmp_path / "test.txt"
    test.write_text("\t".join(line) + "\n")
    featurize([str(test)], tmp_path / "test", vocab_path=str(tmp_path / "train" / "vocab.json"))
    a = open(tmp_path / "train" / "train.libsvm").readline().split()
    b = open(tmp_path / "test" / "test.libsvm").readline().split()
    assert a[:15] == b[:15] and a[16:] == b[16:]
    assert b[15] == f"{v.bases()[1]}:1"  # C2's OOV id
    assert read_manifest(tmp_path / "test").feature_size == v.feature_size


def test_csv_samples_with_header(shared):
    v = build_vocabulary([str(shared / "deepctr_samples" / "criteo_sample.txt")], min_count=1)
    rows = Rows.concat(list(featurize_file(str(shared / "deepctr_samples" / "criteo_sample.txt"), v)), 39)
    assert len(rows) == 200 and v.schema.numeric[0] == "I1" and v.schema.label == "label"
    av = build_vocabulary([str(shared / "deepctr_samples" / "avazu_sample.txt")], min_count=1)
    assert av.schema.label == "click" and "id" not in av.schema.categorical
    arows = Rows.concat(list(featurize_file(str(shared / "deepctr_samples" / "avazu_sample.txt"), av)), 22)
    assert len(arows) == 100 and arows.ids.max() < av.feature_size


def test_hashing_mode(shared):
    v = build_vocabulary([str(shared / "criteo_head1000" / "train.txt")], hash_buckets=64)
    rows = Rows.concat(list(featurize_file(str(shared / "criteo_head1000" / "train.txt"), v)), 39)
    assert v.feature_size == 13 + 26 * 64 and rows.ids.max() < v.feature_size


def test_bad_numeric_field_is_named(tmp_path):
    p = tmp_path / "raw.txt"
    good = "\t".join(["1"] + ["3"] * 13 + ["ab"] * 26)
    bad = "\t".join(["0", "3", "x7"] + ["3"] * 11 + ["ab"] * 26)
    p.write_text(good + "\n" + bad + "\n")
    with pytest.raises(DataError) as e:
        build_vocabulary([str(p)], min_count=1)
    assert e.value.line == 2 and e.value.field == "I2"
    r = run_cli("data", "featurize", p, "--out", tmp_path / "o", check=False)
    assert r.returncode == 2 and "line 2" in r.stderr and "I2" in r.stderr
    assert not (tmp_path / "o").exists()
    # F39: 'inf' and 1e400 (past float64) were written as 709.78 while 'nan' was refused:
    # every non-finite cell is refused, named by line and column.
    for cell, what in (("nan", "'nan' is not a number"), ("inf", "'inf' is not finite"),
                       ("1e400", "'1e400' is not finite"), ("-inf", "'-inf' is not finite")):
        p.write_text(good + "\n" + bad.replace("x7", cell) + "\n")
        with pytest.raises(DataError, match=what) as e:
            build_vocabulary([str(p)], min_count=1)
        assert e.value.line == 2 and e.value.field == "I2"


def test_cli_featurize_then_convert_carries_the_vocabulary(shared, tmp_path):
    run_cli("data", "featurize", shared / "criteo_head1000" / "train.txt", "--out", tmp_path / "f",
            "--min-count", "2")
    run_cli("data", "convert", tmp_path / "f", "--out", tmp_path / "tf", "--shards", 3)
    m = read_manifest(tmp_path / "tf")
    assert m.records == 1000 and m.vocabulary == "vocab.json" and (tmp_path / "tf" / "vocab.json").exists()
    run_cli("data", "validate", tmp_path / "tf")


def test_a_value_the_transform_cannot_write_is_named(tmp_path):
    """F39: 1e300 in a numeric column under --numeric-transform none or standard was written
    as inf (standard: every value of the column as 0, its deviation inf) and featurize exited
    0. Refused, naming the file, line and column, and nothing written; log takes it; a later
    split whose value the training split's range blows up (minmax) is named the same way."""
    rows = ["label,price,city"] + [f"{i % 2},{i + 1},c{i % 3}" for i in range(20)]
    rows[8] = "1,1e300,c1"
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    for transform in ("none", "standard", "minmax"):
        code, _, err = cli("data", "featurize", tmp_path / "train.csv", "--out",
                           tmp_path / transform, "--numeric", "price", "--numeric-transform",
                           transform)
        assert code == 2 and f"train.csv, line 9, field price: 1e+300 is too large for " \
            f"--numeric-transform {transform}" in err, err
        assert not (tmp_path / transform).exists()
    ctrtrain_here("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "log",
                  "--numeric", "price", "--numeric-transform", "log")
    rows[8] = "1,9,c1"
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    ctrtrain_here("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "mm",
                  "--numeric", "price", "--numeric-transform", "minmax")
    (tmp_path / "test.csv").write_text("label,price,city\n0,3,c1\n1,1e40,c2\n")
    code, _, err = cli("data", "featurize", tmp_path / "test.csv", "--out", tmp_path / "t",
                       "--vocab", tmp_path / "mm" / "vocab.json")
    assert code == 2 and "test.csv, line 3, field price: 1e+40 is too large" in err, err
    assert not (tmp_path / "t").exists()


def test_numeric_transforms_use_the_training_splits_statistics_everywhere(tmp_path):
    """--numeric-transform: the training split's mean and deviation (or range) of the present
    values, kept in vocab.json and applied to a later split featurized with --vocab; a missing
    value is 0 after the transform (the mean, standardized). A vocabulary of the first
    versions (a formula in numeric_transform) reads as log."""
    import json
    from conftest import ctrtrain_here
    from ctrtrain.data.tfrecord import read_field_blocks
    rng = np.random.default_rng(0)
    price = rng.lognormal(3, 1, 400)
    price[::10] = np.nan                                       # missing cells
    rows = ["label,price,year,city,tags"] + [
        f"{int(rng.random() < 0.3)},{'' if np.isnan(p) else round(p, 2)},{1990 + i % 30},"
        f"c{i % 7},t{i % 3}|t{i % 5}" for i, p in enumerate(price)]
    (tmp_path / "train.csv").write_text("\n".join(rows[:301]) + "\n")
    (tmp_path / "test.csv").write_text("\n".join([rows[0]] + rows[301:]) + "\n")
    present = [float(r.split(",")[1]) for r in rows[1:301] if r.split(",")[1]]
    years = np.array([1990 + i % 30 for i in range(300)], float)
    for transform in ("standard", "log-standard", "minmax", "log"):
        out = tmp_path / transform
        ctrtrain_here("data", "featurize", tmp_path / "train.csv", "--out", out / "train",
                      "--numeric", "price,year", "--multi-hot", "tags", "--min-count", "1",
                      "--numeric-transform", transform)
        ctrtrain_here("data", "featurize", tmp_path / "test.csv", "--out", out / "test",
                      "--vocab", out / "train" / "vocab.json")
        vocab = json.loads((out / "train" / "vocab.json").read_text())
        assert vocab["numeric_transform"] == transform
        x = np.log1p(present) if transform == "log-standard" else np.array(present)
        if transform != "log":
            s = vocab["numeric_stats"]["price"]
            assert s["mean"] == pytest.approx(x.mean()) and s["std"] == pytest.approx(x.std())
            assert (s["min"], s["max"]) == pytest.approx((x.min(), x.max()))
            y = np.log1p(years) if transform == "log-standard" else years
            assert vocab["numeric_stats"]["year"]["std"] == pytest.approx(y.std())
        m = read_manifest(out / "test")
        got = np.concatenate([b["price"].numpy()[:, 0] for b in read_field_blocks(
            str(out / "test" / m.files[0].path), m.schema)])
        raw = [r.split(",")[1] for r in rows[301:]]
        assert len(got) == len(raw) == 100
        for cell, v in zip(raw, got):
            if not cell:
                assert v == 0.0
                continue
            p = float(cell)
            want = {"standard": (p - x.mean()) / x.std(),
                    "log-standard": (np.log1p(p) - x.mean()) / x.std(),
                    "minmax": (p - x.min()) / (x.max() - x.min()),
                    "log": np.log1p(p)}[transform]
            assert v == pytest.approx(want, abs=2e-5), (transform, cell)
    # A model trained on them predicts raw rows (featurized by its export's vocabulary, the
    # statistics with it) as it predicts the featurized split.
    d = tmp_path / "log-standard"
    ctrtrain_here("train", "--train", d / "train", "--test", d / "test", "--model-dir", d / "m",
                  "--steps", 5, "--batch-size", 64, "--numeric-input", "value", "--quiet")
    ctrtrain_here("predict", "--model", d / "m" / "export", "--input", d / "test", "--out",
                  d / "a.csv")
    ctrtrain_here("predict", "--model", d / "m" / "export", "--input", tmp_path / "test.csv",
                  "--out", d / "b.csv")
    assert (d / "a.csv").read_text() == (d / "b.csv").read_text()
    old = json.loads((tmp_path / "log" / "train" / "vocab.json").read_text())
    old["numeric_transform"] = "sign(x)*log1p(|x|), missing=0"
    del old["numeric_stats"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Vocabulary.load(str(tmp_path / "old.json")).numeric_transform == "log"
    r = run_cli("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "bad",
                "--numeric", "price", "--numeric-transform", "zscore", check=False)
    assert r.returncode == 2 and "numeric transform 'zscore' is not one of" in r.stderr
    assert not (tmp_path / "bad").exists()


def test_buckets_at_the_training_splits_quantiles_everywhere(tmp_path):
    """--buckets 4: each numeric column a declared numeric field bucketized at the training
    split's quartiles (of the present values, written as the values are: log-standard here),
    the boundaries that a column's mass of zeros repeats merged; a later split and raw rows at
    predict time bucketized alike (the boundaries are in the vocabulary and the model's input)."""
    import json
    from conftest import ctrtrain_here
    from ctrtrain.data.featurize import scale_numeric
    from ctrtrain.data.tfrecord import read_field_blocks
    rng = np.random.default_rng(1)
    price = rng.lognormal(3, 1, 1200)
    price[::9] = np.nan
    clicks = np.where(rng.random(1200) < 0.6, 0, rng.integers(1, 50, 1200))
    rows = ["label,price,clicks,city"] + [
        f"{int(rng.random() < 0.2 + 0.4 * (p > 30))},{'' if np.isnan(p) else round(p, 2)},"
        f"{c},c{i % 7}" for i, (p, c) in enumerate(zip(price, clicks))]
    (tmp_path / "train.csv").write_text("\n".join(rows[:1001]) + "\n")
    (tmp_path / "test.csv").write_text("\n".join([rows[0]] + rows[1001:]) + "\n")
    ctrtrain_here("data", "featurize", tmp_path / "train.csv", "--out", tmp_path / "train",
                  "--numeric", "price,clicks", "--min-count", "1", "--buckets", "4")
    ctrtrain_here("data", "featurize", tmp_path / "test.csv", "--out", tmp_path / "test",
                  "--vocab", tmp_path / "train" / "vocab.json")
    vocab = json.loads((tmp_path / "train" / "vocab.json").read_text())
    m = read_manifest(tmp_path / "train")
    price_f, clicks_f = m.schema.fields[:2]
    assert m.format == "tfrecord" and (price_f.kind, clicks_f.kind) == ("numeric", "numeric")
    raw = price[:1000][~np.isnan(price[:1000])].round(2)
    want = scale_numeric(np.quantile(raw, [0.25, 0.5, 0.75])[:, None], "log-standard",
                         vocab["numeric_stats"], ["price"])[:, 0]
    assert list(price_f.boundaries) == pytest.approx(want, abs=1e-9)
    assert vocab["buckets"]["price"] == list(price_f.boundaries)
    # 60% zeros: the first two quartiles are both 0, one boundary
    assert len(clicks_f.boundaries) == 2
    # ids of their own after each other, inside feature_size, before the categorical's
    assert (price_f.bucket_base, clicks_f.bucket_base) == (0, 4)
    assert m.feature_size == 4 + 3 + 8 and m.field_size == 5
    x = np.concatenate([b["price"].numpy()[:, 0] for b in read_field_blocks(
        str(tmp_path / "train" / m.files[0].path), m.schema)])
    present = x[~np.isnan(price[:1000])]
    counts = np.bincount(np.searchsorted(np.float32(price_f.boundaries), present, "right"))
    assert counts.min() >= 0.23 * len(present), counts
    assert read_manifest(tmp_path / "test").schema == m.schema
    # Trained, the model's input bucketizes raw rows at predict time as featurize did.
    ctrtrain_here("train", "--train", tmp_path / "train", "--test", tmp_path / "test",
                  "--model-dir", tmp_path / "m", "--steps", 5, "--batch-size", 64, "--quiet")
    for src, out in ((tmp_path / "test", "a.csv"), (tmp_path / "test.csv", "b.csv")):
        ctrtrain_here("predict", "--model", tmp_path / "m" / "export", "--input", src,
                      "--out", tmp_path / out)
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    r = run_cli("data", "featurize", tmp_path / "test.csv", "--out", tmp_path / "bad",
                "--vocab", tmp_path / "train" / "vocab.json", "--buckets", "8", check=False)
    assert r.returncode == 2 and "--buckets" in r.stderr and not (tmp_path / "bad").exists()


def test_a_column_that_cannot_name_a_declared_field_is_refused_before_writing(tmp_path):
    """A header like a numbered table's ("4", "5") is fine for the fixed schema (ids by
    position) but cannot name a declared field: refused, naming the column and the file."""
    (tmp_path / "t.csv").write_text("label,4,city\n1,2.5,a\n0,3.5,b\n")
    ctrtrain_here("data", "featurize", tmp_path / "t.csv", "--out", tmp_path / "fixed",
                  "--numeric", "4", "--min-count", "1")
    r = run_cli("data", "featurize", tmp_path / "t.csv", "--out", tmp_path / "o", "--numeric",
                "4", "--declared", check=False)
    assert r.returncode == 2 and "column '4' cannot name a declared field" in r.stderr
    assert "t.csv" in r.stderr and not (tmp_path / "o").exists()


def test_declared_without_multi_valued_columns_makes_numeric_fields(shared, tmp_path):
    """--declared on Criteo (13 numeric, 26 categorical columns, no bag): declared fields in
    TFRecord, each numeric column a numeric field holding what the fixed schema's libsvm holds
    as its id's value, each categorical the same id; kept in the vocabulary for later splits."""
    from conftest import ctrtrain_here
    from ctrtrain.data.tfrecord import read_field_blocks
    src = shared / "criteo_head1000" / "train.txt"
    ctrtrain_here("data", "featurize", src, "--out", tmp_path / "fixed", "--min-count", "2",
                  "--numeric-transform", "log-standard")
    ctrtrain_here("data", "featurize", src, "--out", tmp_path / "declared", "--min-count", "2",
                  "--numeric-transform", "log-standard", "--declared")
    ctrtrain_here("data", "featurize", src, "--out", tmp_path / "again", "--vocab",
                  tmp_path / "declared" / "vocab.json")
    fixed = np.array([[float(t.split(":")[1]) for t in line.split()[1:14]] for line in
                      (tmp_path / "fixed" / "train.libsvm").read_text().splitlines()])
    for d in ("declared", "again"):
        m = read_manifest(tmp_path / d)
        assert m.format == "tfrecord" and [f.kind for f in m.schema.fields] == \
            ["numeric"] * 13 + ["categorical"] * 26
        b = next(read_field_blocks(str(tmp_path / d / m.files[0].path), m.schema))
        got = np.stack([b[f"I{j}"].numpy()[:, 0] for j in range(1, 14)], 1)
        np.testing.assert_allclose(got, fixed, atol=1e-5)
