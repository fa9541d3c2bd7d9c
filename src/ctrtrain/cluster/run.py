"""`ctrtrain run`: the entry point inside a real cluster's containers.

It finds who it is, in this order: TF_CONFIG (Kubernetes TFJob, Vertex AI: one process per
container, its role given), SageMaker's resourceconfig.json / SM_* variables (one container
per host: this host's processes are planned exactly as the local launcher plans them), or
explicit --hosts/--host-index flags (bare machines). Then it starts this host's processes
(servers for ps / data-service roles, the entry point for the others) under the same
supervisor as the local launcher; TensorFlow's gRPC runtime does the distributed work."""

from __future__ import annotations

import dataclasses
import os

from ..errors import ConfigError
from .plan import Group, Process, Topology, plan_cluster
from .sagemaker import read_resource_config, topology_from_resource_config

BASE_PORT = 2222


@dataclasses.dataclass
class Resolved:
    source: str                     # "tf_config" | "sagemaker" | "flags"
    host: str
    processes: list[Process]        # this host's (or this container's) processes
    all_processes: list[Process]


def port_address(host: str, slot: int, base_port: int = BASE_PORT) -> str:
    return f"{host}:{base_port + slot}"


def serves(p: Process) -> bool:
    """Whether the process listens on its address (TF gRPC server or tf.data service)."""
    return p.tf_config is not None or p.role in ("dispatcher", "data_worker")


def check_ports(processes: list[Process]) -> None:
    """Every port this host's processes will listen on must be free: every host computes
    every address from the same plan, so a port cannot be moved, only reported."""
    import errno
    import socket
    for p in processes:
        if not serves(p):
            continue
        port = int(p.address.rsplit(":", 1)[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise ConfigError(f"port {port} ({p.label}) is already in use on this host; "
                                      "free it or choose other ports (--base-port)") from e
                raise


def tf_config_processes(cluster: dict) -> list[Process]:
    """Every task of a TF_CONFIG cluster as a process on a host of its own (a TFJob pod),
    named `<role>-<index>` -- two tasks may share an address's host part on one machine, so
    the task, not the address, is the host -- with ranks for all-reduce (chief first)."""
    procs = []
    for role in ("chief", "worker", "ps", "evaluator"):
        for i, addr in enumerate(cluster.get(role, [])):
            task_cfg = {"cluster": cluster, "task": {"type": role, "index": i}}
            procs.append(Process(f"{role}-{i}", "tfjob", role, i, 0, address=addr,
                                 tf_config=task_cfg))
    if "ps" not in cluster:
        from ..environment import tf_config_rank
        for q in procs:
            if q.role in ("chief", "worker"):
                q.rank, q.world_size, _ = tf_config_rank(q.tf_config)
    return procs


def resolve(environ=os.environ, mode: str = "single", processes_per_host: int = 1,
            parameter_servers_per_host: int = 1, data_service_group: str | None = None,
            hosts: list[str] | None = None, host_index: int | None = None,
            base_port: int = BASE_PORT) -> Resolved:
    if environ.get("TF_CONFIG") and not environ.get("CTRTRAIN_ROLE"):
        from ..environment import Environment
        cfg = Environment(environ).tf_config
        try:
            cluster, task = cfg["cluster"], cfg["task"]
            role, index = task["type"], int(task["index"])
            if not 0 <= index < len(cluster[role]):
                raise IndexError(f"task {role} {index} is not in the cluster")
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ConfigError(f"TF_CONFIG is not a valid cluster/task description: {e}") from e
        if role == "master":  # SageMaker's TF1 parameter-server naming
            raise ConfigError("TF_CONFIG names a 'master' (TF1); TF2's ParameterServerStrategy "
                              "needs a 'chief' job")
        procs = tf_config_processes(cluster)
        me = next(q for q in procs if q.role == role and q.index == index)
        me.tf_config = cfg   # exactly as given (it may carry more keys, e.g. "environment")
        return Resolved("tf_config", me.host, [me], procs)
    if hosts:
        if host_index is None or not 0 <= host_index < len(hosts):
            raise ConfigError(f"--host-index must be in [0, {len(hosts)})")
        topo = Topology([Group("cluster", len(hosts), processes_per_host, names=tuple(hosts))],
                        mode, parameter_servers_per_host)
        me, source = hosts[host_index], "flags"
    else:
        rc = read_resource_config(environ)
        if rc is None:
            raise ConfigError("no cluster found: no TF_CONFIG, no SageMaker resourceconfig.json "
                              "or SM_HOSTS, and no --hosts/--host-index")
        topo = topology_from_resource_config(rc, mode, processes_per_host,
                                             parameter_servers_per_host, data_service_group)
        me, source = rc["current_host"], "sagemaker"
    procs = plan_cluster(topo, address=lambda host, slot: port_address(host, slot, base_port))
    return Resolved(source, me, [p for p in procs if p.host == me], procs)
