"""The one place that turns a topology (instance groups, hosts, processes per host, mode) into
processes: their role, task index, ranks and TF_CONFIG. The local launcher and `ctrtrain run`
inside a real cluster both call `plan_cluster`, so both give a process the same identity.

Roles per mode:
- single: one `worker` process (no TF_CONFIG).
- allreduce / horovod: every process is a `worker`; worker 0 is the chief (checkpoints,
  evaluation). TF_CONFIG lists all workers (MultiWorkerMirroredStrategy).
- mirrored: one process per host using all local devices (MirroredStrategy); one host.
- parameter_server: TF2's ParameterServerStrategy needs a `chief` (the coordinator, an extra
  process on the first training host), `ps` processes (`parameter_servers_per_host` on every
  training host) and `worker` processes (`processes_per_host` on every training host).
SageMaker's own PS TF_CONFIG says `master` (TF1); TF2 needs `chief`, which is what we emit.
- A data-service group (heterogeneous clusters) runs a `dispatcher` on its first host and
  `data_worker`s (one per host by default); training processes get the dispatcher address.
- parameter_server without a data-service group: the training hosts serve the input
  themselves, a `dispatcher` on the first and a `data_worker` on each. The coordinator builds
  one dataset definition for all workers and cannot tell them apart inside it, so sharding by
  worker index is impossible there; one tf.data-service job in `distributed_epoch` mode gives
  every worker a disjoint part of each epoch instead (every example read once).
"""

from __future__ import annotations

import dataclasses

from ..mode import Mode

SERVER_ROLES = ("ps", "dispatcher", "data_worker")   # never exit on their own


@dataclasses.dataclass(frozen=True)
class Group:
    name: str
    hosts: int
    processes_per_host: int = 1
    instance_type: str = "local"
    names: tuple[str, ...] = ()   # real host names; default algo-N numbered across groups


@dataclasses.dataclass
class Topology:
    groups: list[Group]
    mode: Mode = Mode.SINGLE
    parameter_servers_per_host: int = 1
    data_service_group: str | None = None
    data_workers_per_host: int = 1

    def host_names(self) -> list[tuple[str, str]]:
        """(host name, group) in SageMaker's naming: algo-1, algo-2, ... across groups in order."""
        out, i = [], 1
        for g in self.groups:
            for k in range(g.hosts):
                out.append((g.names[k] if g.names else f"algo-{i}", g.name))
                i += 1
        return out

    def training_groups(self) -> list[Group]:
        return [g for g in self.groups if g.name != self.data_service_group]


@dataclasses.dataclass
class Process:
    host: str
    group: str
    role: str                 # chief | worker | ps | dispatcher | data_worker
    index: int                # task index within its role
    local_rank: int           # among this host's training processes
    rank: int | None = None   # global rank among training processes (all-reduce)
    world_size: int | None = None
    address: str = ""         # host:port where this process serves (TF gRPC)
    tf_config: dict | None = None

    @property
    def label(self) -> str:
        return f"{self.host}/{self.role}/{self.index}"

    @property
    def is_server(self) -> bool:
        """Blocks in server.join() forever: ended by whoever runs the job."""
        return self.role in SERVER_ROLES or (self.role == "worker" and self.tf_config is not None
                                             and "chief" in self.tf_config["cluster"]
                                             and "ps" in self.tf_config["cluster"])

    @property
    def is_chief(self) -> bool:
        return self.role == "chief" or (self.role == "worker" and self.index == 0
                                        and not (self.tf_config or {}).get("cluster", {}).get("chief"))


def plan_cluster(topo: Topology, address=lambda host, slot: f"{host}:{2222 + slot}") -> list[Process]:
    """Every process of the job. `address(host, slot)` gives the endpoint of the slot-th server
    process on a host (slots are numbered per host in a fixed order, so every host computes
    the same addresses for every other host)."""
    topo.mode = Mode.parse(topo.mode)
    hosts = topo.host_names()
    training = {g.name for g in topo.training_groups()}
    per_group = {g.name: g for g in topo.groups}
    procs: list[Process] = []
    slot: dict[str, int] = {}

    def add(host, group, role, index, local_rank):
        p = Process(host, group, role, index, local_rank)
        s = slot.get(host, 0)
        slot[host] = s + 1
        p.address = address(host, s)
        procs.append(p)
        return p

    counters: dict[str, int] = {}

    def next_index(role):
        counters[role] = counters.get(role, 0) + 1
        return counters[role] - 1

    first_training_host = next(h for h, g in hosts if g in training)
    for host, group in hosts:
        g = per_group[group]
        if group not in training:
            if host == next(h for h, gg in hosts if gg == group):
                add(host, group, "dispatcher", 0, 0)
            for _ in range(topo.data_workers_per_host):
                add(host, group, "data_worker", next_index("data_worker"), 0)
            continue
        local = 0
        if topo.mode.asynchronous:
            if host == first_training_host:
                add(host, group, "chief", 0, local)
                if topo.data_service_group is None:
                    add(host, group, "dispatcher", 0, 0)
            if topo.data_service_group is None:
                add(host, group, "data_worker", next_index("data_worker"), 0)
            for _ in range(topo.parameter_servers_per_host):
                add(host, group, "ps", next_index("ps"), 0)
        for _ in range(g.processes_per_host):
            add(host, group, "worker", next_index("worker"), local)
            local += 1

    workers = [p for p in procs if p.role == "worker"]
    if topo.mode.ranked:
        for rank, p in enumerate(workers):
            p.rank, p.world_size = rank, len(workers)
    if topo.mode.uses_tf_config:
        cluster: dict[str, list[str]] = {}
        for role in ("chief", "worker", "ps"):
            members = [p.address for p in procs if p.role == role]
            if members:
                cluster[role] = members
        for p in procs:
            if p.role in cluster:
                p.tf_config = {"cluster": cluster, "task": {"type": p.role, "index": p.index}}
    return procs


def dispatcher_address(procs: list[Process]) -> str | None:
    d = next((p for p in procs if p.role == "dispatcher"), None)
    return f"grpc://{d.address}" if d else None
