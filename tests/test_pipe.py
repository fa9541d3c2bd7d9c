"""Pipe-mode input: the FIFO stream framed in Python must yield exactly the records TensorFlow
reads from the same files, reject damaged streams with the place named, and train DeepFM
through `ctrtrain launch` like a File channel."""

import io
import json
import os
import random
import struct
import time

import pytest
import tensorflow as tf

from conftest import run_cli
from ctrtrain.data.manifest import read_manifest
from ctrtrain.errors import DataError
from ctrtrain.input.pipe import PipeStream, line_blocks, tfrecord_blocks
from ctrtrain.input.pipeline import PipelineConfig, make_pipe_dataset
from ctrtrain.launch.channels import PipeFeeder
from test_launch import spec_from_example


@pytest.fixture(scope="module")
def synth(synth_data):
    return synth_data(rows=20_000, feature_size=2_000)[0]


class Trickle(io.RawIOBase):
    """A stream that returns a few bytes per read, as a FIFO may: exercises every boundary."""

    def __init__(self, data: bytes, seed=0):
        self.data, self.pos, self.rng = data, 0, random.Random(seed)

    def read(self, n=-1):
        k = min(n, self.rng.randint(1, 700))
        out = self.data[self.pos:self.pos + k]
        self.pos += len(out)
        return out


def stream_of(directory):
    m = read_manifest(directory)
    return m, b"".join(open(p, "rb").read() for p in m.paths(directory))


@pytest.mark.tf215
def test_framing_yields_exactly_what_tensorflow_reads(synth):
    m, data = stream_of(synth / "tf" / "train")
    want = [r.numpy() for r in tf.data.TFRecordDataset(m.paths(synth / "tf" / "train"))]
    got = [r for b in tfrecord_blocks(Trickle(data), "fifo", block=100) for r in b]
    assert len(got) == m.records == 16_000
    assert got == want


def record_offsets(data: bytes, n: int) -> list[int]:
    out, pos = [], 0
    while len(out) < n:
        out.append(pos)
        pos += 16 + int.from_bytes(data[pos:pos + 8], "little")
    return out


def test_damaged_streams_are_errors_that_name_the_record(synth):
    _, data = stream_of(synth / "tf" / "train")
    at = record_offsets(data, 4)
    with pytest.raises(DataError, match=rf"fifo, record 3: truncated.* at byte {at[3]} \(10 bytes"):
        list(tfrecord_blocks(io.BytesIO(data[:at[3] + 10]), "fifo"))
    bad = bytearray(data)
    bad[at[1] + 20] ^= 0xFF                    # a byte inside the second record's data
    with pytest.raises(DataError, match=rf"record 1: corrupted record data .* at byte {at[1]}"):
        list(tfrecord_blocks(io.BytesIO(bytes(bad)), "fifo"))
    bad = bytearray(data)
    bad[at[2] + 3] ^= 0x01                     # the third record's length
    with pytest.raises(DataError, match=rf"record 2: corrupted record length at byte {at[2]}$"):
        list(tfrecord_blocks(io.BytesIO(bytes(bad)), "fifo"))
    import gzip
    with pytest.raises(DataError, match="the stream is gzip"):
        list(tfrecord_blocks(io.BytesIO(gzip.compress(data[:5000])), "fifo"))


def recordio(*records, split=()) -> bytes:
    """SageMaker's RecordIO framing; the records at the indices in `split` in two parts."""
    out = b""
    for i, r in enumerate(records):
        parts = [(0, r)] if i not in split else [(1, r[:3]), (3, r[3:])]
        for flag, part in parts:
            out += struct.pack("<II", 0xCED7230A, (flag << 29) | len(part)) + part
            out += b"\0" * ((4 - len(part) % 4) % 4)
    return out


@pytest.mark.tf215
def test_the_stand_in_pipe_mode_dataset_reads_the_next_fifo_each_iteration(synth, tmp_path):
    """ctrtrain's PipeModeDataset (launch/standins, for images without a PipeModeDataset
    built for their TensorFlow): each iterator, of any PipeModeDataset of the channel, reads
    the channel's next FIFO (the index kept in state_dir, as SageMaker's op keeps it), in each
    record format, in eager and graph mode; damaged records are errors naming the FIFO."""
    import threading
    from ctrtrain.launch.standins.sagemaker_tensorflow import (PipeModeDataset,
                                                               PipeModeDatasetException)
    config, pipes, state = tmp_path / "config", tmp_path / "data", tmp_path / "state"
    config.mkdir()
    pipes.mkdir()
    (config / "inputdataconfig.json").write_text(json.dumps({
        "training": {"TrainingInputMode": "Pipe"}, "lines": {"TrainingInputMode": "Pipe"},
        "io": {"TrainingInputMode": "Pipe"}, "file": {"TrainingInputMode": "File"}}))
    dirs = {"pipe_dir": str(pipes), "config_dir": str(config), "state_dir": str(state)}
    m, data = stream_of(synth / "tf" / "train")
    want = [r.numpy() for r in tf.data.TFRecordDataset(m.paths(synth / "tf" / "train"))]

    def fifo(name: str, payload: bytes):    # a real FIFO, written as a reader opens it
        def write():
            try:
                (pipes / name).write_bytes(payload)
            except BrokenPipeError:            # a reader that stopped early (graph mode below)
                pass
        os.mkfifo(pipes / name)
        threading.Thread(target=write, daemon=True).start()
    fifo("training_0", data)
    ds = PipeModeDataset("training", record_format="TFRecord", **dirs)
    assert ds.element_spec == tf.TensorSpec([], tf.string)
    assert [r.numpy() for r in ds] == want                        # epoch 0
    at = record_offsets(data, 8)
    (pipes / "training_1").write_bytes(data[:at[7]])
    again = PipeModeDataset("training", record_format="TFRecord", **dirs)   # the same index
    assert [r.numpy() for r in again] == want[:7]
    assert (state / ".training-pipe_mode-state").read_text() == "2"
    # A bare dataset's iterator in graph mode (where 2.14's op crashes TensorFlow 2.15).
    fifo("training_2", data)
    with tf.Graph().as_default():
        it = tf.compat.v1.data.make_one_shot_iterator(
            PipeModeDataset("training", record_format="TFRecord", **dirs))
        first = it.get_next()
        with tf.compat.v1.Session() as sess:
            assert sess.run(first) == want[0]
    records = [b"a", b"", b"seven b", b"x" * 13]
    (pipes / "io_0").write_bytes(recordio(*records, split={2, 3}))
    assert [r.numpy() for r in PipeModeDataset("io", **dirs)] == records     # RecordIO default
    (pipes / "lines_0").write_bytes(b"1 2:1\n0 3:1\n\n1 4:1")
    assert [r.numpy() for r in PipeModeDataset("lines", record_format="TextLine", **dirs)] == \
        [b"1 2:1", b"0 3:1", b"", b"1 4:1"]
    # Damaged: named; with max_corrupted_records_to_skip, skipped.
    bad = bytearray(data[:at[2]])
    bad[at[1] + 20] ^= 0xFF
    (pipes / "training_3").write_bytes(bytes(bad))
    with pytest.raises(tf.errors.OpError, match=f"training_3: CRC check on data failed at "
                                                f"byte {at[1]}"):
        list(PipeModeDataset("training", record_format="TFRecord", **dirs))
    (pipes / "training_4").write_bytes(bytes(bad))
    assert [r.numpy() for r in PipeModeDataset("training", record_format="TFRecord",
                                                max_corrupted_records_to_skip=1, **dirs)] == \
        want[:1]
    (pipes / "io_1").write_bytes(recordio(b"abcdef")[:10])
    with pytest.raises(tf.errors.OpError, match="io_1: the stream ended inside a RecordIO"):
        list(PipeModeDataset("io", **dirs))
    for channel, kw, message in (("nope", {}, "Channel nope not found"),
                                 ("file", {}, "Channel file is not a PipeMode channel"),
                                 ("io", {"max_corrupted_records_to_skip": 1}, "only be set for")):
        with pytest.raises(PipeModeDatasetException, match=message):
            PipeModeDataset(channel, **kw, **dirs)


def test_libsvm_lines_survive_any_chunking(synth):
    m, data = stream_of(synth / "raw" / "train")
    lines = data.rstrip(b"\n").split(b"\n")
    assert [x for b in line_blocks(Trickle(data, seed=1), "fifo") for x in b] == lines
    # A last line without its newline still counts.
    assert [x for b in line_blocks(io.BytesIO(b"1 1:1\n0 2:1"), "f") for x in b] == [b"1 1:1", b"0 2:1"]


def test_the_reader_reads_its_epochs_fifos_then_ends(synth, tmp_path):
    m = read_manifest(synth / "tf" / "train")
    errors = []
    feeder = PipeFeeder(tmp_path, "training", m.paths(synth / "tf" / "train"), None,
                        lambda: [os.getpid()], errors.append)
    feeder.start()
    ds = make_pipe_dataset(str(tmp_path / "training"), m.field_size,
                           cfg=PipelineConfig(batch_size=1000, shuffle_buffer=500, epochs=2))
    labels = [b["label"].numpy() for b in ds]
    # Two epochs, every record, then the end: 2 x 16,000 records. The feeder has made the
    # third epoch's FIFO (on demand, as SageMaker does) and waits for a reader that never comes.
    assert len(labels) == 32 and sum(len(x) for x in labels) == 32_000
    assert not errors and feeder.fed_epochs == 2 and (tmp_path / "training_2").exists()
    feeder.stop.set()
    feeder.join(10)
    # Without an epoch count (a run given in steps) the stream goes on: 5 epochs' batches.
    (tmp_path / "more").mkdir()
    feeder = PipeFeeder(tmp_path / "more", "training", m.paths(synth / "tf" / "train"), None,
                        lambda: [os.getpid()], errors.append)
    feeder.start()
    more = make_pipe_dataset(str(tmp_path / "more" / "training"), m.field_size,
                             cfg=PipelineConfig(batch_size=1000, shuffle_buffer=0, epochs=None))
    assert len(list(more.take(80))) == 80
    feeder.stop.set()
    feeder.join(10)
    assert not errors and feeder.fed_epochs >= 4
    with pytest.raises(DataError, match="no such FIFO"):
        next(PipeStream(str(tmp_path / "absent"))())
    # A FIFO that never comes is an error naming it, not a wait forever.
    (tmp_path / "gone_0").write_bytes(b"")           # an empty first epoch, then nothing
    stream = PipeStream(str(tmp_path / "gone"), epochs=2, wait_s=0.5)
    with pytest.raises(DataError, match="gone_1: epoch 2's FIFO did not appear within 0.5 s"):
        list(stream())


def pipe_spec(tmp_path, synth, example, hyperparameters, **over):
    m = read_manifest(synth / "tf" / "train")
    hp = {"batch_size": 256, "field_size": m.field_size, "feature_size": m.feature_size,
          "export": False, **hyperparameters}
    return spec_from_example(
        tmp_path, example, hyperparameters=hp,
        channels={"training": {"path": str(synth / "tf" / "train"), "input_mode": "Pipe"},
                  "test": {"path": str(synth / "tf" / "test")}}, **over)


@pytest.mark.slow
@pytest.mark.tf215
def test_deepfm_recipe_trains_from_a_pipe_channel_for_its_epochs(tmp_path, synth):
    run_cli("launch", pipe_spec(tmp_path, synth, "deepfm-single", {"epochs": 2}))
    result = json.loads((tmp_path / "run" / "model" / "result.json").read_text())
    # No steps given: one reader trains on every record of two epochs' FIFOs, in full batches.
    assert result["step"] == 2 * 16_000 // 256
    assert result["test"]["auc"] > 0.6


@pytest.mark.slow
def test_allreduce_ranks_share_pipe_streams_and_a_capped_stream_fails_fast(tmp_path, synth):
    # FullyReplicated over 2 hosts: each host's FIFO streams everything, each rank keeps
    # every other record (a record shard), and both run the steps given, reading as many
    # epochs as they take. They stop in the middle of the second epoch: a reader that
    # closes early is no failure.
    run_cli("launch", pipe_spec(tmp_path, synth, "deepfm-allreduce",
                                {"steps": 40, "shuffle_buffer": 1000}))
    result = json.loads((tmp_path / "run" / "model" / "result.json").read_text())
    assert result["step"] == 40 and result["replicas"] == 2 and result["test"]["auc"] > 0.55
    # 8,000 records per rank and epoch = 31 batches of 256: 40 steps need a second epoch,
    # which a spec that caps the channel at one does not serve.
    (tmp_path / "short").mkdir()
    t = time.time()
    r = run_cli("launch", pipe_spec(tmp_path / "short", synth, "deepfm-allreduce", {"steps": 40},
                                    pipe_epochs=1, time_limit=300), check=False)
    assert r.returncode == 2 and time.time() - t < 120
    assert ("a reader opened training_1, epoch 2 of the channel, but the job spec caps it at "
            "pipe_epochs: 1") in r.stderr


@pytest.mark.parametrize("over, message", [
    ({"field_size": None}, "a stream carries no manifest; give field_size and feature_size"),
    ({"mode": "parameter_server"}, "mode parameter_server reads File channels"),
    ({"data_service": "grpc://localhost:1"}, "cannot be read through tf.data service"),
    ({"cache": True}, "cache: a Pipe channel streams every epoch anew"),
])
def test_pipe_settings_that_cannot_work_are_refused_before_anything_starts(tmp_path, over, message):
    from ctrtrain.errors import ConfigError
    from ctrtrain.train import train
    from ctrtrain.train.config import TrainConfig
    cfg = TrainConfig(str(tmp_path / "training"), str(tmp_path / "model"), input_mode="Pipe",
                      **{"field_size": 39, "feature_size": 1000, **over})
    with pytest.raises(ConfigError, match=message):
        train(cfg)
    assert not (tmp_path / "model").exists()


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    """Synthesized splits with numeric, categorical, multi_hot and sequence fields."""
    out = tmp_path_factory.mktemp("declared") / "data"
    run_cli("data", "synth", "--out", out, "--rows", 6_000, "--feature-size", 2_000, "--seed", 3,
            "--numeric-fields", 2, "--categorical-fields", 5, "--multi-hot-fields", 2,
            "--multi-hot-len", 3, "--multi-hot-vocab", 200, "--sequence-fields", 1,
            "--sequence-len", 2, "--files-per-split", 2,
            "--processes", 1)
    return out


@pytest.mark.slow
def test_a_pipe_channel_streams_declared_fields(tmp_path, declared):
    """A stream has no manifest: the `fields` hyperparameter declares it (the JSON list, as a
    SageMaker estimator passes it), and the recipe trains on every record of every epoch and
    evaluates the declared test channel."""
    m = read_manifest(declared / "train")
    hp = {"batch_size": 100, "fields": json.dumps(m.fields), "feature_size": m.feature_size,
          "export": False}
    spec = spec_from_example(
        tmp_path, "deepfm-single", hyperparameters={**hp, "epochs": 2},
        channels={"training": {"path": str(declared / "train"), "input_mode": "Pipe"},
                  "test": {"path": str(declared / "test")}})
    run_cli("launch", spec)
    result = json.loads((tmp_path / "run" / "model" / "result.json").read_text())
    assert result["step"] == 2 * m.records // 100
    assert result["test"]["auc"] > 0.6


def test_a_streams_declaration_is_read_and_checked(tmp_path, declared, synth):
    """`fields` as a data directory, its manifest or the list; a fixed-schema manifest, a
    declaration that disagrees with field_size, or `fields` in File mode is refused."""
    from ctrtrain.data.manifest import declared_fields
    from ctrtrain.errors import ConfigError
    from ctrtrain.train import train
    from ctrtrain.train.config import TrainConfig
    want = read_manifest(declared / "train").fields
    assert declared_fields(str(declared / "train")) == want
    assert declared_fields(str(declared / "train" / "manifest.json")) == want
    assert declared_fields(want) == want
    with pytest.raises(DataError, match="declares no fields"):
        declared_fields(str(synth / "tf" / "train"))
    with pytest.raises(DataError, match=r"fields\[0\].*kind 'dense'"):
        declared_fields([{"name": "a", "kind": "dense"}])

    def config(**over):
        return TrainConfig(str(tmp_path / "training"), str(tmp_path / "model"), input_mode="Pipe",
                           feature_size=2_000, **over)
    with pytest.raises(ConfigError, match="field_size 39, but fields declares"):
        train(config(fields=want, field_size=39))
    with pytest.raises(ConfigError, match="streamed as TFRecord, not libsvm"):
        train(config(fields=want, data_format="libsvm"))
    with pytest.raises(ConfigError, match="fields is for a Pipe channel"):
        train(TrainConfig(str(declared / "train"), str(tmp_path / "model"), fields=want))
    assert not (tmp_path / "model").exists()
