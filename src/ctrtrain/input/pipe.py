"""Pipe-mode input: records streamed through FIFOs, as SageMaker's Pipe mode delivers a channel.

A Pipe channel `training` appears as FIFOs `<SM_CHANNEL_TRAINING>_0`, `_1`, ... one per epoch,
each streaming the channel's files back to back. TensorFlow's file readers cannot read them
(they seek: "Illegal seek" on a FIFO), so the stream is framed here, in Python, a chunk at a
time, and handed to tf.data as blocks of serialized records; everything after that (shuffle,
batch, vectorized parse) is the same pipeline as File mode (pipeline.py).

Every TFRecord's length and data CRCs are checked, so a truncated or corrupted stream is an
error that names the FIFO, the record and its byte offset, never silently shorter data.

The platform makes each epoch's FIFO on demand, once the one before is done, with no last
one: the reader decides how many epochs it reads (the recipe's `epochs`, or as many as its
`steps` take). A FIFO that does not appear within NEXT_EPOCH_WAIT_S is an error naming it,
never a wait forever.
"""

from __future__ import annotations

import os
import struct
import time

import numpy as np

from ..data.tfrecord import _masked_crc
from ..errors import DataError

READ_BYTES = 1 << 20          # bytes per read() from the FIFO
BLOCK_RECORDS = 1024          # records per element handed to tf.data
# How long to wait for the next epoch's FIFO. ctrtrain's feeder makes it before the reader
# sees the end of the one before; SageMaker's platform makes it soon after.
NEXT_EPOCH_WAIT_S = 60.0


def tfrecord_blocks(stream, name: str, block: int = BLOCK_RECORDS):
    """Lists of serialized records from a TFRecord byte stream, CRCs checked."""
    buf, pos, offset = b"", 0, 0    # offset: the stream position of buf[0]
    out, n = [], 0

    def have(nbytes: int) -> bool:
        """Reads until buf holds nbytes after pos; False at the end of the stream."""
        nonlocal buf, pos, offset
        while len(buf) - pos < nbytes:
            chunk = stream.read(max(READ_BYTES, nbytes))
            if not chunk:
                return False
            offset += pos
            buf, pos = buf[pos:] + chunk, 0
        return True

    while have(12):
        length, len_crc = struct.unpack_from("<QI", buf, pos)
        if _masked_crc(buf[pos:pos + 8]) != len_crc:
            hint = " (the stream is gzip: Pipe mode streams uncompressed TFRecords)" \
                if offset + pos == 0 and buf[:2] == b"\x1f\x8b" else ""
            raise DataError(f"corrupted record length at byte {offset + pos}{hint}",
                            path=name, record=n)
        if not have(16 + length):
            break
        data = buf[pos + 12:pos + 12 + length]
        if _masked_crc(data) != struct.unpack_from("<I", buf, pos + 12 + length)[0]:
            raise DataError(f"corrupted record data (CRC mismatch) at byte {offset + pos}",
                            path=name, record=n)
        out.append(data)
        pos += 16 + length
        n += 1
        if len(out) == block:
            yield out
            out = []
    if len(buf) > pos:
        raise DataError(f"truncated: the stream ended inside a record at byte {offset + pos} "
                        f"({len(buf) - pos} bytes of it)", path=name, record=n)
    if out:
        yield out


def line_blocks(stream, name: str, block: int = BLOCK_RECORDS):
    """Lists of text lines (libsvm) from a byte stream; a last line without newline counts."""
    rest = b""
    while chunk := stream.read(READ_BYTES):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for i in range(0, len(lines), block):
            yield lines[i:i + block]
    if rest:
        yield [rest]


class PipeStream:
    """The generator behind a Pipe channel's dataset: streams `<prefix>_0`, `_1`, ... in turn,
    `epochs` of them (None: without end, for a reader that counts steps). The epochs are read
    here, so the dataset is read once (tf.data's `repeat` would open no new FIFO)."""

    def __init__(self, prefix: str, fmt: str = "tfrecord", epochs: int | None = 1,
                 wait_s: float = NEXT_EPOCH_WAIT_S):
        if fmt not in ("tfrecord", "libsvm"):
            raise ValueError(f"unknown Pipe stream format {fmt!r}")
        self.prefix, self.fmt, self.epochs, self.wait_s = prefix, fmt, epochs, wait_s

    def fifo(self, epoch: int) -> str:
        return f"{self.prefix}_{epoch}"

    def __call__(self):
        blocks = tfrecord_blocks if self.fmt == "tfrecord" else line_blocks
        epoch = 0
        while self.epochs is None or epoch < self.epochs:
            path = self._wait_for(epoch)
            with open(path, "rb", buffering=0) as stream:
                for b in blocks(stream, path):
                    yield np.array(b, dtype=object)
            epoch += 1

    def _wait_for(self, epoch: int) -> str:
        path = self.fifo(epoch)
        deadline = time.monotonic() + self.wait_s
        while not os.path.exists(path):
            if epoch == 0:
                raise DataError("no such FIFO: the channel is not in Pipe mode here, or "
                                "nothing feeds it", path=path)
            if time.monotonic() > deadline:
                raise DataError(f"epoch {epoch + 1}'s FIFO did not appear within "
                                f"{self.wait_s:g} s of the end of the one before: nothing "
                                "feeds the channel any more", path=path)
            time.sleep(0.02)
        return path


def pipe_records(prefix: str, fmt: str = "tfrecord", epochs: int | None = 1):
    """A tf.data.Dataset of the Pipe channel's serialized records (one per element), `epochs`
    FIFOs (None: without end) in order; to be iterated once."""
    import tensorflow as tf
    return tf.data.Dataset.from_generator(
        PipeStream(prefix, fmt, epochs),
        output_signature=tf.TensorSpec([None], tf.string)).unbatch()
