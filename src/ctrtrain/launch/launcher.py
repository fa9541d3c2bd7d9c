"""`ctrtrain launch job.yaml`: a multi-host job on this machine. Each simulated host is a
container without Docker (container.py): its /opt/ml is <run dir>/hosts/<host>/, written as
the SageMaker platform writes it (config files, channels, code), its hostname algo-N, its
address on the job's private bridge. A framework image job (`framework_version`) runs
SageMaker's own training toolkit on every host; ctrtrain's own modes run their roles with the
same environment (plus TF_CONFIG and ranks). The master host's /opt/ml/model is collected
into <run dir>/model and model.tar.gz; a failure is in <run dir>/hosts/<host>/output/failure.
Without containers (--isolation loopback|host) hosts are directories sharing this machine's
filesystem and loopback, on free ports."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from .. import heartbeat
from ..cluster.plan import plan_cluster
from ..cluster.process_env import process_command, process_env
from ..cluster.sagemaker import container_env, sdk_hyperparameters, write_config_files
from ..errors import CtrError
from ..mode import Mode
from .channels import (PipeFeeder, assign, channel_files, check_pipe_files,
                       materialize_file_channel)
from .container import HostContainer, bridge_address, make_bridge
from .images import TOOLKIT_MODULE, Image, find_image, own_image
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


def launch(spec: JobSpec, console: bool = True, cores: int | None = None,
           containers: bool | None = None) -> dict:
    """Runs the job to its end. `containers`: each simulated host in namespaces of its own
    (container.py; needs the job's own namespaces, isolation.py); default: when the launcher
    runs inside them."""
    check_runtime(spec)
    if containers is None:
        from .isolation import inside
        containers = inside("loopback")
    if spec.framework_version and not containers:
        raise JobFailed(f"job {spec.name}: a framework image job (framework_version "
                        f"{spec.framework_version}) runs in simulated containers, which need "
                        "user namespaces (`ctrtrain launch` with the default --isolation "
                        "containers); SageMaker scripts expect their own /opt/ml, hostname and "
                        "network")
    run_dir = Path(spec.output_dir)
    lock = claim_run_dir(run_dir, spec)
    try:
        return _launch(spec, run_dir, console, cores, containers)
    finally:
        lock.close()


def _prepare_run(spec: JobSpec, run_dir: Path) -> None:
    if not os.access(run_dir, os.W_OK):
        raise JobFailed(f"output directory {run_dir} is not writable")
    free_mb = shutil.disk_usage(run_dir).free / 2**20
    if free_mb < spec.min_free_disk_mb:
        raise JobFailed(f"only {free_mb:,.0f} MB free on the disk of {run_dir}; the job asks for "
                        f"min_free_disk_mb={spec.min_free_disk_mb:g} (checkpoints, logs, model)")
    for stale in ("model", "model.tar.gz", "failure"):
        path = run_dir / stale
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _code(spec: JobSpec, run_dir: Path) -> str:
    """The job's code as the SDK uploads it: source_dir (or the entry point's file alone)
    packed into sourcedir.tar.gz. Returns the tarball's path (sagemaker_submit_directory)."""
    src = run_dir / "source"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir()
    tar_path = src / "sourcedir.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        if spec.entry_point.kind == "script":
            if spec.source_dir:
                for item in sorted(os.listdir(spec.source_dir)):
                    tar.add(os.path.join(spec.source_dir, item), arcname=item)
            else:
                tar.add(spec.entry_point.target, arcname=os.path.basename(spec.entry_point.target))
    return str(tar_path)


def _unpack_code(tar_path: str, code_dir: Path) -> None:
    if code_dir.exists():
        shutil.rmtree(code_dir)
    code_dir.mkdir(parents=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(code_dir, filter="data")


def _launch(spec: JobSpec, run_dir: Path, console: bool, cores: int | None,
            containers: bool) -> dict:
    _prepare_run(spec, run_dir)
    cores = cores or os.cpu_count() or 1
    hosts = [h for h, _ in spec.topology.host_names()]
    if containers:
        # Every simulated host has its own address: the ports SageMaker's and TensorFlow's
        # conventions fix (2222, ...) are free on each, as on real hosts.
        procs = plan_cluster(spec.topology)
    else:
        ports = PortAllocator()
        procs = plan_cluster(spec.topology, address=lambda host, slot: f"127.0.0.1:{ports.get()}")
    framework = spec.framework_version is not None
    image = find_image(spec.framework_version, spec.py_version) if framework else own_image()
    training_hosts = hosts if framework else sorted(
        {p.host for p in procs if p.role in ("chief", "worker")}, key=hosts.index)
    shares, warnings = {}, []
    for ch in spec.channels.values():
        shares[ch.name], w = assign(ch, training_hosts)
        warnings += w
    for w in warnings:
        print(f"warning: {w}", flush=True)

    channel_modes = {c.name: c.as_dict() for c in spec.channels.values()}
    data_hosts = {p.host for p in procs if p.role == "data_worker"} if containers else set()
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
    source_tar = _code(spec, run_dir)
    hyperparameters = sdk_hyperparameters(
        spec.hyperparameters, program=spec.program, submit_directory=source_tar,
        job_name=spec.name, region=spec.region, log_level=spec.container_log_level,
        model_dir=_model_dir(spec), framework=spec.framework_params)
    interface = "eth0" if containers else "lo"
    shared_ckpt = run_dir / "checkpoints"
    shared_ckpt.mkdir(exist_ok=True)
    shared = run_dir / "shared"
    (shared / "model").mkdir(parents=True, exist_ok=True)
    feeders, boxes = [], {}
    for host in hosts:
        tree = host_base(run_dir, host)
        for sub in ("model", "output/data", "output/intermediate", "input/data", "code", "shared"):
            (tree / sub).mkdir(parents=True, exist_ok=True)
        (tree / "output" / "failure").unlink(missing_ok=True)
        (tree / "output" / "success").unlink(missing_ok=True)
        if not framework:
            # The toolkit unpacks the code itself in a framework image; ctrtrain's own
            # modes find it unpacked, in the same place.
            _unpack_code(source_tar, tree / "code")
        # /opt/ml/checkpoints: SageMaker syncs every host's copy with one S3 prefix, so a
        # re-launched job restores the same checkpoint everywhere; here they are one directory.
        ckpt = tree / "checkpoints"
        if containers:
            if ckpt.is_symlink():
                ckpt.unlink()
            ckpt.mkdir(exist_ok=True)
        elif not ckpt.is_symlink():
            if ckpt.is_dir():
                ckpt.rmdir()   # the mount point of an earlier run in containers
            ckpt.symlink_to(shared_ckpt.resolve(), target_is_directory=True)
        write_config_files(tree, spec.topology, host, channel_modes, hyperparameters, interface)
        for ch in spec.channels.values():
            files = shares[ch.name].get(host, [])
            if host in data_hosts and ch.input_mode == "File":
                # A tf.data service worker reads the files the trainers' pipelines name,
                # wherever they are: its host holds every channel whole.
                files = channel_files(ch)
            if ch.input_mode == "File":
                materialize_file_channel(ch, files, tree / "input" / "data" / ch.name)
            elif host in training_hosts:
                check_pipe_files(ch, files)
                feeders.append(PipeFeeder(tree / "input" / "data", ch.name, files,
                                          spec.pipe_epochs, sup.pids, sup.report_error))
        if containers:
            boxes[host] = HostContainer(
                host, hosts.index(host), tree, run_dir / "tmp" / host, hosts,
                keep=[image.prefix, str(Path(__file__).resolve().parents[2]), str(run_dir)],
                images=[image.prefix], binds={"/opt/ml/checkpoints": str(shared_ckpt),
                                              SHARED: str(shared)})
    try:
        if containers:
            make_bridge()
            for box in boxes.values():
                box.start()
        started = time.time()
        if framework:
            _start_framework_hosts(spec, sup, image, hosts, boxes, hyperparameters, channel_modes,
                                   cores, run_dir)
        else:
            _start_processes(spec, sup, image, procs, boxes, hyperparameters, channel_modes,
                             cores, run_dir, containers)
        for f in feeders:
            f.start()
        try:
            outcome = sup.wait()
        finally:
            for f in feeders:
                f.stop.set()
    finally:
        for box in boxes.values():
            box.stop()
    summary = {"job": spec.name, "ok": outcome.ok, "reason": outcome.reason,
               "seconds": time.time() - started, "exit_codes": outcome.exit_codes,
               "framework_version": spec.framework_version, "image": image.python,
               "processes": [{"label": p.label, "host": p.host, "group": p.group, "role": p.role,
                              "index": p.index, "rank": p.rank,
                              "address": p.address, "tf_config": p.tf_config} for p in procs]
               if not framework else [{"label": f"{h}/train", "host": h} for h in hosts],
               "warnings": warnings, "tolerated_failures": outcome.tolerated}
    failures = _failure_files(run_dir, hosts)
    if not outcome.ok:
        _write_failure(run_dir, hosts, outcome, framework)
        failures = _failure_files(run_dir, hosts)
        summary["failure"] = failures
    if outcome.ok:
        master = _model_host(spec, run_dir, hosts) if framework else \
            next(p for p in procs if p.is_chief).host
        summary["model"], summary["model_files"] = collect_model(
            host_base(run_dir, master) / "model", run_dir)
        if not summary["model_files"]:
            summary["warnings"].append(f"{master} wrote nothing into /opt/ml/model: "
                                       "model.tar.gz is empty")
            print(f"warning: {summary['warnings'][-1]}", flush=True)
    (run_dir / "job.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not outcome.ok:
        first = next(iter(failures.values()), "")
        msg = "\n".join([f"job {spec.name} failed: {outcome.reason}", *outcome.tail] +
                        (["--- /opt/ml/output/failure ---", first.strip()[-2000:]]
                         if first and framework else []))
        raise JobFailed(msg)
    return summary


SHARED = "/opt/ml/shared"


def _model_dir(spec: JobSpec) -> str | None:
    """The `model_dir` hyperparameter. The SDK gives a TensorFlow job an S3 prefix that every
    host shares (a distributed Estimator's checkpoints need one); here, as in the SDK's own
    local mode, /opt/ml/shared/model, one directory bound into every host. ctrtrain's own
    modes get none unless the spec names one (they checkpoint in /opt/ml/checkpoints)."""
    if spec.model_dir is False:
        return None
    if spec.model_dir is None:
        return f"{SHARED}/model" if spec.framework_version else None
    return spec.model_dir


def _platform_env(spec: JobSpec, image: Image, host: str) -> dict[str, str]:
    """What the platform and the image give a SageMaker container before the toolkit runs:
    a clean environment, the image's Python first on PATH, the training module, the job."""
    env = {"PATH": f"{image.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": "/root", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INDEX": "1", "SAGEMAKER_TRAINING_MODULE": TOOLKIT_MODULE,
           "TRAINING_JOB_NAME": spec.name, "AWS_REGION": spec.region,
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.update(spec.environment)
    return env


def _start_framework_hosts(spec, sup, image, hosts, boxes, hyperparameters, channel_modes, cores,
                           run_dir):
    """Each host runs the image's entry, SageMaker's training toolkit (`train`): it reads
    /opt/ml, unpacks the code, installs its requirements.txt, and runs the entry point as the
    SageMaker TensorFlow container does (TF_CONFIG, parameter servers, MWMS). With `mpi`,
    the hosts of the distribution's groups run one horovodrun world instead (_start_mpi)."""
    mpi_hosts = _mpi_hosts(spec)
    for host in hosts:
        if host in mpi_hosts:
            continue
        cmd = [image.python, "-m", "sagemaker_training.cli.train"]
        sup.start(f"{host}/train", boxes[host].enter(cmd, "/opt/ml"),
                  _platform_env(spec, image, host),
                  finished_marker=host_base(run_dir, host) / "output" / "success")
    if mpi_hosts:
        _start_mpi(spec, sup, image, mpi_hosts, boxes, hyperparameters, channel_modes, cores,
                   run_dir)


def _mpi_hosts(spec: JobSpec) -> list[str]:
    """The hosts SageMaker's MPI runner would span: those of the distribution's instance
    groups (all when it names none)."""
    fp = spec.framework_params
    if not fp.get("sagemaker_mpi_enabled"):
        return []
    groups = fp.get("sagemaker_distribution_instance_groups")
    return [h for h, g in spec.topology.host_names() if groups is None or g in groups]


def _mpi_options(options: str) -> tuple[dict[str, str], list[str]]:
    """custom_mpi_options as the toolkit parses them (--NCCL_DEBUG, default INFO) plus the
    `-x NAME[=VALUE]` exports: (variables for every rank, options without meaning here)."""
    exports = {"NCCL_MIN_NRINGS": "4", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}
    words, ignored = options.split(), []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--NCCL_DEBUG" and i + 1 < len(words):
            exports["NCCL_DEBUG"] = words[i + 1]
            i += 2
        elif w == "-x" and i + 1 < len(words):
            name, eq, value = words[i + 1].partition("=")
            if eq:
                exports[name] = value
            elif name in os.environ:
                exports[name] = os.environ[name]
            i += 2
        else:
            ignored.append(w)
            i += 1
    return exports, ignored


def _start_mpi(spec, sup, image, mpi_hosts, boxes, hyperparameters, channel_modes, cores,
               run_dir):
    """SageMaker's `mpi` distribution: where the toolkit would run `mpirun` over ssh, one
    horovodrun (Gloo) world of processes_per_host ranks on each host, every rank in its
    host's container with the environment the toolkit gives (SM_*, its host's local rank,
    OMPI_COMM_WORLD_* as Open MPI sets them, the NCCL and `-x` exports of custom_mpi_options)
    and the command the toolkit would run. The toolkit's own installer puts requirements.txt
    into each host's layer first."""
    if image.horovod is None:
        raise JobFailed(f"job {spec.name}: distribution mpi runs Horovod, which the "
                        f"{image.framework_version} image ({image.python}) does not have; the "
                        "2.15 image has it (`bash scripts/horovod_env.sh`)")
    fp = spec.framework_params
    per_host = fp.get("sagemaker_mpi_num_of_processes_per_host", 1)
    exports, ignored = _mpi_options(fp.get("sagemaker_mpi_custom_mpi_options", ""))
    if ignored:
        print(f"warning: custom_mpi_options {' '.join(ignored)}: mpirun options without meaning "
              "under horovodrun (Gloo); ignored", flush=True)
    slots = [(host, local) for host in mpi_hosts for local in range(per_host)]
    places = rank_places([h for h, _ in slots])
    ranks = []
    for host in mpi_hosts:
        _unpack_code(str(run_dir / "source" / "sourcedir.tar.gz"), host_base(run_dir, host) / "code")
        install = [image.python, "-c", "import sys; from sagemaker_training import entry_point; "
                   "entry_point.install(sys.argv[1], '/opt/ml/code', capture_error=True)",
                   spec.program]
        r = subprocess.run(boxes[host].enter(install, "/opt/ml/code"), capture_output=True,
                           text=True, env=_platform_env(spec, image, host), timeout=1800)
        if r.returncode != 0:
            raise JobFailed(f"{host}: installing /opt/ml/code/requirements.txt failed:\n"
                            f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    for rank, (host, local) in enumerate(slots):
        env = _platform_env(spec, image, host)
        env.update(container_env(Path("/opt/ml"), spec.topology, host, channel_modes,
                                 hyperparameters, spec.name, num_cpus=cores,
                                 framework_module=TOOLKIT_MODULE))
        env.update(exports)
        env[heartbeat.ENV] = str(sup.heartbeat_path("horovodrun"))
        cmd = [image.python, spec.program, *json.loads(env["SM_USER_ARGS"])]
        override = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": bridge_address(), "HOROVOD_GLOO_IFACE": "eth0",
                    **places[rank]}
        ranks.append({"rank": rank, "env": env, "cmd": boxes[host].enter(cmd, "/opt/ml/code"),
                      "cwd": "/", "override": override})
    sup.start("horovodrun", horovod_command(ranks, run_dir, image), dict(os.environ),
              cwd=str(run_dir), server=False)


def _start_processes(spec, sup, image, procs, boxes, hyperparameters, channel_modes, cores,
                     run_dir, containers):
    """ctrtrain's own modes: each role a process of its host, with the SageMaker variables."""
    ranks = []
    for p in procs:
        tree = host_base(run_dir, p.host)
        base = Path("/opt/ml") if containers else tree
        env = dict(os.environ)
        if containers:
            env["PATH"] = f"{image.bin_dir}:{env.get('PATH', '')}"
        env.update(container_env(base, spec.topology, p.host, channel_modes, hyperparameters,
                                 spec.name, num_cpus=cores,
                                 interface="eth0" if containers else "lo"))
        env.update(spec.environment)
        env.update(process_env(p, procs, cores, spec.processing_mode, spec.topology.mode))
        target = spec.entry_point.target
        if spec.entry_point.kind == "script":
            target = str(base / "code" / spec.program)
        # The arguments SM_USER_ARGS names: the hyperparameters as the toolkit passes them.
        cmd = process_command(p, spec.entry_point.kind, target, spec.entry_point.args,
                              json.loads(env["SM_USER_ARGS"]))
        cwd = str(base / "code")
        if containers:
            cmd, cwd = boxes[p.host].enter(cmd, cwd), None
        if spec.topology.mode is Mode.HOROVOD and not p.is_server:
            # Every rank's training heartbeat counts as horovodrun's progress.
            env[heartbeat.ENV] = str(sup.heartbeat_path("horovodrun"))
            # horovodrun runs in the job's namespace and its rendezvous server listens on
            # every interface there: ranks in containers reach it over the bridge.
            override = ({"HOROVOD_GLOO_RENDEZVOUS_ADDR": bridge_address(),
                         "HOROVOD_GLOO_IFACE": "eth0"} if containers else {})
            override.update(rank_places([q.host for q in procs if q.rank is not None])[p.rank])
            ranks.append({"rank": p.rank, "env": env, "cmd": cmd, "cwd": cwd or "/",
                          "override": override})
        else:
            # A parameter-server worker may die: the coordinator reschedules its steps.
            sup.start(p.label, cmd, env, cwd=cwd, server=p.is_server,
                      tolerated=spec.topology.mode.asynchronous and p.role == "worker")
    if ranks:
        sup.start("horovodrun", horovod_command(ranks, run_dir), dict(os.environ),
                  cwd=str(run_dir), server=False)


def _model_host(spec: JobSpec, run_dir: Path, hosts: list[str]) -> str:
    """Whose /opt/ml/model becomes model.tar.gz: the toolkit's master (the first host of the
    distribution's groups, else the first host) -- or, when it wrote nothing there, the
    first host that did (in a heterogeneous job the data hosts save no model)."""
    groups = spec.framework_params.get("sagemaker_distribution_instance_groups")
    named = [h for h, g in spec.topology.host_names() if groups is None or g in groups]
    master = named[0] if named else hosts[0]
    for h in [master] + hosts:
        if any((host_base(run_dir, h) / "model").iterdir()):
            return h
    return master


def rank_places(rank_hosts: list[str]) -> list[dict[str, str]]:
    """Each rank's place among the simulated hosts (`rank_hosts[r]`: the host of rank r), as
    Horovod and Open MPI give it on real hosts: horovodrun here starts every rank on one
    machine and would call them all local. Local rank and size within its host, cross rank
    and size across hosts, and the OMPI_COMM_WORLD_* variables scripts read."""
    hosts = list(dict.fromkeys(rank_hosts))
    out = []
    for rank, host in enumerate(rank_hosts):
        on_host = [r for r, h in enumerate(rank_hosts) if h == host]
        local = on_host.index(rank)
        same_slot = [h for h in hosts if rank_hosts.count(h) > local]
        out.append({"HOROVOD_LOCAL_RANK": str(local), "HOROVOD_LOCAL_SIZE": str(len(on_host)),
                    "HOROVOD_CROSS_RANK": str(same_slot.index(host)),
                    "HOROVOD_CROSS_SIZE": str(len(same_slot)), "HOROVOD_HOSTNAME": host,
                    "OMPI_COMM_WORLD_RANK": str(rank),
                    "OMPI_COMM_WORLD_SIZE": str(len(rank_hosts)),
                    "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
                    "OMPI_COMM_WORLD_LOCAL_SIZE": str(len(on_host))})
    return out


def _failure_files(run_dir: Path, hosts: list[str]) -> dict[str, str]:
    out = {}
    for h in hosts:
        f = host_base(run_dir, h) / "output" / "failure"
        if f.exists():
            out[h] = f.read_text(errors="replace")
    return out


def _write_failure(run_dir: Path, hosts: list[str], outcome, framework: bool) -> None:
    """/opt/ml/output/failure of the host that failed (every host when none in particular
    did), as SageMaker's FailureReason; the toolkit writes its own in framework images."""
    failed = outcome.failed.split("/")[0] if outcome.failed else None
    for h in hosts if failed is None else [failed]:
        f = host_base(run_dir, h) / "output" / "failure"
        if h in hosts and not f.exists():
            f.write_text("\n".join([outcome.reason, *outcome.tail]) + "\n")


def horovod_command(ranks: list[dict], run_dir: Path, image: Image | None = None) -> list[str]:
    """horovodrun (Gloo) starts one process per rank on this machine; each becomes its
    simulated host's process through ctrtrain.launch.hvd_rank, which takes the environment
    the launcher prepared for that rank (horovodrun gives every rank the same environment).
    horovodrun and the shim are the image's (a framework image job) or this Python's."""
    table = run_dir / "logs" / "horovod-ranks.json"
    table.write_text(json.dumps(ranks))
    n = len(ranks)
    python = image.python if image else sys.executable
    runner = str(Path(image.bin_dir) / "horovodrun") if image else horovodrun()
    return [runner, "--gloo", "-np", str(n), "-H", f"localhost:{n}",
            "--network-interface", "lo", python, "-m", "ctrtrain.launch.hvd_rank", str(table)]


def collect_model(model_dir: Path, run_dir: Path) -> tuple[str, list[str]]:
    """The master host's /opt/ml/model becomes the job's output, like SageMaker's
    model.tar.gz step: (the copy's path, the files it holds)."""
    out = run_dir / "model"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(model_dir, out, symlinks=False)
    with tarfile.open(run_dir / "model.tar.gz", "w:gz") as tar:
        for item in sorted(out.iterdir()):
            tar.add(item, arcname=item.name)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return str(out), files
