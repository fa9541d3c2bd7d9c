"""What a job's process is given besides SageMaker's variables: TF_CONFIG, ranks, its role,
thread settings that do not over-subscribe the host, and the data-service address. One place,
used by the local launcher and by `ctrtrain run`."""

from __future__ import annotations

import json
import sys

from ..tf_start import child_log_env
from .plan import Process, dispatcher_address


def process_env(p: Process, procs: list[Process], cores: int,
                processing_mode: str = "parallel_epochs", mode: str = "single") -> dict[str, str]:
    on_host = [q for q in procs if q.host == p.host]
    env = {"CTRTRAIN_MODE": str(mode), "CTRTRAIN_ROLE": p.role, "CTRTRAIN_TASK_INDEX": str(p.index),
           "CTRTRAIN_ADDRESS": p.address, "CTRTRAIN_HOST": p.host,
           "LOCAL_RANK": str(p.local_rank),
           "PYTHONUNBUFFERED": "1", "CTRTRAIN_NO_PROGRESS": "1"}
    env.update(child_log_env())    # TensorFlow's banner and log level as the command's (-v)
    if p.tf_config:
        env["TF_CONFIG"] = json.dumps(p.tf_config)
    if p.rank is not None:
        env.update(RANK=str(p.rank), WORLD_SIZE=str(p.world_size))
    # Who reads the training data, for the sharding plan (data/sharding.py): the hosts that
    # run readers, in plan order, and this host's readers. Given the same way by the local
    # launcher and by `ctrtrain run` (SageMaker, TF_CONFIG, --hosts), so every path splits
    # the data alike.
    readers = [q for q in procs if is_reader(q)]
    env["CTRTRAIN_READER_HOSTS"] = json.dumps(list(dict.fromkeys(q.host for q in readers)))
    env["LOCAL_SIZE"] = str(sum(1 for q in readers if q.host == p.host))
    d = dispatcher_address(procs)
    if d:
        env["CTRTRAIN_DATA_SERVICE"] = d
        env["CTRTRAIN_DATA_SERVICE_MODE"] = processing_mode
    # Every TF process on a host shares its cores: split them instead of each taking all.
    intra = max(1, cores // max(1, len(on_host)))
    inter = max(2, intra)
    if p.tf_config and "ps" in p.tf_config["cluster"]:
        # ParameterServerStrategy's run hung on a 2-core host with the default inter-op
        # threads; workers + 1 of them run.
        inter = len(p.tf_config["cluster"].get("worker", [])) + 1
        env["GRPC_FAIL_FAST"] = "use_caller"
    elif len(on_host) == 1:
        # Alone on its host: what `ctrtrain tune` measured best here, if it ran (tuned.py).
        from ..train.tuned import tuned_settings
        tuned = tuned_settings()
        if tuned.get("intra_op_threads"):
            intra, inter = tuned["intra_op_threads"], tuned.get("inter_op_threads") or 2
    env.update(TF_NUM_INTRAOP_THREADS=str(intra), TF_NUM_INTEROP_THREADS=str(inter),
               OMP_NUM_THREADS=str(intra))
    return env


def is_reader(p: Process) -> bool:
    """Training processes that read the training channel themselves (a parameter-server
    worker is a server: its data comes through the coordinator's dataset)."""
    return p.role in ("chief", "worker") and not p.is_server


def process_command(p: Process, kind: str, target: str, args: list[str],
                    hp_args: list[str]) -> list[str]:
    """Servers run ctrtrain's role server; every other process runs the job's entry point."""
    if p.is_server:
        return [sys.executable, "-m", "ctrtrain.cluster.server"]
    if kind == "script":
        return [sys.executable, target, *args, *hp_args]
    if kind == "module":
        return [sys.executable, "-m", target, *args, *hp_args]
    return [sys.executable, "-m", f"ctrtrain.recipes.{target}", *args, *hp_args]
