"""The sharding plan: for each case of the 4-case table (S3 sharding x channel per worker), File
mode, every example is read exactly once per epoch across all workers -- checked by reading
the real TFRecord files through the real input pipeline, each worker seeing only what its host
holds (launch/channels.assign) and reading what plan_reads tells it."""

import itertools

import numpy as np
import pytest

from ctrtrain.data.convert import libsvm_to_tfrecord
from ctrtrain.data.libsvm import format_libsvm
from ctrtrain.data.manifest import read_manifest
from ctrtrain.data.sharding import plan_reads
from ctrtrain.errors import ConfigError
from ctrtrain.input.pipeline import PipelineConfig, make_dataset
from ctrtrain.launch.channels import assign
from ctrtrain.launch.spec import Channel

from conftest import random_rows

HOSTS, WORKERS_PER_HOST = 2, 2


def _data(tmp_path, name, first_id, rows, shards):
    """A TFRecord data dir whose rows are numbered by their first id (first_id + i)."""
    r = random_rows(n=rows, f=3, feature_size=3_000_000, seed=first_id)
    r.ids[:, 0] = first_id + np.arange(rows)
    src = tmp_path / f"{name}.libsvm"
    src.write_bytes(format_libsvm(r))
    out = tmp_path / name
    libsvm_to_tfrecord([str(src)], out, field_size=3, feature_size=3_000_000, shards=shards,
                       processes=1)
    return out


def _read(files, plan, m):
    ds = make_dataset(files, m.field_size, cfg=PipelineConfig(batch_size=7, shuffle_buffer=0, epochs=1,
                                                               drop_remainder=False),
                      file_shard=plan.file_shard, record_shard=plan.record_shard)
    return [int(i) for b in ds for i in b["ids"][:, 0].numpy()]


@pytest.mark.parametrize("distribution,per_worker,shards",
                         list(itertools.product(["ShardedByS3Key", "FullyReplicated"], [True, False],
                                                [8, 3])))
def test_every_example_read_exactly_once(tmp_path, distribution, per_worker, shards):
    # One channel (all workers share it), or one channel per local worker holding that
    # worker's part of the data (training_0, training_1: distinct ids).
    names = [f"training_{k}" for k in range(WORKERS_PER_HOST)] if per_worker else ["training"]
    dirs = {n: _data(tmp_path, n, 1_000_000 * (i + 1), 150 + 10 * i, shards) for i, n in enumerate(names)}
    expected = sorted(i for d in dirs.values()
                      for i in (1_000_000 * (list(dirs).index(d.name) + 1) + np.arange(
                          read_manifest(d).records)).tolist())
    hosts = [f"algo-{h + 1}" for h in range(HOSTS)]
    shares = {n: assign(Channel(n, str(d), "File", distribution), hosts)[0] for n, d in dirs.items()}
    seen, readers = [], []
    for h, k in itertools.product(range(HOSTS), range(WORKERS_PER_HOST)):
        name = f"training_{k}" if per_worker else "training"
        files = shares[name][hosts[h]]
        m = read_manifest(dirs[name])
        by_name = {e.path: e.records for e in m.files}
        counts = [by_name[f.rsplit("/", 1)[1]] for f in files]
        plan = plan_reads(channel="training", distribution=distribution, input_mode="File",
                          hosts=HOSTS, host_index=h, workers_per_host=WORKERS_PER_HOST,
                          local_rank=k, channel_per_worker=per_worker, files=counts)
        assert plan.channel == name
        got = _read(files, plan, m) if files else []
        assert plan.records(counts) == len(got)
        seen += got
        readers.append(len(got))
    assert sorted(seen) == expected          # each example once: nothing lost, nothing twice
    assert all(n > 0 for n in readers)       # and every worker has data to read


def test_file_shards_when_enough_files_else_records():
    kw = dict(channel="training", distribution="FullyReplicated", input_mode="File", hosts=2,
              host_index=1, workers_per_host=2, local_rank=1, channel_per_worker=False)
    assert plan_reads(files=8, **kw).file_shard == (4, 3)
    assert plan_reads(files=3, **kw).record_shard == (4, 3)
    # Record counts known: an empty or very uneven file part falls back to record shards.
    assert plan_reads(files=[100] * 4, **kw).file_shard == (4, 3)
    assert plan_reads(files=[100, 0, 100, 100], **kw).record_shard == (4, 3)
    assert plan_reads(files=[500, 100, 100, 100], **kw).record_shard == (4, 3)
    assert plan_reads(**{**kw, "input_mode": "Pipe", "channel_per_worker": True}, files=None) \
        .record_shard == (2, 1)
    one = plan_reads(**{**kw, "hosts": 1, "host_index": 0, "workers_per_host": 1, "local_rank": 0},
                     files=4)
    assert one.file_shard is None and one.record_shard is None


def test_pipe_channel_cannot_be_shared_by_a_hosts_workers():
    with pytest.raises(ConfigError, match="one channel per worker"):
        plan_reads(channel="training", distribution="ShardedByS3Key", input_mode="Pipe", hosts=1,
                   host_index=0, workers_per_host=2, local_rank=0, channel_per_worker=False,
                   files=None)


@pytest.mark.parametrize("block", [1, 16])
def test_blocks_keep_epochs_whole_and_the_order_seeded(tmp_path, block):
    """Records moved in blocks (PipelineConfig.read_block) or one by one: every training batch
    holds exactly batch_size records, each epoch holds each record once (epochs do not
    blend), the order is shuffled, the same for the same seed and another for another."""
    d = _data(tmp_path, "t", 1_000_000, 1_003, 4)    # 4 files, a partial block at each end
    files = read_manifest(d).paths(d)

    def order(seed):
        cfg = PipelineConfig(batch_size=64, shuffle_buffer=300, epochs=2, seed=seed,
                             read_block=block)
        sizes, ids = [], []
        for b in make_dataset(files, 3, cfg=cfg):
            sizes.append(len(b["ids"]))
            ids += b["ids"][:, 0].numpy().tolist()
        return sizes, ids
    sizes, ids = order(5)
    assert sizes == [64] * (2 * 1_003 // 64)
    every = list(range(1_000_000, 1_001_003))
    assert sorted(ids[:1_003]) == every
    second = ids[1_003:]                           # the second epoch, less the last partial batch
    assert len(set(second)) == len(second) and set(second) <= set(every)
    assert ids[:1_003] != sorted(ids[:1_003])
    assert order(5)[1] == ids and order(6)[1] != ids
