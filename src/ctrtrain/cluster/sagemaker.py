"""The environment a SageMaker training container gives a process (DESIGN.md 3.3), in one
place: `container_env` writes it (the local launcher), `read_resource_config` and
`topology_from_sagemaker` read it back (`ctrtrain run` inside a real container)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ConfigError
from .plan import Group, Topology

DEFAULT_BASE = "/opt/ml"


def channel_env_name(channel: str) -> str:
    """`training-2` -> `SM_CHANNEL_TRAINING-2`: only upper-cased, as the toolkit does."""
    return f"SM_CHANNEL_{channel.upper()}"


def hp_env_value(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def resource_config(topo: Topology, host: str) -> dict:
    hosts = topo.host_names()
    group = dict(hosts)[host]
    types = {g.name: g.instance_type for g in topo.groups}
    return {"current_host": host, "current_instance_type": types[group],
            "current_group_name": group, "hosts": [h for h, _ in hosts],
            "instance_groups": [{"instance_group_name": g.name, "instance_type": g.instance_type,
                                 "hosts": [h for h, gg in hosts if gg == g.name]}
                                for g in topo.groups],
            "network_interface_name": "lo"}


def input_data_config(channels: dict[str, dict]) -> dict:
    return {name: {"TrainingInputMode": c["input_mode"], "S3DistributionType": c["distribution"],
                   "RecordWrapperType": "None"} for name, c in channels.items()}


def write_config_files(base: Path, topo: Topology, host: str, channels: dict[str, dict],
                       hyperparameters: dict) -> None:
    cfg = base / "input" / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "resourceconfig.json").write_text(json.dumps(resource_config(topo, host), indent=2))
    (cfg / "inputdataconfig.json").write_text(json.dumps(input_data_config(channels), indent=2))
    (cfg / "hyperparameters.json").write_text(
        json.dumps({k: hp_env_value(v) for k, v in hyperparameters.items()}, indent=2))


def container_env(base: Path, topo: Topology, host: str, channels: dict[str, dict],
                  hyperparameters: dict, job_name: str, num_cpus: int, num_gpus: int = 0) -> dict:
    """Every SM_* variable a training process on `host` sees, as strings."""
    rc = resource_config(topo, host)
    names = sorted(channels)
    env = {
        "SM_HOSTS": json.dumps(rc["hosts"]),
        "SM_CURRENT_HOST": host,
        "SM_CURRENT_INSTANCE_TYPE": rc["current_instance_type"],
        "SM_CHANNELS": json.dumps(names),
        "SM_HPS": json.dumps(hyperparameters),
        "SM_MODEL_DIR": str(base / "model"),
        "SM_OUTPUT_DIR": str(base / "output"),
        "SM_OUTPUT_DATA_DIR": str(base / "output" / "data"),
        "SM_OUTPUT_INTERMEDIATE_DIR": str(base / "output" / "intermediate"),
        "SM_INPUT_DIR": str(base / "input"),
        "SM_INPUT_CONFIG_DIR": str(base / "input" / "config"),
        "SM_INPUT_DATA_CONFIG": json.dumps(input_data_config(channels)),
        "SM_RESOURCE_CONFIG": json.dumps(rc),
        "SM_NUM_CPUS": str(num_cpus),
        "SM_NUM_GPUS": str(num_gpus),
        "SM_NETWORK_INTERFACE_NAME": "lo",
        "SM_CURRENT_INSTANCE_GROUP": rc["current_group_name"],
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": json.dumps(
            next(g["hosts"] for g in rc["instance_groups"] if g["instance_group_name"] == rc["current_group_name"])),
        "SM_INSTANCE_GROUPS": json.dumps([g.name for g in topo.groups]),
        "SM_INSTANCE_GROUPS_DICT": json.dumps({g["instance_group_name"]: g for g in rc["instance_groups"]}),
        "SM_IS_HETERO": json.dumps(len(topo.groups) > 1),
        "SM_USER_ARGS": json.dumps(user_args(hyperparameters)),
        "SM_USER_ENTRY_POINT": "",
        "SM_LOG_LEVEL": "20",
        "SM_TRAINING_ENV": "",
    }
    for name in names:
        env[channel_env_name(name)] = str(base / "input" / "data" / name)
    for k, v in hyperparameters.items():
        env[f"SM_HP_{k.upper()}"] = hp_env_value(v)
    training_env = {k[3:].lower(): _maybe_json(v) for k, v in env.items()
                    if k.startswith("SM_") and k != "SM_TRAINING_ENV"}
    training_env.update(hyperparameters=hyperparameters, job_name=job_name,
                        channel_input_dirs={n: env[channel_env_name(n)] for n in names})
    env["SM_TRAINING_ENV"] = json.dumps(training_env)
    return env


def user_args(hyperparameters: dict) -> list[str]:
    """SageMaker passes hyperparameters to the entry point as `--key value` arguments."""
    out = []
    for k, v in hyperparameters.items():
        out += [f"--{k}", hp_env_value(v)]
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
