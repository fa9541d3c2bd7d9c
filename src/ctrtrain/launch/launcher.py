"""`ctrtrain launch job.yaml`: a multi-host job on this machine. Each simulated host gets an
/opt/ml-like tree under <run dir>/hosts/<host>/ and its processes get exactly the environment a
SageMaker TensorFlow container gives (plus TF_CONFIG and ranks); servers listen on free
loopback ports; the chief's model/ is collected into <run dir>/model (and model.tar.gz)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import tarfile
import time
from pathlib import Path

from .. import heartbeat
from ..cluster.plan import plan_cluster
from ..cluster.process_env import process_command, process_env
from ..cluster.sagemaker import container_env, user_args, write_config_files
from ..errors import CtrError
from ..mode import Mode
from .channels import PipeFeeder, assign, check_pipe_files, materialize_file_channel
from .spec import JobSpec
from .supervisor import Supervisor


class JobFailed(CtrError):
    pass


class PortAllocator:
    """Free loopback ports, never the same twice in one job; gives up after `tries` (a
    machine whose ephemeral ports are used up would otherwise loop forever)."""

    def __init__(self, tries: int = 1000):
        self.used: set[int] = set()
        self.tries = tries

    def get(self) -> int:
        for _ in range(self.tries):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in self.used:
                self.used.add(port)
                return port
        raise JobFailed(f"no free loopback port after {self.tries} tries "
                        f"({len(self.used)} taken by this job)")


RUN_MARKER = "ctrtrain-run.json"


def claim_run_dir(run_dir: Path, spec: JobSpec):
    """The run directory must be new, empty, or this job's own earlier run (to resume), and
    no other launch may use it at the same time: returns the open lock file, held until the
    launcher exits. A symlink, a directory of other files, another job's run: refused, and
    nothing in them is touched."""
    if run_dir.is_symlink():
        raise JobFailed(f"output directory {run_dir} is a symbolic link; give a real directory")
    if run_dir.exists() and not run_dir.is_dir():
        raise JobFailed(f"output directory {run_dir} exists and is not a directory")
    marker = run_dir / RUN_MARKER
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if not marker.exists():
            raise JobFailed(f"output directory {run_dir} is not empty and is not a ctrtrain run "
                            f"(no {RUN_MARKER}); a launch needs a new or empty directory, or "
                            "its own earlier run to resume")
        try:
            owner = json.loads(marker.read_text()).get("job")
        except (ValueError, AttributeError):
            owner = None
        if owner != spec.name:
            raise JobFailed(f"output directory {run_dir} holds the run of job {owner!r}, not "
                            f"{spec.name!r}; choose another output_dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = open(run_dir / ".lock", "a")
    except OSError as e:
        raise JobFailed(f"cannot create the output directory {run_dir}: {e.strerror}") from e
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise JobFailed(f"another launch is running in {run_dir} (its lock is held); wait for it "
                        "or choose another output_dir") from None
    marker.write_text(json.dumps({"job": spec.name, "spec": spec.spec_path}) + "\n")
    return lock


def host_base(run_dir: Path, host: str) -> Path:
    return run_dir / "hosts" / host


def horovodrun() -> str | None:
    """horovodrun beside this Python (its venv), else on PATH."""
    beside = Path(sys.executable).parent / "horovodrun"
    return str(beside) if beside.exists() else shutil.which("horovodrun")


def check_runtime(spec: JobSpec) -> None:
    """What the mode needs installed, checked before anything starts."""
    import importlib.util
    if spec.topology.mode is Mode.HOROVOD and (importlib.util.find_spec("horovod") is None
                                            or horovodrun() is None):
        raise JobFailed("distribution mode 'horovod' needs Horovod (and its horovodrun), which is "
                        "not installed in this Python. Horovod 0.28.1 does not build against "
                        "TensorFlow 2.21; `bash scripts/horovod_env.sh` builds it against "
                        "tensorflow-cpu==2.15.1 in .venv-hvd (run the launch from there). Or use "
                        "mode 'allreduce' for the same synchronous training on TensorFlow's own "
                        "collectives.")


def launch(spec: JobSpec, console: bool = True, cores: int | None = None) -> dict:
    check_runtime(spec)
    run_dir = Path(spec.output_dir)
    lock = claim_run_dir(run_dir, spec)
    try:
        return _launch(spec, run_dir, console, cores)
    finally:
        lock.close()


def _launch(spec: JobSpec, run_dir: Path, console: bool, cores: int | None) -> dict:
    if not os.access(run_dir, os.W_OK):
        raise JobFailed(f"output directory {run_dir} is not writable")
    free_mb = shutil.disk_usage(run_dir).free / 2**20
    if free_mb < spec.min_free_disk_mb:
        raise JobFailed(f"only {free_mb:,.0f} MB free on the disk of {run_dir}; the job asks for "
                        f"min_free_disk_mb={spec.min_free_disk_mb:g} (checkpoints, logs, model)")
    cores = cores or os.cpu_count() or 1
    ports = PortAllocator()
    procs = plan_cluster(spec.topology, address=lambda host, slot: f"127.0.0.1:{ports.get()}")
    hosts = [h for h, _ in spec.topology.host_names()]
    training_hosts = sorted({p.host for p in procs if p.role in ("chief", "worker")},
                            key=hosts.index)
    shares, warnings = {}, []
    for ch in spec.channels.values():
        shares[ch.name], w = assign(ch, training_hosts)
        warnings += w
    for w in warnings:
        print(f"warning: {w}", flush=True)

    channel_modes = {c.name: c.as_dict() for c in spec.channels.values()}
    sup = Supervisor(run_dir / "logs", console=console, time_limit=spec.time_limit,
                     watchdog=spec.watchdog)
    if sup.pid_file.exists():
        sup.pid_file.unlink()
    # PIDs in logs/pids are this namespace's when the job has its own (isolation.host_pid).
    pidns = sup.log_dir / "pidns"
    if os.getpid() == 1:
        pidns.write_text(os.readlink("/proc/self/ns/pid") + "\n")
    elif pidns.exists():
        pidns.unlink()
    feeders = []
    for host in hosts:
        base = host_base(run_dir, host)
        for sub in ("model", "output/data", "output/intermediate", "input/data"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        # /opt/ml/checkpoints: SageMaker syncs every host's copy with one S3 prefix, so a
        # re-launched job restores the same checkpoint everywhere; here they are one directory.
        shared_ckpt = run_dir / "checkpoints"
        shared_ckpt.mkdir(exist_ok=True)
        if not (base / "checkpoints").is_symlink():
            (base / "checkpoints").symlink_to(shared_ckpt.resolve(), target_is_directory=True)
        write_config_files(base, spec.topology, host, channel_modes, spec.hyperparameters)
        for ch in spec.channels.values():
            files = shares[ch.name].get(host, [])
            if ch.input_mode == "File":
                materialize_file_channel(ch, files, base / "input" / "data" / ch.name)
            elif host in training_hosts:
                check_pipe_files(ch, files)
                feeders.append(PipeFeeder(base / "input" / "data", ch.name, files,
                                          spec.pipe_epochs, sup.pids, sup.report_error))
    started = time.time()
    ranks = []
    for p in procs:
        base = host_base(run_dir, p.host)
        env = dict(os.environ)
        env.update(container_env(base, spec.topology, p.host, channel_modes, spec.hyperparameters,
                                 spec.name, num_cpus=cores))
        env.update(process_env(p, procs, cores, spec.processing_mode, spec.topology.mode))
        cmd = process_command(p, spec.entry_point.kind, spec.entry_point.target,
                              spec.entry_point.args, user_args(spec.hyperparameters))
        if spec.topology.mode is Mode.HOROVOD and not p.is_server:
            # Every rank's training heartbeat counts as horovodrun's progress.
            env[heartbeat.ENV] = str(sup.heartbeat_path("horovodrun"))
            ranks.append({"rank": p.rank, "env": env, "cmd": cmd, "cwd": str(base)})
        else:
            # A parameter-server worker may die: the coordinator reschedules its steps.
            sup.start(p.label, cmd, env, cwd=str(base), server=p.is_server,
                      tolerated=spec.topology.mode.asynchronous and p.role == "worker")
    if ranks:
        sup.start("horovodrun", horovod_command(ranks, run_dir), dict(os.environ),
                  cwd=str(run_dir), server=False)
    for f in feeders:
        f.start()
    try:
        outcome = sup.wait()
    finally:
        for f in feeders:
            f.stop.set()
    summary = {"job": spec.name, "ok": outcome.ok, "reason": outcome.reason,
               "seconds": time.time() - started, "exit_codes": outcome.exit_codes,
               "processes": [{"label": p.label, "host": p.host, "group": p.group, "role": p.role,
                              "index": p.index, "rank": p.rank,
                              "address": p.address, "tf_config": p.tf_config} for p in procs],
               "warnings": warnings, "tolerated_failures": outcome.tolerated}
    if outcome.ok:
        chief = next(p for p in procs if p.is_chief)
        summary["model"] = collect_model(host_base(run_dir, chief.host) / "model", run_dir)
    (run_dir / "job.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not outcome.ok:
        msg = "\n".join([f"job {spec.name} failed: {outcome.reason}", *outcome.tail])
        raise JobFailed(msg)
    return summary


def horovod_command(ranks: list[dict], run_dir: Path) -> list[str]:
    """horovodrun (Gloo) starts one process per rank on localhost; each becomes its simulated
    host's process through ctrtrain.launch.hvd_rank, which takes the environment the launcher
    prepared for that rank (horovodrun gives every rank the same environment)."""
    table = run_dir / "logs" / "horovod-ranks.json"
    table.write_text(json.dumps(ranks))
    n = len(ranks)
    return [horovodrun(), "--gloo", "-np", str(n), "-H", f"localhost:{n}",
            "--network-interface", "lo", sys.executable, "-m", "ctrtrain.launch.hvd_rank",
            str(table)]


def collect_model(model_dir: Path, run_dir: Path) -> str:
    """The chief's model/ becomes the job's output, like SageMaker's model.tar.gz step."""
    out = run_dir / "model"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(model_dir, out, symlinks=False)
    with tarfile.open(run_dir / "model.tar.gz", "w:gz") as tar:
        for item in sorted(out.iterdir()):
            tar.add(item, arcname=item.name)
    return str(out)
