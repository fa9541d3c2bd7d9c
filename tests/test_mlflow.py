"""Experiment tracking in MLflow (issue 56, train/tracking.py): a run trained with `--mlflow`
against a real tracking server, started here on loopback with a SQLite store, is read back
through MlflowClient -- its params are the settings of config.yaml, its metric histories the
log windows and evaluations of metrics.jsonl at their steps, the result's figures, and the
exported model among its artifacts. A server that does not answer is refused before anything
is read or built."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from conftest import cli, ctrtrain_here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(root):
    """`mlflow server` on loopback, a SQLite store and artifacts under `root`; yields its URI
    once /health answers. Its process group is ended at the end."""
    port = free_port()
    log = open(root / "server.log", "w")
    # One worker and no job runner (a huey consumer per job kind, 5 CPU-s more to start):
    # this test needs the REST API only.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        uri = f"http://127.0.0.1:{port}"
        yield proc, uri
    finally:
        # The server's own command forwards SIGTERM to its uvicorn process and waits for it;
        # what is still there after that goes with the group.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def wait_for(proc, uri, root, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("mlflow server did not start:\n"
                                     + (root / "server.log").read_text()[-3000:])
            time.sleep(0.2)


def files(client, run_id, path) -> set[str]:
    """The paths of the files among a run's artifacts under `path`, at any depth."""
    out = set()
    for a in client.list_artifacts(run_id, path):
        out |= files(client, run_id, a.path) if a.is_dir else {a.path}
    return out


def as_param(v) -> str:
    """A config.yaml value as the run's param: a list as the flag takes it, a bool as YAML."""
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v).lower() if isinstance(v, bool) else str(v)


@pytest.mark.slow
def test_a_run_is_tracked_in_a_real_mlflow_server(synth_data, tmp_path):
    data = synth_data(rows=8000, feature_size=4000)[0] / "tf"     # test_tensorboard.py's
    md = tmp_path / "deepfm-small"
    with mlflow_server(tmp_path) as (proc, uri):
        import tensorflow  # noqa: F401  (while the server starts: the two cores overlap)
        wait_for(proc, uri, tmp_path)
        # 6,400 rows in batches of 128: a window every 10 steps, the validation split at 20
        # and at the end, the test split of the model chosen.
        out = ctrtrain_here(
            "train", "--train", data / "train", "--valid", data / "valid", "--test",
            data / "test", "--model-dir", md, "--batch-size", 128, "--steps", 40,
            "--embedding-size", 4, "--deep-layers", "16,8", "--log-every", 10,
            "--eval-every", 20, "--mlflow", uri, "--mlflow-experiment", "issue56")
        assert "mlflow: run deepfm-small (" in out and "in experiment 'issue56'" in out

        from mlflow.tracking import MlflowClient
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("issue56")
        [run] = client.search_runs([exp.experiment_id])
        run_id = run.info.run_id
        assert run.info.run_name == "deepfm-small" and run.info.status == "FINISHED"
        assert run.data.tags["ctrtrain.model_dir"] == str(md.resolve())
        assert run.data.tags["ctrtrain.records"] == "6400"

        # The settings: config.yaml's, section by section, but the tracking's own.
        settings = yaml.safe_load((md / "config.yaml").read_text())
        assert settings["output"]["mlflow"] == uri       # the file re-runs it, tracked
        want = {f"{section}.{k}": as_param(v) for section, values in settings.items()
                for k, v in values.items()
                if v is not None and k not in ("mlflow", "mlflow_experiment")}
        assert run.data.params == want
        assert run.data.params["model.deep_layers"] == "16,8"

        # Each log window's and evaluation's figures at its step, as metrics.jsonl has them.
        events = [json.loads(line) for line in (md / "metrics.jsonl").read_text().splitlines()]

        def history(key):
            return [(m.step, m.value) for m in
                    sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]

        windows = [e for e in events if e["event"] == "train"]
        assert [s for s, _ in history("train_loss")] == [10, 20, 30, 40]
        for key, field in (("train_loss", "loss"), ("train_input_bound", "input_bound")):
            assert history(key) == [(e["step"], pytest.approx(e[field])) for e in windows]
        evals = {}
        for e in events:
            if e["event"] == "eval":       # a step evaluated again is the same model
                evals.setdefault((e["split"], e["step"]), e)
        for split in ("valid", "test"):
            mine = sorted((step, e) for (s, step), e in evals.items() if s == split)
            assert history(f"{split}_auc") == [(step, pytest.approx(e["auc"])) for step, e in mine]
            assert history(f"{split}_loss") == [(step, pytest.approx(e["logloss"]))
                                                for step, e in mine]
        assert [s for s, _ in history("valid_auc")] == [20, 40]
        start = next(e for e in events if e["event"] == "start")
        assert history("learning_rate") == [(0, pytest.approx(start["learning_rate"]))]

        # The result: its figures at the last step, the file and the exported model.
        result = json.loads((md / "result.json").read_text())
        for key, value in (("result.step", 40), ("result.test.auc", result["test"]["auc"]),
                           ("result.valid.logloss", result["valid"]["logloss"]),
                           ("result.selected.step", result["selected"]["step"]),
                           ("result.phases_s.export", result["phases_s"]["export"])):
            assert history(key) == [(40, pytest.approx(value))], key
        assert not any(k.startswith("result.windows") for k in run.data.metrics)
        root = {a.path for a in client.list_artifacts(run_id)}
        assert {"model", "result.json", "config.yaml"} <= root
        export = md / "export" / str(result["selected"]["step"])
        assert files(client, run_id, "model") == {
            "model/" + str(p.relative_to(export)) for p in export.rglob("*") if p.is_file()}
        assert "model/saved_model.pb" in files(client, run_id, "model")


def test_an_unreachable_tracking_server_is_refused_before_anything_starts(tmp_path):
    """Nothing listens at the URI: exit 2 naming it, in seconds, before the data is read
    (there is none here) or the model directory made; the Python API raises the same."""
    uri = f"http://127.0.0.1:{free_port()}"
    t = time.monotonic()
    code, out, err = cli("train", "--train", tmp_path / "no-data", "--model-dir",
                         tmp_path / "m", "--mlflow", uri)
    assert code == 2, (out, err)
    assert f"no tracking server answers at {uri}" in err and "Connection refused" in err
    assert time.monotonic() - t < 10 and not (tmp_path / "m").exists()
    import ctrtrain
    from ctrtrain.errors import ConfigError
    with pytest.raises(ConfigError, match=f"no tracking server answers at {uri}"):
        ctrtrain.train(train=tmp_path / "no-data", model_dir=tmp_path / "m", mlflow=uri)
