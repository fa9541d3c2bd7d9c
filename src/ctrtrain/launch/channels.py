"""Channels as a SageMaker container sees them. File mode copies the host's share of the
channel's objects into input/data/<channel>/, keeping their relative paths (sub-folders,
dotfiles, every kind of file): FullyReplicated gives every host all of them, ShardedByS3Key
every n-th key of the sorted list of keys, like S3 key sharding. A ctrtrain data directory
(one with a manifest) is sharded by its data files, and every host gets the manifest of its
share. Copies, not links: a script that writes into its input changes its host's copy only.
Pipe mode feeds one FIFO per channel per epoch, input/data/<channel>_<epoch>, from the
host's share, each made when the one before is done."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import threading
import time
from pathlib import Path

from ..data.files import remove_tree
from ..data.manifest import MANIFEST_NAME, read_manifest
from ..errors import ConfigError
from .spec import Channel


def _is_data_dir(ch: Channel) -> bool:
    return os.path.isdir(ch.path) and os.path.exists(os.path.join(ch.path, MANIFEST_NAME))


def channel_keys(ch: Channel) -> dict[str, str]:
    """key (path relative to the channel, as an S3 key below its prefix) -> file, sorted by
    key. A ctrtrain data directory: its data files only (its manifest travels separately)."""
    if _is_data_dir(ch):
        m = read_manifest(ch.path)
        files = m.paths(ch.path)
        return {os.path.relpath(f, ch.path): f for f in sorted(files)}
    if os.path.isfile(ch.path):
        return {os.path.basename(ch.path): ch.path}
    keys = {}
    for root, dirs, names in os.walk(ch.path):
        dirs.sort()
        for n in names:
            f = os.path.join(root, n)
            keys[os.path.relpath(f, ch.path)] = f
    return dict(sorted(keys.items()))


def channel_files(ch: Channel) -> list[str]:
    """The channel's files in key order."""
    return list(channel_keys(ch).values())


def _records(ch: Channel) -> dict[str, int | None]:
    """Record count of each data file from the manifest; None where there is none."""
    if _is_data_dir(ch):
        m = read_manifest(ch.path)
        return dict(zip(m.paths(ch.path), (e.records for e in m.files)))
    return dict.fromkeys(channel_files(ch))


def assign(ch: Channel, hosts: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(host -> files in key order, warnings)."""
    records = _records(ch)
    files = channel_files(ch)
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
    """Copies the host's files into dest at their keys; a ctrtrain data dir also gets a
    manifest of the share and its vocabulary."""
    if dest.exists():
        remove_tree(dest)
    dest.mkdir(parents=True)
    root = ch.path if os.path.isdir(ch.path) else os.path.dirname(ch.path)
    for f in files:
        target = dest / os.path.relpath(f, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    if _is_data_dir(ch):
        m = read_manifest(ch.path)
        keep = {os.path.relpath(f, ch.path) for f in files}
        whole = m.records
        m.files = [type(e)(e.path, e.records, e.bytes, e.sha256) for e in m.files if e.path in keep]
        # Positives are counted per set, not per file: a share is given the set's rate, so
        # that every host starts from the prior output bias one process reading the whole
        # set starts from (output_bias prior; exact when the host has every file).
        m.positives = round(m.positives * m.records / whole) if whole else 0
        if m.vocabulary and os.path.exists(os.path.join(ch.path, m.vocabulary)):
            shutil.copy2(os.path.join(ch.path, m.vocabulary), dest / m.vocabulary)
        m.write(dest)


CHECK_READERS_S = 1.0
OPEN_POLL_S = 0.005


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
    """Feeds <dir>/<channel>_<epoch> FIFOs on demand, as SageMaker does: `_0` is in place
    before the job starts, and `_N+1` appears once `_N` is done -- fed to its end, or closed
    by its reader before that (a script that reads a few records and discards its dataset
    gets a fresh epoch from the next one). There is no last epoch unless the spec sets
    `pipe_epochs`: a reader that opens the FIFO past that cap gets an empty stream and the
    job fails with a message naming the cap. A FIFO is opened for writing only when a reader
    has opened it (polled, so teardown never blocks here); if more than one process of the
    job holds it open, the feeder reports an error instead of splitting the stream."""

    def __init__(self, directory: Path, channel: str, files: list[str], epochs: int | None,
                 job_pids, on_error, chunk: int = 1 << 20):
        super().__init__(daemon=True, name=f"pipe-{channel}")
        self.directory, self.channel, self.files, self.epochs = directory, channel, files, epochs
        self.job_pids, self.on_error, self.chunk = job_pids, on_error, chunk
        self.stop = threading.Event()
        self.fed_epochs = 0
        # Wall-clock time of the last bytes handed to a reader: a job whose processes print
        # nothing while they read (an Estimator's evaluation) is making progress.
        self.last_fed = time.time()
        self._make(0)  # in place before any process starts, as in a SageMaker container

    def _make(self, epoch: int) -> None:
        path = self.fifo(epoch)
        if path.exists():
            path.unlink()
        os.mkfifo(path)

    def fifo(self, epoch: int) -> Path:
        return self.directory / f"{self.channel}_{epoch}"

    def run(self):
        epoch = 0
        try:
            while not self.stop.is_set():
                path = self.fifo(epoch)
                fd = self._open_when_read(path)
                if fd is None:
                    return
                if self.epochs is not None and epoch >= self.epochs:
                    os.close(fd)      # the reader sees an empty stream, the job a reason
                    path.unlink(missing_ok=True)
                    raise ConfigError(
                        f"a reader opened {path.name}, epoch {epoch + 1} of the channel, but the "
                        f"job spec caps it at pipe_epochs: {self.epochs} (remove pipe_epochs to "
                        "serve every epoch the script reads, as SageMaker does)")
                try:
                    self._feed(fd, path)
                    self.fed_epochs += 1
                except BrokenPipeError:
                    # The reader closed it before its end: it read what it wanted (a run of
                    # a given number of steps, a dataset read in part and discarded). The
                    # supervisor judges the reader by its exit status; the channel goes on.
                    pass
                finally:
                    # Before the reader can see EOF: the next epoch's FIFO appears, and this
                    # one disappears, so a late second reader gets "no such file" at once
                    # instead of blocking forever on a FIFO nobody will write.
                    self._make(epoch + 1)
                    path.unlink(missing_ok=True)
                    os.close(fd)
                epoch += 1
        except Exception as e:  # reported to the supervisor, which fails the job
            self.on_error(f"Pipe channel {self.channel}: {e}")

    def _feed(self, fd: int, path: Path) -> None:
        """The host's share of the channel, file after file, into the FIFO."""
        os.set_blocking(fd, True)
        _widen(fd)
        self._check_single_reader(path)
        checked = time.monotonic()
        for f in self.files:
            with open(f, "rb") as src:
                offset, size = 0, os.fstat(src.fileno()).st_size
                while offset < size:
                    if self.stop.is_set():
                        return
                    # In the kernel, file to FIFO: no copy through this process.
                    sent = os.sendfile(fd, src.fileno(), offset, self.chunk)
                    if sent == 0:
                        raise OSError(f"{f} shrank while it was streamed")
                    offset += sent
                    self.last_fed = time.time()
                    # Scanning every job process's fds costs CPU the job shares: once a
                    # second is enough to catch a second reader.
                    if time.monotonic() - checked > CHECK_READERS_S:
                        self._check_single_reader(path)
                        checked = time.monotonic()

    def _open_when_read(self, path: Path):
        while not self.stop.is_set():
            try:
                return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
                # A reader at an epoch boundary waits for this open, and with it the model:
                # polled often (a failed open costs microseconds).
                time.sleep(OPEN_POLL_S)
        return None

    def _check_single_reader(self, path: Path):
        readers = [pid for pid in self.job_pids() if _has_open(pid, path)]
        if len(readers) > 1:
            raise ConfigError(f"{len(readers)} processes (pids {readers}) opened the FIFO {path}; "
                              "a Pipe channel has one reader: give each process its own channel")


def _widen(fd: int) -> None:
    """A FIFO holds 64 KB by default: the reader, taking 1 MB a read, would wake the feeder
    16 times per read. Widened to the largest size the system allows an unprivileged process
    (/proc/sys/fs/pipe-max-size, 1 MB by default); left as it is where that is refused."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            size = int(f.read())
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except OSError:
        pass


def _has_open(pid: int, path: Path) -> bool:
    """Whether the process holds `path` open. Compared by device and inode: a process in a
    simulated host sees the FIFO at /opt/ml/..., not at the run directory's path."""
    try:
        want = os.stat(path)
    except OSError:
        return False
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                return True
    except OSError:
        return False
    return False
