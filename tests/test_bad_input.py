"""Nothing lost, nothing silently wrong: what the data tools, `train` and `predict` do with
inputs a careless user or an adversarial tester gives them. Every case here failed before
(deleted data, exit 0 with a wrong result, or a traceback); each now ends in a named error,
exit status 2, with the inputs intact. Commands run in-process through the real CLI entry
(`ctrtrain.cli.main`), so the table costs no TensorFlow start-up per case."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cli


def refused(*args, match):
    code, out, err = cli(*args)
    assert code == 2, (code, out[-2000:], err[-2000:])
    assert match in err, err[-2000:]
    return err


def tree_digest(path: Path) -> str:
    """Names and contents of everything under path: equal digests, nothing lost or changed."""
    h = hashlib.sha256()
    for p in sorted(Path(path).rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def data(synth_data):
    return synth_data(rows=6000, feature_size=2000, seed=5)[0]


@pytest.fixture(scope="module")
def model(data, tmp_path_factory):
    md = tmp_path_factory.mktemp("model") / "m"
    code, out, err = cli("train", "--train", data / "tf" / "train", "--model-dir", md,
                         "--steps", 10, "--batch-size", 256, "--quiet")
    assert code == 0, err
    return md


def criteo_day(shared, path: Path, rows: int = 50) -> Path:
    lines = (shared / "criteo_head1000" / "train.txt").read_text().splitlines(keepends=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines[:rows]))
    return path


# --- data loss ----------------------------------------------------------------------------

def test_overlapping_or_foreign_outputs_are_refused_and_inputs_kept(tmp_path, shared, data):
    day = criteo_day(shared, tmp_path / "in" / "day.txt")
    lib = tmp_path / "lib"
    shutil.copytree(data / "raw" / "train", lib)
    before = {p: tree_digest(p) for p in (tmp_path / "in", lib)}
    for args in (["data", "featurize", day, "--out", tmp_path / "in"],
                 ["data", "featurize", day, "--out", tmp_path],
                 ["data", "split", day, "--out", tmp_path / "in"],
                 ["data", "split", day, "--out", tmp_path],
                 ["data", "convert", lib, "--out", lib],
                 ["data", "convert", lib, "--out", tmp_path],
                 ["data", "convert", lib / "part-00000.libsvm", lib / "part-00001.libsvm",
                  "--field-size", 39, "--out", lib]):
        refused(*args, "--overwrite", match="overlaps the input")
    # --overwrite replaces only an empty directory or a ctrtrain output.
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    refused("data", "split", day, "--out", foreign, "--overwrite", match="left as it is")
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert {p: tree_digest(p) for p in before} == before
    code, _, err = cli("data", "split", day, "--out", tmp_path / "s")
    assert code == 0, err
    code, _, err = cli("data", "split", day, "--out", tmp_path / "s", "--overwrite")
    assert code == 0, err


def test_featurize_inputs_with_one_stem_keep_every_row(tmp_path, shared):
    a = criteo_day(shared, tmp_path / "a" / "day.txt", 50)
    b = criteo_day(shared, tmp_path / "b" / "day.txt", 200)
    c = criteo_day(shared, tmp_path / "a" / "day.tsv", 30)
    code, _, err = cli("data", "featurize", a, b, c, "--out", tmp_path / "f", "--min-count", 1)
    assert code == 0, err
    m = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert [(f["path"], f["records"]) for f in m["files"]] == [
        ("day.libsvm", 50), ("day-2.libsvm", 200), ("day-3.libsvm", 30)]
    for f in m["files"]:
        assert len((tmp_path / "f" / f["path"]).read_text().splitlines()) == f["records"]
    code, _, err = cli("data", "convert", tmp_path / "f", "--out", tmp_path / "t", "--shards", 2)
    assert code == 0, err
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["records"] == 280


def test_predict_never_writes_over_its_input(tmp_path, data, model):
    src = tmp_path / "rows.libsvm"
    shutil.copy(data / "raw" / "test" / json.loads(
        (data / "raw" / "test" / "manifest.json").read_text())["files"][0]["path"], src)
    before = src.read_bytes()
    refused("predict", "--model", model / "export", "--input", src, "--out", src,
            match="overlaps the input")
    d = tmp_path / "d"
    shutil.copytree(data / "tf" / "test", d)
    refused("predict", "--model", model / "export", "--input", d, "--out", d / "p.csv",
            match="overlaps the input")
    assert src.read_bytes() == before and not (d / "p.csv").exists()


# --- silently wrong results -----------------------------------------------------------------

def test_csv_label_column_is_found_or_required(tmp_path, shared):
    sample = (shared / "deepctr_samples" / "criteo_sample.txt").read_text().splitlines()
    header = sample[0].split(",")
    assert header[0] == "label"
    for name in ("Label", "CLICK"):
        f = tmp_path / f"{name}.csv"
        f.write_text("\n".join([",".join([name] + header[1:])] + sample[1:]) + "\n")
        code, _, err = cli("data", "featurize", f, "--out", tmp_path / name, "--min-count", 1)
        assert code == 0, err
        m = json.loads((tmp_path / name / "manifest.json").read_text())
        labels = [int(x) for x in sample[1:] and [r.split(",")[0] for r in sample[1:]]]
        assert m["positives"] == sum(labels) > 0 and m["field_size"] == 39
    f = tmp_path / "y.csv"
    f.write_text("\n".join([",".join(["y"] + header[1:])] + sample[1:]) + "\n")
    refused("data", "featurize", f, "--out", tmp_path / "y", match="no label column")
    code, _, err = cli("data", "featurize", f, "--out", tmp_path / "y", "--label-column", "y",
                       "--min-count", 1)
    assert code == 0, err
    assert json.loads((tmp_path / "y" / "manifest.json").read_text())["positives"] == sum(labels)
    # A TSV given as --format csv is named, not read as one column.
    tsv = criteo_day(shared, tmp_path / "day.tsv")
    tsv.write_text("label\t" + "\t".join(f"I{i}" for i in range(1, 14)) + "\n" + tsv.read_text())
    refused("data", "featurize", tsv, "--format", "csv", "--out", tmp_path / "t",
            match="TAB-separated")


def write_tfrecord_dir(path: Path, labels, ids, values, feature_size: int):
    """A TFRecord data directory as another pipeline would write it (no checks on values)."""
    from ctrtrain.data.libsvm import Rows
    from ctrtrain.data.manifest import FileEntry, Manifest
    from ctrtrain.data.tfrecord import ShardWriter
    path.mkdir(parents=True)
    w = ShardWriter(str(path / "part-0.tfrecord"))
    w.write_rows(Rows(np.asarray(labels, np.float32), np.asarray(ids, np.int64),
                      np.asarray(values, np.float32)))
    n, size, sha = w.commit()
    Manifest("tfrecord", ids.shape[1], feature_size,
             [FileEntry("part-0.tfrecord", n, size, sha)]).write(path)


def synthetic(n=2048, f=39, feature_size=2000, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2, n).astype(np.float32), rng.integers(0, feature_size, (n, f)),
            np.ones((n, f), np.float32))


@pytest.mark.parametrize("case,record,reason", [
    ("label 2", 1500, "label 2 is not 0 or 1"),
    ("label -1", 700, "label -1 is not 0 or 1"),
    ("id outside the table", 1999, "id 2000 (field 7) is outside [0, 2000)"),
])
@pytest.mark.tf215
def test_bad_records_are_named_by_train_and_predict(tmp_path, model, case, record, reason):
    labels, ids, values = synthetic()
    if case.startswith("label"):
        labels[record] = float(case.split()[1])
    else:
        ids[record, 7] = 2000
    d = tmp_path / "d"
    write_tfrecord_dir(d, labels, ids, values, 2000)
    where = f"{d / 'part-0.tfrecord'}, record {record}: {reason}"
    refused("train", "--train", d, "--model-dir", tmp_path / "m", "--steps", 8,
            "--batch-size", 256, "--shuffle-buffer", 0, "--quiet", match=where)
    refused("predict", "--model", model / "export", "--input", d, "--out", tmp_path / "p.csv",
            match=where)
    assert not (tmp_path / "p.csv").exists()


def test_cached_data_is_checked_whole_before_the_first_step(tmp_path):
    """With `--cache` every record is parsed and checked at once: a bad id far past the two
    steps' records (and what the reader prefetches) is named by file and record before
    training starts."""
    labels, ids, values = synthetic(n=40_000)
    ids[39_999, 7] = 2000
    d = tmp_path / "d"
    write_tfrecord_dir(d, labels, ids, values, 2000)
    refused("train", "--train", d, "--model-dir", tmp_path / "m", "--steps", 2,
            "--batch-size", 256, "--cache", "--shuffle-buffer", 0, "--quiet",
            match=f"{d / 'part-0.tfrecord'}, record 39999: id 2000 (field 7) is outside [0, 2000)")


def memory_cgroup(tmp_path, limit: int):
    """A memory cgroup (v1, as this machine and CI have) of `limit` bytes under this process's
    own, or a skip where none can be made; removed by the caller once its processes ended."""
    with open("/proc/self/cgroup") as f:
        path = next((line.rstrip("\n").split(":", 2)[2] for line in f
                     if "memory" in line.split(":", 2)[1].split(",")), None)
    if path is None:
        pytest.skip("no cgroup v1 memory controller here")
    cg = Path(f"/sys/fs/cgroup/memory{path.rstrip('/')}/ctrtrain-test-{os.getpid()}-{tmp_path.name}")
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup: {e}")
    return cg


def test_cache_beyond_the_memory_left_is_refused_with_sizes(tmp_path):
    """F35: `--cache` under a 900 MB limit was OOM-killed without a word (streaming peaked at
    370 MiB). The parsed size is estimated against the memory left, cgroup limit included,
    and the run refused before reading, naming both sizes."""
    tagged_rows(tmp_path / "f", 10_000, "--multi-hot")
    tags_reindexed(tmp_path / "f", max_len=5_000)
    cg = memory_cgroup(tmp_path, 900 << 20)
    try:
        r = subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh",
                            sys.executable, "-m", "ctrtrain.cli", "train", "--train",
                            str(tmp_path / "f"), "--model-dir", str(tmp_path / "m"),
                            "--batch-size", "16", "--cache"],
                           capture_output=True, text=True, timeout=300)
    finally:
        cg.rmdir()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "--cache: holding the training data in memory needs about 1.1" in r.stderr
    assert "GiB of memory left: train without --cache" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "m" / "checkpoint").exists()


def test_libsvm_directory_with_bad_labels_is_named(tmp_path):
    from ctrtrain.data.manifest import FileEntry, Manifest, sha256_file
    d = tmp_path / "lib"
    d.mkdir()
    rows = ["1 " + " ".join(f"{j}:1" for j in range(3))] * 300
    rows[123] = "2 0:1 1:1 2:1"
    (d / "a.libsvm").write_text("\n".join(rows) + "\n")
    Manifest("libsvm", 3, 10, [FileEntry("a.libsvm", 300, (d / "a.libsvm").stat().st_size,
                                         sha256_file(d / "a.libsvm"))]).write(d)
    refused("train", "--train", d, "--model-dir", tmp_path / "m", "--steps", 4,
            "--batch-size", 64, "--shuffle-buffer", 0, "--quiet",
            match=f"{d / 'a.libsvm'}, line 124: label 2")


def test_non_finite_loss_stops_training_without_a_checkpoint(tmp_path):
    labels, ids, values = synthetic()
    values[:, 3] = 3e38   # finite float32, but the model's logits overflow
    d = tmp_path / "d"
    write_tfrecord_dir(d, labels, ids, values, 2000)
    refused("train", "--train", d, "--model-dir", tmp_path / "m", "--steps", 8,
            "--batch-size", 256, "--quiet", match="the training loss became")
    assert not list((tmp_path / "m").glob("checkpoints/ckpt-*")) and \
        not (tmp_path / "m" / "export").exists()


def test_convert_refuses_values_float32_cannot_hold(tmp_path):
    (tmp_path / "a.libsvm").write_text("1 0:1 1:1\n0 0:1e39 1:1\n")
    refused("data", "convert", tmp_path / "a.libsvm", "--field-size", 2, "--out", tmp_path / "o",
            match="line 2: pair 1: value 1e+39 is outside float32's range")
    (tmp_path / "b.libsvm").write_text("0 0:x 1:1\n" * 5)
    refused("data", "convert", tmp_path / "b.libsvm", "--field-size", 2, "--out", tmp_path / "o",
            "--max-bad-rows", 5, match="no valid rows")
    assert not (tmp_path / "o").exists()


@pytest.mark.tf215
def test_cut_files_and_lying_manifests_are_caught_wherever_data_is_read(tmp_path, data, model):
    from ctrtrain.data.manifest import read_manifest
    d = tmp_path / "cut"
    shutil.copytree(data / "tf" / "train", d)
    m = read_manifest(d)
    first = d / m.files[0].path
    # Cut exactly at a record boundary: TensorFlow reads it as a shorter, valid file.
    framed = first.read_bytes()
    n, off = 0, 0
    while n < m.files[0].records // 3:
        off += 16 + int.from_bytes(framed[off:off + 8], "little")
        n += 1
    first.write_bytes(framed[:off])
    for args in (["train", "--train", d, "--model-dir", tmp_path / "m", "--steps", 2, "--quiet"],
                 ["predict", "--model", model / "export", "--input", d, "--out", tmp_path / "p.csv"],
                 ["data", "convert", d, "--to", "libsvm", "--out", tmp_path / "back"]):
        refused(*args, match=f"{first}: {off} bytes, the manifest says {m.files[0].bytes}")
    # A record count that no file of that size can hold (3.6 passes for "1 epoch" before).
    d2 = tmp_path / "lie"
    shutil.copytree(data / "tf" / "train", d2)
    raw = json.loads((d2 / "manifest.json").read_text())
    raw["files"][0]["records"] = int(raw["files"][0]["records"] * 3.6)
    (d2 / "manifest.json").write_text(json.dumps(raw))
    refused("train", "--train", d2, "--model-dir", tmp_path / "m2", "--steps", 2, "--quiet",
            match="cannot hold the")


def test_resume_refuses_another_data_position_and_survives_damaged_checkpoints(tmp_path, data):
    tf_train = data / "tf" / "train"
    md = tmp_path / "m"
    base = ["train", "--train", tf_train, "--model-dir", md, "--batch-size", 256, "--quiet",
            "--checkpoint-every", 5, "--keep-checkpoints", 5, "--no-export"]
    code, _, err = cli(*base, "--steps", 10)
    assert code == 0, err
    for flag, value in (("--batch-size", 128), ("--seed", 3), ("--shuffle-buffer", 100),
                        ("--read-block", 4)):
        args = list(base)
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
        refused(*args, "--steps", 15, match="resuming would continue at the wrong data position")
    other = tmp_path / "other"
    shutil.copytree(data / "tf" / "valid", other)
    refused(*[other if a == tf_train else a for a in base], "--steps", 15,
            match="train_data=")
    # A garbled state file: set aside, the newest checkpoint found by name.
    (md / "checkpoints" / "checkpoint").write_text("model_checkpoint_path: \x00garbage {{{")
    code, out, err = cli(*base, "--steps", 15)
    assert code == 0, err
    assert "damaged" in out and "resuming from the checkpoint at step 10" in out
    assert list((md / "checkpoints").glob("checkpoint.damaged-*"))
    # A damaged newest checkpoint: the one before it, loudly.
    newest = md / "checkpoints" / "ckpt-15.data-00000-of-00001"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    code, out, err = cli(*base, "--steps", 20)
    assert code == 0, err
    assert "could not restore ckpt-15" in out and "resumed from ckpt-10" in out
    result = json.loads((md / "result.json").read_text())
    assert result["resumed_from"] == 10 and result["step"] == 20
    # --fresh starts over.
    code, out, err = cli(*base, "--steps", 5, "--batch-size", 128, "--fresh")
    assert code == 0, err
    assert json.loads((md / "result.json").read_text())["resumed_from"] == 0


@pytest.mark.slow
def test_sigterm_and_sigint_checkpoint_before_exiting(tmp_path, data):
    import signal
    import time
    md = tmp_path / "m"
    args = [sys.executable, "-m", "ctrtrain.cli", "train", "--train", data / "tf" / "train",
            "--model-dir", md, "--steps", 100000, "--batch-size", 64, "--checkpoint-every", 0,
            "--log-every", 20, "--quiet", "--no-export"]
    def train_events():
        path = md / "metrics.jsonl"
        return path.read_text().count('"event": "train"') if path.exists() else 0
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        seen = train_events()
        proc = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and train_events() == seen:
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == code, err[-2000:]
        assert f"stopped by {sig.name} at step" in err and "checkpoint saved" in err
        stopped = [json.loads(x) for x in (md / "metrics.jsonl").read_text().splitlines()
                   if '"stopped"' in x][-1]
        assert (md / "checkpoints" / f"ckpt-{stopped['step']}.index").exists()
    # The next run resumes where the last one stopped.
    code, out, err = cli("train", "--train", data / "tf" / "train", "--model-dir", md,
                         "--steps", stopped["step"] + 3, "--batch-size", 64, "--quiet",
                         "--checkpoint-every", 0, "--no-export")
    assert code == 0, err
    assert json.loads((md / "result.json").read_text())["resumed_from"] == stopped["step"]


# --- inconsistent parsing and odd inputs ----------------------------------------------------

@pytest.mark.parametrize("line", [b'1 "0":1 1:1', b"\xef\xbb\xbf1 0:1 1:1", b"1 0:1 1:1\r",
                                  b"1 0:1_0 1:1", b"1 0:inf 1:1", b"1 0:nan 1:1", b"1 0:0x1 1:1",
                                  b"1 0:+1 1:.5", b"1 0:1e-3 1:2E2"])
def test_both_libsvm_parse_paths_agree_on_every_line(line):
    from ctrtrain.data.libsvm import parse_libsvm
    alone_rows, alone_bad = parse_libsvm(line + b"\n", 2)
    block = b"0 0:1 1:1\n" * 50 + line + b"\n" + b"1 0:2 1:3\n" * 50
    rows, bad = parse_libsvm(block, 2)
    assert len(alone_bad) == len(bad)
    assert len(rows) == 100 + len(alone_rows)
    if len(alone_rows):
        np.testing.assert_array_equal(rows.values[50], alone_rows.values[0])


def test_directory_inputs_refuse_what_they_would_skip(tmp_path, data):
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(data / "raw" / "train" / "part-00000.libsvm", d / "a.libsvm")
    for extra in ("b.json", ".hidden", "c.tmp", "sub/"):
        p = d / extra.rstrip("/")
        p.mkdir() if extra.endswith("/") else p.write_text("1 0:1\n")
        refused("data", "convert", d, "--field-size", 39, "--out", tmp_path / "o",
                match=extra.rstrip("/"))
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    code, _, err = cli("data", "convert", d, "--field-size", 39, "--out", tmp_path / "o")
    assert code == 0, err


@pytest.mark.parametrize("edit,match", [
    (lambda m: m["files"][0].update(path="/etc/passwd"), "must be a relative path"),
    (lambda m: m["files"][0].update(path="../train/part-00000-of-00004.tfrecord"),
     "must be a relative path"),
    (lambda m: m.update(field_size="39"), "field_size: not a valid ctrtrain manifest: '39' is not a positive integer"),
    (lambda m: m.update(compression="zip"), "field compression"),
    (lambda m: m["files"][0].update(records=-1), "-1 is not a non-negative integer"),
])
def test_manifests_are_checked_field_by_field(tmp_path, data, edit, match):
    d = tmp_path / "d"
    shutil.copytree(data / "tf" / "valid", d)
    raw = json.loads((d / "manifest.json").read_text())
    edit(raw)
    (d / "manifest.json").write_text(json.dumps(raw))
    refused("train", "--train", d, "--model-dir", tmp_path / "m", "--steps", 1, match=match)
    refused("data", "inspect", d, match=match)


def test_nonsense_arguments_are_refused(tmp_path, data, shared):
    day = criteo_day(shared, tmp_path / "day.txt")
    t = data / "tf" / "train"
    cases = [
        (["train", "--train", t, "--model-dir", tmp_path / "m", "--epochs", "-1"], "--epochs"),
        (["train", "--train", t, "--model-dir", tmp_path / "m", "--deep-layers", "0"], "--deep-layers"),
        (["train", "--train", t, "--model-dir", tmp_path / "m", "--dropout", "1.5"], "--dropout"),
        (["train", "--train", t, "--model-dir", tmp_path / "m", "--batch-size", "0"], "--batch-size"),
        (["data", "convert", day, "--field-size", 39, "--shards", 0, "--out", tmp_path / "o"], "--shards"),
        (["data", "featurize", day, "--hash-buckets", "-1", "--out", tmp_path / "o"], "--hash-buckets"),
        (["data", "synth", "--rows", "0", "--out", tmp_path / "o"], "--rows"),
        (["predict", "--model", "x", "--input", day, "--out", "p.csv", "--batch-size", "-5"], "--batch-size"),
    ]
    for args, flag in cases:
        refused(*args, match=flag)
    assert not (tmp_path / "m").exists() and not (tmp_path / "o").exists()


def test_inputs_that_used_to_end_in_a_traceback(tmp_path, data, model, shared):
    """A table of inputs that each ended in a Python or TensorFlow traceback (exit 1)."""
    t = data / "tf" / "train"
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "vocab.json").write_text('{"schema": {"label": "label", "numeric": [], '
                                         '"categorical": ["C1"]}, "mode": "vocab", '
                                         '"min_count": 1, "hash_buckets": 0, "values": [1, 2]}')
    (tmp_path / "a-file").write_text("x")
    corrupt_valid = tmp_path / "valid"
    shutil.copytree(data / "tf" / "valid", corrupt_valid)
    f = corrupt_valid / "part-00001-of-00002.tfrecord"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))
    (tmp_path / "deep.yaml").write_text("[" * 100_000 + "]" * 100_000)
    day = criteo_day(shared, tmp_path / "day.txt")
    cases = [
        (["data", "featurize", tmp_path / "empty.csv", "--format", "csv", "--out", tmp_path / "o"],
         "empty.csv: file is empty"),
        (["data", "featurize", day, "--vocab", tmp_path / "vocab.json", "--out", tmp_path / "o"],
         "not a ctrtrain vocabulary"),
        (["data", "split", day, "--out", tmp_path / "a-file"], "exists and is not a directory"),
        (["data", "convert", day, "--field-size", 39, "--out", tmp_path / "a-file" / "x"],
         "a-file"),
        (["train", "--train", t, "--valid", corrupt_valid, "--model-dir", tmp_path / "m",
          "--steps", 1, "--quiet"], f"{f}: sha256 does not match"),
        (["launch", tmp_path / "deep.yaml"], "nested too deeply"),
        (["predict", "--model", tmp_path / "a-file", "--input", day, "--out", tmp_path / "p.csv"],
         "no SavedModel here"),
    ]
    for args, match in cases:
        refused(*args, match=match)
    assert not (tmp_path / "m").exists() and not (tmp_path / "o").exists()


def test_disk_full_is_a_named_error_and_leaves_nothing_half_written(tmp_path, data):
    """A 300 KB tmpfs in a mount namespace of the test's own (no privilege needed)."""
    from ctrtrain.launch import isolation
    if not isolation.available("host"):
        pytest.skip("no user namespaces here")
    small = tmp_path / "small"
    small.mkdir()
    script = (f"mount -t tmpfs -o size=300k tmpfs {small} && "
              f"cd {os.getcwd()} && {sys.executable} -m ctrtrain.cli data convert "
              f"{data / 'raw' / 'train'} "
              f"--out {small / 'o'} --processes 1; echo EXIT=$?; "
              f"{sys.executable} -m ctrtrain.cli data split {data / 'raw' / 'train'} "
              f"--out {small / 's'}; echo SPLIT=$?; ls -A {small}/s 2>&1; echo LISTED")
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                       capture_output=True, text=True, timeout=300)
    assert "EXIT=2" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "No space left on device" in r.stderr and "Traceback" not in r.stderr
    # split (issue 30): the file it was writing named, nothing left behind, not even the
    # directory it made
    assert "SPLIT=2" in r.stdout and "train.libsvm.tmp: No space left on device" in r.stderr, \
        (r.stdout, r.stderr[-2000:])
    assert "No such file or directory\nLISTED" in r.stdout, r.stdout


def without_read_override():
    """For a subprocess: file modes bind it even as root (the bounding set loses
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), as they bind any other user."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):                  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0 and os.geteuid() == 0:     # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")


def test_damaged_or_unreadable_models_and_files_are_named(tmp_path, data, model):
    """Issue 30, finding 3: predict on a SavedModel whose variables are cut short or whose
    saved_model.pb is empty, and unreadable (mode 000) data and model files, each ended in a
    traceback (exit 1). Now: exit 2 naming the file or model and what is wrong."""
    export = next((model / "export").iterdir())
    rows = data / "raw" / "test"
    cut = tmp_path / "cut"
    shutil.copytree(export, cut)
    data_file = next((cut / "variables").glob("variables.data-*"))
    data_file.write_bytes(data_file.read_bytes()[:100])
    empty = tmp_path / "empty"
    shutil.copytree(export, empty)
    (empty / "saved_model.pb").write_bytes(b"")
    for bad, match in ((cut, "Read less bytes than requested"),
                       (empty, "saved_model.pb holds no model")):
        refused("predict", "--model", bad, "--input", rows, "--out", tmp_path / "p.csv",
                match=f"{bad}: not a usable SavedModel, damaged or unreadable: {match}")
    assert not (tmp_path / "p.csv").exists()
    # An empty input said "raw rows need vocab" (F24): it is named as empty.
    (tmp_path / "none.csv").write_bytes(b"")
    refused("predict", "--model", export, "--input", tmp_path / "none.csv", "--out",
            tmp_path / "p.csv", match="none.csv: is empty: no rows to predict")
    assert not (tmp_path / "p.csv").exists()

    shards = tmp_path / "shards"
    shutil.copytree(data / "tf" / "train", shards)
    locked_shard = sorted(shards.glob("part-*"))[-1]
    locked_shard.chmod(0)
    locked_model = tmp_path / "locked"
    shutil.copytree(export, locked_model)
    (locked_model / "variables" / "variables.index").chmod(0)
    cases = [
        (["predict", "--model", export, "--input", shards, "--out", tmp_path / "p.csv"],
         f"{locked_shard}: Permission denied"),
        (["train", "--train", shards, "--model-dir", tmp_path / "m", "--steps", 1],
         f"{locked_shard}: Permission denied"),
        (["predict", "--model", locked_model, "--input", rows, "--out", tmp_path / "p.csv"],
         f"{locked_model / 'variables' / 'variables.index'}; Permission denied"),
    ]
    for args, match in cases:
        r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", *map(str, args)],
                           capture_output=True, text=True, timeout=300,
                           preexec_fn=without_read_override)
        assert r.returncode == 2 and match in r.stderr and "Traceback" not in r.stderr, \
            (args, r.returncode, r.stderr[-2000:])
    assert not (tmp_path / "m").exists() and not (tmp_path / "p.csv").exists()


def test_bags_are_bounded_before_anything_is_allocated(tmp_path):
    """F29: every row's bag is padded to its field's max_len, so one long row made every batch
    that wide (a 200,000-pair libffm row: training OOM-killed; a declared 1e9: 8.4 GB, no
    step). Convert and featurize cap what they find at MAX_LEN_LIMIT and say so, a declaration
    or --max-len above it is refused, and train refuses a batch of bags over half the memory
    left, naming the field, before it allocates."""
    from ctrtrain.data.schema import MAX_LEN_LIMIT
    long = MAX_LEN_LIMIT + 2_000
    ffm = tmp_path / "day.ffm"
    ffm.write_text("1 0:1:1 1:2:1\n0 0:3:1 " + " ".join(f"1:{i}:1" for i in range(long)) + "\n")
    code, out, err = cli("data", "convert", ffm, "--out", tmp_path / "ffm", "--shards", 1)
    assert code == 0, err
    assert f"a row holds {long:,} pairs ({ffm}, line 2); max_len set to {MAX_LEN_LIMIT:,}" in out
    assert f"f1: 1 rows hold more than max_len {MAX_LEN_LIMIT}" in out
    m = json.loads((tmp_path / "ffm" / "manifest.json").read_text())
    assert m["fields"][1]["max_len"] == MAX_LEN_LIMIT and m["records"] == 2
    refused("train", "--train", tmp_path / "ffm", "--batch-size", 1 << 20,
            "--model-dir", tmp_path / "m", match="field f1: a batch's bags need about")
    assert not (tmp_path / "m" / "checkpoint").exists()

    fields = m["fields"]
    fields[1]["max_len"] = 1_000_000_000
    refused("data", "index", tmp_path / "ffm", "--fields", json.dumps(fields), "--overwrite",
            match="f1: max_len 1,000,000,000 is over 10,000 ids a row")

    csv = tmp_path / "day.csv"
    csv.write_text("label,tags\n1,a|b\n0," + "|".join(f"t{i}" for i in range(long)) + "\n")
    code, out, err = cli("data", "featurize", csv, "--out", tmp_path / "f", "--multi-hot",
                         "tags", "--min-count", 1)
    assert code == 0 and f"column tags: a cell holds {long:,} values ({csv}, line 3)" in out, err
    assert json.loads((tmp_path / "f" / "manifest.json").read_text())["fields"][0][
        "max_len"] == MAX_LEN_LIMIT
    refused("data", "featurize", csv, "--out", tmp_path / "g", "--multi-hot", "tags",
            "--max-len", 20_000, match="--max-len 20,000 is over 10,000 ids a row")
    assert not (tmp_path / "g").exists()


def test_what_a_declaration_cuts_or_leaves_empty_is_reported(tmp_path):
    """F40: `data index --fields` with max_len 1 where rows hold 2 tags said nothing (featurize
    and convert count such rows), and one libffm line naming field 999 declared 1,000 fields,
    997 of them empty, without a word. Both are reported (kept, not refused: a user may mean
    it), and the index's manifest records the count as featurize's does."""
    tagged_rows(tmp_path / "f", 30, "--multi-hot")
    out = tags_reindexed(tmp_path / "f", max_len=1)
    assert "tags: 30 rows hold more than max_len 1" in out, out
    indexed = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert indexed["extra"]["longer_than_max_len"] == {"tags": 30}
    ffm = tmp_path / "day.ffm"
    ffm.write_text("1 0:1:1 1:2:1\n0 0:3:1 999:4:1\n")
    code, out, err = cli("data", "convert", ffm, "--out", tmp_path / "ffm", "--shards", 1)
    assert code == 0, err
    assert "997 of the 1,000 fields hold no pair in any row (f2..f998)" in out, out


def tagged_rows(out, rows: int, kind: str) -> None:
    """Featurized rows of a user id and a `tags` bag (`kind`: --multi-hot or --sequence) in out."""
    csv = out.parent / "day.csv"
    csv.write_text("label,user,tags\n" + "".join(
        f"{i % 2},u{i % 7},a|b{i % 3}\n" for i in range(rows)))
    code, _, err = cli("data", "featurize", csv, "--out", out, kind, "tags", "--min-count", 1)
    assert code == 0, err


def tags_reindexed(d, max_len: int) -> str:
    """`data index --fields` over tagged_rows' files with the tags bag declared at max_len;
    its stdout."""
    m = json.loads((d / "manifest.json").read_text())
    fields = [dict(f, max_len=max_len) if f["name"] == "tags" else f for f in m["fields"]]
    code, out, err = cli("data", "index", d, "--fields", json.dumps(fields), "--overwrite")
    assert code == 0, err
    return out


def test_a_declared_field_the_records_lack_is_refused(tmp_path):
    """F30: TensorFlow reads a bag feature that a record lacks as an empty bag, so a
    declaration naming `tagz` where the records hold `tags` trained on nothing in that field
    (index, validate, train: exit 0). Each refuses, naming the field."""
    tagged_rows(tmp_path / "f", 60, "--multi-hot")
    m = json.loads((tmp_path / "f" / "manifest.json").read_text())
    fields = [dict(f, name="tagz") if f["name"] == "tags" else f for f in m["fields"]]
    records = tmp_path / "records"
    records.mkdir()
    for f in m["files"]:
        shutil.copy(tmp_path / "f" / f["path"], records / f["path"])
    refused("data", "index", records, "--fields", json.dumps(fields),
            match="the declared fields ['tagz'] are not in the records")
    assert not (records / "manifest.json").exists()
    # A manifest edited by hand: validate and train name it too.
    (tmp_path / "f" / "manifest.json").write_text(json.dumps({**m, "fields": fields}))
    refused("data", "validate", tmp_path / "f", match="['tagz'] are not in the records")
    refused("train", "--train", tmp_path / "f", "--model-dir", tmp_path / "m",
            match="['tagz'] are not in the records")
    # predict on records without a field the model declares (`tags` renamed `tagz`).
    (tmp_path / "f" / "manifest.json").write_text(json.dumps(m))
    code, _, err = cli("train", "--train", tmp_path / "f", "--model-dir", tmp_path / "m",
                       "--steps", 2, "--batch-size", 16)
    assert code == 0, err
    other = tmp_path / "o" / "day.csv"
    other.parent.mkdir()
    other.write_text("label,user,tagz\n" + "".join(f"{i % 2},u{i % 7},a|b\n" for i in range(20)))
    code, _, err = cli("data", "featurize", other, "--out", tmp_path / "o" / "f", "--multi-hot",
                       "tagz", "--min-count", 1)
    assert code == 0, err
    # Every file's first record is checked: the model's own data first, then the other.
    for inputs in ([], sorted((tmp_path / "f").glob("*.tfrecord"))):
        refused("predict", "--model", tmp_path / "m" / "export", "--input", *inputs,
                *sorted((tmp_path / "o" / "f").glob("*.tfrecord")), "--out", tmp_path / "p.csv",
                match="['tags'] are not in the records")
        assert not (tmp_path / "p.csv").exists()


def test_a_later_record_without_a_bag_key_is_named_by_validate(tmp_path):
    """F30 re-probe: training checks each file's first record for every declared key; a
    later record lacking one (a writer that drops an empty bag's key) was read as an empty
    bag by every command. `data validate` reads every record's keys and names it."""
    import tensorflow as tf
    from tensorflow.core.example import example_pb2
    tagged_rows(tmp_path / "f", 40, "--multi-hot")
    m = json.loads((tmp_path / "f" / "manifest.json").read_text())
    path = tmp_path / "records" / m["files"][0]["path"]
    path.parent.mkdir()
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "f" / m["files"][0]["path"]))]
    lacking = example_pb2.Example.FromString(records[7])
    del lacking.features.feature["tags"]
    records[7] = lacking.SerializeToString()
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)
    said = f"{path.name}, record 7: has no feature tags (a declared field; an empty one is " \
           "an empty list)"
    refused("data", "index", path.parent, "--fields", json.dumps(m["fields"]), match=said)
    assert not (path.parent / "manifest.json").exists()
    # A manifest written beside the files by another tool: validate names the record.
    from ctrtrain.data.manifest import sha256_file
    entry = {**m["files"][0], "bytes": path.stat().st_size, "sha256": sha256_file(path)}
    (path.parent / "manifest.json").write_text(json.dumps({**m, "files": [entry]}))
    refused("data", "validate", path.parent, match=said)


def test_a_declared_type_the_records_do_not_hold_is_named_plainly(tmp_path):
    """F22: a manifest declaring `user` numeric where the records hold its ids was refused
    with TensorFlow's 300-character `{{function_node ...}}` text. The record and the field are
    named in plain words."""
    tagged_rows(tmp_path / "f", 60, "--multi-hot")
    m = json.loads((tmp_path / "f" / "manifest.json").read_text())
    fields = [dict(f, kind="numeric") if f["name"] == "user" else f for f in m["fields"]]
    (tmp_path / "f" / "manifest.json").write_text(json.dumps({**m, "fields": fields}))
    for args in (("data", "validate", tmp_path / "f"),
                 ("train", "--train", tmp_path / "f", "--model-dir", tmp_path / "m",
                  "--batch-size", 16)):
        err = refused(*args, match="record 0: Example does not match the schema (the "
                      "manifest's declared fields): user holds int64 values where the "
                      "schema reads float32")
        assert "function_node" not in err and "[Op:" not in err


def test_a_field_size_the_records_do_not_hold_is_named_with_both_counts(tmp_path):
    """F22: a fixed-schema manifest edited to field_size 40 over records of 39 ids was
    refused with TensorFlow's "Some int64_list slice was not parsed": the counts are named."""
    code, _, err = cli("data", "synth", "--rows", 400, "--feature-size", 300, "--out",
                       tmp_path / "s")
    assert code == 0, err
    code, _, err = cli("data", "convert", tmp_path / "s" / "train", "--out", tmp_path / "t")
    assert code == 0, err
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    (tmp_path / "t" / "manifest.json").write_text(json.dumps({**m, "field_size": 40}))
    for args in (("data", "validate", tmp_path / "t"),
                 ("train", "--train", tmp_path / "t", "--model-dir", tmp_path / "m",
                  "--batch-size", 64)):
        refused(*args, match="record 0: Example does not match the schema (label[1], "
                "ids/values[field_size]): ids holds 39 values where the schema reads 40")


def test_an_id_among_a_buckets_ids_is_refused(tmp_path):
    """F34: a bucketized field's ids (and a hashed field's) are rows the declaration gives it;
    a manifest moving `bucket_base` onto the records' own user ids made them share those
    rows, silently. validate and train name the clash."""
    csv = tmp_path / "day.csv"
    csv.write_text("label,user,age\n" + "".join(
        f"{i % 2},u{i % 7},{20 + i % 50}\n" for i in range(120)))
    d = tmp_path / "f"
    code, _, err = cli("data", "featurize", csv, "--out", d, "--numeric", "age",
                       "--buckets", 4, "--min-count", 1)
    assert code == 0, err
    cli_ok = cli("data", "validate", d)
    assert cli_ok[0] == 0, cli_ok[2]
    m = json.loads((d / "manifest.json").read_text())
    last = m["feature_size"] - 4     # the table's last 4 ids: users'
    fields = [dict(f, bucket_base=last) if "boundaries" in f else f for f in m["fields"]]
    (d / "manifest.json").write_text(json.dumps({**m, "fields": fields}))
    refused("data", "validate", d, match="of user is among age's bucket ids")
    refused("train", "--train", d, "--model-dir", tmp_path / "m", "--batch-size", 16,
            match="of user is among age's bucket ids")
    assert not (tmp_path / "m" / "export").exists()


def test_an_empty_or_binary_text_input_is_named_as_such(tmp_path):
    """F42: `data convert` of an empty `.ffm`, or of a binary one, said "--field-size is
    required ..." (a libsvm guess): both are named for what they are, nothing written."""
    empty, binary = tmp_path / "day.ffm", tmp_path / "night.ffm"
    empty.write_bytes(b"")
    binary.write_bytes(bytes(range(256)) * 8)
    refused("data", "convert", empty, "--out", tmp_path / "a", match="day.ffm: is empty")
    refused("data", "convert", binary, "--out", tmp_path / "b",
            match="night.ffm: is not text (byte 0 is 0x00)")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.fixture(scope="module")
def csv_model(tmp_path_factory):
    """A model trained on a small featurized CSV, its vocabulary in the export (predict reads
    raw rows through it), and the CSV's test rows (test.csv)."""
    d = tmp_path_factory.mktemp("csv")
    rng = np.random.default_rng(0)
    rows = ["label,price,city"] + [f"{int(rng.random() < 0.3)},{rng.random() * 10:.2f},c{i % 5}"
                                   for i in range(300)]
    (d / "train.csv").write_text("\n".join(rows[:201]) + "\n")
    (d / "test.csv").write_text("\n".join([rows[0]] + rows[201:]) + "\n")
    for args in (["data", "featurize", d / "train.csv", "--out", d / "train", "--numeric",
                  "price", "--min-count", 1],
                 ["train", "--train", d / "train", "--model-dir", d / "m", "--steps", 3,
                  "--batch-size", 32, "--quiet"]):
        code, _, err = cli(*args)
        assert code == 0, err
    return d


def compressed(src: Path, dst: Path) -> Path:
    """src's bytes compressed as dst's extension says (.gz, .bz2, .xz), as gzip(1) &c. write."""
    import bz2
    import gzip
    import lzma
    module = {".gz": gzip, ".bz2": bz2, ".xz": lzma}[dst.suffix]
    dst.write_bytes(module.compress(src.read_bytes()))
    return dst


def test_compressed_inputs_are_told_by_what_they_hold(tmp_path, data, model, csv_model):
    """Any gzip file was taken for a gzipped TFRecord: `predict` of a `test.csv.gz` failed
    ("record 0: file is truncated or corrupted"), `data index` of a `.libsvm.gz` ended in a
    TensorFlow traceback. The decompressed bytes are sniffed: compressed CSV is predicted as
    its text is; compressed libsvm (read as plain text) and a TFRecord compressed other than
    by gzip are refused naming the file and what it holds; a gzipped TFRecord still reads."""
    d = csv_model
    code, _, err = cli("predict", "--model", d / "m" / "export", "--input", d / "test.csv", "--out",
                       tmp_path / "plain.csv")
    assert code == 0, err
    for ext in (".gz", ".bz2", ".xz"):
        src = compressed(d / "test.csv", tmp_path / f"test.csv{ext}")
        code, _, err = cli("predict", "--model", d / "m" / "export", "--input", src, "--out",
                           tmp_path / f"p{ext}.csv")
        assert code == 0, err
        assert (tmp_path / f"p{ext}.csv").read_text() == (tmp_path / "plain.csv").read_text()

    libsvm = sorted((data / "raw" / "test").glob("*.libsvm"))[0]
    (tmp_path / "svm").mkdir()
    gz = compressed(libsvm, tmp_path / "svm" / "test.libsvm.gz")
    said = f"{gz}: a gzip-compressed libsvm file: decompress it first"
    refused("predict", "--model", model / "export", "--input", gz, "--out", tmp_path / "q.csv",
            match=said)
    refused("data", "index", tmp_path / "svm", match=said)
    refused("train", "--train", gz, "--model-dir", tmp_path / "m", "--steps", 1, match=said)
    assert not (tmp_path / "q.csv").exists() and not (tmp_path / "m").exists()
    assert sorted(os.listdir(tmp_path / "svm")) == ["test.libsvm.gz"]

    shard = sorted((data / "tf" / "test").glob("*.tfrecord"))[0]
    for ext, said in ((".xz", "an xz-compressed TFRecord file: TFRecords are read plain or "
                              "gzip-compressed"), (".gz", None)):
        (tmp_path / ext).mkdir()
        tf = compressed(shard, tmp_path / ext / f"{shard.name}{ext}")
        if said:
            refused("data", "index", tf.parent, match=f"{tf}: {said}")
            continue
        code, _, err = cli("data", "index", tf.parent)
        assert code == 0, err
        m = json.loads((tf.parent / "manifest.json").read_text())
        assert (m["format"], m["compression"]) == ("tfrecord", "gzip")


def test_predict_on_input_without_rows_is_refused(tmp_path, csv_model):
    """`predict` on a CSV of its header line only, or on an empty `.csv.gz`, wrote a file of
    no predictions and exited 0: refused naming the file, nothing written."""
    import gzip
    header = tmp_path / "header.csv"
    header.write_text((csv_model / "test.csv").read_text().splitlines()[0] + "\n")
    empty = tmp_path / "empty.csv.gz"
    empty.write_bytes(gzip.compress(b""))
    for src, said in ((header, "holds no rows"),
                      (compressed(header, tmp_path / "header.csv.gz"), "holds no rows"),
                      (empty, "file is empty (no header, no rows)")):
        refused("predict", "--model", csv_model / "m" / "export", "--input", src, "--out",
                tmp_path / "p.csv", match=f"{src}: {said}")
        assert not (tmp_path / "p.csv").exists()


def test_resume_refuses_an_edited_field_declaration(tmp_path):
    """F33: a manifest's declaration edited between runs (pooling, max_len, sequence to
    multi_hot) resumed and exported a model that predict and --valid then refuse: the same
    files read into another model. Refused on resume, naming the field and both forms; a
    field removed or the fields reordered said "field ? as nothing": said in plain words."""
    tagged_rows(tmp_path / "f", 200, "--sequence")
    base = ["train", "--train", tmp_path / "f", "--model-dir", tmp_path / "m", "--quiet",
            "--batch-size", 32, "--checkpoint-every", 2, "--no-export"]
    code, out, err = cli(*base, "--steps", 4)
    assert code == 0, err
    path = tmp_path / "f" / "manifest.json"
    m = json.loads(path.read_text())
    was = "field tags was declared sequence (max_len 2, pooling mean) at the checkpoint, now"
    for edit, now in (({"kind": "multi_hot", "pooling": "sum", "weighted": False},
                       "multi_hot (max_len 2, pooling sum, weighted false)"),
                      ({"pooling": "sum"}, "sequence (max_len 2, pooling sum)"),
                      ({"max_len": 9}, "sequence (max_len 9, pooling mean)")):
        fields = [dict(f, **edit) if f["name"] == "tags" else f for f in m["fields"]]
        path.write_text(json.dumps({**m, "fields": fields}))
        refused(*base, "--steps", 8, match=f"{was} {now}.")
    user, tags = m["fields"]
    for fields, said in (([tags], "field user is no longer declared"),
                         ([tags, user], "the fields are declared in another order: user, tags "
                                        "at the checkpoint, now tags, user")):
        path.write_text(json.dumps({**m, "fields": fields, "field_size": len(fields)}))
        err = refused(*base, "--steps", 8, match=f"declared other fields: {said}.")
        assert "?" not in err and "nothing" not in err, err
    path.write_text(json.dumps(m))
    code, out, err = cli(*base, "--steps", 8)
    assert code == 0 and "resuming from the checkpoint at step 4" in out, (out, err)
