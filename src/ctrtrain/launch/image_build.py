"""Framework images built on demand, for any TensorFlow release pip can install on this
machine's Python, as SageMaker offers a container for every release. An image is a venv in
the cache (cache.py: images/tensorflow-X.Y-pyNNN) holding what SageMaker's TensorFlow
container of that version holds for a training script:

- tensorflow-cpu X.Y (the newest patch release) for the job's py_version (this Python's by
  default; another one on PATH or installed by pyenv, for releases older than this Python's
  wheels); Keras 2 is TensorFlow's own up to 2.15, and
  tf-keras X.Y from 2.16 on (Keras 3 is the default there: TF_USE_LEGACY_KERAS=1 selects it);
- SageMaker's training toolkit (sagemaker-training; 4.8.3 up to TF 2.15, whose protobuf 3.20
  the 5.x toolkits cannot use) and the TensorFlow container's entry
  (sagemaker-tensorflow-training, without its dependency pins, as in the project's images);
- SageMaker's PipeModeDataset (sagemaker-tensorflow X.Y, its C++ op built for that
  TensorFlow) where AWS published a cp310 wheel of it (2.11 to 2.14), whose files do not
  depend on the Python version.

Horovod stays in the 2.15 image (scripts/horovod_env.sh). A build shows pip's progress and
its time; it runs under a lock, is marked incomplete until its last step (an interrupted
build is rebuilt, never used), and is reused by every later launch."""

from __future__ import annotations

import fcntl
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ConfigError
from ..data.files import remove_tree
from ..data.manifest import INCOMPLETE_NAME
from .images import Image, find_image, image_dir, probe

TOOLKIT_ENTRY = "sagemaker-tensorflow-training==20.5.0"


def _toolkit(version: tuple[int, int]) -> list[str]:
    """SageMaker's training toolkit for a TensorFlow version, and the protobuf both accept.
    TensorFlow 2.8-2.11 name no upper bound on numpy but break under numpy 2."""
    if version < (2, 12):
        return ["sagemaker-training==4.8.3", "protobuf<3.20", "numpy<2"]
    if version < (2, 16):
        return ["sagemaker-training==4.8.3", "protobuf==3.20.3"]
    return ["sagemaker-training==5.1.4"]


def _series(python_version: str) -> list[str]:
    """The TensorFlow release series pip can install for Python `python_version`, oldest first."""
    releases = installable("tensorflow-cpu", python_version)
    return sorted({".".join(v.split(".")[:2]) for v in releases if re.match(r"\d+\.\d+\.\d+$", v)},
                  key=lambda s: tuple(map(int, s.split("."))))


def this_py() -> str:
    return f"py{sys.version_info.major}{sys.version_info.minor}"


def interpreter(py_version: str) -> str | None:
    """A working Python of py_version (py310 -> python3.10) on this machine: on PATH, or one
    pyenv installed; None if there is none."""
    if py_version == this_py():
        return getattr(sys, "_base_executable", None) or sys.executable
    m = re.fullmatch(r"py3(\d+)", py_version)
    if not m:
        return None
    name = f"python3.{m.group(1)}"
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = [shutil.which(name)] + sorted(
        glob.glob(os.path.join(pyenv, "versions", f"3.{m.group(1)}.*", "bin", name)), reverse=True)
    for python in filter(None, found):
        # A pyenv shim is on PATH whether or not that version is selected: try it.
        if subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


def known_interpreters() -> list[str]:
    return [f"py3{n}" for n in range(8, 15) if interpreter(f"py3{n}")]


@functools.lru_cache(maxsize=None)
def installable(package: str, python_version: str) -> tuple[str, ...]:
    """Every release of `package` pip finds a wheel of for Python `python_version` (3.11),
    newest first."""
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package,
                        "--python-version", python_version, "--only-binary=:all:"],
                       capture_output=True, text=True, timeout=300)
    m = re.search(r"Available versions: (.*)", r.stdout)
    if r.returncode != 0 or not m:
        return ()
    return tuple(v.strip() for v in m.group(1).split(","))


def ensure_image(framework_version: str, py_version: str | None, say=print) -> Image:
    """The image of framework_version: one that exists, else built now (needs the package
    index: call it outside the job's namespaces)."""
    try:
        return find_image(framework_version, py_version)
    except ConfigError as missing:
        if not re.fullmatch(r"2\.\d+", framework_version):
            raise missing
    return build_image(framework_version, py_version, say)


def build_image(framework_version: str, py_version: str | None = None, say=print) -> Image:
    py = py_version or this_py()
    base = interpreter(py)
    if base is None:
        raise ConfigError(f"py_version {py}: this machine has no Python {py[2]}.{py[3:]} to "
                          f"build an image with (it has: {', '.join(known_interpreters())})")
    dotted = f"{py[2]}.{py[3:]}"
    series = _series(dotted)
    if framework_version not in series:
        # Another Python of this machine may have it (TensorFlow 2.8-2.11 stop at 3.10).
        others = [o for o in known_interpreters()
                  if o != py and framework_version in _series(f"{o[2]}.{o[3:]}")]
        hint = f"; py_version {' or '.join(others)} can have it" if others else ""
        raise ConfigError(f"framework_version {framework_version}: pip cannot install TensorFlow "
                          f"{framework_version} on Python {dotted} here (releases with wheels "
                          f"for it: {', '.join(series) or 'none found: is the index reachable?'})"
                          + hint)
    target = image_dir(framework_version, py)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # one build of an image at a time
        if target.exists() and not (target / INCOMPLETE_NAME).exists():
            image = probe(str(target / "bin" / "python"))
            if image:
                return image
        if target.exists():
            remove_tree(target)
        start = time.monotonic()
        _build(target, base, framework_version, dotted, say)
        probe.cache_clear()
        image = probe(str(target / "bin" / "python"))
        size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file() and not f.is_symlink())
        say(f"image {framework_version} ({py}) built in {time.monotonic() - start:.1f} s: "
            f"{target}, {size / 1e9:.2f} GB")
        return image


def _build(target: Path, base: str, version: str, dotted: str, say) -> None:
    v = tuple(map(int, version.split(".")))
    python = str(target / "bin" / "python")
    pipemode = [r for r in installable("sagemaker-tensorflow", "3.10")
                if r.startswith(version + ".")]
    steps = [
        ("a virtual environment", [base, "-m", "venv", str(target)]),
        (f"TensorFlow {version} and SageMaker's training toolkit",
         [python, "-m", "pip", "install", "--progress-bar", "on", f"tensorflow-cpu=={version}.*",
          *_toolkit(v)]),
        ("the TensorFlow container's entry" + (" and Keras 2 (tf-keras)" if v >= (2, 16) else ""),
         [python, "-m", "pip", "install", "--no-deps", TOOLKIT_ENTRY,
          *([f"tf-keras=={version}.*"] if v >= (2, 16) else [])]),
    ]
    if pipemode:
        purelib = str(target / "lib" / f"python{dotted}" / "site-packages")   # the venv's
        steps.append((f"PipeModeDataset (sagemaker-tensorflow {pipemode[0]})",
                      [python, "-m", "pip", "install", "--no-deps", "--only-binary=:all:",
                       "--python-version", "3.10", "--upgrade", "--target", purelib,
                       f"sagemaker-tensorflow=={pipemode[0]}"]))
    target.mkdir(parents=True)
    (target / INCOMPLETE_NAME).write_text("being built; removed by the build's last step\n")
    say(f"building the framework image {version} in {target} ({len(steps)} steps"
        + ("" if pipemode else "; no PipeModeDataset was published for this version") + ")")
    for i, (what, cmd) in enumerate(steps, 1):
        t = time.monotonic()
        say(f"[image {version} {i}/{len(steps)}] {what} ...")
        sys.stdout.flush()      # before pip's own lines, in order, when stdout is a pipe
        r = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=3600)
        if r.returncode != 0:
            errors = [ln for ln in r.stderr.splitlines() if ln.startswith("ERROR")]
            raise ConfigError(f"building the framework image {version} ({target}) failed at "
                              f"'{what}':\n" + "\n".join(errors or r.stderr.splitlines()[-10:]))
        say(f"[image {version} {i}/{len(steps)}] done in {time.monotonic() - t:.1f} s")
    (target / INCOMPLETE_NAME).unlink()


def remove_image(framework_version: str, py_version: str | None = None) -> Path:
    target = image_dir(framework_version, py_version or this_py())
    if not target.exists():
        raise ConfigError(f"framework_version {framework_version}: no built image at {target} "
                          "(the project's .venv and .venv-hvd are removed by hand)")
    remove_tree(target)
    return target
