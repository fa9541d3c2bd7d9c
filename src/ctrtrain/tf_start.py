"""TensorFlow without Keras at start-up: ctrtrain's processes start about 2 CPU-seconds sooner.

`import tensorflow` (2.16 and later) imports Keras 3 eagerly, "so that any function that
needs to happen at load time will trigger", for Keras' own optimizers in the SavedModel
registry; TensorFlow wraps that import in `try/except ImportError`. ctrtrain uses no Keras (its
models, optimizers, checkpoints and SavedModels are TensorFlow's own), yet every process of
it -- a `ctrtrain` command, each trainer, server and data worker of a job -- paid for Keras:
about 35% of the import (`import ctrtrain, tensorflow`: 5.4-5.8 -> 3.4-3.6 CPU-seconds, 2-core
AMD EPYC; docs/benchmarks.md "A process's start and first steps").

`install()` (run when the package is imported) adds an import hook that refuses the `keras`
package only while TensorFlow's own `__init__` runs, when ctrtrain was imported first. Keras
stays installed and importable: `tf.keras` and `import keras` load it on first use, as
TensorFlow's lazy loader always did, so a user's code beside ctrtrain's sees no difference.
`CTRTRAIN_TF_KERAS=1` turns the hook off.

TensorFlow's start-up banner: its C++ libraries log while `import tensorflow` loads them, before
anything can configure their logging -- absl's "WARNING: All log messages before
absl::InitializeLog() is called are written to STDERR", then "oneDNN custom operations are
on ..." (which TF_CPP_MIN_LOG_LEVEL does not reach), each twice (two libraries hold a copy),
and the cpu_feature_guard lines. Every command and every process of a job printed them. The
same hook runs TensorFlow's import with file descriptor 2 (the C++ side's stderr) on a pipe
whose every line but those (`banner_line`) goes on to stderr as it comes: warnings and errors
at import, and Python's own, still show. `--verbose` (CTRTRAIN_VERBOSE=1, which the
processes a command starts inherit) leaves stderr alone and TensorFlow's log level as it is.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading

OFF = "CTRTRAIN_TF_KERAS"
VERBOSE = "CTRTRAIN_VERBOSE"
# What TensorFlow's C++ side says at import without being asked: absl's notice, and its
# informational (I...) lines, with the cpu_feature_guard line's second line.
_BANNER = re.compile(rb"WARNING: All log messages before absl::InitializeLog\(\) is called"
                     rb"|I\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] "
                     rb"|To enable the following instructions: .* rebuild TensorFlow with")


class _KerasAfterTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name != "keras" or not _tensorflow_initializing():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        # TensorFlow also asks where keras is (importlib.util.find_spec, for its API's module
        # path): that gets the real location; only loading it fails.
        spec.loader = self
        return spec

    def create_module(self, spec):
        raise ImportError("keras is loaded on first use, not while TensorFlow starts "
                          f"(ctrtrain.tf_start; {OFF}=1 turns this off)")

    def exec_module(self, module):   # never reached: create_module refuses
        raise ImportError("keras")


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Finds the top-level `tensorflow` package as the import system would, with a loader that
    runs its import under `banner_filtered` (unless verbose) and `collector_paused`."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _FilteredLoader(spec.loader)
        return spec


class _FilteredLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # Afterwards the module is as the import system leaves it: its own loader.
        module.__loader__ = module.__spec__.loader = self.loader
        with collector_paused(), \
                (contextlib.nullcontext() if verbose() else banner_filtered()):
            self.loader.exec_module(module)


_own_process = False


def own_process() -> None:
    """Says that this process is one of ctrtrain's own (a command, a job's fork server or
    trainer), not a user's program that imported ctrtrain: see collector_paused."""
    global _own_process
    _own_process = True


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while the block (TensorFlow's import) runs.
    The import makes about 260,000 objects and almost no garbage (1,657 objects in cycles):
    the collector's four full passes over them were 0.43-0.46 of the import's 2.5-2.7 CPU-s,
    and a run's first full pass 0.18 more. In ctrtrain's own processes (own_process) the
    objects are then frozen (`gc.freeze`: out of every later pass; a job's forks share their
    memory pages instead of copying those the collector would write to), as Python's
    documentation advises for a process that forks; a user's program keeps its collector as
    it was, with TensorFlow's objects collected as usual once the import is over."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _own_process:
            gc.freeze()
        if was:
            gc.enable()

    def __getattr__(self, name):     # get_data, is_package, ...: the real loader's
        return getattr(self.loader, name)


def banner_line(line: bytes) -> bool:
    return bool(_BANNER.match(line.lstrip()))


@contextlib.contextmanager
def banner_filtered():
    """File descriptor 2 into a pipe while the block runs; a thread passes on to stderr, as it
    comes, every line but TensorFlow's banner (banner_line). A banner line is still a sign of
    life: it touches the heartbeat (heartbeat.py), as its output did for a launcher's
    watchdog, which would otherwise see the whole import (seconds) as silence."""
    with contextlib.suppress(OSError, AttributeError, ValueError):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:     # no stderr to filter
        yield
        return
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    reader = threading.Thread(target=_pass_on, args=(read, saved), daemon=True,
                              name="ctrtrain-tf-banner")
    reader.start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)   # closes the pipe's last writing end: the reader sees its end
        reader.join(timeout=10)
        if not reader.is_alive():   # else a process started meanwhile holds the pipe
            os.close(saved)


def _pass_on(read: int, out: int) -> None:
    from . import heartbeat
    pending = b""
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while chunk := pipe.read(1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if banner_line(line):
                    heartbeat.beat(force=True)
                else:
                    os.write(out, line + b"\n")
    if pending and not banner_line(pending):
        os.write(out, pending)


def verbose() -> bool:
    """Whether this process shows TensorFlow's own logging as it comes (`ctrtrain
    --verbose`, inherited by the processes a command starts)."""
    return os.environ.get(VERBOSE) == "1"


def set_verbose(on: bool) -> None:
    """`--verbose` for this process and those it starts; else TensorFlow's C++ log level at
    errors (TF_CPP_MIN_LOG_LEVEL 2, unless the environment says), read when TensorFlow loads."""
    if on:
        os.environ[VERBOSE] = "1"
    if not verbose():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def child_log_env() -> dict[str, str]:
    """What a job's process gets for TensorFlow's logging: this process's verbosity."""
    return {VERBOSE: "1"} if verbose() else {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _tensorflow_initializing() -> bool:
    tf = sys.modules.get("tensorflow")
    return bool(tf is not None and getattr(getattr(tf, "__spec__", None), "_initializing", False))


def install() -> None:
    if "tensorflow" in sys.modules:
        return
    if not any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())
    if os.environ.get(OFF) != "1" and \
            not any(isinstance(f, _KerasAfterTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _KerasAfterTensorFlow())


class _Refused(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name in self.names:
            raise ImportError(f"{name} is not imported here (ctrtrain.tf_start.unimported)",
                              name=name)
        return None


@contextlib.contextmanager
def unimported(*names: str):
    """Within: `import NAME` of a top-level module not imported yet raises ImportError, as if
    it were not installed. TensorBoard's summary helpers import its file-system stub (its
    reader's, for when TensorFlow is absent), which tries boto3 for s3:// paths: 0.35 CPU-s
    of every training process's start, for paths ctrtrain's summaries never take (they are
    written by TensorFlow, whose own file systems read s3://). The stub then has no s3 in
    this process; TensorBoard itself, run as its own process, is not touched."""
    finder = _Refused(n for n in names if n not in sys.modules)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
