"""Faults injected for real into running jobs (SIGKILL, SIGSTOP on real processes of a
`ctrtrain launch`): what each mode survives, and that nothing hangs or stays behind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from test_distributed import AUC_TOLERANCE, PS_HP, channels
from test_launch import alive, spec_from_example


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from trainutil import make_synth
    root = tmp_path_factory.mktemp("fault-data")
    make_synth(root, rows=40_000, feature_size=2_000, seed=3)
    return root / "tf"


@pytest.fixture(scope="module")
def undisturbed(data, tmp_path_factory):
    """Test AUC of undisturbed training by (batch, epochs): single-process runs, which every
    mode matches within 0.005 (test_distributed.py), stand in for undisturbed runs."""
    from test_distributed import launch
    return {(b, e): launch(tmp_path_factory.mktemp(f"undisturbed{b}"), "deepfm-single", data,
                           hyperparameters={"epochs": e, "batch_size": b})[0]["test"]["auc"]
            for b, e in ((256, 2), (512, 2))}


def start(tmp_path, example, data, **over):
    over.setdefault("channels", channels(data))
    spec = spec_from_example(tmp_path, example, **over)
    proc = subprocess.Popen([sys.executable, "-m", "ctrtrain.cli", "launch", str(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CTRTRAIN_NO_PROGRESS": "1"})
    return proc, tmp_path / "run"


def events(run, kind):
    path = run / "checkpoints" / "metrics.jsonl"
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


def wait_for(cond, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        assert proc.poll() is None, f"the job ended before the fault: {proc.communicate()}"
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("timed out waiting for the job")


def pid_of(run, label):
    for line in (run / "logs" / "pids").read_text().splitlines():
        pid, name = line.split(maxsplit=1)
        if name == label:
            return int(pid)
    raise KeyError(label)


def finish(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_parameter_server_job_survives_a_killed_worker(tmp_path, data, undisturbed):
    proc, run = start(tmp_path, "deepfm-parameter-server", data,
                      hyperparameters={**PS_HP, "log_every": 20})
    wait_for(lambda: events(run, "train"), proc)
    os.kill(pid_of(run, "algo-2/worker/1"), signal.SIGKILL)
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    job = json.loads((run / "job.json").read_text())
    assert [t["label"] for t in job["tolerated_failures"]] == ["algo-2/worker/1"]
    assert "tolerated" in out
    r = json.loads((run / "model" / "result.json").read_text())
    # Every scheduled step ran (a step in flight on the dead worker may run twice).
    assert r["step"] >= r["total_steps"] == 250
    assert abs(r["test"]["auc"] - undisturbed[256, 2]) < AUC_TOLERANCE, (r["test"], undisturbed)
    assert alive(run)[1] == []


def test_allreduce_rank_killed_fails_fast_naming_it(tmp_path, data):
    proc, run = start(tmp_path, "deepfm-allreduce", data,
                      hyperparameters={"epochs": 3, "batch_size": 256, "log_every": 5})
    wait_for(lambda: events(run, "train"), proc)
    killed = time.monotonic()
    os.kill(pid_of(run, "algo-2/worker/1"), signal.SIGKILL)
    code, out, err = finish(proc, timeout=120)
    detect = time.monotonic() - killed
    assert code == 2 and "algo-2/worker/1 exited with status -9" in err
    assert detect < 30, detect
    assert alive(run)[1] == []


def test_allreduce_rank_hung_is_torn_down_by_the_watchdog(tmp_path, data):
    proc, run = start(tmp_path, "deepfm-allreduce", data, watchdog=15,
                      hyperparameters={"epochs": 3, "batch_size": 256, "log_every": 5})
    wait_for(lambda: events(run, "train"), proc)
    stopped = time.monotonic()
    os.kill(pid_of(run, "algo-2/worker/1"), signal.SIGSTOP)
    code, out, err = finish(proc, timeout=180)
    detect = time.monotonic() - stopped
    # Whichever notices first names the hung rank: TensorFlow's coordination service (the
    # stopped task misses its heartbeats; the other rank's collective aborts and it exits), or
    # the launcher's watchdog (no output from anyone; /proc says who is stopped).
    assert code == 2
    assert ("stopped sending heartbeats" in err and "/job:worker/replica:0/task:1" in err) or \
        ("no progress for 15 s" in err and "algo-2/worker/1 [stopped]" in err), err[-3000:]
    assert detect < 60, detect
    assert alive(run)[1] == []


def test_chief_killed_then_relaunch_resumes_from_the_last_checkpoint(tmp_path, data, undisturbed):
    hp = {"epochs": 2, "batch_size": 256, "checkpoint_every": 10, "log_every": 5}
    proc, run = start(tmp_path, "deepfm-allreduce", data, hyperparameters=hp)
    wait_for(lambda: [e for e in events(run, "checkpoint") if e["step"] >= 30], proc)
    last_train = max(e["step"] for e in events(run, "train"))
    os.kill(pid_of(run, "algo-1/worker/0"), signal.SIGKILL)
    code, _, err = finish(proc, timeout=120)
    assert code == 2 and "algo-1/worker/0 exited with status -9" in err
    assert alive(run)[1] == []
    spec = tmp_path / "deepfm-allreduce.yaml"
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", "launch", str(spec)], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "CTRTRAIN_NO_PROGRESS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((run / "model" / "result.json").read_text())
    assert result["resumed_from"] >= 30 and last_train - result["resumed_from"] <= 10 + 5
    assert result["step"] == result["total_steps"] == 2 * (32_000 // 512)
    assert abs(result["test"]["auc"] - undisturbed[512, 2]) < AUC_TOLERANCE
    assert alive(run)[1] == []
