"""The environment a SageMaker training container gives a process (docs/cluster.md), in one
place: `container_env` writes it (the local launcher), `read_resource_config` and
`topology_from_sagemaker` read it back (`ctrtrain run` inside a real container)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ConfigError
from .plan import Group, Topology

DEFAULT_BASE = "/opt/ml"
HOMOGENEOUS = "homogeneousCluster"   # the group name of a job without instance groups
# sagemaker_* hyperparameters the toolkit keeps for itself; the others reach the framework as
# its parameters (SM_FRAMEWORK_PARAMS), the rest are the user's.
SAGEMAKER_OWN = ("sagemaker_program", "sagemaker_submit_directory",
                 "sagemaker_enable_cloudwatch_metrics", "sagemaker_region",
                 "sagemaker_container_log_level", "sagemaker_job_name", "default_user_module_name",
                 "_tuning_objective_metric", "sagemaker_s3_output")
# Framework parameters that make the current group a distribution group (the toolkit's list).
DISTRIBUTION_FLAGS = ("sagemaker_mpi_enabled", "sagemaker_parameter_server_enabled",
                      "sagemaker_distributed_dataparallel_enabled", "sagemaker_pytorch_ddp_enabled",
                      "sagemaker_pytorch_xla_multi_worker_enabled",
                      "sagemaker_multi_worker_mirrored_strategy_enabled",
                      "sagemaker_torch_distributed_enabled")


def channel_env_name(channel: str) -> str:
    """`training-2` -> `SM_CHANNEL_TRAINING-2`: only upper-cased, as the toolkit does."""
    return f"SM_CHANNEL_{channel.upper()}"


def _env_value(v) -> str:
    """A value as the toolkit writes it into a variable: strings as they are, None empty,
    anything else compact JSON with sorted keys."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def hp_env_value(v) -> str:
    return _env_value(v)


def sdk_hyperparameters(user: dict, *, program: str, submit_directory: str, job_name: str,
                        region: str, log_level: int = 20, model_dir: str | None = DEFAULT_BASE + "/model",
                        framework: dict | None = None) -> dict[str, str]:
    """hyperparameters.json as the SageMaker Python SDK writes it for a TensorFlow estimator:
    the user's values, the script-mode keys, the distribution's `sagemaker_*` keys and
    `model_dir`, every value JSON-encoded (a string "x" becomes "\"x\"", True "true")."""
    hps = dict(user)
    hps.update(sagemaker_submit_directory=submit_directory, sagemaker_program=program,
               sagemaker_container_log_level=log_level, sagemaker_job_name=job_name,
               sagemaker_region=region)
    hps.update(framework or {})
    if model_dir is not None:
        hps["model_dir"] = model_dir
    return {str(k): json.dumps(v) for k, v in hps.items()}


def decode_hyperparameters(encoded: dict[str, str]) -> dict:
    """What the toolkit reads back: each value JSON-decoded, or kept as text when it is not JSON."""
    out = {}
    for k, v in encoded.items():
        try:
            out[k] = json.loads(v)
        except (ValueError, TypeError):
            out[k] = v
    return out


def split_hyperparameters(decoded: dict) -> tuple[dict, dict, dict]:
    """(user hyperparameters, framework parameters, the toolkit's own sagemaker_* values)."""
    user, framework, own = {}, {}, {}
    for k, v in decoded.items():
        if k in SAGEMAKER_OWN:
            own[k] = v
        elif k.startswith("sagemaker_"):
            framework[k] = v
        else:
            user[k] = v
    return user, framework, own


def resource_config(topo: Topology, host: str, interface: str = "eth0") -> dict:
    hosts = topo.host_names()
    group = dict(hosts)[host]
    types = {g.name: g.instance_type for g in topo.groups}
    return {"current_host": host, "current_instance_type": types[group],
            "current_group_name": group, "hosts": [h for h, _ in hosts],
            "instance_groups": [{"instance_group_name": g.name, "instance_type": g.instance_type,
                                 "hosts": [h for h, gg in hosts if gg == g.name]}
                                for g in topo.groups],
            "network_interface_name": interface}


def input_data_config(channels: dict[str, dict]) -> dict:
    return {name: {"TrainingInputMode": c["input_mode"], "S3DistributionType": c["distribution"],
                   "RecordWrapperType": "None"} for name, c in channels.items()}


def write_config_files(base: Path, topo: Topology, host: str, channels: dict[str, dict],
                       hyperparameters: dict[str, str], interface: str = "eth0") -> None:
    """/opt/ml/input/config as the platform writes it; `hyperparameters` already encoded
    (sdk_hyperparameters)."""
    cfg = base / "input" / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "resourceconfig.json").write_text(json.dumps(resource_config(topo, host, interface)))
    (cfg / "inputdataconfig.json").write_text(json.dumps(input_data_config(channels)))
    (cfg / "hyperparameters.json").write_text(json.dumps(hyperparameters))


def container_env(base: Path, topo: Topology, host: str, channels: dict[str, dict],
                  hyperparameters: dict[str, str], job_name: str, num_cpus: int,
                  num_gpus: int = 0, framework_module: str | None = None,
                  interface: str = "eth0", training_env_keys: tuple[str, ...] | None = None) -> dict:
    """Every SM_* variable the SageMaker training toolkit gives the entry point on `host`
    (`Environment().to_env_vars()`, checked key by key against the real toolkit in
    tests/test_launch.py), plus the platform's TRAINING_JOB_NAME, CURRENT_HOST and
    SAGEMAKER_REGION. `hyperparameters` as written in hyperparameters.json. SM_TRAINING_ENV
    holds the toolkit version's own keys when `training_env_keys` names them (the image's
    toolkit, read by launch/images.py)."""
    rc = resource_config(topo, host, interface)
    user, framework, own = split_hyperparameters(decode_hyperparameters(hyperparameters))
    group = rc["current_group_name"]
    groups = {g["instance_group_name"]: g for g in rc["instance_groups"]}
    dist_groups = framework.get("sagemaker_distribution_instance_groups")
    if dist_groups is None:
        dist_groups = [group] if any(framework.get(f) for f in DISTRIBUTION_FLAGS) else []
    dist_hosts = [h for g in rc["instance_groups"] if g["instance_group_name"] in dist_groups
                  for h in g["hosts"]]
    program = own.get("sagemaker_program")
    module_name = program[:-3] if isinstance(program, str) and program.endswith(".py") else program
    paths = {"model_dir": base / "model", "output_dir": base / "output",
             "output_data_dir": base / "output" / "data",
             "output_intermediate_dir": base / "output" / "intermediate",
             "input_dir": base / "input", "input_config_dir": base / "input" / "config"}
    paths = {k: str(v) for k, v in paths.items()}
    channel_dirs = {n: str(base / "input" / "data" / n) for n in channels}
    args = to_cmd_args(user)
    env = {"hosts": rc["hosts"], "network_interface_name": interface, "hps": user,
           "user_entry_point": program, "framework_params": framework, "resource_config": rc,
           "input_data_config": input_data_config(channels), "channels": sorted(channels),
           "current_host": host, "current_instance_type": rc["current_instance_type"],
           "current_instance_group": group,
           "current_instance_group_hosts": groups[group]["hosts"],
           "instance_groups": list(groups), "instance_groups_dict": groups,
           "distribution_instance_groups": dist_groups, "is_hetero": len(groups) > 1,
           "module_name": module_name, "log_level": own.get("sagemaker_container_log_level", 20),
           "framework_module": framework_module, "num_cpus": num_cpus, "num_gpus": num_gpus,
           "num_neurons": 0, "module_dir": own.get("sagemaker_submit_directory", str(base / "code")),
           "user_args": args, **paths}
    master = dist_hosts[0] if dist_hosts else rc["hosts"][0]
    training_env = {
        "additional_framework_parameters": framework, "channel_input_dirs": channel_dirs,
        "current_host": host, "current_instance_group": group,
        "current_instance_group_hosts": groups[group]["hosts"],
        "current_instance_type": rc["current_instance_type"], "distribution_hosts": dist_hosts,
        "distribution_instance_groups": dist_groups, "framework_module": framework_module,
        "hosts": rc["hosts"], "hyperparameters": user, "input_data_config": env["input_data_config"],
        "instance_groups": list(groups), "instance_groups_dict": groups,
        "is_hetero": len(groups) > 1, "is_master": host == master,
        "is_modelparallel_enabled": None, "is_smddpmprun_installed": False,
        "is_smddprun_installed": False, "job_name": job_name, "log_level": env["log_level"],
        "master_hostname": master, "module_dir": env["module_dir"], "module_name": module_name,
        "network_interface_name": interface, "num_cpus": num_cpus, "num_gpus": num_gpus,
        "num_neurons": 0, "resource_config": rc, "topology": [], "user_entry_point": program,
        **paths}
    if training_env_keys is not None:
        training_env = {k: v for k, v in training_env.items() if k in training_env_keys}
    env["training_env"] = training_env
    for name, path in channel_dirs.items():
        env[f"channel_{name}"] = path
    for k, v in user.items():
        env[f"hp_{k}"] = v
    out = {f"SM_{k.upper()}": _env_value(v) for k, v in env.items()}
    out.update(TRAINING_JOB_NAME=job_name, CURRENT_HOST=host,
               SAGEMAKER_REGION=str(own.get("sagemaker_region", "")),
               SAGEMAKER_JOB_NAME=str(own.get("sagemaker_job_name", "")))
    return out


def to_cmd_args(user: dict) -> list[str]:
    """The toolkit's `--key value` arguments: keys sorted, values as Python prints them (a
    boolean is `True`), a mapping as `k=v,k2=v2`."""
    out = []
    for k in sorted(user):
        v = user[k]
        out += [f"--{k}", ",".join(f"{a}={b}" for a, b in sorted(v.items()))
                if isinstance(v, dict) else str(v)]
    return out


def _maybe_json(v: str):
    try:
        return json.loads(v)
    except (json.JSONDecodeError, TypeError):
        return v


def read_resource_config(environ=os.environ) -> dict | None:
    """resourceconfig.json of this container (SM_INPUT_CONFIG_DIR or /opt/ml), or None."""
    if environ.get("SM_RESOURCE_CONFIG"):
        return json.loads(environ["SM_RESOURCE_CONFIG"])
    cfg_dir = Path(environ.get("SM_INPUT_CONFIG_DIR", f"{DEFAULT_BASE}/input/config"))
    path = cfg_dir / "resourceconfig.json"
    if path.exists():
        return json.loads(path.read_text())
    if environ.get("SM_HOSTS") and environ.get("SM_CURRENT_HOST"):
        hosts = json.loads(environ["SM_HOSTS"])
        return {"current_host": environ["SM_CURRENT_HOST"], "hosts": hosts,
                "current_group_name": "homogeneousCluster",
                "instance_groups": [{"instance_group_name": "homogeneousCluster",
                                     "instance_type": environ.get("SM_CURRENT_INSTANCE_TYPE", "unknown"),
                                     "hosts": hosts}]}
    return None


def topology_from_resource_config(rc: dict, mode: str, processes_per_host: int = 1,
                                  parameter_servers_per_host: int = 1,
                                  data_service_group: str | None = None) -> Topology:
    """The job's topology as a SageMaker container sees it. Host order is SageMaker's
    (`hosts`, sorted algo-N) and each group lists its hosts."""
    groups = rc.get("instance_groups") or [{"instance_group_name": "homogeneousCluster",
                                            "hosts": rc["hosts"], "instance_type": "unknown"}]
    order = {h: i for i, h in enumerate(sorted(rc["hosts"], key=_host_key))}
    groups = sorted(groups, key=lambda g: min(order[h] for h in g["hosts"]))
    if data_service_group and data_service_group not in {g["instance_group_name"] for g in groups}:
        raise ConfigError(f"data-service group {data_service_group!r} is not an instance group "
                          f"of this job ({[g['instance_group_name'] for g in groups]})")
    return Topology([Group(g["instance_group_name"], len(g["hosts"]),
                           processes_per_host if g["instance_group_name"] != data_service_group else 1,
                           g.get("instance_type", "unknown"),
                           tuple(sorted(g["hosts"], key=_host_key))) for g in groups],
                    mode=mode, parameter_servers_per_host=parameter_servers_per_host,
                    data_service_group=data_service_group)


def _host_key(h: str):
    prefix, _, num = h.rpartition("-")
    return (prefix, int(num)) if num.isdigit() else (h, 0)
