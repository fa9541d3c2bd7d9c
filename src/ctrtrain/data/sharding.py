"""Who reads what: decided once, here, for every mode and channel layout.

The inputs are those of the public SageMaker DeepFM sample's 4-case table: the channel's S3
distribution (ShardedByS3Key: each host already holds a disjoint part; FullyReplicated: every
host holds everything), whether each worker of a host has its own channel (`training_0`,
`training_1`, ... -- channel k holds local worker k's part of the data), the hosts, the workers
per host and the reader's place among them.

| S3 distribution  | channel per worker | worker (host h, local rank k) reads              |
|------------------|--------------------|--------------------------------------------------|
| ShardedByS3Key   | yes                | all of its channel `training_k` on its host       |
| ShardedByS3Key   | no                 | part k of workers_per_host of its host's files   |
| FullyReplicated  | yes                | part h of hosts of its channel `training_k`       |
| FullyReplicated  | no                 | part (h*workers_per_host + k) of all workers     |

A "part" is a file shard when there are at least as many files as parts and, where the
per-file record counts are known (a manifest), no part would be empty or hold more than twice
another's records; else a record shard (every n-th record; each reader scans all files), which
gives every part data whenever there are at least as many records as parts. Pipe mode has
no files, only a stream: a part is always a record shard, and a FIFO has one reader, so several
workers on a host need a channel each. Either way every example is read exactly once per epoch
across the job (tests/test_sharding.py reads all four cases and checks it).
"""

from __future__ import annotations

import dataclasses
from ..errors import ConfigError

DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    channel: str                             # the channel this reader opens
    file_shard: tuple[int, int] | None = None    # (count, index) over the channel's files
    record_shard: tuple[int, int] | None = None  # (count, index) over its records

    def records(self, file_records: list[int]) -> int:
        """How many records this reader gets, given its channel's per-file record counts."""
        if self.file_shard:
            n, i = self.file_shard
            return sum(file_records[i::n])
        if self.record_shard:
            n, i = self.record_shard
            total = sum(file_records)
            return max(0, (total - i + n - 1) // n)
        return sum(file_records)


def plan_reads(*, channel: str, distribution: str, input_mode: str, hosts: int, host_index: int,
               workers_per_host: int, local_rank: int, channel_per_worker: bool,
               files: int | list[int] | None) -> ReadPlan:
    """`files`: the reader's channel's files on its host: their record counts (from its
    manifest), or just how many there are, or None (Pipe mode)."""
    if distribution not in DISTRIBUTIONS:
        raise ConfigError(f"channel {channel}: unknown S3 distribution {distribution!r}")
    if not (0 <= host_index < hosts and 0 <= local_rank < workers_per_host):
        raise ConfigError(f"reader (host {host_index}, local rank {local_rank}) is outside "
                          f"{hosts} hosts x {workers_per_host} workers")
    if input_mode == "Pipe" and workers_per_host > 1 and not channel_per_worker:
        raise ConfigError(f"channel {channel}: Pipe mode with {workers_per_host} workers per host "
                          "needs one channel per worker (a FIFO has one reader)")
    name = f"{channel}_{local_rank}" if channel_per_worker else channel
    if distribution == "ShardedByS3Key":
        parts, part = (1, 0) if channel_per_worker else (workers_per_host, local_rank)
    elif channel_per_worker:
        parts, part = hosts, host_index
    else:
        parts, part = hosts * workers_per_host, host_index * workers_per_host + local_rank
    if parts == 1:
        return ReadPlan(name)
    if input_mode == "File" and files is not None and _file_shards_even(files, parts):
        return ReadPlan(name, file_shard=(parts, part))
    return ReadPlan(name, record_shard=(parts, part))


def _file_shards_even(files: int | list[int], parts: int) -> bool:
    if isinstance(files, int):
        return files >= parts
    if len(files) < parts:
        return False
    per_part = [sum(files[i::parts]) for i in range(parts)]
    return min(per_part) > 0 and max(per_part) <= 2 * min(per_part)
