"""The benchmark matrix (a tiny real one), its cost maths and recommendation (on recorded
results), and `ctrtrain tune` writing settings that training then uses."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cli, ctrtrain_here, run_cli
from ctrtrain.bench.cost import cost, hourly, load_prices
from ctrtrain.bench.matrix import DEFAULTS, expand_cells, load_matrix, mode_cells
from ctrtrain.bench.report import write_report
from ctrtrain.errors import ConfigError

PRICES = {"instances": {"ml.c5.xlarge": {"usd_per_hour": 0.204},
                        "ml.c5.4xlarge": {"usd_per_hour": 0.816},
                        "ml.p3.2xlarge": {"usd_per_hour": 3.825}}}


def test_cost_maths():
    cell = {**DEFAULTS, "hosts": 2, "instance_type": "ml.c5.xlarge", "data_service": True,
            "data_instance_type": "ml.c5.4xlarge"}
    assert hourly(cell, PRICES) == pytest.approx(2 * 0.204 + 0.816)
    c = cost(cell, 10_000, PRICES, 45_840_617)
    assert c["usd_per_million_examples"] == pytest.approx(1.224 / 36_000_000 * 1e6)
    assert c["hours_to_train"] == pytest.approx(45_840_617 / 10_000 / 3600)
    assert c["usd_to_train"] == pytest.approx(1.224 * 45_840_617 / 10_000 / 3600)
    with pytest.raises(ConfigError, match="no price for instance type 'ml.x'"):
        hourly({**cell, "instance_type": "ml.x"}, PRICES)
    shipped = load_prices()
    assert shipped["instances"]["ml.c5.xlarge"]["usd_per_hour"] > 0 and shipped["date"]


def recorded(name, eps, input_bound, instance="ml.c5.xlarge", hosts=1, mode="single"):
    return {"cell": {**DEFAULTS, "name": name, "mode": mode, "instance_type": instance,
                     "hosts": hosts},
            "examples_per_s": eps, "step_ms": 1024 / eps * 1000, "input_bound": input_bound,
            "auc": 0.78, "peak_rss_mb": 900}


def test_recommendation_on_recorded_results(tmp_path):
    # A GPU instance that is fastest but input-bound, against two CPU cells (the shape of the
    # SageMaker heterogeneous-cluster comparison).
    report = {"machine": {"cpu": "x", "cores": 2}, "data": {"rows": 1}, "budget": 1000, "repeats": 1,
              "train_examples": 45_840_617,
              "cells": [recorded("gpu", 90_000, 0.55, "ml.p3.2xlarge"),
                        recorded("cpu-1", 50_000, 0.04),
                        recorded("cpu-2hosts", 60_000, 0.06, hosts=2, mode="allreduce"),
                        {"cell": {**DEFAULTS, "name": "broken"}, "error": "exit 2"}]}
    rec = write_report(report, PRICES, tmp_path)
    assert rec["fastest"] == "gpu" and rec["fastest_margin"] == pytest.approx(0.5)
    assert rec["cheapest"] == "cpu-1"
    # cpu-1: 0.204 $/h at 50k/s; cpu-2hosts: 0.408 $/h at 60k/s -> 1 - (0.204/50)/(0.408/60)
    assert rec["cheapest_margin"] == pytest.approx(1 - (0.204 / 50_000) / (0.408 / 60_000))
    assert "input-bound (55%" in rec["text"] and "compute-bound" in rec["text"]
    md = (tmp_path / "matrix.md").read_text()
    assert md.index("| 1 | gpu |") < md.index("| 2 | cpu-2hosts |") < md.index("| 3 | cpu-1 |")
    assert "broken: exit 2" in md
    assert (tmp_path / "matrix.csv").read_text().count("\n") == 5
    assert (tmp_path / "matrix-throughput.png").stat().st_size > 1000
    assert (tmp_path / "matrix-time.png").stat().st_size > 1000


def test_matrix_cells_from_axes_and_lists():
    m = load_matrix(text="defaults: {batch_size: 512}\ncells: [{name: a}]\n"
                         "axes: {mode: [single, allreduce], cache: [false, true]}\n")
    cells = expand_cells(m)
    assert [c["name"] for c in cells] == ["a", "mode=single,cache=False", "mode=single,cache=True",
                                          "mode=allreduce,cache=False", "mode=allreduce,cache=True"]
    assert all(c["batch_size"] == 512 for c in cells)
    with pytest.raises(ConfigError, match="unknown settings"):
        expand_cells({"cells": [{"name": "x", "colour": 1}]})
    assert mode_cells(["allreduce+data_service:sparse_reduce=dense"]) == [
        {"name": "allreduce+data_service:sparse_reduce=dense", "mode": "allreduce",
         "data_service": True, "hosts": 2, "sparse_reduce": "dense"}]


@pytest.mark.slow
def test_tiny_matrix_end_to_end(tmp_path):
    (tmp_path / "m.yaml").write_text(
        "data: {rows: 12000, feature_size: 2000}\nbudget: 7680\n"
        "defaults: {batch_size: 256}\n"
        "cells:\n  - {name: single}\n  - {name: allreduce-2, mode: allreduce, hosts: 2}\n"
        "  - {name: pipe, input_mode: Pipe}\n  - {name: pipe-cache, input_mode: Pipe, cache: true}\n")
    # Without the suite's pool (conftest): the matrix keeps its own for its cells' launches.
    run_cli("bench", "matrix", tmp_path / "m.yaml", "--work-dir", tmp_path / "work",
            "--out", tmp_path / "report", timeout=900, env={"CTRTRAIN_FORK_POOL": None})
    for name in ("single", "allreduce-2"):
        log = tmp_path / "work" / "cells" / name / "logs" / "fork-server.log"
        assert "forked by the pool" in log.read_text(), name
    rep = json.loads((tmp_path / "report" / "matrix.json").read_text())
    cells = {c["cell"]["name"]: c for c in rep["cells"]}
    assert cells["single"]["examples_per_s"] > 0 and cells["single"]["steps"] == 30
    assert cells["allreduce-2"]["global_batch"] == 512 and cells["allreduce-2"]["steps"] == 15
    for name in ("single", "allreduce-2", "pipe"):
        c = cells[name]
        assert 0.5 < c["auc"] < 1 and c["peak_rss_mb"] > 100
        assert all(0 < u < 3 for u in c["cpu_util"].values()), c["cpu_util"]
    assert len(cells["allreduce-2"]["processes"]) == 2
    assert cells["pipe"]["steps"] == 30 and 0.5 < cells["pipe"]["auc"] < 1
    # A failing cell is recorded with the process's own message; the matrix goes on.
    assert "cache: a Pipe channel streams every epoch anew" in cells["pipe-cache"]["error"]
    assert rep["recommendation"]["fastest"] in ("single", "allreduce-2", "pipe")
    for f in ("matrix.csv", "matrix.md", "matrix-throughput.png", "matrix-time.png"):
        assert (tmp_path / "report" / f).exists()


@pytest.mark.slow
def test_tune_writes_settings_that_training_uses(tmp_path, monkeypatch):
    from trainutil import make_synth
    make_synth(tmp_path / "d", rows=12_000, feature_size=2_000)
    tuned = tmp_path / "tuned.json"
    # On one core of this host (as a 1-core machine is): its grid is the smallest (one intra-op
    # choice), and the other test worker keeps the other core.
    cores = {min(os.sched_getaffinity(0))}
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", "tune", "--data",
                        tmp_path / "d" / "tf" / "train", "--steps", "15", "--out", tuned,
                        "--repeats", "1"], capture_output=True, text=True, timeout=900,
                       preexec_fn=lambda: os.sched_setaffinity(0, cores))
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads(tuned.read_text())
    s = rec["settings"]
    intra_choices = len({len(cores), max(1, len(cores) // 2)})
    assert len(rec["tried"]) == intra_choices * 3 + 2   # threads grid, then 2 other batch sizes
    assert max(t["examples_per_s"] for t in rec["tried"]) == rec["examples_per_s"]
    assert rec["repeats"] == 1 and all(len(t["runs"]) == 1 for t in rec["tried"])
    # Picked up by `ctrtrain train` when no flag says otherwise: the threads, and the batch
    # size on a table large enough for speed to rule (this one, 12,000 rows, trains at the
    # small tables' batch; train/config.py table_scale).
    run_cli("train", "--train", tmp_path / "d" / "tf" / "train", "--model-dir", tmp_path / "m",
            "--steps", "3", "--no-export", env={"CTRTRAIN_TUNED": str(tuned)})
    start = next(json.loads(line) for line in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()
                 if '"start"' in line)
    assert start["threads"]["intra_op"] == s["intra_op_threads"]
    assert start["threads"]["inter_op"] == s["inter_op_threads"]
    cfg = json.loads((tmp_path / "m" / "train_config.json").read_text())
    assert cfg["batch_size"] == 256
    monkeypatch.setenv("CTRTRAIN_TUNED", str(tuned))
    from ctrtrain.train.config import table_scale
    assert table_scale(102_400) == {"batch_size": s["batch_size"], "embedding_size": 16}
    assert table_scale(102_399) == {"batch_size": 256, "embedding_size": 4}
    assert table_scale(100) == {"batch_size": 100, "embedding_size": 4}   # one batch of all


def deepctr_python() -> str | None:
    """DeepCTR's environment (scripts/deepctr_env.sh; the test command builds it and names it
    in CTRTRAIN_DEEPCTR_PYTHON, so there the peer's run is required, not skipped)."""
    return os.environ.get("CTRTRAIN_DEEPCTR_PYTHON") or None


def test_a_quality_variant_may_carry_several_settings():
    """--variants: commas part the runs, and the settings of one run (key=value after its
    `:`), as `ctrtrain bench quality --help` shows."""
    from ctrtrain.bench.quality import split_variants, variant_settings
    runs = split_variants("auto,catchup:adam_epsilon=1e-8,output_bias=zero,dense:cache=true")
    assert runs == ["auto", "catchup:adam_epsilon=1e-8,output_bias=zero", "dense:cache=true"]
    assert variant_settings(runs[1]) == {"table_updates": "catchup", "adam_epsilon": 1e-8,
                                         "output_bias": "zero"}
    with pytest.raises(ConfigError, match="not_a_setting"):
        variant_settings(split_variants("auto:cache=true,not_a_setting=1")[0])


def test_the_suite_summary_holds_each_protocol_against_deepctrs_bar(tmp_path):
    """bench quality over several sets with DeepCTR and seeds: per variant and protocol (the
    best validation epoch; the last epoch), the mean difference to DeepCTR over the sets and
    the sets below DeepCTR's mean minus its standard error. --suite names only known sets,
    and --numeric-transform and --buckets only with it."""
    from ctrtrain.bench.quality import format_suite, suite_summary

    def runs(*aucs):
        return {"test_auc": sum(aucs) / len(aucs), "se": 0.001, "runs": list(aucs)}
    report = {"sets": {
        "a": {"over_seeds": {"ctrtrain auto": runs(0.75), "deepctr": runs(0.74)},
              "over_seeds_last": {"ctrtrain auto": runs(0.73), "deepctr": runs(0.74)}},
        "b": {"over_seeds": {"ctrtrain auto": runs(0.70), "deepctr": runs(0.7005)},
              "over_seeds_last": {"ctrtrain auto": runs(0.70), "deepctr": runs(0.70)}},
        "c": {"over_seeds": {"ctrtrain auto": runs(0.6)}}}}      # no peer: not counted
    suite = suite_summary(report)
    best, last = suite["best valid epoch"]["ctrtrain auto"], suite["last epoch"]["ctrtrain auto"]
    assert best == {"mean_minus_deepctr": pytest.approx(0.00475), "below_bar": [], "sets": 2}
    assert last == {"mean_minus_deepctr": pytest.approx(-0.005), "below_bar": ["a"], "sets": 2}
    assert "| last epoch | ctrtrain auto | -0.0050 (2 sets) | a |" in format_suite(suite)
    code, _, err = cli("bench", "quality", "--suite", "bank,nope", "--work-dir", tmp_path)
    assert code == 2 and "--suite: no set nope" in err
    code, _, err = cli("bench", "quality", "--numeric-transform", "standard", "--work-dir",
                       tmp_path)
    assert code == 2 and "--numeric-transform and --buckets apply to the --suite sets" in err
    code, _, err = cli("bench", "quality", "--buckets", "8", "--work-dir", tmp_path)
    assert code == 2 and "apply to the --suite sets" in err
    assert not (tmp_path / "sets").exists()


@pytest.mark.slow
def test_bench_quality_runs_every_variant_and_deepctr(tmp_path):
    """The quality benchmark end to end on a small long-tailed set: ctrtrain's catchup and
    dense reference per epoch, and the real DeepCTR 0.9.4 from its own environment."""
    ctrtrain_here("data", "synth", "--out", tmp_path / "d", "--rows", "8000", "--feature-size", "4000",
                  "--zipf", "0.7", "--processes", "1")
    peer = deepctr_python()
    if peer is None and os.environ.get("CTRTRAIN_REQUIRE_DEEPCTR"):
        pytest.fail("CTRTRAIN_REQUIRE_DEEPCTR is set but CTRTRAIN_DEEPCTR_PYTHON is not")
    # A set smaller than one batch of the protocol (1024) is refused before any run, naming
    # it: not an hour into a suite, with the sets before it lost.
    ctrtrain_here("data", "synth", "--out", tmp_path / "t", "--rows", "600", "--feature-size", "500")
    code, _, err = cli("bench", "quality", "--data", f"small={tmp_path / 'd'}", "--data",
                       f"tiny={tmp_path / 't'}", "--epochs", "1", "--work-dir", tmp_path / "w0",
                       "--json", tmp_path / "q0.json")
    assert code == 2 and "tiny: its training split has 480 records" in err, err
    assert not (tmp_path / "q0.json").exists() and not (tmp_path / "w0" / "arrays").exists()
    args = ["bench", "quality", "--data", f"small={tmp_path / 'd'}", "--epochs", "2",
            "--variants", "auto,catchup,dense", "--batch-size", "256", "--work-dir", tmp_path / "w",
            "--json", tmp_path / "q.json"]
    r = run_cli(*args, *(["--deepctr-python", peer] if peer else []), timeout=1200)
    report = json.loads((tmp_path / "q.json").read_text())
    assert report["complete"] is True
    runs = report["sets"]["small"]["runs"]
    assert set(runs) == ({"ctrtrain auto", "ctrtrain catchup", "ctrtrain dense"}
                         | ({"deepctr"} if peer else set()))
    # The default on a 4,000-row table is the dense update itself: the same run.
    assert runs["ctrtrain auto"][-1]["table_updates"] == "dense"
    assert runs["ctrtrain catchup"][-1]["table_updates"] == "catchup"
    for a, b in zip(runs["ctrtrain auto"], runs["ctrtrain dense"]):
        assert a["test"] == pytest.approx(b["test"], abs=1e-6), (a, b)
    for name, epochs in runs.items():
        assert [e["epoch"] for e in epochs] == [1, 2], name
        for e in epochs:
            for split in ("valid", "test"):
                assert 0.0 <= e[split]["auc"] <= 1.0 and 0 < e[split]["logloss"] < 5, (name, e)
    if peer:    # DeepCTR takes the fixed schema's 13 numeric columns as its users do: DenseFeat
        assert {(e["numeric_as"], e["numeric_columns"]) for e in runs["deepctr"]} == {("dense", 13)}
    # catchup is the dense update's result: the same model to float noise, so the same AUC.
    for a, b in zip(runs["ctrtrain catchup"], runs["ctrtrain dense"]):
        assert abs(a["test"]["auc"] - b["test"]["auc"]) < 0.003, (a, b)
        assert a["test"]["auc"] > 0.6
    assert "| epoch |" in r.stdout
    # Each run's figures as it ends (a suite stopped part-way still says what it measured).
    for label, epochs in runs.items():
        best = max(epochs, key=lambda e: e["valid"]["auc"])
        assert (f"[small] {label} deepfm seed 0: test AUC {best['test']['auc']:.4f} at the best "
                f"validation epoch ({best['epoch']}), {epochs[-1]['test']['auc']:.4f} at the last "
                "(2)") in r.stdout, r.stdout[-3000:]


@pytest.mark.slow
def test_bench_quality_din_on_declared_fields_and_deepctr(tmp_path):
    """DIN in the quality benchmark: ctrtrain's and DeepCTR 0.9.4's on the same declared
    fields (numeric, categorical, a bag and a history), the target named by the variant's
    setting (synth's history S1 names none) and passed on to DeepCTR's run. The defaults
    protocol: each trainer with its own defaults (ctrtrain train's embedding 16 and L2 1e-6;
    DeepCTR's SparseFeat width 4), the batch given to both."""
    ctrtrain_here("data", "synth", "--out", tmp_path / "d", "--rows", "6000", "--feature-size",
                  "2000", "--categorical-fields", "5", "--multi-hot-fields", "1",
                  "--multi-hot-len", "3", "--multi-hot-vocab", "200", "--sequence-fields", "1",
                  "--sequence-len", "3", "--processes", "1")
    peer = deepctr_python()
    if peer is None and os.environ.get("CTRTRAIN_REQUIRE_DEEPCTR"):
        pytest.fail("CTRTRAIN_REQUIRE_DEEPCTR is set but CTRTRAIN_DEEPCTR_PYTHON is not")
    run_cli("bench", "quality", "--model", "din", "--data", f"small={tmp_path / 'd'}",
            "--epochs", "1", "--variants", "auto:din_target=C1", "--batch-size", "256",
            "--seeds", "2", "--protocol", "defaults", "--work-dir", tmp_path / "w", "--json",
            tmp_path / "q.json", *(["--deepctr-python", peer] if peer else []), timeout=900)
    small = json.loads((tmp_path / "q.json").read_text())["sets"]["small"]
    assert (tmp_path / "q.png").stat().st_size > 10_000      # the curves beside the report
    runs = small["runs"]
    assert set(runs) == {"ctrtrain auto:din_target=C1"} | ({"deepctr"} if peer else set())
    from ctrtrain.train.config import TrainConfig
    assert runs["ctrtrain auto:din_target=C1"][-1]["settings"] == {
        "embedding_size": 4, "deep_layers": list(TrainConfig.deep_layers),   # auto, small set
        "dropout": TrainConfig.dropout, "l2_reg": TrainConfig.l2_reg,
        "learning_rate": TrainConfig.learning_rate, "batch_size": 256}
    # --seeds 2: each trainer twice, seeds 0 and 1, different initial values: different AUCs;
    # their mean with its standard error, and the difference to DeepCTR's.
    for name, means in small["over_seeds"].items():
        seeds = small["seeds"][name]
        assert [s["seed"] for s in seeds] == [0, 1] and seeds[0]["epochs"] == runs[name], name
        aucs = [s["epochs"][0]["test"]["auc"] for s in seeds]
        assert means["runs"] == aucs and aucs[0] != aucs[1], name
        assert means["test_auc"] == pytest.approx(sum(aucs) / 2)
        assert means["se"] == pytest.approx(abs(aucs[0] - aucs[1]) / 2)
    if peer:
        d = small["minus_deepctr"]["ctrtrain auto:din_target=C1"]
        assert d["test_auc"] == pytest.approx(small["over_seeds"]["ctrtrain auto:din_target=C1"]
                                              ["test_auc"] - small["over_seeds"]["deepctr"]["test_auc"])
    for name, epochs in runs.items():
        assert [e["epoch"] for e in epochs] == [1], name
        assert all(0 < e[s]["auc"] < 1 for e in epochs for s in ("valid", "test")), name
    if peer:    # DeepCTR's DIN saw the declared fields, the history weighed against C1 (s0)
        assert (runs["deepctr"][0]["protocol"], runs["deepctr"][0]["embedding_dim"]) == \
            ("defaults", 4)
        columns = runs["deepctr"][0]["columns"]
        assert columns["C1"] == "SparseFeat s0" and columns["I1"] == "DenseFeat d0"
        assert columns["M1"].startswith("VarLenSparseFeat b")
        assert columns["S1"] == "VarLenSparseFeat hist_s0"


@pytest.mark.slow
def test_bench_quality_gives_deepctr_numeric_columns_as_ctrtrain_takes_them(tmp_path, shared):
    """--peer-numeric scaled: DeepCTR's run takes Criteo's 13 numeric columns as scaled
    embeddings (ctrtrain's model), not as DenseFeat values; it trains and is evaluated. (The
    default, dense, is test_bench_quality_runs_every_variant_and_deepctr's.)"""
    peer = deepctr_python()
    if peer is None:
        if os.environ.get("CTRTRAIN_REQUIRE_DEEPCTR"):
            pytest.fail("CTRTRAIN_REQUIRE_DEEPCTR is set but CTRTRAIN_DEEPCTR_PYTHON is not")
        pytest.skip("no DeepCTR environment (scripts/deepctr_env.sh)")
    ctrtrain_here("data", "split", shared / "criteo_head1000" / "train.txt", "--out", tmp_path / "raw")
    ctrtrain_here("data", "featurize", tmp_path / "raw" / "train.txt", "--out", tmp_path / "d" / "train",
                  "--min-count", "2")
    for split in ("valid", "test"):
        ctrtrain_here("data", "featurize", tmp_path / "raw" / f"{split}.txt", "--out",
                      tmp_path / "d" / split, "--vocab", tmp_path / "d" / "train" / "vocab.json")
    run_cli("bench", "quality", "--data", f"c={tmp_path / 'd'}", "--epochs", "2",
            "--batch-size", "32", "--variants", "auto", "--peer-numeric", "scaled",
            "--deepctr-python", peer, "--work-dir", tmp_path / "w",
            "--json", tmp_path / "scaled.json", timeout=900)
    last = json.loads((tmp_path / "scaled.json").read_text())["sets"]["c"]["runs"]["deepctr"][-1]
    assert last["numeric_as"] == "scaled" and last["numeric_columns"] == 13, last
    assert 0.5 < last["test"]["auc"] <= 1.0, last


def weighted_libffm_set(root: Path) -> Path:
    """Train, valid and test splits (400, 100, 100 rows) of libffm text converted as a user
    converts them (`data convert`, valid and test --like train): f0 holds ids 1 and 2 in every
    row, id 1 weighted w in [0.2, 2] and id 2 weighted 1 (a weighted multi_hot bag), and a row
    clicks where w > 1.1: its label is a function of f0's weights alone. f1 is one id of 10-59
    (categorical), f2 0 to 2 ids of 60-99 of weight 1 (an unweighted bag)."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for split, n in (("train", 400), ("valid", 100), ("test", 100)):
        lines = []
        for _ in range(n):
            w = rng.uniform(0.2, 2.0)
            bag = rng.choice(np.arange(60, 100), rng.integers(0, 3), replace=False)
            pairs = [f"0:1:{w:.4f}", "0:2:1", f"1:{rng.integers(10, 60)}:1",
                     *(f"2:{i}:1" for i in bag)]
            lines.append(f"{int(w > 1.1)} " + " ".join(pairs) + "\n")
        (root / f"{split}.txt").write_text("".join(lines))
    ctrtrain_here("data", "convert", root / "train.txt", "--out", root / "train",
                  "--feature-size", 100, "--processes", 1)
    for split in ("valid", "test"):
        ctrtrain_here("data", "convert", root / f"{split}.txt", "--out", root / split,
                      "--like", root / "train", "--processes", 1)
    return root


def test_bench_quality_refuses_what_deepctrs_runner_cannot_feed_before_any_run(tmp_path):
    """DeepCTR's runner feeds a weighted bag its weights (DeepCTR's weight input, pooled by
    sum): as they are for a `sum` bag, divided by their sum for a `mean` one (ctrtrain's
    weighted mean; an empty bag pools to 0). What it cannot feed (a sqrtn bag, a low-rank
    DCN-v2) `bench quality` refuses before its first run, naming the set, with nothing written;
    its check is the runner's own, which ctrtrain imports without taking DeepCTR's Keras."""
    keras = os.environ.get("TF_USE_LEGACY_KERAS")
    from ctrtrain.bench.deepctr_runner import fed_weights, unfed
    assert os.environ.get("TF_USE_LEGACY_KERAS") == keras
    w = np.array([[0.5, 1.5, 0.0], [0.0, 0.0, 0.0]], np.float32)    # 0-padded; an empty bag
    assert fed_weights(w, "sum").shape == (2, 3, 1)
    assert fed_weights(w, "sum")[..., 0].tolist() == w.tolist()
    assert fed_weights(w, "mean")[..., 0].tolist() == [[0.25, 0.75, 0.0], [0.0, 0.0, 0.0]]
    bag = {"name": "f0", "kind": "multi_hot", "max_len": 3, "pooling": "sum", "weighted": True}
    assert unfed({"model": "deepfm"}, [bag]) is None
    assert unfed({"model": "deepfm"}, [{**bag, "pooling": "mean"}]) is None
    assert unfed({"model": "deepfm"}, [{**bag, "pooling": "sqrtn"}]) == \
        "f0: DeepCTR has no sqrtn pooling (sum, mean)"

    root = weighted_libffm_set(tmp_path / "ffm")
    odd = tmp_path / "odd"      # the same rows, f2 declared sqrtn
    shutil.copytree(root, odd)
    for split in ("train", "valid", "test"):
        m = json.loads((odd / split / "manifest.json").read_text())
        m["fields"][2]["pooling"] = "sqrtn"
        (odd / split / "manifest.json").write_text(json.dumps(m))
    common = ("bench", "quality", "--epochs", 1, "--batch-size", 32, "--deepctr-python",
              tmp_path / "never-started", "--work-dir", tmp_path / "w", "--json",
              tmp_path / "q.json")
    code, _, err = cli(*common, "--variants", "auto", "--data", f"ffm={root}",
                       "--data", f"odd={odd}")
    assert code == 2 and "odd: --deepctr-python: f2: DeepCTR has no sqrtn pooling" in err, err
    code, _, err = cli(*common, "--model", "dcn_v2", "--variants", "auto:cross_rank=4",
                       "--data", f"ffm={root}")
    assert code == 2 and "ffm: --deepctr-python: DeepCTR's DCN is parallel and full rank" in err
    assert not (tmp_path / "q.json").exists() and not (tmp_path / "w" / "arrays").exists()


@pytest.mark.slow
def test_deepctr_pools_a_weighted_bag_with_its_weights(tmp_path):
    """DeepCTR's runner on a converted libffm set: the weighted bag f0 a VarLenSparseFeat fed
    its weights, pooled by sum as ctrtrain pools it, the unweighted bag f2 without weights.
    f0's ids are the same in every row and the label a function of its weights alone: only a
    model fed the weights ranks the test rows (here 0.97-0.99 after 2 epochs over 3 runs; fed
    the ids alone, 0.47)."""
    peer = deepctr_python()
    if peer is None:
        if os.environ.get("CTRTRAIN_REQUIRE_DEEPCTR"):
            pytest.fail("CTRTRAIN_REQUIRE_DEEPCTR is set but CTRTRAIN_DEEPCTR_PYTHON is not")
        pytest.skip("no DeepCTR environment (scripts/deepctr_env.sh)")
    from ctrtrain.bench import quality
    from ctrtrain.bench.runner import run_json
    root = weighted_libffm_set(tmp_path / "ffm")
    params = {"model": "deepfm", "options": {}, "protocol": "sample", "embedding_size": 4,
              "deep_layers": [16], "dropout": 0.0, "l2": 0.0, "learning_rate": 0.05,
              "batch_size": 32, "epochs": 2, "seed": 0, "feature_size": 100}
    for split in ("train", "valid", "test"):
        params[split] = str(quality.export_arrays(str(root / split), tmp_path / f"{split}.npz"))
    train = np.load(params["train"])
    assert train["bag_weights"].shape == train["bag_ids"].shape == (400, 4)   # f0 2, f2 2
    runner = Path(quality.__file__).with_name("deepctr_runner.py")
    last = run_json([peer, str(runner), json.dumps(params)], "DeepCTR", timeout=600)[-1]
    assert last["columns"] == {"f0": "VarLenSparseFeat b0", "f1": "SparseFeat s0",
                               "f2": "VarLenSparseFeat b2"}, last
    assert last["bags"] == {"f0": {"column": "b0", "pooled": "sum", "weights": "b0_w, as given"},
                            "f2": {"column": "b2", "pooled": "sum", "weights": None}}, last
    assert last["test"]["auc"] > 0.9, last
