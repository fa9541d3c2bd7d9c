"""The distribution mode, as a type: parsed once where it enters (a job spec, a flag, a
process's environment), asked for what it implies everywhere else -- never compared as a
string in more than one place."""

from __future__ import annotations

import enum

from .errors import ConfigError


class Mode(enum.StrEnum):
    SINGLE = "single"                      # one process, one replica
    MIRRORED = "mirrored"                  # one process, one replica per local device
    ALLREDUCE = "allreduce"                # MultiWorkerMirroredStrategy, one replica a process
    HOROVOD = "horovod"                    # horovodrun's ranks, one replica a process
    PARAMETER_SERVER = "parameter_server"  # a chief, asynchronous workers, ps

    @classmethod
    def parse(cls, value, where: str = "mode") -> "Mode":
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"{where}: {str(value)[:40]!r} is not one of "
                              f"{', '.join(m.value for m in cls)}") from None

    @property
    def one_process(self) -> bool:
        return self in (Mode.SINGLE, Mode.MIRRORED)

    @property
    def ranked(self) -> bool:
        """Synchronous processes with ranks, each reading its own part of the data."""
        return self in (Mode.ALLREDUCE, Mode.HOROVOD)

    @property
    def uses_tf_config(self) -> bool:
        return self in (Mode.ALLREDUCE, Mode.PARAMETER_SERVER)

    @property
    def asynchronous(self) -> bool:
        return self is Mode.PARAMETER_SERVER

    @property
    def default_processing_mode(self) -> str:
        """Parameter-server workers share one data-service job that must split each epoch
        between them (cluster/plan.py); other modes give every consumer all of it."""
        return "distributed_epoch" if self.asynchronous else "parallel_epochs"
