"""horovodrun as the local launcher uses it: one Gloo world whose ranks become processes of
their simulated hosts (hvd_rank.py), each told its place among those hosts."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .images import Image


def horovodrun() -> str | None:
    """horovodrun beside this Python (its venv), else on PATH."""
    beside = Path(sys.executable).parent / "horovodrun"
    return str(beside) if beside.exists() else shutil.which("horovodrun")


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


def horovod_command(ranks: list[dict], run_dir: Path, image: Image | None = None) -> list[str]:
    """horovodrun (Gloo) starts one process per rank on this machine; each becomes its
    simulated host's process through ctrtrain.launch.hvd_rank, which takes the environment
    the launcher prepared for that rank (horovodrun gives every rank the same environment).
    horovodrun and the shim are the image's (a framework image job) or this Python's."""
    table = run_dir / "logs" / "horovod-ranks.json"
    table.write_text(json.dumps(ranks))
    n = len(ranks)
    if image:
        # The shim by its file: an image built on demand has no ctrtrain installed (the shim
        # needs only the standard library, and runs on the machine, before its rank's box).
        from . import hvd_rank
        runner = str(Path(image.bin_dir) / "horovodrun")
        shim = [image.python, "-I", hvd_rank.__file__]   # -I: not the launch folder on sys.path
    else:
        runner, shim = horovodrun(), [sys.executable, "-m", "ctrtrain.launch.hvd_rank"]
    return [runner, "--gloo", "-np", str(n), "-H", f"localhost:{n}",
            "--network-interface", "lo", *shim, str(table)]
