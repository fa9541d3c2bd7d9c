"""Framework image jobs (`framework_version`): every simulated host runs SageMaker's own
training toolkit, as a SageMaker TensorFlow container does; SageMaker's `mpi` distribution
runs as one horovodrun world over the hosts of its instance groups."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .. import heartbeat
from ..cluster.sagemaker import container_env
from ..tf_start import child_log_env
from .container import bridge_address
from .horovod import horovod_command, rank_places
from .images import TOOLKIT_MODULE, Image
from .run_dir import JobFailed, host_base, unpack_code
from .spec import JobSpec


SHARED = "/opt/ml/shared"
# SageMaker's packages where the image has none that works (standins/__init__.py).
STANDINS = Path(__file__).resolve().parent / "standins"


def model_dir_hyperparameter(spec: JobSpec) -> str | None:
    """The `model_dir` hyperparameter. The SDK gives a TensorFlow job an S3 prefix that every
    host shares (a distributed Estimator's checkpoints need one); here, as in the SDK's own
    local mode, /opt/ml/shared/model, one directory bound into every host. ctrtrain's own
    modes get none unless the spec names one (they checkpoint in /opt/ml/checkpoints)."""
    if spec.model_dir is False:
        return None
    if spec.model_dir is None:
        return f"{SHARED}/model" if spec.framework_version else None
    return spec.model_dir


def platform_env(spec: JobSpec, image: Image, host: str) -> dict[str, str]:
    """What the platform and the image give a SageMaker container before the toolkit runs:
    a clean environment, the image's Python first on PATH, the training module, the job."""
    env = {"PATH": f"{image.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": "/root", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INDEX": "1", "SAGEMAKER_TRAINING_MODULE": TOOLKIT_MODULE,
           "TRAINING_JOB_NAME": spec.name, "AWS_REGION": spec.region, **child_log_env()}
    wheels = job_wheelhouse(spec, image)
    if wheels:
        # The toolkit's `pip install -r requirements.txt` finds the index's packages here.
        env["PIP_FIND_LINKS"] = str(wheels)
    env.update(spec.environment)
    if pipe_mode_standin(spec, image):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STANDINS), env.get("PYTHONPATH")) if p)
    return env


def pipe_mode_standin(spec: JobSpec, image: Image) -> bool:
    """Whether the hosts import ctrtrain's PipeModeDataset (standins/sagemaker_tensorflow): a
    job with a Pipe channel on an image without one built for its TensorFlow (AWS published
    its op for 2.11 to 2.14; 2.15's image has 2.14's, whose bare iterator crashes there)."""
    if not any(c.input_mode == "Pipe" for c in spec.channels.values()):
        return False
    return not (image.pipemode and image.pipemode.startswith(image.framework_version + "."))


def job_wheelhouse(spec: JobSpec, image: Image) -> Path | None:
    """The wheelhouse of the job's requirements.txt for its image, made before the hosts
    start (wheelhouse.py)."""
    from .wheelhouse import ready, requirements_file
    req = requirements_file(spec.source_dir)
    return ready(req, image) if req else None


def start_framework_hosts(spec, sup, image, hosts, boxes, hyperparameters, channel_modes, cores,
                           run_dir):
    """Each host runs the image's entry, SageMaker's training toolkit (`train`): it reads
    /opt/ml, unpacks the code, installs its requirements.txt, and runs the entry point as the
    SageMaker TensorFlow container does (TF_CONFIG, parameter servers, MWMS). With `mpi`,
    the hosts of the distribution's groups run one horovodrun world instead (start_mpi)."""
    mpi_hosts = mpi_world_hosts(spec)
    for host in hosts:
        if host in mpi_hosts:
            continue
        cmd = [image.python, "-m", "sagemaker_training.cli.train"]
        sup.start(f"{host}/train", boxes[host].enter(cmd, "/opt/ml"),
                  platform_env(spec, image, host),
                  finished_marker=host_base(run_dir, host) / "output" / "success")
    if mpi_hosts:
        start_mpi(spec, sup, image, mpi_hosts, boxes, hyperparameters, channel_modes, cores,
                   run_dir)


def mpi_world_hosts(spec: JobSpec) -> list[str]:
    """The hosts SageMaker's MPI runner would span: those of the distribution's instance
    groups (all when it names none)."""
    fp = spec.framework_params
    if not fp.get("sagemaker_mpi_enabled"):
        return []
    groups = fp.get("sagemaker_distribution_instance_groups")
    return [h for h, g in spec.topology.host_names() if groups is None or g in groups]


def mpi_options(options: str) -> tuple[dict[str, str], list[str]]:
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


def start_mpi(spec, sup, image, mpi_hosts, boxes, hyperparameters, channel_modes, cores,
               run_dir):
    """SageMaker's `mpi` distribution: where the toolkit would run `mpirun` over ssh, one
    horovodrun (Gloo) world of processes_per_host ranks on each host, every rank in its
    host's container with the environment the toolkit gives (SM_*, its host's local rank,
    OMPI_COMM_WORLD_* as Open MPI sets them, the NCCL and `-x` exports of custom_mpi_options)
    and the command the toolkit would run. The toolkit's own installer puts requirements.txt
    into each host's layer first."""
    if image.horovod is None:
        raise JobFailed(f"job {spec.name}: distribution mpi runs Horovod, which the "
                        f"{image.framework_version} image ({image.python}) does not have; "
                        f"`ctrtrain images build {image.framework_version} --py-version "
                        f"{image.py_version} --horovod` compiles it in (`ctrtrain launch` "
                        "does so on demand, outside the job's namespaces)")
    fp = spec.framework_params
    per_host = fp.get("sagemaker_mpi_num_of_processes_per_host", 1)
    exports, ignored = mpi_options(fp.get("sagemaker_mpi_custom_mpi_options", ""))
    if ignored:
        print(f"warning: custom_mpi_options {' '.join(ignored)}: mpirun options without meaning "
              "under horovodrun (Gloo); ignored", flush=True)
    slots = [(host, local) for host in mpi_hosts for local in range(per_host)]
    places = rank_places([h for h, _ in slots])
    ranks = []
    for host in mpi_hosts:
        unpack_code(str(run_dir / "source" / "sourcedir.tar.gz"), host_base(run_dir, host) / "code")
        install = [image.python, "-c", "import sys; from sagemaker_training import entry_point; "
                   "entry_point.install(sys.argv[1], '/opt/ml/code', capture_error=True)",
                   spec.program]
        r = subprocess.run(boxes[host].enter(install, "/opt/ml/code"), capture_output=True,
                           text=True, env=platform_env(spec, image, host), timeout=1800)
        if r.returncode != 0:
            raise JobFailed(f"{host}: installing /opt/ml/code/requirements.txt failed:\n"
                            f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    for rank, (host, local) in enumerate(slots):
        env = platform_env(spec, image, host)
        env.update(container_env(Path("/opt/ml"), spec.topology, host, channel_modes,
                                 hyperparameters, spec.name, num_cpus=cores,
                                 framework_module=TOOLKIT_MODULE,
                                 training_env_keys=image.training_env_keys))
        env.update(exports)
        env[heartbeat.ENV] = str(sup.heartbeat_path("horovodrun"))
        cmd = [image.python, spec.program, *json.loads(env["SM_USER_ARGS"])]
        override = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": bridge_address(), "HOROVOD_GLOO_IFACE": "eth0",
                    **places[rank]}
        ranks.append({"rank": rank, "env": env, "cmd": boxes[host].enter(cmd, "/opt/ml/code"),
                      "cwd": "/", "override": override})
    sup.start("horovodrun", horovod_command(ranks, run_dir, image), dict(os.environ),
              cwd=str(run_dir), server=False)


def model_hosts(spec: JobSpec, hosts: list[str]) -> list[str]:
    """Whose /opt/ml/model go into model.tar.gz, in the order a file name two of them wrote
    is settled (the first keeps it): every host, the toolkit's master first (the first host
    of the distribution's groups, else the first host)."""
    groups = spec.framework_params.get("sagemaker_distribution_instance_groups")
    named = [h for h, g in spec.topology.host_names() if groups is None or g in groups]
    master = named[0] if named else hosts[0]
    return [master] + [h for h in hosts if h != master]
