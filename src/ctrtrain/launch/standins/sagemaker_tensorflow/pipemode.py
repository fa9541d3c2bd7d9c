"""SageMaker's PipeModeDataset for an image whose TensorFlow has no build of AWS's.

AWS publishes `sagemaker-tensorflow` (PipeModeDataset, a C++ dataset op) up to TensorFlow 2.14;
SageMaker's own 2.15 and later containers carry one built for their TensorFlow, which the
package index does not have. The 2.14 op loaded by TensorFlow 2.15 crashes the process at a bare
dataset's first read. On such an image a simulated host imports this module instead
(launch/framework.py), with the op's constructor, arguments and checks (the channel named in
inputdataconfig.json, in Pipe mode; `max_corrupted_records_to_skip` for TFRecord only), and
its files: the channel's FIFOs `<pipe_dir>/<channel>_<N>`, N kept in
`<state_dir>/.<channel>-pipe_mode-state` under an flock of `.<channel>-pipe_mode-lock`, so that
each iterator reads the next epoch's FIFO, in any process of the host, as the op's do. Records
are those of the op's three formats, one scalar string each: RecordIO (SageMaker's framing,
multi-part records joined), TFRecord (length and data CRCs checked; up to
`max_corrupted_records_to_skip` corrupted records in a row skipped), TextLine.

TensorFlow's file readers seek, which a FIFO cannot, so the framing is Python's, here, and
records reach tf.data in blocks (Dataset.from_generator, then unbatched). Two differences
from the op: the pipe index is taken when an iterator first reads (the op takes it when the
iterator is made), and `benchmark` prints nothing.
"""

import fcntl
import json
import os
import struct
import time

import tensorflow as tf

try:
    import google_crc32c

    def _crc32c(data) -> int:
        return google_crc32c.value(bytes(data))
except ImportError:                     # an image without it: the same sums, slower
    _TABLE = []
    for _i in range(256):
        _c = _i
        for _ in range(8):
            _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
        _TABLE.append(_c)

    def _crc32c(data) -> int:
        crc = 0xFFFFFFFF
        for b in bytes(data):
            crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF

FORMATS = ("RecordIO", "TFRecord", "TextLine")
RECORDIO_MAGIC = 0xCED7230A
READ_BYTES = 1 << 20
BLOCK_RECORDS = 512
FILE_WAIT_S = 120        # for the platform to make the epoch's FIFO (the op waits as long)


class PipeModeDatasetException(Exception):
    """An error using a PipeModeDataset."""


def _masked_crc(data) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class _Stream:
    """Reads exact byte counts from a file object; None at a clean end."""

    def __init__(self, f, path):
        self.f, self.path, self.buf, self.pos, self.offset = f, path, b"", 0, 0

    def take(self, n: int, where: str):
        while len(self.buf) - self.pos < n:
            chunk = self.f.read(max(READ_BYTES, n))
            if not chunk:
                if len(self.buf) == self.pos:
                    return None
                raise PipeModeDatasetException(
                    f"{self.path}: the stream ended inside {where} at byte {self.offset}")
            self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        self.offset += n
        return out


def _recordio(stream: _Stream):
    while True:
        parts = []
        while True:
            head = stream.take(8, "a RecordIO header")
            if head is None:
                if parts:
                    raise PipeModeDatasetException(
                        f"{stream.path}: the stream ended inside a multi-part record")
                return
            magic, size_flag = struct.unpack("<II", head)
            if magic != RECORDIO_MAGIC:
                raise PipeModeDatasetException(
                    f"{stream.path}: invalid RecordIO magic number {magic} at byte "
                    f"{stream.offset - 8}")
            size, flag = size_flag & ((1 << 29) - 1), size_flag >> 29
            parts.append(stream.take(size + (4 - size % 4) % 4, "a RecordIO record")[:size]
                         if size else b"")
            if flag not in (1, 2):       # 1 starts and 2 continues a multi-part record
                break
        yield b"".join(parts)


def _tfrecord(stream: _Stream, skip: int):
    skipped = 0
    while True:
        head = stream.take(12, "a TFRecord header")
        if head is None:
            return
        length, length_crc = struct.unpack("<QI", head)
        if _masked_crc(head[:8]) != length_crc:
            raise PipeModeDatasetException(
                f"{stream.path}: CRC check on header failed at byte {stream.offset - 12}")
        data = stream.take(length + 4, "a TFRecord")
        if _masked_crc(data[:length]) != struct.unpack("<I", data[length:])[0]:
            skipped += 1
            if skipped > skip:
                raise PipeModeDatasetException(f"{stream.path}: CRC check on data failed at "
                                               f"byte {stream.offset - length - 16}")
            continue
        skipped = 0
        yield data[:length]


def _lines(f):
    rest = b""
    while True:
        chunk = f.read(READ_BYTES)
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


class _PipeIndex:
    """The channel's next pipe index, in state_dir as the op keeps it."""

    def __init__(self, state_dir: str, channel: str):
        self.lock = os.path.join(state_dir, f".{channel}-pipe_mode-lock")
        self.state = os.path.join(state_dir, f".{channel}-pipe_mode-state")
        with self._locked():
            if not os.path.exists(self.state):
                with open(self.state, "w") as f:
                    f.write("0")

    def _locked(self):
        fd = os.open(self.lock, os.O_WRONLY | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)

        class _Held:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        return _Held()

    def take(self) -> int:
        with self._locked():
            with open(self.state) as f:
                index = int(f.read().strip() or 0)
            with open(self.state, "w") as f:
                f.write(str(index + 1))
        return index


class PipeModeDataset(tf.data.Dataset):
    """A SageMaker Pipe Mode TensorFlow Dataset: the records of the channel's next FIFO."""

    def __init__(self, channel, record_format="RecordIO", state_dir="/opt/ml/pipe_state",
                 pipe_dir="/opt/ml/input/data", config_dir="/opt/ml/input/config",
                 benchmark=False, benchmark_records_interval=0, max_corrupted_records_to_skip=0):
        os.makedirs(state_dir, exist_ok=True)
        self.record_format, self.channel = record_format, channel
        self.pipe_dir, self.state_dir = pipe_dir, state_dir
        self.benchmark, self.benchmark_records_interval = benchmark, benchmark_records_interval
        self.max_corrupted_records_to_skip = max_corrupted_records_to_skip
        with open(os.path.join(config_dir, "inputdataconfig.json")) as f:
            self.input_data_config = json.load(f)
        if channel not in self.input_data_config:
            raise PipeModeDatasetException(
                f"Channel {channel} not found in Training Job InputDataConfig")
        if self.input_data_config[channel].get("TrainingInputMode", "").lower() != "pipe":
            raise PipeModeDatasetException(f"Channel {channel} is not a PipeMode channel")
        if max_corrupted_records_to_skip > 0 and record_format != "TFRecord":
            raise PipeModeDatasetException(
                "max_corrupted_records_to_skip can only be set for record_format='TFRecord'")
        if record_format not in FORMATS:
            raise PipeModeDatasetException(f"record_format {record_format!r} is not one of "
                                           f"{', '.join(FORMATS)}")
        self._index = _PipeIndex(state_dir, channel)
        self._records = tf.data.Dataset.from_generator(
            self._blocks, output_signature=tf.TensorSpec([None], tf.string)).unbatch()
        super().__init__(self._records._variant_tensor)

    def _blocks(self):
        path = os.path.join(self.pipe_dir, f"{self.channel}_{self._index.take()}")
        waited = 0
        while not os.path.exists(path):
            if waited >= FILE_WAIT_S:
                raise PipeModeDatasetException(f"File does not exist: {path}")
            time.sleep(1)
            waited += 1
        with open(path, "rb", buffering=0) as f:
            if self.record_format == "TextLine":
                records = _lines(f)
            elif self.record_format == "TFRecord":
                records = _tfrecord(_Stream(f, path), self.max_corrupted_records_to_skip)
            else:
                records = _recordio(_Stream(f, path))
            block = []
            for r in records:
                block.append(r)
                if len(block) == BLOCK_RECORDS:
                    yield block
                    block = []
            if block:
                yield block

    def _inputs(self):
        return []

    @property
    def element_spec(self):
        return tf.TensorSpec([], tf.string)
