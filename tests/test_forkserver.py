"""A job's ctrtrain processes are forks of one that imported TensorFlow once (launch/forkserver.py):
each is still the process `python -m MODULE` would be -- its own environment, working
directory, process group, output and exit status -- and anything else starts as a new process.
The jobs of every mode (test_distributed.py, test_models.py, test_faults.py, ...) run their
servers and trainers this way, in simulated hosts' namespaces too."""

import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from ctrtrain.launch import forkserver
from ctrtrain.launch.supervisor import Supervisor

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_pool(monkeypatch):
    """These tests hold a job's own server to what they claim: the suite's pool (conftest)
    out of their way; test_a_pool_... sets its own."""
    monkeypatch.delenv(forkserver.POOL, raising=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _wait_for_line(m, text, timeout=60):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in m.tail):
            return
        assert m.proc.poll() is None, f"{m.label} ended ({m.proc.returncode}): {list(m.tail)}"
        time.sleep(0.1)
    raise AssertionError(f"{m.label} never printed {text!r}: {list(m.tail)}")


@pytest.mark.tf215
def test_forked_processes_keep_their_environment_directory_group_and_exit_status(tmp_path):
    sup = Supervisor(tmp_path / "logs", console=False)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    port = _free_port()
    py = sys.executable
    serving = sup.start("dispatcher", [py, "-m", "ctrtrain.cluster.server"],
                        {**env, "CTRTRAIN_ROLE": "dispatcher", "CTRTRAIN_ADDRESS": f"localhost:{port}"},
                        server=True)
    (tmp_path / "work").mkdir()
    synth = sup.start("synth", [py, "-m", "ctrtrain.cli", "data", "synth", "--out", "made",
                                "--rows", "200", "--feature-size", "2000", "--processes", "1"],
                      env, cwd=str(tmp_path / "work"))
    refused = sup.start("refused", [py, "-m", "ctrtrain.cli", "train", "--no-such-flag"], env)
    # Not ctrtrain's module, or another import-time environment: a new process.
    script = sup.start("script", [py, "-c", "print('a user script')"], env)
    louder = sup.start("louder", [py, "-m", "ctrtrain.cli", "data", "--help"],
                       {**env, "TF_CPP_MIN_LOG_LEVEL": "0"})
    try:
        server = sup.forks.server_pids[0]
        _wait_for_line(serving, f"tf.data service dispatcher on grpc://localhost:{port}")
        assert _parent(serving.proc.pid) == server != os.getpid()
        with open(f"/proc/{serving.proc.pid}/comm") as f:     # named by its role in ps, top
            assert f.read().strip() == "dispatcher"
        assert os.getpgid(serving.proc.pid) == serving.proc.pid     # its own group
        assert synth.proc.wait(timeout=120) == 0, list(synth.tail)
        assert (tmp_path / "work" / "made" / "train").is_dir()       # its working directory
        assert refused.proc.wait(timeout=60) == 2
        assert any("--no-such-flag" in line for line in refused.tail)
        for m in (script, louder):
            assert type(m.proc).__name__ == "Popen" and m.proc.wait(timeout=60) == 0
        assert "a user script" in script.tail
        serving.proc.send_signal(signal.SIGKILL)
        assert serving.proc.wait(timeout=30) == -signal.SIGKILL     # as subprocess says it
    finally:
        sup._teardown()
    assert sup.forks.server_pids == []     # the fork server ended with the job


def test_a_fork_server_that_dies_takes_its_children_and_says_so(tmp_path):
    """Killed, the server's children die with it (PR_SET_PDEATHSIG) and are reported as
    SIGKILLed: the job fails at once instead of waiting on processes nobody can reap."""
    sup = Supervisor(tmp_path / "logs", console=False)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CTRTRAIN_ROLE": "dispatcher",
           "CTRTRAIN_ADDRESS": f"localhost:{_free_port()}"}
    serving = sup.start("dispatcher", [sys.executable, "-m", "ctrtrain.cluster.server"], env,
                        server=True)
    trainer = sup.start("trainer", [sys.executable, "-m", "ctrtrain.cli", "data", "--help"],
                        {**env, "CTRTRAIN_ROLE": ""})
    try:
        _wait_for_line(serving, "tf.data service dispatcher on")
        assert trainer.proc.wait(timeout=60) == 0
        os.kill(sup.forks.server_pids[0], signal.SIGKILL)
        assert serving.proc.wait(timeout=30) == -signal.SIGKILL
        outcome = sup.wait()
        assert not outcome.ok and outcome.reason == "dispatcher exited with status -9"
    finally:
        sup._teardown()
    # Dead within moments (the kernel's SIGKILL on its parent's death): gone, or a zombie until
    # init, its new parent, reaps it.
    import time
    from ctrtrain.launch.supervisor import _state
    deadline = time.monotonic() + 10
    while _state(serving.proc.pid) not in ("gone", "exited") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _state(serving.proc.pid) in ("gone", "exited")


def test_forking_is_off_when_asked(tmp_path):
    sup = Supervisor(tmp_path / "logs", console=False)
    m = sup.start("help", [sys.executable, "-m", "ctrtrain.cli", "data", "--help"],
                  {**os.environ, "CTRTRAIN_FORK_SERVER": "0"})
    try:
        assert type(m.proc).__name__ == "Popen" and m.proc.wait(timeout=60) == 0
        # Nor a framework host's toolkit entry, and nothing under a coverage run (coverage
        # patches new processes only): new processes, no server started.
        entry = [sys.executable, "-m", "sagemaker_training.cli.train"]
        for env in ({**os.environ, "CTRTRAIN_FORK_SERVER": "0"},
                    {**os.environ, "COVERAGE_PROCESS_START": "pyproject.toml"}):
            assert sup.forks.fork(entry, env, None, None) is None
        assert sup.forks.server_pids == []
    finally:
        sup._teardown()


def test_benchmark_runs_are_forked_with_stdout_and_stderr_apart(tmp_path):
    """`bench quality`'s runs (bench/runner.py run_json, fork=True) of ctrtrain's modules fork
    from one server per command, which ends with it: stdout (the JSON results) and stderr (what
    a failure says) on pipes of their own, the exit status, and a time limit that kills the
    run. Runs measured for speed and memory (fork=False) stay new processes."""
    import subprocess
    from ctrtrain.bench import runner
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with runner.forked_runs():
        forks = runner._forks = runner.ForkServer(tmp_path / "forks.log")
        helped = forks.spawn("ctrtrain.cli", ["data", "--help"], env, None, None, stderr=True)
        out, err = helped.communicate(timeout=60)
        assert helped.returncode == 0 and b"usage: ctrtrain data" in out and err == b""
        assert _parent(forks.server_pid) == os.getpid()
        with pytest.raises(RuntimeError, match="(?s)a refused run failed:.*--no-such-flag"):
            runner.run_json([sys.executable, "-m", "ctrtrain.cli", "train", "--no-such-flag"],
                            "a refused run", fork=True)
        assert len(forks._pids) == 2          # forked too, not a new process
        with pytest.raises(RuntimeError, match="(?s)a measured run failed:.*--no-such-flag"):
            runner.run_json([sys.executable, "-m", "ctrtrain.cli", "train", "--no-such-flag"],
                            "a measured run")
        assert len(forks._pids) == 2          # a new process
        # A run past its time limit is killed, as subprocess.run kills it.
        serving = forks.spawn("ctrtrain.cluster.server", [], {
            **env, "CTRTRAIN_ROLE": "dispatcher", "CTRTRAIN_ADDRESS": f"localhost:{_free_port()}"},
            None, None, stderr=True)
        with pytest.raises(subprocess.TimeoutExpired):
            serving.communicate(timeout=3)
        assert serving.returncode == -signal.SIGKILL
        server = forks.server_pid
    assert forks.server_pid is None and runner._forks is None     # ended with the block
    from ctrtrain.launch.supervisor import _state
    assert _state(server) in ("gone", "exited")


def test_the_toolkits_entry_forked_runs_the_script_as_a_new_entry_would(tmp_path):
    """A framework image's host entry (SageMaker's training toolkit, `python -m
    sagemaker_training.cli.train`) forks from a plain server of the image's Python, which
    imported TensorFlow as the toolkit's TensorFlow module does (by this file's path: an image
    need not have ctrtrain). Run on the same /opt/ml tree (SAGEMAKER_BASE_DIR, read as the
    toolkit imports) as a new process and forked: the same command for the user's script, the
    same environment and PYTHONPATH given to it (the toolkit makes it of its own sys.path), the
    script's output, and the exit status."""
    import re
    import subprocess
    ml = tmp_path / "ml"
    (ml / "input" / "config").mkdir(parents=True)
    (ml / "code").mkdir()
    # One write: the toolkit passes on the script's output as it reads it, so print's separate
    # writes of each word may reach the log as lines of their own.
    (ml / "code" / "fit.py").write_text("import os, sys\nsys.stdout.write("
                                        "f\"fit on {os.environ['SM_CURRENT_HOST']} {sys.argv[1:]}\\n\")\n")
    said = "fit on localhost ['--epochs', '2']"
    for name, value in {"hyperparameters": {"sagemaker_program": '"fit.py"', "epochs": "2"},
                        "resourceconfig": {"current_host": "localhost", "hosts": ["localhost"]},
                        "inputdataconfig": {}}.items():
        (ml / "input" / "config" / f"{name}.json").write_text(json.dumps(value))
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": os.environ["HOME"],
           "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "SAGEMAKER_BASE_DIR": str(ml),
           "SAGEMAKER_TRAINING_MODULE": "sagemaker_tensorflow_container.training:main"}
    cmd = [sys.executable, "-m", "sagemaker_training.cli.train"]

    def told(out: str) -> list[str]:
        """The toolkit's own lines but their times, after the script's line once (where it
        falls among them is the toolkit's reader's timing)."""
        lines = [re.sub(r"^\d{4}-\d\d-\d\d [\d:,]+ ", "", line) for line in out.splitlines()
                 if not line.startswith(("WARNING: All log", "I0000"))]
        assert lines.count(said) == 1, out
        return [said] + [line for line in lines if line != said]
    new = subprocess.run(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    sup = Supervisor(tmp_path / "logs", console=False)
    try:
        m = sup.start("algo-1/train", cmd, env, cwd=str(tmp_path))
        server = sup.forks.server_pids[0]
        assert _parent(m.proc.pid) == server
        with open(f"/proc/{server}/cmdline") as f:
            assert f.read().split("\0")[1:4:2] == [
                str(Path(forkserver.__file__).resolve()), "tensorflow"]
        code = m.proc.wait(timeout=120)
        m.pump.join(timeout=30)
    finally:
        sup._teardown()
    forked = (tmp_path / "logs" / "algo-1-train.log").read_text()
    assert code == new.returncode
    assert told(forked) == told(new.stdout), forked


def test_a_pool_forks_each_jobs_server_inside_the_job_which_runs_as_with_its_own(
        tmp_path, synth_data):
    """A pool (launch/forkpool.py) kept by a parent that launches job after job: each job's
    server is a fork of it made in the job's own namespaces (isolation.py: its PID namespace,
    which ends every process with the launcher), and the job trains what it trains with a
    server of its own, to the digit. A launcher killed mid-job takes its job's processes with
    it (the launcher's `nice` and `taskset` were its server's), the pool serves the next job,
    and a job whose import-time environment is not the pool's starts its own server."""
    import re
    import subprocess
    import time
    from ctrtrain.launch.forkpool import ForkPool
    from test_distributed import DATA, channels
    from test_launch import alive, spec_from_example
    data = synth_data(**DATA)[0] / "tf"
    hp = {"steps": 12, "batch_size": 256, "embedding_size": 8, "log_every": 4}

    def launch(name, env, preexec_fn=None, **over):
        (tmp_path / name).mkdir()
        spec = spec_from_example(tmp_path / name, "deepfm-allreduce", channels=channels(data),
                                 hyperparameters={**hp, **over})
        return subprocess.Popen([sys.executable, "-m", "ctrtrain.cli", "launch", str(spec)],
                                env={**os.environ, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)

    def finished(proc, name):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        run = tmp_path / name / "run"
        log = (run / "logs" / "fork-server.log").read_text()
        return json.loads((run / "model" / "result.json").read_text())["test"], log

    with ForkPool() as pool:
        pool.start_for_jobs(wait=120)
        [listening] = pool.pids
        # The launcher killed while its job trains: nothing of the job is left. Run as under
        # `nice -n 3 taskset -c N`: its server takes those on, as a child of it would.
        core = min(os.sched_getaffinity(0))

        def niced_on_one_core():
            os.nice(3)
            os.sched_setaffinity(0, {core})
        killed = launch("killed", pool.environ(), niced_on_one_core, steps=4000)
        run = tmp_path / "killed" / "run"
        deadline = time.monotonic() + 120
        while not list(run.glob("checkpoints/metrics.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(run)[1]
        # Its server is a process of the job's PID namespace (the pid the log gives is that
        # namespace's), so the namespace's end ends it too.
        from ctrtrain.launch.isolation import host_pid
        server = int(re.search(r"pid (\d+), forked by the pool",
                               (run / "logs" / "fork-server.log").read_text())[1])
        server = host_pid(server, (run / "logs" / "pidns").read_text().strip())
        assert server is not None
        assert os.sched_getaffinity(server) == {core}
        assert os.getpriority(os.PRIO_PROCESS, server) == os.getpriority(os.PRIO_PROCESS, 0) + 3
        killed.kill()
        killed.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while alive(run)[1] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(run)[1] == []
        # The pool goes on serving. Another import-time environment (verbose: TensorFlow's
        # log level) starts the job's own server, which trains the same model.
        pooled, log = finished(launch("pooled", pool.environ()), "pooled")
        assert "forked by the pool" in log, log
        assert alive(tmp_path / "pooled" / "run")[1] == []
        own, log = finished(launch("own", {**pool.environ(), "CTRTRAIN_VERBOSE": "1"}), "own")
        assert "forked by the pool" not in log
        assert pooled == own              # the same AUC and log loss, every digit
        assert _parent(listening) == os.getpid()
    from ctrtrain.launch.supervisor import _state
    assert _state(listening) in ("gone", "exited") and not pool.folder.exists()


def test_a_pool_does_not_serve_a_launch_in_other_control_groups(tmp_path):
    """A launcher in control groups other than the pool's (run under `systemd-run`, say) gets
    no server of the pool (which could not put its job where the launcher is): the job
    starts its own, as without a pool."""
    import subprocess
    import uuid
    base = Path("/sys/fs/cgroup/pids")
    group = base / f"ctrtrain-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"no control group can be made here ({e})")
    try:
        # Moved before it runs anything: the process stands for a launcher there.
        try:
            other = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: (
                group / "cgroup.procs").write_text(str(os.getpid())))
        except subprocess.SubprocessError as e:
            pytest.skip(f"no process can be moved into {group} here ({e})")
        try:
            with pytest.raises(OSError, match="other control groups than the pool"):
                forkserver._take_on(other.pid)
            forkserver._take_on(os.getpid())       # the same groups: taken on
        finally:
            other.kill()
            other.wait()
    finally:
        group.rmdir()
