"""One Horovod rank as its simulated host's process: horovodrun starts `python -m
ctrtrain.launch.hvd_rank <ranks.json>` once per slot with HOROVOD_RANK set; this replaces
itself with that rank's command, in that rank's environment (its host's SM_* variables,
working directory), keeping horovodrun's HOROVOD_* / Gloo variables except those the rank's
entry overrides (in containers: the rendezvous address on the job's bridge and eth0)."""

from __future__ import annotations

import json
import os
import sys


def main(argv=None) -> None:
    argv = argv if argv is not None else sys.argv[1:]
    rank = int(os.environ["HOROVOD_RANK"])
    entry = next(r for r in json.loads(open(argv[0]).read()) if r["rank"] == rank)
    env = dict(entry["env"])
    env.update({k: v for k, v in os.environ.items()
                if k.startswith(("HOROVOD_", "GLOO_", "OMPI_", "PMIX_"))})
    env.update(entry.get("override", {}))
    os.chdir(entry["cwd"])
    os.execvpe(entry["cmd"][0], entry["cmd"], env)


if __name__ == "__main__":
    main()
