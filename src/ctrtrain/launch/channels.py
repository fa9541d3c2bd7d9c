"""Channels as a SageMaker container sees them: File mode materializes the host's share of the
files under input/data/<channel>/ (FullyReplicated: all; ShardedByS3Key: every n-th key of the
sorted list, like S3 key sharding); Pipe mode feeds one FIFO per channel per epoch,
input/data/<channel>_<epoch>, from the host's share."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

from ..data.files import list_inputs
from ..data.manifest import MANIFEST_NAME, read_manifest
from ..errors import ConfigError
from .spec import Channel


def channel_files(ch: Channel) -> list[str]:
    """The channel's data files, sorted by key (a ctrtrain data dir: those in its manifest)."""
    return sorted(_file_records(ch))


def _file_records(ch: Channel) -> dict[str, int | None]:
    """Each data file of the channel (full path) with its record count from the manifest, or
    None where there is no manifest."""
    if os.path.isdir(ch.path) and os.path.exists(os.path.join(ch.path, MANIFEST_NAME)):
        m = read_manifest(ch.path)
        return dict(zip(m.paths(ch.path), (e.records for e in m.files)))
    return dict.fromkeys(list_inputs([ch.path]))


def assign(ch: Channel, hosts: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(host -> files, warnings)."""
    records = _file_records(ch)
    files = sorted(records)
    if ch.distribution == "FullyReplicated":
        return {h: list(files) for h in hosts}, []
    share = {h: files[i::len(hosts)] for i, h in enumerate(hosts)}
    warnings = []
    counts = sorted(len(v) for v in share.values())
    # A host with no file, or only files its manifest says are empty.
    empty = [h for h, v in share.items()
             if not v or sum(1 if records[f] is None else records[f] for f in v) == 0]
    msg = (f"channel {ch.name}: ShardedByS3Key over {len(hosts)} hosts gives {', '.join(empty)} "
           f"no file or only empty ones ({len(files)} files); use FullyReplicated or at least as "
           "many non-empty files as hosts")
    if empty and ch.name.startswith("train"):
        # Its training processes would have nothing to read: refused before anything starts
        # (a rank without data would stop early and leave the others in a collective).
        raise ConfigError(msg)
    if empty:
        warnings.append(msg)
    elif counts[0] != counts[-1]:
        warnings.append(f"channel {ch.name}: {len(files)} files do not divide evenly over "
                        f"{len(hosts)} hosts (ShardedByS3Key gives {counts[0]} to {counts[-1]} per host)")
    return share, warnings


def materialize_file_channel(ch: Channel, files: list[str], dest: Path) -> None:
    """Links the host's files into dest; a ctrtrain data dir also gets a manifest of the share."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in files:
        os.symlink(os.path.abspath(f), dest / os.path.basename(f))
    if os.path.isdir(ch.path) and os.path.exists(os.path.join(ch.path, MANIFEST_NAME)):
        m = read_manifest(ch.path)
        keep = {os.path.basename(f) for f in files}
        m.files = [e for e in m.files if os.path.basename(e.path) in keep]
        m.files = [type(e)(os.path.basename(e.path), e.records, e.bytes, e.sha256) for e in m.files]
        m.positives = 0  # unknown for a share
        if m.vocabulary and os.path.exists(os.path.join(ch.path, m.vocabulary)):
            os.symlink(os.path.abspath(os.path.join(ch.path, m.vocabulary)), dest / m.vocabulary)
        m.write(dest)


CHECK_READERS_S = 1.0


def _looks_like_text(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(8192)
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start > len(head) - 4   # a character cut by the 8 KB boundary
    return True


def check_pipe_files(ch: Channel, files: list[str]) -> None:
    """A Pipe stream is its files back to back, byte for byte, as SageMaker streams S3
    objects. A text file without a final newline would join its last line to the next
    file's first: refused before the job starts, naming the file. Binary files (TFRecord's
    framed records, anything with a NUL byte or not UTF-8 at its start) need no separator."""
    from ..data.tfrecord import is_tfrecord
    for f in files:
        size = os.path.getsize(f)
        if size == 0 or is_tfrecord(f) or not _looks_like_text(f):
            continue
        with open(f, "rb") as fh:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                raise ConfigError(f"Pipe channel {ch.name}: {f} does not end with a newline; the "
                                  "stream would join its last line to the next file's first")


class PipeFeeder(threading.Thread):
    """Feeds <dir>/<channel>_<epoch> FIFOs, one epoch after another. The FIFO is opened for
    writing only when a reader has opened it (polled, so teardown never blocks here). If more
    than one process of the job holds the FIFO open, the feeder reports an error instead of
    splitting the stream between readers. A reader may close the FIFO before its end (it
    trained the steps it wanted): feeding stops there, and that is not an error."""

    def __init__(self, directory: Path, channel: str, files: list[str], epochs: int,
                 job_pids, on_error, chunk: int = 1 << 20):
        super().__init__(daemon=True, name=f"pipe-{channel}")
        self.directory, self.channel, self.files, self.epochs = directory, channel, files, epochs
        self.job_pids, self.on_error, self.chunk = job_pids, on_error, chunk
        self.stop = threading.Event()
        self.fed_epochs = 0
        self._make(0)  # in place before any process starts, as in a SageMaker container

    def _make(self, epoch: int) -> None:
        path = self.fifo(epoch)
        if path.exists():
            path.unlink()
        os.mkfifo(path)

    def fifo(self, epoch: int) -> Path:
        return self.directory / f"{self.channel}_{epoch}"

    def run(self):
        try:
            for epoch in range(self.epochs):
                path = self.fifo(epoch)
                fd = self._open_when_read(path)
                if fd is None:
                    return
                try:
                    os.set_blocking(fd, True)
                    time.sleep(0.05)
                    self._check_single_reader(path)
                    checked = time.monotonic()
                    for f in self.files:
                        with open(f, "rb") as src:
                            while block := src.read(self.chunk):
                                if self.stop.is_set():
                                    return
                                os.write(fd, block)
                                # Scanning every job process's fds costs CPU the job shares:
                                # once a second is enough to catch a second reader.
                                if time.monotonic() - checked > CHECK_READERS_S:
                                    self._check_single_reader(path)
                                    checked = time.monotonic()
                finally:
                    # Before the reader can see EOF: the next epoch's FIFO appears, and this
                    # one disappears, so a late second reader gets "no such file" at once
                    # instead of blocking forever on a FIFO nobody will write.
                    if epoch + 1 < self.epochs:
                        self._make(epoch + 1)
                    path.unlink(missing_ok=True)
                    os.close(fd)
                self.fed_epochs += 1
        except BrokenPipeError:
            # The reader stopped early: normal for a run of a given number of steps (the
            # supervisor judges the reader by its exit status). The stream just ends here.
            pass
        except Exception as e:  # reported to the supervisor, which fails the job
            self.on_error(f"Pipe channel {self.channel}: {e}")

    def _open_when_read(self, path: Path):
        while not self.stop.is_set():
            try:
                return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
                time.sleep(0.05)
        return None

    def _check_single_reader(self, path: Path):
        readers = [pid for pid in self.job_pids() if _has_open(pid, path)]
        if len(readers) > 1:
            raise ConfigError(f"{len(readers)} processes (pids {readers}) opened the FIFO {path}; "
                              "a Pipe channel has one reader: give each process its own channel")


def _has_open(pid: int, path: Path) -> bool:
    target = os.path.realpath(path)
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False
