"""Launches that must neither lose data, nor kill healthy work, nor hang, nor leave processes
behind, nor silently read the data twice: real `ctrtrain launch` / `ctrtrain run` processes
with real signals."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from test_distributed import channels
from test_faults import events, finish, pid_of, record, start, wait_for
from test_launch import alive, spec_from_example


@pytest.fixture(scope="module")
def data(synth_data):
    return synth_data(rows=20_000, feature_size=2_000)[0] / "tf"


def script_job(tmp_path, body: str, name="job", hosts=1, mode="single", **over) -> Path:
    (tmp_path / f"{name}.py").write_text(body)
    spec = {"name": name, "entry_point": {"script": str(tmp_path / f"{name}.py")},
            "instance_groups": [{"name": "g", "hosts": hosts}], "distribution": mode,
            "output_dir": str(tmp_path / "run"), **over}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def launch_bg(spec, *extra):
    return subprocess.Popen([sys.executable, "-m", "ctrtrain.cli", "launch", str(spec), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_file(path: Path, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not path.exists():
        time.sleep(0.1)
    assert path.exists(), path


# --- the run directory -------------------------------------------------------------------

def test_run_directory_must_be_new_empty_or_this_jobs_and_is_locked(tmp_path):
    spec = script_job(tmp_path, "print('ok')\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "thesis.tex").write_text("years of work")
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2 and "is not empty and is not a ctrtrain run" in r.stderr
    assert (run / "thesis.tex").read_text() == "years of work" and len(list(run.iterdir())) == 1
    # A symlink to anywhere is refused.
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    r = run_cli("launch", spec, "--output-dir", tmp_path / "link", check=False)
    assert r.returncode == 2 and "symbolic link" in r.stderr
    # Another job's run is refused; this job's own is resumed into.
    r = run_cli("launch", spec, "--output-dir", tmp_path / "run2")
    other = script_job(tmp_path, "print('other')\n", name="other")
    r = run_cli("launch", other, "--output-dir", tmp_path / "run2", check=False)
    assert r.returncode == 2 and "holds the run of job 'job'" in r.stderr
    run_cli("launch", spec, "--output-dir", tmp_path / "run2")
    # Two launches into one directory: the second is refused while the first runs.
    # The first job outlives whatever the second launch takes to reach its lock (it is ended
    # by SIGTERM below, not by its own end).
    slow = script_job(tmp_path, "import time\nprint('working', flush=True)\ntime.sleep(600)\n",
                      name="slow", output_dir=str(tmp_path / "run3"))
    first = launch_bg(slow)
    wait_file(tmp_path / "run3" / "logs" / "pids")
    r = run_cli("launch", slow, check=False)
    assert r.returncode == 2 and "another launch is running" in r.stderr
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert alive(tmp_path / "run3")[1] == []


def test_a_symlink_where_the_run_replaces_a_directory_is_refused_by_name(tmp_path):
    """A re-launch replaces its run's `model/`; a symbolic link there (say, to move the model
    to another disk) was refused by shutil.rmtree as "I/O: Cannot call rmtree on a symbolic
    link", naming no path. Refused naming the link; the link and its target left as they are."""
    spec = script_job(tmp_path, "print('ok')\n")
    run_cli("launch", spec)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("the user's")
    model = tmp_path / "run" / "model"
    shutil.rmtree(model)
    os.symlink(elsewhere, model)
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2, r.stderr
    assert f"{model}: is a symbolic link where a directory of ctrtrain's own belongs" \
        in r.stderr, r.stderr
    assert model.is_symlink() and (elsewhere / "notes.txt").read_text() == "the user's"


# --- healthy work is not killed, stuck work is --------------------------------------------

@pytest.mark.slow
@pytest.mark.serial   # a 4 s watchdog: the other worker's load stretched the job's end past it
def test_a_recipe_training_longer_than_its_watchdog_finishes(tmp_path, data):
    # No log window for the whole run (log_every beyond the steps): only the trainer's
    # heartbeat tells the watchdog that it is making progress. Its longest silence on an idle
    # EPYC (the start: TensorFlow's import and the graph's tracing) was over 1.2 s and under
    # 2 s (a 1.2 s watchdog tore the job down, 2 s did not, twice); 6 s leaves three times
    # that, for a loaded machine. After its summary the run beats from a thread through its
    # exit (heartbeat.finishing): on CI a finished run's cleanup was silent for over 4 s.
    # 8,000 steps of batch 64 trained for 25-30 s on the EPYC, but a launch of them took 11.3 s
    # on the Xeon once its job's server came from the suite's fork pool: 12,000 keep the run
    # over twice the watchdog there too.
    hp = {"steps": 12_000, "batch_size": 64, "log_every": 100_000, "checkpoint_every": 0}
    spec = spec_from_example(tmp_path, "deepfm-single", channels=channels(data),
                             hyperparameters=hp, watchdog=6)
    t = time.monotonic()
    run_cli("launch", spec, timeout=600)
    took = time.monotonic() - t
    result = json.loads((tmp_path / "run" / "model" / "result.json").read_text())
    assert result["step"] == 12_000 and took > 12, took  # trained for over twice the watchdog
    record("single: recipe silent for its whole run, watchdog 6 s", job_s=round(took, 1),
           outcome="completed")


@pytest.mark.slow
def test_a_recipe_logs_its_windows_on_the_jobs_console(tmp_path, data):
    """The recipe logs its windows, so a job's console shows progress too (not in the serial
    test above: this launch has no time limit to keep, and the serial part runs alone)."""
    spec = spec_from_example(tmp_path, "deepfm-single", channels=channels(data),
                             hyperparameters={"steps": 40, "batch_size": 64, "log_every": 10})
    r = run_cli("launch", spec)
    assert r.stdout.count("[train] step") == 4


@pytest.mark.slow
def test_a_stopped_parameter_server_fails_the_job_naming_it(tmp_path, data):
    from test_distributed import PS_HP, PS_ONE_HOST
    proc, run = start(tmp_path, "deepfm-parameter-server", data,
                      hyperparameters={**PS_HP, "epochs": 20, "log_every": 5}, **PS_ONE_HOST)
    wait_for(lambda: events(run, "train"), proc)
    sent = time.monotonic()
    os.kill(pid_of(run, "algo-1/ps/0"), signal.SIGSTOP)
    code, out, err = finish(proc, timeout=120)
    took = time.monotonic() - sent
    assert code == 2 and "algo-1/ps/0 has been stopped" in err, err[-3000:]
    assert took < 40, took        # not the watchdog's 600 s
    assert alive(run)[1] == []
    record("parameter_server: a ps SIGSTOPped", detect_s=round(took, 1), outcome="failed fast")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_processes_an_entry_point_detaches_die_with_the_launcher(tmp_path, sig):
    from ctrtrain.launch import isolation
    if not isolation.available("loopback"):
        pytest.skip("no user namespaces on this machine")
    marker = 31337 + int(sig)
    # A daemon the way scripts start them: double fork, own session, parent gone.
    body = ("import os, subprocess, sys, time\n"
            f"subprocess.Popen(['sh', '-c', 'setsid sleep {marker}.5 &'], start_new_session=True)\n"
            "print('started', flush=True)\n"
            "time.sleep(300)\n")
    spec = script_job(tmp_path, body, hosts=2, mode="allreduce")
    proc = launch_bg(spec)

    def daemons():
        # The sleeps alone, not the short-lived `sh -c` that starts them (its command line
        # holds the same words, and while it lives it would count as a third).
        r = subprocess.run(["pgrep", "-f", f"^sleep {marker}\\.5$"], capture_output=True,
                           text=True)
        return r.stdout.split()
    end = time.monotonic() + 60
    while time.monotonic() < end and len(daemons()) != 2:
        time.sleep(0.2)
    assert len(daemons()) == 2
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    sent = time.monotonic()
    end = sent + 15
    while time.monotonic() < end and daemons():
        time.sleep(0.2)
    assert daemons() == []
    record(f"launcher {sig.name}: detached daemons of the entry point",
           gone_after_s=round(time.monotonic() - sent, 1), outcome="none left")
    assert alive(tmp_path / "run")[1] == []


def test_ctrtrain_netns_variable_does_not_skip_isolation(tmp_path):
    from ctrtrain.launch import isolation
    if not isolation.available("loopback"):
        pytest.skip("no user namespaces on this machine")
    spec = script_job(tmp_path, "import json, os, socket\n"
                      "print('IFACES', json.dumps(sorted(n for _, n in socket.if_nameindex())))\n")
    r = run_cli("launch", spec, env={"CTRTRAIN_NETNS": "1"})
    assert 'IFACES ["eth0", "lo"]' in r.stdout   # its simulated host's own network


# --- absurd specs ------------------------------------------------------------------------

def test_absurd_topologies_and_alias_bombs_are_refused_at_once(tmp_path):
    spec = script_job(tmp_path, "print('x')\n", hosts=300, mode="allreduce")
    t = time.monotonic()
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2 and "at most 64" in r.stderr
    assert not (tmp_path / "run").exists()
    # 604 bytes that expand to 10^9 list items if anything formats them.
    bomb = "\n".join(["a: &a [x,x,x,x,x,x,x,x,x,x]"] +
                     [f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]"
                      for p, c in zip("abcdefgh", "bcdefghi")])
    for key in ("hosts", "mode"):
        body = yaml.safe_load((tmp_path / "job.yaml").read_text())
        text = yaml.safe_dump(body)
        if key == "hosts":
            text = text.replace("hosts: 300", "hosts: *i")
        else:
            text = text.replace("distribution: allreduce", "distribution: {mode: *i}")
        (tmp_path / "bomb.yaml").write_text(bomb + "\n" + text)
        r = subprocess.run([sys.executable, "-c",
                            "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, "
                            "(2 << 30, 2 << 30)); from ctrtrain.cli import main; "
                            f"sys.exit(main(['launch', {str(tmp_path / 'bomb.yaml')!r}]))"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "job spec" in r.stderr and len(r.stderr) < 2000, r.stderr[-500:]
    assert time.monotonic() - t < 60
    from ctrtrain.launch.launcher import JobFailed, PortAllocator
    ports = PortAllocator(tries=50)
    ports.used = set(range(65536))      # every port this machine could give is taken
    with pytest.raises(JobFailed, match="no free loopback port after 50 tries"):
        ports.get()


def test_a_pipe_text_file_without_final_newline_is_refused(tmp_path):
    d = tmp_path / "ch"
    d.mkdir()
    (d / "a.libsvm").write_text("1 0:1 1:1\n0 0:1 1:2")       # no newline at the end
    (d / "b.libsvm").write_text("1 0:3 1:1\n")
    spec = script_job(tmp_path, "print('x')\n",
                      channels={"training": {"path": str(d), "input_mode": "Pipe"}})
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2 and "a.libsvm does not end with a newline" in r.stderr


# --- ctrtrain run ------------------------------------------------------------------------

def run_host(tmp_path, data, tf_config, index, *extra):
    """`ctrtrain run` as a TFJob pod would run it: TF_CONFIG, a channel, its own /opt/ml."""
    base = tmp_path / f"host{index}"
    (base / "output").mkdir(parents=True)
    (base / "model").mkdir()
    env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "SM_CHANNEL_TRAINING": str(data / "train"),
           "SM_OUTPUT_DIR": str(base / "output"), "SM_OUTPUT_DATA_DIR": str(base / "output"),
           "SM_MODEL_DIR": str(base / "model"), "CTRTRAIN_NO_PROGRESS": "1"}
    env.pop("CTRTRAIN_MODE", None)
    return subprocess.Popen([sys.executable, "-m", "ctrtrain.cli", "run", "--mode", "allreduce",
                             *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def free_ports(n):
    import socket
    out = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            out.append(s.getsockname()[1])
    return out


@pytest.mark.slow
def test_run_from_tf_config_splits_the_data_between_workers(tmp_path, data):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = [run_host(tmp_path, data, {"cluster": {"worker": workers},
                                       "task": {"type": "worker", "index": i}}, i,
                      "--", "--steps", "20", "--batch_size", "256") for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    shards = sorted(line.split("reading ")[1] for out, _ in outs for line in out.splitlines()
                    if "reading ReadPlan" in line)
    assert len(shards) == 2 and shards[0] != shards[1] and "shard=(2, 0)" in shards[0]
    metrics = (tmp_path / "host0" / "checkpoints" / "metrics.jsonl").read_text().splitlines()
    start_event = next(json.loads(x) for x in metrics if '"start"' in x)
    records = json.loads((data / "train" / "manifest.json").read_text())["records"]
    assert start_event["records"] == records      # each example once per epoch, not twice


@pytest.mark.slow
def test_run_tears_down_when_a_peer_never_starts(tmp_path, data):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    t = time.monotonic()
    proc = run_host(tmp_path, data, {"cluster": {"worker": workers},
                                     "task": {"type": "worker", "index": 0}}, 0,
                    "--watchdog", "6", "--", "--steps", "20")
    out, err = proc.communicate(timeout=300)
    took = time.monotonic() - t
    assert proc.returncode == 2 and took < 120
    # Either ends it: nothing here is healthy work a short watchdog could cut (6 s, not 15: the
    # test waited the whole watchdog out with one core idle).
    assert "no progress for 6 s" in err or "exited with status" in err, err[-2000:]
    record("run: a peer that never starts, --watchdog 6", ended_after_s=round(took, 1),
           by="watchdog" if "no progress" in err else "TensorFlow", outcome="torn down")


def test_run_with_hosts_flags_splits_the_data_like_launch(tmp_path, data):
    """`ctrtrain run --hosts` gives each process the same reader list as the launcher and
    TF_CONFIG paths (process_env), so the plan splits the channel: every file once."""
    from ctrtrain.cluster.process_env import process_env
    from ctrtrain.cluster.run import resolve
    from ctrtrain.environment import Environment
    files = json.loads((data / "train" / "manifest.json").read_text())["files"]
    seen = []
    for i in range(2):
        r = resolve({}, mode="allreduce", hosts=["h0", "h1"], host_index=i, processes_per_host=2)
        for p in r.processes:
            env = {**process_env(p, r.all_processes, 2, mode="allreduce"),
                   "SM_CHANNEL_TRAINING": str(data / "train")}
            plan = Environment(env).read_plan("training")
            n, k = plan.file_shard
            seen += [f["path"] for f in files[k::n]]
    assert sorted(seen) == sorted(f["path"] for f in files)


# --- retries (issue 30) ------------------------------------------------------------------

def dies_until(run: Path, attempts: int, then: str) -> str:
    """A script that SIGKILLs itself on its first `attempts` runs (counted in a file of the
    run directory, which every attempt sees), then runs `then`."""
    return (f"import os, signal\nfrom pathlib import Path\n"
            f"count = Path({str(run / 'attempts.txt')!r})\n"
            f"n = int(count.read_text()) + 1 if count.exists() else 1\n"
            f"count.write_text(str(n))\n"
            f"print('attempt', n, flush=True)\n"
            f"if n <= {attempts}:\n    os.kill(os.getpid(), signal.SIGKILL)\n{then}\n")


def test_a_job_whose_process_dies_is_started_again_up_to_max_retry_attempts(tmp_path):
    run = tmp_path / "run"
    spec = script_job(tmp_path, dies_until(run, 2, "print('done', flush=True)"),
                      max_retry_attempts=2)
    r = run_cli("launch", spec)
    assert r.stdout.count("[launcher] attempt") == 2 and "done" in r.stdout, r.stdout[-3000:]
    job = json.loads((run / "job.json").read_text())
    assert job["ok"] is True and job["state"] == "completed"
    assert [a["attempt"] for a in job["attempts"]] == [1, 2, 3]
    assert all("exited with status -9" in a["cause"] for a in job["attempts"][:2])
    assert job["attempts"][2]["cause"] is None
    assert all({"resumed_from_step", "step_reached", "seconds"} <= set(a) for a in job["attempts"])

    # Attempts run out: the job fails after 1 + max_retry_attempts, each one recorded.
    run2 = tmp_path / "run2"
    spec = script_job(tmp_path, dies_until(run2, 5, ""), name="always",
                      output_dir=str(run2), max_retry_attempts=1)
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2 and "exited with status -9" in r.stderr, r.stderr[-2000:]
    job = json.loads((run2 / "job.json").read_text())
    assert job["ok"] is False and job["state"] == "failed" and len(job["attempts"]) == 2


def test_a_process_that_exits_2_is_not_retried(tmp_path):
    """Status 2 says the input or the settings are wrong: another attempt fails the same."""
    run = tmp_path / "run"
    spec = script_job(tmp_path, dies_until(run, 0, "raise SystemExit(2)"),
                      max_retry_attempts=3)
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2 and "[launcher] attempt" not in r.stdout
    job = json.loads((run / "job.json").read_text())
    assert job["state"] == "failed" and len(job["attempts"]) == 1
    assert (run / "attempts.txt").read_text() == "1"


def test_retries_stop_where_another_attempt_cannot_pass(tmp_path):
    """F36: a script that exits 1 at start-up was retried all max_retry_attempts times; a
    hanging one with time_limit 5 and 3 retries ran 4 x 5 s; a watchdog stop was retried. The
    time limit bounds the whole job (SageMaker's MaxRuntime), a time-limit or watchdog stop is
    not retried, nor a second attempt in a row that failed on its own with no new checkpoint;
    job.json says why."""
    run = tmp_path / "run"
    spec = script_job(tmp_path, dies_until(run, 0, "raise SystemExit(1)"), max_retry_attempts=5)
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2 and "not retried: two attempts in a row" in r.stdout, r.stdout
    job = json.loads((run / "job.json").read_text())
    assert job["state"] == "failed" and len(job["attempts"]) == 2
    assert "before any new checkpoint" in job["attempts"][-1]["not_retried"]
    # A crash by a signal the process raises itself (abort(), as a failed C++ check does)
    # fails on its own too; one from outside (SIGKILL: tests above) is retried.
    crashed = tmp_path / "crashed"
    spec = script_job(tmp_path, dies_until(crashed, 0, "import os\nos.abort()"), name="crashed",
                      output_dir=str(crashed), max_retry_attempts=5)
    r = run_cli("launch", spec, check=False)
    assert r.returncode == 2 and "not retried: two attempts in a row" in r.stdout, r.stdout
    assert len(json.loads((crashed / "job.json").read_text())["attempts"]) == 2

    for name, over, said in (("late", {"time_limit": 3}, "time limit of 3 s reached"),
                             ("hung", {"watchdog": 2}, "no progress for 2 s")):
        out = tmp_path / name
        spec = script_job(tmp_path, dies_until(out, 0, "import time\ntime.sleep(60)"),
                          name=name, output_dir=str(out), max_retry_attempts=3, **over)
        t = time.monotonic()
        r = run_cli("launch", spec, check=False)
        assert r.returncode == 2 and said in r.stderr, r.stderr[-2000:]
        assert time.monotonic() - t < 30
        job = json.loads((out / "job.json").read_text())
        assert len(job["attempts"]) == 1 and (out / "attempts.txt").read_text() == "1"
        assert job["attempts"][0]["not_retried"] == "another attempt cannot get past this failure"


def test_a_time_limit_that_ends_in_the_wait_to_retry_starts_no_attempt(tmp_path):
    """A process killed 2 s into a job of time_limit 4: the time limit ran out during the
    2 s wait to retry, yet a second attempt was recorded (it failed at once on the limit,
    having run nothing). No attempt is started or recorded; job.json says the time limit
    ended the job. (Killed at 2 s or later, at most 2 s are left: the wait's length.)"""
    run = tmp_path / "run"
    body = (f"import os, signal, time\nfrom pathlib import Path\n"
            f"count = Path({str(run / 'attempts.txt')!r})\n"
            f"count.write_text(str(int(count.read_text()) + 1 if count.exists() else 1))\n"
            f"time.sleep(2)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    spec = script_job(tmp_path, body, time_limit=4, max_retry_attempts=3)
    r = run_cli("launch", spec, check=False)
    said = "time limit of 4 s reached (over all attempts) while waiting to retry"
    assert r.returncode == 2 and f"{said}: attempt 1 failed" in r.stderr, r.stderr[-2000:]
    job = json.loads((run / "job.json").read_text())
    assert (job["state"], job["reason"]) == ("failed", said), job
    assert len(job["attempts"]) == 1 and "exited with status -9" in job["attempts"][0]["cause"]
    assert "time limit (4 s) ends before another attempt" in job["attempts"][0]["not_retried"]
    assert (run / "attempts.txt").read_text() == "1"


def test_launch_max_retry_attempts_overrides_the_spec(tmp_path):
    run = tmp_path / "run"
    spec = script_job(tmp_path, dies_until(run, 1, "print('done', flush=True)"))
    r = run_cli("launch", spec, "--max-retry-attempts", 1)
    assert "done" in r.stdout and json.loads((run / "job.json").read_text())["state"] == "completed"


def test_max_retry_attempts_is_checked(tmp_path):
    for bad in (-1, 31, "3"):
        spec = script_job(tmp_path, "print('x')\n", max_retry_attempts=bad)
        r = run_cli("launch", spec, check=False)
        assert r.returncode == 2 and "max_retry_attempts" in r.stderr, r.stderr


def test_a_retried_job_reads_its_pipe_channel_again_from_the_start(tmp_path):
    """What a retried Pipe channel reads (docs/cluster.md): the FIFOs are made anew for every
    attempt and served from the start of the host's share, as a new SageMaker job's are."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.libsvm").write_text("".join(f"{i % 2} 1:{i}\n" for i in range(20_000)))
    run = tmp_path / "run"
    then = ("fifo = os.environ['SM_CHANNEL_TRAINING'] + '_0'\n"
            "with open(fifo, 'rb') as f:\n"
            "    print('first line', f.readline().decode().strip(), flush=True)\n"
            "    if n == 1:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    print('lines', 1 + sum(1 for _ in f), flush=True)\n")
    spec = script_job(tmp_path, dies_until(run, 0, then), max_retry_attempts=1,
                      channels={"training": {"path": str(data), "input_mode": "Pipe"}})
    r = run_cli("launch", spec)
    assert r.stdout.count("first line 0 1:0") == 2, r.stdout[-3000:]
    assert "lines 20000" in r.stdout and "[launcher] attempt 1 failed" in r.stdout
    assert json.loads((run / "job.json").read_text())["state"] == "completed"


def test_a_spec_that_is_not_a_mapping_is_refused(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- name: x\n")
    for name, holds in (("empty", "nothing"), ("list", "list")):
        r = run_cli("launch", tmp_path / f"{name}.yaml", check=False)
        assert r.returncode == 2 and f"is not a mapping of keys (name, entry_point, ...): it " \
            f"holds {holds}" in r.stderr and "Traceback" not in r.stderr, r.stderr
