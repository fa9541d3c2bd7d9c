"""`ctrtrain run`: this host's part of a job inside a real cluster's container -- its roles
found (cluster/run.py: TF_CONFIG, SageMaker's resourceconfig, or --hosts), its ports checked,
its processes started with the same environment and under the same supervisor (watchdog,
time limit, fail-fast teardown) as the local launcher's."""

from __future__ import annotations

import os

from ..cluster.process_env import process_command, process_env
from ..cluster.run import check_ports, resolve
from ..environment import Environment
from ..errors import CtrError
from ..mode import Mode
from .supervisor import Supervisor


def run_host(*, mode=None, processes_per_host=1, parameter_servers_per_host=1,
             data_service_group=None, processing_mode=None, hosts=None, host_index=None,
             base_port=2222, entry=("recipe", "deepfm", []), watchdog=600.0, time_limit=None,
             dry_run=False):
    """Runs this host's processes to the end (raises CtrError if the job fails); with dry_run,
    returns the resolved roles instead."""
    env = Environment()
    mode = Mode.parse(mode or env.hyperparameters().get("ctrtrain_mode", "single"), "--mode")
    r = resolve(os.environ, mode=mode, processes_per_host=processes_per_host,
                parameter_servers_per_host=parameter_servers_per_host,
                data_service_group=data_service_group, hosts=hosts, host_index=host_index,
                base_port=base_port)
    if dry_run:
        return {"source": r.source, "host": r.host, "processes": [
            {"role": p.role, "index": p.index, "rank": p.rank, "address": p.address,
             "tf_config": p.tf_config} for p in r.processes]}
    check_ports(r.processes)
    kind, target, args = entry
    sup = Supervisor(env.output_data_dir / "ctrtrain-logs", time_limit=time_limit,
                     watchdog=watchdog)
    processing = processing_mode or mode.default_processing_mode
    for p in r.processes:
        penv = dict(os.environ)
        penv.update(process_env(p, r.all_processes, os.cpu_count() or 1, processing, mode))
        sup.start(p.label, process_command(p, kind, target, args, []), penv, server=p.is_server)
    outcome = sup.wait()
    if not outcome.ok:
        raise CtrError("\n".join([outcome.reason, *outcome.tail]))
    return None
