import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import ROOT, run_cli
from ctrtrain.cluster.plan import plan_cluster
from ctrtrain.cluster.run import resolve
from ctrtrain.cluster.sagemaker import resource_config
from ctrtrain.errors import ConfigError
from ctrtrain.launch.spec import load_spec, parse_spec

EXAMPLES = ROOT / "examples"


def spec_from_example(tmp_path, name, **over):
    """An example spec with its paths made absolute and the output in tmp_path."""
    raw = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    if "source_dir" in raw:
        raw["source_dir"] = str(EXAMPLES / raw["source_dir"])
    elif "script" in raw["entry_point"]:
        raw["entry_point"]["script"] = str(EXAMPLES / raw["entry_point"]["script"])
    for ch in (raw.get("channels") or {}).values():
        ch["path"] = str(EXAMPLES / ch["path"])
    raw["output_dir"] = str(tmp_path / "run")
    raw.update(over)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def alive(run_dir):
    """(every process the launch started, those still alive) as this machine's PIDs."""
    from ctrtrain.launch.isolation import job_processes
    procs = job_processes(run_dir)
    out = []
    for pid, _ in procs:
        if pid is None:
            continue
        try:
            os.kill(pid, 0)
            out.append(pid)
        except ProcessLookupError:
            pass
    return procs, out


@pytest.mark.slow
def test_sagemaker_estimator_example(tmp_path):
    run_cli("launch", spec_from_example(tmp_path, "sagemaker-estimator"))
    run = tmp_path / "run"
    h = json.loads((run / "model" / "history.json").read_text())
    assert h["workers"] == ["algo-1:8890", "algo-2:8890"] and h["replicas"] == 2
    assert (run / "model" / "1" / "saved_model.pb").exists() and (run / "model.tar.gz").exists()


def test_sagemaker_script_runs_unchanged_with_sharded_channel(tmp_path):
    r = run_cli("launch", spec_from_example(tmp_path, "sagemaker-script"))
    assert "do not divide evenly" in r.stdout  # 5 files over 2 hosts
    run = tmp_path / "run"
    models = json.loads((run / "job.json").read_text())
    assert models["ok"] and models["model"] == str(run / "model")
    m1 = json.loads((run / "model" / "model-algo-1.json").read_text())
    assert m1["hosts"] == ["algo-1", "algo-2"] and m1["epochs"] == 2 and m1["learning_rate"] == 0.05
    assert m1["files"] == ["part-0.txt", "part-2.txt", "part-4.txt"]
    m2 = json.loads((run / "hosts" / "algo-2" / "model" / "model-algo-2.json").read_text())
    assert m2["files"] == ["part-1.txt", "part-3.txt"]  # every file read by exactly one host
    assert (run / "model.tar.gz").exists() and "[algo-2/worker/1]" in r.stdout
    assert (run / "logs" / "algo-2-worker-1.log").read_text().startswith("algo-2: 4 rows")
    assert alive(run)[1] == []


ENV_DUMP = """
import json, os, pathlib
cfg = pathlib.Path(os.environ["SM_INPUT_CONFIG_DIR"])
out = {"env": {k: v for k, v in os.environ.items() if k.startswith(("SM_", "TF_CONFIG", "RANK",
       "WORLD_SIZE", "LOCAL_RANK", "CTRTRAIN_"))},
       "resourceconfig": json.loads((cfg / "resourceconfig.json").read_text()),
       "inputdataconfig": json.loads((cfg / "inputdataconfig.json").read_text()),
       "hyperparameters": json.loads((cfg / "hyperparameters.json").read_text())}
# The oracle: SageMaker's own training toolkit, reading the same /opt/ml.
from sagemaker_training import environment
out["toolkit"] = environment.Environment().to_env_vars()
name = f"env-{os.environ['SM_CURRENT_HOST']}-{os.environ['LOCAL_RANK']}.json"
pathlib.Path(os.environ["SM_OUTPUT_DATA_DIR"], name).write_text(json.dumps(out))
"""


def test_environment_matches_the_sagemaker_contract_key_by_key(tmp_path):
    (tmp_path / "dump.py").write_text(ENV_DUMP)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d1" / "a.txt").write_text("x\n")
    spec = {"name": "env", "entry_point": {"script": "dump.py"},
            "hyperparameters": {"epochs": 3, "optimizer": "adam"},
            "instance_groups": [{"name": "train", "hosts": 2, "processes_per_host": 2,
                                 "instance_type": "ml.c5.xlarge"},
                                {"name": "data", "hosts": 1, "instance_type": "ml.c5.large"}],
            "distribution": {"mode": "allreduce",
                             "data_service": {"group": "data", "processing_mode": "distributed_epoch"}},
            "channels": {"training-2": {"path": "d1"}, "Eval": {"path": "d1", "distribution": "ShardedByS3Key"}},
            "output_dir": "run", "time_limit": 120}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    run_cli("launch", tmp_path / "job.yaml")
    run = tmp_path / "run"
    base = run / "hosts" / "algo-2"
    d = json.loads((base / "output" / "data" / "env-algo-2-1.json").read_text())
    env = d["env"]
    # Key by key against the real toolkit's Environment().to_env_vars() in the same host.
    ours = {k: v for k, v in env.items() if k.startswith("SM_")}
    assert sorted(ours) == sorted(d["toolkit"])
    for k, v in d["toolkit"].items():
        assert ours[k] == v, k
    assert env["SM_HOSTS"] == '["algo-1","algo-2","algo-3"]'
    assert env["SM_CURRENT_HOST"] == "algo-2"
    assert json.loads(env["SM_CHANNELS"]) == ["Eval", "training-2"]  # sorted
    assert env["SM_CHANNEL_TRAINING-2"] == "/opt/ml/input/data/training-2"
    assert env["SM_HP_EPOCHS"] == "3" and env["SM_HP_OPTIMIZER"] == "adam"
    assert env["SM_MODEL_DIR"] == "/opt/ml/model" and "SM_HP_MODEL_DIR" not in env
    assert env["SM_USER_ENTRY_POINT"] == "dump.py" and env["SM_MODULE_NAME"] == "dump"
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "train"
    assert json.loads(env["SM_INSTANCE_GROUPS"]) == ["train", "data"]
    assert env["SM_IS_HETERO"] == "true"
    assert json.loads(env["SM_USER_ARGS"]) == ["--epochs", "3", "--optimizer", "adam"]
    # Ranks for all-reduce: 4 workers, algo-2's second process is global rank 3.
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("3", "4", "1")
    tfc = json.loads(env["TF_CONFIG"])
    assert tfc["task"] == {"type": "worker", "index": 3} and len(tfc["cluster"]["worker"]) == 4
    assert tfc["cluster"]["worker"] == ["algo-1:2222", "algo-1:2223", "algo-2:2222", "algo-2:2223"]
    assert env["CTRTRAIN_DATA_SERVICE"] == "grpc://algo-3:2222"
    assert env["CTRTRAIN_DATA_SERVICE_MODE"] == "distributed_epoch"
    rc = d["resourceconfig"]
    assert rc["current_host"] == "algo-2" and rc["current_group_name"] == "train"
    assert rc["instance_groups"] == [
        {"instance_group_name": "train", "instance_type": "ml.c5.xlarge", "hosts": ["algo-1", "algo-2"]},
        {"instance_group_name": "data", "instance_type": "ml.c5.large", "hosts": ["algo-3"]}]
    assert d["inputdataconfig"]["Eval"] == {"TrainingInputMode": "File",
                                           "S3DistributionType": "ShardedByS3Key",
                                           "RecordWrapperType": "None"}
    # As the SageMaker SDK writes it: every value JSON-encoded, its own sagemaker_* keys.
    hps = d["hyperparameters"]
    assert {k: hps[k] for k in ("epochs", "optimizer", "sagemaker_program")} == {
        "epochs": "3", "optimizer": '"adam"', "sagemaker_program": '"dump.py"'}
    job = json.loads((run / "job.json").read_text())
    roles = sorted((p["label"]) for p in job["processes"])
    assert roles == ["algo-1/worker/0", "algo-1/worker/1", "algo-2/worker/2", "algo-2/worker/3",
                     "algo-3/data_worker/0", "algo-3/dispatcher/0"]
    # The data-service servers were shut down when training finished.
    assert job["exit_codes"]["algo-3/dispatcher/0"] < 0 and alive(run)[1] == []


def test_first_failure_fails_the_job_fast_and_tears_everything_down(tmp_path):
    (tmp_path / "s.py").write_text(
        "import os, sys, time\n"
        "if os.environ['SM_CURRENT_HOST'] == 'algo-2':\n"
        "    print('bad input on algo-2', flush=True); sys.exit(3)\n"
        "time.sleep(120)\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "fail", "entry_point": {"script": "s.py"},
        "instance_groups": [{"name": "g", "hosts": 3}], "distribution": "allreduce",
        "output_dir": "run"}))
    t = time.time()
    r = run_cli("launch", tmp_path / "job.yaml", check=False)
    assert r.returncode == 2 and time.time() - t < 30
    assert "algo-2/worker/1 exited with status 3" in r.stderr and "bad input on algo-2" in r.stderr
    pids, live = alive(tmp_path / "run")
    assert len(pids) == 3 and live == []


@pytest.mark.slow
def test_time_limit_and_ctrl_c_leave_no_process(tmp_path):
    (tmp_path / "s.py").write_text("import time\nprint('working', flush=True)\ntime.sleep(300)\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "slow", "entry_point": {"script": "s.py"},
        "instance_groups": [{"name": "g", "hosts": 2}], "distribution": "allreduce",
        "output_dir": "run", "time_limit": 3}))
    r = run_cli("launch", tmp_path / "job.yaml", check=False)
    assert r.returncode == 2 and "time limit of 3 s reached" in r.stderr
    assert alive(tmp_path / "run")[1] == []
    # Ctrl-C (SIGINT to the launcher) tears the job down.
    proc = subprocess.Popen([sys.executable, "-m", "ctrtrain.cli", "launch", str(tmp_path / "job.yaml"),
                             "--time-limit", "300", "--output-dir", str(tmp_path / "run2")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pidfile = tmp_path / "run2" / "logs" / "pids"
    end = time.time() + 60
    while time.time() < end and not (pidfile.exists() and len(pidfile.read_text().splitlines()) == 2):
        time.sleep(0.1)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert alive(tmp_path / "run2")[1] == []


def test_launcher_killed_outright_takes_its_processes_with_it(tmp_path):
    (tmp_path / "s.py").write_text("import time\nprint('working', flush=True)\ntime.sleep(300)\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "orphan", "entry_point": {"script": "s.py"},
        "instance_groups": [{"name": "g", "hosts": 2}], "distribution": "allreduce",
        "output_dir": "run"}))
    proc = subprocess.Popen([sys.executable, "-m", "ctrtrain.cli", "launch", str(tmp_path / "job.yaml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pidfile = tmp_path / "run" / "logs" / "pids"
    end = time.time() + 60
    while time.time() < end and not (pidfile.exists() and len(pidfile.read_text().splitlines()) == 2):
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    end = time.time() + 10
    while time.time() < end and alive(tmp_path / "run")[1]:
        time.sleep(0.1)
    assert alive(tmp_path / "run")[1] == []


def test_pipe_mode_feeds_each_host_its_share(tmp_path):
    run_cli("launch", spec_from_example(tmp_path, "pipe-mode"))
    run = tmp_path / "run"
    files = sorted((EXAMPLES / "data" / "text").iterdir())
    want1 = sum(f.stat().st_size for f in files[0::2])
    want2 = sum(f.stat().st_size for f in files[1::2])
    assert json.loads((run / "model" / "pipe-algo-1.json").read_text())["bytes"] == want1
    got2 = json.loads((run / "hosts" / "algo-2" / "model" / "pipe-algo-2.json").read_text())
    assert got2["bytes"] == want2


def test_pipe_mode_one_fifo_per_epoch_made_on_demand(tmp_path):
    """As on SageMaker: no epoch count in the spec; each FIFO appears once the one before is
    done, read to its end or closed early (a reader that read a few bytes and let go), and
    the script may look for the next one before it opens it."""
    (tmp_path / "epochs.py").write_text(
        "import json, os\nch = os.environ['SM_CHANNEL_TRAINING']\n"
        "sizes = []\n"
        "for e in range(5):\n"
        "    assert not os.path.exists(f'{ch}_{e + 1}'), e\n"
        "    with open(f'{ch}_{e}', 'rb') as f:\n"
        "        sizes.append(len(f.read(10) if e % 2 else f.read()))\n"
        "    for _ in range(500):\n"
        "        if os.path.exists(f'{ch}_{e + 1}'): break\n"
        "        __import__('time').sleep(0.01)\n"
        "    assert os.path.exists(f'{ch}_{e + 1}'), e\n"
        "json.dump(sizes, open(os.path.join(os.environ['SM_MODEL_DIR'], 'sizes.json'), 'w'))\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "epochs", "entry_point": {"script": "epochs.py"},
        "instance_groups": [{"name": "g", "hosts": 1}],
        "channels": {"training": {"path": str(EXAMPLES / "data" / "text"), "input_mode": "Pipe"}},
        "output_dir": "run", "time_limit": 60}))
    run_cli("launch", tmp_path / "job.yaml")
    total = sum(f.stat().st_size for f in (EXAMPLES / "data" / "text").iterdir())
    assert json.loads((tmp_path / "run" / "model" / "sizes.json").read_text()) == [
        total, 10, total, 10, total]
    # pipe_epochs is a cap: a reader past it gets an empty stream and the job a reason.
    spec = yaml.safe_load((tmp_path / "job.yaml").read_text())
    spec.update(pipe_epochs=3, output_dir="run-capped")
    (tmp_path / "capped.yaml").write_text(yaml.safe_dump(spec))
    r = run_cli("launch", tmp_path / "capped.yaml", check=False)
    assert r.returncode == 2
    assert ("a reader opened training_3, epoch 4 of the channel, but the job spec caps it at "
            "pipe_epochs: 3") in r.stderr
    assert alive(tmp_path / "run-capped")[1] == []


def test_a_quiet_reader_of_a_pipe_channel_is_alive_while_it_is_fed(tmp_path):
    """A script that prints nothing while it reads a long stream (an Estimator's evaluation)
    makes progress: the watchdog (3 s here) lets it finish its 6.4 s of reading. (1.5 s was
    too short for a loaded machine's start of the host and the script.)"""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "big.bin").write_bytes(os.urandom(4 << 20))
    (tmp_path / "slow.py").write_text(
        "import os, time\nf = open(os.environ['SM_CHANNEL_TRAINING'] + '_0', 'rb')\n"
        "while f.read(64 << 10): time.sleep(0.1)\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "quiet", "entry_point": {"script": "slow.py"}, "watchdog": 3,
        "instance_groups": [{"name": "g", "hosts": 1}],
        "channels": {"training": {"path": "d", "input_mode": "Pipe"}},
        "output_dir": "run", "time_limit": 60}))
    t = time.time()
    run_cli("launch", tmp_path / "job.yaml")
    assert time.time() - t > 5
    # A reader that stops reading is stuck: the watchdog still ends it.
    (tmp_path / "stuck.py").write_text(
        "import os, time\nf = open(os.environ['SM_CHANNEL_TRAINING'] + '_0', 'rb')\n"
        "f.read(1)\ntime.sleep(60)\n")
    spec = yaml.safe_load((tmp_path / "job.yaml").read_text())
    spec.update(entry_point={"script": "stuck.py"}, output_dir="run-stuck")
    (tmp_path / "stuck.yaml").write_text(yaml.safe_dump(spec))
    r = run_cli("launch", tmp_path / "stuck.yaml", check=False)
    assert r.returncode == 2 and "no progress for 3 s" in r.stderr


def test_second_reader_of_a_fifo_is_an_error_not_a_hang(tmp_path):
    # Two processes read the same FIFO slowly, side by side: the feeder sees both.
    (tmp_path / "two.py").write_text(
        "import os, subprocess, sys, time\n"
        "ch = os.environ['SM_CHANNEL_TRAINING'] + '_0'\n"
        "slow = 'import sys, time\\nf = open(sys.argv[1], \"rb\")\\nwhile f.read(4096): time.sleep(0.01)'\n"
        "other = subprocess.Popen([sys.executable, '-c', slow, ch])\n"
        "time.sleep(0.3)\n"
        "subprocess.run([sys.executable, '-c', slow, ch])\n"
        "other.wait()\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "big.bin").write_bytes(os.urandom(1 << 22))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "fifo", "entry_point": {"script": "two.py"},
        "instance_groups": [{"name": "g", "hosts": 1}],
        "channels": {"training": {"path": "d", "input_mode": "Pipe"}},
        "output_dir": "run", "time_limit": 60}))
    t = time.time()
    r = run_cli("launch", tmp_path / "job.yaml", check=False)
    assert r.returncode == 2 and "a Pipe channel has one reader" in r.stderr
    assert time.time() - t < 30 and alive(tmp_path / "run")[1] == []
    # A reader that comes after the epoch was fed gets an error at once, not a hang.
    (tmp_path / "late.py").write_text(
        "import os\nch = os.environ['SM_CHANNEL_TRAINING'] + '_0'\n"
        "open(ch, 'rb').read()\nopen(ch, 'rb').read()\n")
    spec = yaml.safe_load((tmp_path / "job.yaml").read_text())
    spec["entry_point"] = {"script": "late.py"}
    spec["output_dir"] = "run-late"
    (tmp_path / "late.yaml").write_text(yaml.safe_dump(spec))
    t = time.time()
    r = run_cli("launch", tmp_path / "late.yaml", check=False)
    assert r.returncode == 2 and "No such file or directory" in r.stderr and time.time() - t < 30


@pytest.mark.parametrize("mutate,message", [
    (lambda s: s.update(colour="red"), "colour: unknown key"),
    (lambda s: s["instance_groups"][0].update(hosts="two"), "instance_groups[0].hosts: must be an integer"),
    (lambda s: s.update(distribution={"mode": "magic"}), "distribution.mode: 'magic' is not one of"),
    (lambda s: s["channels"]["training"].update(path="nope"), "channels.training.path"),
    (lambda s: s["channels"]["training"].update(input_mode="Stream"), "channels.training.input_mode"),
    (lambda s: s.update(entry_point={"script": "x.py", "module": "m"}), "exactly one of"),
    (lambda s: s.update(distribution="single"), "mode single runs one training process"),
    (lambda s: s["channels"].update({"../../etc": {"path": "d"}}), "channels.../../etc: '../../etc' must be a simple name"),
    (lambda s: s["instance_groups"][0].update(name="a/../../b"), "must be a simple name"),
    (lambda s: (s["channels"]["training"].update(input_mode="Pipe"),
                s["instance_groups"][0].update(processes_per_host=2)), "cannot share 1 Pipe channel"),
    (lambda s: s.update(framework_version=2.10, distribution={"mode": "single"}),
     "framework_version: 2.1 is a number: quote it ('2.10')"),
    (lambda s: s.update(framework_version="2.9-gpu", distribution={"mode": "single"}),
     "framework_version: '2.9-gpu' is not a TensorFlow 2 release"),
    (lambda s: s.update(time_limit=float("inf")), "time_limit: a finite number of seconds > 0"),
    (lambda s: s.update(watchdog=float("nan")), "watchdog: a finite number of seconds > 0"),
])
def test_invalid_specs_name_the_key(tmp_path, mutate, message):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    (tmp_path / "t.py").write_text("")
    spec = {"name": "x", "entry_point": {"script": "t.py"},
            "instance_groups": [{"name": "g", "hosts": 2}], "distribution": "allreduce",
            "channels": {"training": {"path": "d"}}, "output_dir": "run"}
    mutate(spec)
    with pytest.raises(ConfigError) as e:
        parse_spec(spec, base=tmp_path)
    assert message in str(e.value)
    (tmp_path / "empty").mkdir()
    spec = {"name": "x", "entry_point": {"script": "t.py"}, "instance_groups": [{"name": "g"}],
            "channels": {"training": "empty"}, "output_dir": "run"}
    with pytest.raises(ConfigError, match="is empty"):
        parse_spec(spec, base=tmp_path)


def test_framework_versions_as_the_sdk_writes_them(tmp_path):
    """The SDK takes a release (2.9.1) as well as a series (2.9): both name the series' image."""
    (tmp_path / "t.py").write_text("")
    for version in ("2.9", "2.9.1"):
        spec = parse_spec({"name": "x", "entry_point": {"script": "t.py"},
                           "instance_groups": [{"name": "g"}], "framework_version": version,
                           "output_dir": "run"}, base=tmp_path)
        assert spec.framework_version == "2.9"


def test_yaml_is_parsed_safely(tmp_path):
    (tmp_path / "evil.yaml").write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(tmp_path / "evil.yaml")
    # A key given twice (yaml.safe_load keeps the last, silently), in a job spec and in a
    # training configuration file: named with its line.
    (tmp_path / "twice.yaml").write_text("name: x\ntime_limit: 60\noutput_dir: run\n"
                                         "time_limit: 6000\n")
    with pytest.raises(ConfigError, match="line 4: the key 'time_limit' is given twice"):
        load_spec(tmp_path / "twice.yaml")
    from ctrtrain.train.config import load_config_file
    (tmp_path / "train.yaml").write_text("model:\n  dropout: 0.5\n  dropout: 0\n")
    with pytest.raises(ConfigError, match="line 3: the key 'dropout' is given twice"):
        load_config_file(tmp_path / "train.yaml")


# Recorded environments: what SageMaker / a TFJob would give each container.
SM_RESOURCECONFIG_ALGO2 = {
    "current_host": "algo-2", "current_instance_type": "ml.c5.4xlarge",
    "current_group_name": "homogeneousCluster", "hosts": ["algo-1", "algo-2"],
    "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "ml.c5.4xlarge",
                         "hosts": ["algo-2", "algo-1"]}], "network_interface_name": "eth0"}


@pytest.mark.parametrize("mode,procs_per_host", [("parameter_server", 1), ("allreduce", 2),
                                                 ("parameter_server", 2)])
def test_run_in_a_sagemaker_container_plays_the_launchers_roles(tmp_path, mode, procs_per_host):
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "resourceconfig.json").write_text(json.dumps(SM_RESOURCECONFIG_ALGO2))
    r = resolve({"SM_INPUT_CONFIG_DIR": str(cfg)}, mode=mode, processes_per_host=procs_per_host)
    assert r.source == "sagemaker" and r.host == "algo-2"
    # The local launcher's plan for the same job spec, on the same host.
    spec = parse_spec({"name": "x", "entry_point": {"recipe": "deepfm"},
                       "instance_groups": [{"name": "homogeneousCluster", "hosts": 2,
                                            "processes_per_host": procs_per_host}],
                       "distribution": {"mode": mode}, "output_dir": str(tmp_path / "o")})
    local = [p for p in plan_cluster(spec.topology) if p.host == "algo-2"]
    key = lambda p: (p.role, p.index, p.rank, p.local_rank,  # noqa: E731
                     json.dumps(p.tf_config, sort_keys=True) if p.tf_config else None)
    assert [key(p) for p in r.processes] == [key(p) for p in local]
    for p in r.processes:
        if p.tf_config:
            assert all(a.split(":")[0] in ("algo-1", "algo-2") for v in p.tf_config["cluster"].values()
                       for a in v)
    if mode == "parameter_server":
        # and a tf.data worker: PS workers read through a shared data-service job (plan.py)
        assert {p.role for p in r.processes} == {"ps", "worker", "data_worker"}
        assert "chief" in next(p for p in r.processes if p.tf_config).tf_config["cluster"]


def test_run_from_tfjob_and_flags():
    tfjob = {"cluster": {"chief": ["job-chief-0:2222"], "worker": ["job-worker-0:2222", "job-worker-1:2222"],
                         "ps": ["job-ps-0:2222"]}, "task": {"type": "worker", "index": 1}}
    r = resolve({"TF_CONFIG": json.dumps(tfjob)})
    assert r.source == "tf_config" and [(p.role, p.index) for p in r.processes] == [("worker", 1)]
    assert r.processes[0].is_server  # a PS-mode worker serves the coordinator
    with pytest.raises(ConfigError, match="master"):
        resolve({"TF_CONFIG": json.dumps({"cluster": {"master": ["a:1"]}, "task": {"type": "master", "index": 0}})})
    r = resolve({}, mode="allreduce", hosts=["h0", "h1", "h2"], host_index=2)
    assert [(p.role, p.rank, p.world_size) for p in r.processes] == [("worker", 2, 3)]
    assert r.processes[0].tf_config["cluster"]["worker"] == ["h0:2222", "h1:2222", "h2:2222"]
    r = run_cli("run", "--dry-run", "--mode", "allreduce", "--hosts", "h0,h1", "--host-index", "1")
    assert json.loads(r.stdout)["processes"][0]["rank"] == 1


def test_resource_config_round_trip():
    spec = parse_spec({"name": "x", "entry_point": {"recipe": "deepfm"},
                       "instance_groups": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 2}],
                       "distribution": "allreduce", "output_dir": "/tmp/x"})
    rc = resource_config(spec.topology, "algo-3")
    assert rc["current_group_name"] == "b" and rc["hosts"] == ["algo-1", "algo-2", "algo-3"]


@pytest.mark.slow
def test_allreduce_script_on_tensorflow_collectives(tmp_path):
    """The Horovod-style MNIST-like script, rewritten to MultiWorkerMirroredStrategy, on 2 hosts."""
    r = run_cli("launch", spec_from_example(tmp_path, "allreduce-mnist"))
    result = json.loads((tmp_path / "run" / "model" / "mnist_like.json").read_text())
    assert result["world_size"] == 2 and result["accuracy"] > 0.4  # 10 classes: chance is 0.1
    # Synchronous: both ranks report the same all-reduced loss at every logged step.
    for step in (0, 20, 40):
        losses = {l.split("loss ")[1] for l in r.stdout.splitlines() if f" step {step} loss" in l}
        assert len(losses) == 1, losses
    assert alive(tmp_path / "run")[1] == []


@pytest.mark.slow
def test_parameter_servers_are_shut_down_when_the_chief_finishes(tmp_path):
    # The example's job on one host (chief, a worker and a server): the same roles, 3
    # TensorFlow processes instead of 5.
    run_cli("launch", spec_from_example(
        tmp_path, "parameter-server",
        instance_groups=[{"name": "train", "hosts": 1, "processes_per_host": 1}]))
    job = json.loads((tmp_path / "run" / "job.json").read_text())
    assert json.loads((tmp_path / "run" / "model" / "ps_result.json").read_text())["counter"] == 20.0
    assert job["exit_codes"]["algo-1/chief/0"] == 0
    servers = {k: v for k, v in job["exit_codes"].items() if "/ps/" in k or "/worker/" in k}
    assert sorted(servers) == ["algo-1/ps/0", "algo-1/worker/0"]
    assert all(v < 0 for v in servers.values())  # ended by the launcher
    chief = next(p for p in job["processes"] if p["role"] == "chief")
    assert sorted(chief["tf_config"]["cluster"]) == ["chief", "ps", "worker"]
    assert alive(tmp_path / "run")[1] == []


@pytest.mark.slow
@pytest.mark.tf215
def test_deepfm_recipe_through_launch(tmp_path, synth_data):
    data = synth_data(rows=20_000, feature_size=2_000)[0] / "tf"
    spec = spec_from_example(tmp_path, "deepfm-single", hyperparameters={"epochs": 1, "batch_size": 256},
                             channels={"training": {"path": str(data / "train")},
                                       "test": {"path": str(data / "test")}})
    run_cli("launch", spec)
    result = json.loads((tmp_path / "run" / "model" / "result.json").read_text())
    assert result["step"] == 16_000 // 256 and result["test"]["auc"] > 0.6
    assert list((tmp_path / "run" / "model" / "export").iterdir())


@pytest.mark.slow
def test_mirrored_devices_on_one_host(tmp_path):
    run_cli("launch", spec_from_example(tmp_path, "mirrored"))
    r = json.loads((tmp_path / "run" / "model" / "mirrored.json").read_text())
    assert r["replicas"] == 2 and r["loss"] < 1e-3
    assert [round(v, 2) for v in r["w"]] == [1.0, -2.0, 0.5, 3.0]


@pytest.mark.slow
def test_heterogeneous_cluster_with_data_service(tmp_path):
    run_cli("launch", spec_from_example(tmp_path, "data-service"))
    run = tmp_path / "run"
    got = [json.loads(p.read_text()) for p in sorted(run.glob("hosts/*/output/data/consumed-*.json"))]
    assert len(got) == 2
    everything = sorted(v for g in got for v in g)
    assert everything == [2 * i for i in range(1000)]  # distributed_epoch: each element once
    job = json.loads((run / "job.json").read_text())
    assert {k for k, v in job["exit_codes"].items() if v < 0} == {
        "algo-3/dispatcher/0", "algo-3/data_worker/0", "algo-4/data_worker/1"}
    assert alive(run)[1] == []


@pytest.mark.skipif(importlib.util.find_spec("horovod") is not None,
                    reason="Horovod is installed in this environment (test_distributed runs it)")
def test_horovod_mode_without_horovod_fails_at_launch_with_a_message(tmp_path):
    r = run_cli("launch", spec_from_example(tmp_path, "horovod", channels={}), check=False)
    assert r.returncode == 2 and "needs Horovod" in r.stderr and "2.15.1" in r.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_local_jobs_reach_only_their_own_network(tmp_path):
    # TensorFlow's servers bind every interface. In containers (the default) each host has
    # eth0 on the job's own bridge and no route beyond it; with --isolation loopback the job
    # sees only loopback (where the machine allows user namespaces, as here and in CI).
    from ctrtrain.launch import isolation
    if not isolation.available():
        pytest.skip("no user network namespaces on this machine")
    (tmp_path / "ifaces.py").write_text(
        "import json, socket, subprocess\n"
        "print('IFACES', json.dumps(sorted(n for _, n in socket.if_nameindex())))\n"
        "print('ROUTES', json.dumps(subprocess.run(['ip', '-4', 'route'], capture_output=True,"
        " text=True).stdout.splitlines()))\n")
    spec = {"name": "ifaces", "entry_point": {"script": str(tmp_path / "ifaces.py")},
            "instance_groups": [{"name": "g", "hosts": 2}], "distribution": "allreduce",
            "output_dir": str(tmp_path / "run")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    r = run_cli("launch", tmp_path / "job.yaml")
    assert r.stdout.count('IFACES ["eth0", "lo"]') == 2
    routes = [json.loads(line.split("ROUTES ", 1)[1]) for line in r.stdout.splitlines()
              if "ROUTES " in line]
    assert len(routes) == 2 and all(len(rs) == 1 and rs[0].startswith("10.77.0.0/24 dev eth0")
                                    for rs in routes)   # no default route: nothing outside
    r = run_cli("launch", "--isolation", "loopback", tmp_path / "job.yaml")
    assert r.stdout.count('IFACES ["lo"]') == 2
    r = run_cli("launch", "--network", "host", tmp_path / "job.yaml")
    assert r.stdout.count("IFACES") == 2 and r.stdout.count('IFACES ["lo"]') < 2
