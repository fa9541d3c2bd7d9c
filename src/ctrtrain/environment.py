"""Who this process is, read once from its environment -- the one object every "who am I"
question goes to (the recipe, the training runtime, `ctrtrain run`), in the manner of the
SageMaker training toolkit's `environment.py`:

- SageMaker's contract: SM_CHANNELS, SM_CHANNEL_<NAME>, SM_INPUT_DATA_CONFIG, SM_MODEL_DIR,
  SM_OUTPUT_DIR, SM_HOSTS / SM_CURRENT_HOST, SM_HPS (or hyperparameters.json);
- TensorFlow's: TF_CONFIG (cluster, task), and horovodrun's HOROVOD_* ranks;
- ctrtrain's own, set by the launcher and `ctrtrain run` (cluster/process_env.py):
  CTRTRAIN_MODE, CTRTRAIN_ROLE, CTRTRAIN_HOST, CTRTRAIN_READER_HOSTS, LOCAL_RANK, LOCAL_SIZE,
  CTRTRAIN_DATA_SERVICE(_MODE).

Lower layers take what they need from it as arguments (the data layer's sharding plan takes
hosts and ranks, not variables)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from .errors import ConfigError
from .mode import Mode


@dataclasses.dataclass(frozen=True)
class ChannelInfo:
    name: str
    path: str | None
    input_mode: str = "File"                  # File | Pipe
    distribution: str = "FullyReplicated"     # FullyReplicated | ShardedByS3Key


def tf_config_rank(tf_config: dict) -> tuple[int, int, bool]:
    """(rank, ranks, is_chief) of a TF_CONFIG task among the synchronous processes: a `chief`
    first, then the workers in order (MultiWorkerMirroredStrategy's numbering)."""
    cluster, task = tf_config["cluster"], tf_config["task"]
    chiefs = len(cluster.get("chief", []))
    ranks = chiefs + len(cluster.get("worker", []))
    rank = int(task["index"]) + (chiefs if task["type"] == "worker" else 0)
    return rank, ranks, rank == 0


def _json(environ, key, default):
    try:
        return json.loads(environ[key]) if environ.get(key) else default
    except ValueError:
        raise ConfigError(f"{key} is not valid JSON: {environ[key][:80]!r}") from None


class Environment:
    def __init__(self, environ=None):
        self.environ = dict(os.environ if environ is None else environ)
        e = self.environ
        self.tf_config = _json(e, "TF_CONFIG", None)
        self.mode = self._mode()
        self.role = e.get("CTRTRAIN_ROLE", "worker")
        channels = _json(e, "SM_CHANNELS", [])
        config = _json(e, "SM_INPUT_DATA_CONFIG", {})
        self.channels = {n: ChannelInfo(n, e.get(f"SM_CHANNEL_{n.upper()}"),
                                        config.get(n, {}).get("TrainingInputMode", "File"),
                                        config.get(n, {}).get("S3DistributionType",
                                                              "FullyReplicated"))
                         for n in channels}
        for key, path in e.items():   # a channel given without SM_CHANNELS (a TFJob pod)
            if key.startswith("SM_CHANNEL_") and key != "SM_CHANNELS":
                name = key[len("SM_CHANNEL_"):].lower()
                self.channels.setdefault(name, ChannelInfo(name, path))
        self.model_dir = Path(e.get("SM_MODEL_DIR", "model"))
        self.output_dir = Path(e.get("SM_OUTPUT_DIR", "output"))
        self.output_data_dir = Path(e.get("SM_OUTPUT_DATA_DIR", str(self.output_dir / "data")))
        self.input_config_dir = Path(e.get("SM_INPUT_CONFIG_DIR", "/opt/ml/input/config"))
        if e.get("CTRTRAIN_READER_HOSTS"):
            self.reader_hosts = _json(e, "CTRTRAIN_READER_HOSTS", [])
            self.host = e.get("CTRTRAIN_HOST", self.reader_hosts[0])
        else:
            self.reader_hosts = _json(e, "SM_CURRENT_INSTANCE_GROUP_HOSTS", None) or \
                _json(e, "SM_HOSTS", None) or ["localhost"]
            self.host = e.get("SM_CURRENT_HOST", self.reader_hosts[0])
        self.local_rank = int(e.get("LOCAL_RANK", e.get("HOROVOD_LOCAL_RANK", "0")))
        self.local_size = int(e.get("LOCAL_SIZE", e.get("HOROVOD_LOCAL_SIZE", "1")))
        self.data_service = e.get("CTRTRAIN_DATA_SERVICE") or None
        self.data_service_mode = e.get("CTRTRAIN_DATA_SERVICE_MODE",
                                       self.mode.default_processing_mode)

    def _mode(self) -> Mode:
        """CTRTRAIN_MODE (the launcher and `ctrtrain run`), else what the environment implies:
        horovodrun's ranks, TF_CONFIG with or without parameter servers."""
        e = self.environ
        if e.get("CTRTRAIN_MODE"):
            return Mode.parse(e["CTRTRAIN_MODE"], "CTRTRAIN_MODE")
        if "HOROVOD_RANK" in e or "OMPI_COMM_WORLD_RANK" in e:
            return Mode.HOROVOD
        if self.tf_config:
            cluster = self.tf_config.get("cluster", {})
            if "ps" in cluster:
                return Mode.PARAMETER_SERVER
            if len(cluster.get("worker", [])) + len(cluster.get("chief", [])) > 1:
                return Mode.ALLREDUCE
        return Mode.SINGLE

    def hyperparameters(self) -> dict:
        """SM_HPS, else <input config>/hyperparameters.json (values JSON-decoded where they
        are JSON, as the SageMaker SDK encodes them), else {}."""
        if self.environ.get("SM_HPS"):
            return _json(self.environ, "SM_HPS", {})
        path = self.input_config_dir / "hyperparameters.json"
        if not path.exists():
            return {}
        raw = json.loads(path.read_text())
        out = {}
        for k, v in raw.items():
            try:
                out[k] = json.loads(v) if isinstance(v, str) else v
            except ValueError:
                out[k] = v
        return out

    def channel(self, name: str) -> ChannelInfo | None:
        return self.channels.get(name)

    def read_plan(self, channel: str = "training"):
        """This process's part of a training channel (data/sharding.py's four cases): the
        reader hosts, this host's readers and its place among them, the channel's S3
        distribution and files."""
        from .data.sharding import plan_reads
        per_worker = f"{channel}_0" in self.channels
        first = self.channels.get(f"{channel}_0" if per_worker else channel) or ChannelInfo(channel, None)
        name = f"{channel}_{self.local_rank}" if per_worker else channel
        path = (self.channels.get(name) or ChannelInfo(name, None)).path
        files = None
        if first.input_mode == "File" and path:
            from .data.files import list_inputs
            from .data.manifest import MANIFEST_NAME, read_manifest
            files = [f.records for f in read_manifest(path).files] \
                if os.path.exists(os.path.join(path, MANIFEST_NAME)) else len(list_inputs([path]))
        if self.host not in self.reader_hosts:
            raise ConfigError(f"host {self.host} is not among the reader hosts {self.reader_hosts}")
        return plan_reads(channel=channel, distribution=first.distribution,
                          input_mode=first.input_mode, hosts=len(self.reader_hosts),
                          host_index=self.reader_hosts.index(self.host),
                          workers_per_host=self.local_size, local_rank=self.local_rank,
                          channel_per_worker=per_worker, files=files)
