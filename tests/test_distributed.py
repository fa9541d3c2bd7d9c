"""DeepFM through `ctrtrain launch` with the example specs, on synthesized data of the fixed
schema: parameter servers (the table sharded, the input from a data-service group) within
0.005 AUC of single-process training that saw the same examples, all-reduce over uneven
shards, and no process outliving the job (the default parameter-server topology, the service
on the training hosts, is test_faults.py's). Real processes talking over localhost. The
synchronous modes' comparisons with one process (all-reduce with either sparse reduction,
mirrored, all-reduce fed by tf.data service, Horovod) run on declared fields
(test_fields.py), the multi-process trainers with every model in test_models.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_launch import alive, spec_from_example
from trainutil import made_once

ROOT = Path(__file__).resolve().parents[1]
HVD_PYTHON = ROOT / ".venv-hvd" / "bin" / "python"
AUC_TOLERANCE = 0.005


DATA = {"rows": 40_000, "feature_size": 2_000, "seed": 3}


@pytest.fixture(scope="module")
def data(synth_data):
    return synth_data(**DATA)[0] / "tf"


def channels(data, sharded=False):
    return {"training": {"path": str(data / "train"),
                         "distribution": "ShardedByS3Key" if sharded else "FullyReplicated"},
            "test": {"path": str(data / "test")}}


def hvd_python() -> Path:
    """.venv-hvd's python (TF 2.15: Horovod, tf.estimator); the test is skipped without it,
    or fails where CTRTRAIN_REQUIRE_HOROVOD says the environment must be there (CI)."""
    if not HVD_PYTHON.exists():
        if os.environ.get("CTRTRAIN_REQUIRE_HOROVOD"):
            pytest.fail(f"{HVD_PYTHON} is missing: run scripts/horovod_env.sh")
        pytest.skip("no .venv-hvd (TF 2.15, Horovod; scripts/horovod_env.sh builds it; CI does)")
    return HVD_PYTHON


def launch(tmp_path, example, data, python=sys.executable, sharded=False, runs=None, **over):
    """(result.json, job.json, the launch's stdout) of EXAMPLE's job on DATA. With RUNS
    ({name: settings}) the job's entry is tests/jobs/train_each_model.py, whose processes
    train each run in turn, and the first is its runs.json ({name: {result, start, export}})."""
    over.setdefault("channels", channels(data, sharded))
    if "hyperparameters" in over:   # this file's tolerances, and the parameter servers' table
        # sharding (a table of at least MIN_SHARD_BYTES), were set at width 16, not the width
        # `auto` gives its small sets
        over["hyperparameters"] = {"embedding_size": 16, **over["hyperparameters"]}
    if runs is not None:
        over["entry_point"] = {"script": str(ROOT / "tests" / "jobs" / "train_each_model.py")}
        over["hyperparameters"] = {"runs": json.dumps(runs)}
    spec = spec_from_example(tmp_path, example, **over)
    r = subprocess.run([str(python), "-m", "ctrtrain.cli", "launch", str(spec)], capture_output=True,
                       text=True, timeout=900, env={**os.environ, "CTRTRAIN_NO_PROGRESS": "1"})
    assert r.returncode == 0, f"{example} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    run = tmp_path / "run"
    assert alive(run)[1] == []  # nothing left running
    result = json.loads((run / "model" / ("runs.json" if runs else "result.json")).read_text())
    return result, json.loads((run / "job.json").read_text()), r.stdout


class SingleBaselines(dict):
    """Single-process runs on DATA by (global batch, epochs), each trained on first use and
    shared by this file and test_faults.py (conftest's `single` fixture), once per session."""

    def __init__(self, data: Path, tmp_path_factory):
        super().__init__()
        self.data, self.factory = data, tmp_path_factory

    def __missing__(self, key):
        batch, epochs = key
        self[key] = made_once(self.factory, f"single{batch}x{epochs}",
                              lambda d: self._baseline(d, batch, epochs))[1]
        return self[key]

    def _baseline(self, directory: Path, batch: int, epochs: int) -> dict:
        """`ctrtrain train` in this process, as the deepfm-single example's job would train
        (its learning rate, this file's embedding width): what one process learns does not
        depend on a launch around it (test_fields.py holds the recipe on a host to the command)."""
        from conftest import ctrtrain_here
        args = ["--train", self.data / "train", "--test", self.data / "test", "--epochs", epochs,
                "--batch-size", batch, "--embedding-size", 16, "--learning-rate", 0.001]
        if (batch, epochs) != PS_BASELINE:
            ctrtrain_here("train", *args, "--model-dir", directory / "model")
            return json.loads((directory / "model" / "result.json").read_text())
        # Parameter servers update the table sparsely (table_updates auto: catchup); their
        # baseline does the same, so that the comparison is of the asynchrony alone. Their
        # runs are not repeatable (asynchronous updates), and one seed's single-process AUC on
        # this set moves by up to 0.003 with the shuffling alone (seeds 0-2: 0.7847, 0.7860,
        # 0.7873): they are compared with the mean of three seeds.
        runs = []
        for seed in range(3):
            md = directory / f"s{seed}"
            ctrtrain_here("train", *args, "--table-updates", "catchup", "--seed", seed,
                          "--model-dir", md)
            runs.append(json.loads((md / "result.json").read_text()))
        mean = sum(r["test"]["auc"] for r in runs) / len(runs)
        return {**runs[0], "test": {**runs[0]["test"], "auc": mean}}


def assert_like_single(r, base, steps=None):
    assert r["step"] == (steps or base["step"])
    assert abs(r["test"]["auc"] - base["test"]["auc"]) < AUC_TOLERANCE, (r["test"], base["test"])


@pytest.mark.slow
def test_allreduce_uneven_shards_run_equal_steps(tmp_path, data):
    # 4 files by S3 key over 3 hosts: 2, 1, 1 files (8k, 4k, 4k... records): the ranks must
    # still agree on the step count, or the job would hang in a collective.
    # With catchup named: on this small table the default (auto) is dense, and catchup's
    # per-row counters must work under all-reduce too.
    r, job, out = launch(tmp_path, "deepfm-allreduce", data, sharded=True,
                         hyperparameters={"epochs": 1, "batch_size": 128,
                                          "table_updates": "catchup"},
                         instance_groups=[{"name": "train", "hosts": 3, "processes_per_host": 1}])
    assert "do not divide evenly" in out
    assert r["global_batch"] == 384 and r["step"] == 32_000 // 384
    assert all(code == 0 for code in job["exit_codes"].values())


@pytest.mark.slow
def test_allreduce_with_cache_holds_each_hosts_part_and_matches_single_process(tmp_path, data,
                                                                               single):
    """`cache` in a job of two hosts (all-reduce, ShardedByS3Key): each process parses its own
    files once and draws them in its own order; the job trains as many steps as one process
    on the whole data (streaming) and ends within the tolerance of its AUC."""
    r, job, _ = launch(tmp_path, "deepfm-allreduce", data, sharded=True,
                       hyperparameters={"epochs": 1, "batch_size": 128, "cache": True},
                       instance_groups=[{"name": "train", "hosts": 2, "processes_per_host": 1}])
    assert all(code == 0 for code in job["exit_codes"].values())
    assert r["global_batch"] == 256
    recorded = json.loads((tmp_path / "run" / "checkpoints" / "train_config.json").read_text())
    assert recorded["cache"] is True
    assert_like_single(r, single[256, 1])


# Asynchronous updates cost quality (stale gradients while the embeddings move fast): with the
# single-process learning rate, 2 workers trailed single-process training by 0.000-0.011 AUC
# over runs on this small set; with half the rate, as the issue allows, by up to 0.006 (one CI
# run in four); with 0.35x it stayed within 0.0024 over 5 runs (docs/cluster.md, docs/benchmarks.md).
PS_HP = {"epochs": 2, "batch_size": 256, "learning_rate": 0.00035}
PS_BASELINE = (256, 2)
# The smallest parameter-server job: one host with the chief, a worker, a server and the input
# service (5 TensorFlow processes, not the example's 8), for tests of what does not depend on
# how many there are (a failure's detection, early stopping).
PS_ONE_HOST = {"instance_groups": [{"name": "train", "hosts": 1, "processes_per_host": 1}]}


@pytest.mark.slow
def test_parameter_servers_shard_the_table_and_match_single_process(tmp_path, data, single):
    """Two workers and two servers, the input from a tf.data service on a data group of its own
    (the default topology, the service on the training hosts, is test_faults.py's)."""
    r, job, out = launch(tmp_path, "deepfm-parameter-server", data, hyperparameters=PS_HP,
                         instance_groups=[{"name": "train", "hosts": 2, "processes_per_host": 1},
                                          {"name": "data", "hosts": 1}],
                         distribution={"mode": "parameter_server", "parameter_servers_per_host": 1,
                                       "data_service": {"group": "data",
                                                        "processing_mode": "distributed_epoch"}})
    assert "parameter-server load" in out
    ps = [v for k, v in r["ps_bytes"].items() if "/job:ps/" in k]
    assert len(ps) == 2 and max(ps) < 1.5 * min(ps)   # the table is split, not on one server
    start = next(json.loads(l) for l in (tmp_path / "run" / "checkpoints" / "metrics.jsonl")
                 .read_text().splitlines() if '"start"' in l)
    assert start["table_shards"] == 2    # a ShardedVariable, one row block per server
    assert_like_single(r, single[256, 2])
    # 2 ps + 2 workers, the input service on the data group only: stopped by the launcher once
    # the chief finished (alive() in launch()).
    roles = sorted((p["group"], p["role"]) for p in job["processes"])
    assert [role for g, role in roles if g == "data"] == ["data_worker", "dispatcher"], roles
    assert [role for g, role in roles if g == "train"] == ["chief", "ps", "ps", "worker", "worker"]
