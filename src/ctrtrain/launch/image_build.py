"""Framework images built on demand, for any TensorFlow release pip can install on this
machine's Python, as SageMaker offers a container for every release. An image is a venv in
the cache (cache.py: images/tensorflow-X.Y-pyNNN) holding what SageMaker's TensorFlow
container of that version holds for a training script:

- tensorflow-cpu X.Y (the newest patch release) for the job's py_version (this Python's by
  default; another one on PATH or installed by pyenv, for releases older than this Python's
  wheels); Keras 2 is TensorFlow's own up to 2.15, and
  tf-keras X.Y from 2.16 on (Keras 3 is the default there: TF_USE_LEGACY_KERAS=1 selects it);
- SageMaker's training toolkit (sagemaker-training; 4.8.3 up to TF 2.17, whose protobuf < 5
  the 5.x toolkits cannot use) and the TensorFlow container's entry
  (sagemaker-tensorflow-training, without its dependency pins, as in the project's images);
- SageMaker's PipeModeDataset (sagemaker-tensorflow X.Y, its C++ op built for that
  TensorFlow) where AWS published a cp310 wheel of it (2.11 to 2.14), whose files do not
  depend on the Python version;
- Horovod 0.28.1 (Gloo, no MPI), for a job with SageMaker's `mpi` distribution (or
  `ctrtrain images build X.Y --horovod`): compiled from PyPI's source against the image's own
  TensorFlow and Python, as scripts/horovod_env.sh does for the 2.15 image, with g++ and
  cmake < 4 (minutes: 2.9 on py310 took 203 s on 2 busy cores), as the build's last two steps;
  an image built before without Horovod gets those two steps added, under the same lock and
  incomplete marker. The wheel is kept in the cache (wheels/horovod-0.28.1-tf<version>-pyNNN/,
  e.g. tf2.9.3-py310), so a rebuilt image only installs it. Horovod 0.28.1 builds against
  TensorFlow HOROVOD_TF (2.9 to 2.18: tried 2.9 on py310, 2.13 and 2.18 on py311); other
  versions, and a machine without g++ or without cmake < 4, are refused by horovod_blockers,
  in a moment, before anything is built.

A build shows pip's progress and its time; it runs under a lock, is marked incomplete until
its last step (an interrupted build is rebuilt, never used), and is reused by every later
launch."""

from __future__ import annotations

import fcntl
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import ConfigError
from ..data.files import remove_tree
from ..data.manifest import INCOMPLETE_NAME
from .cache import cache_dir
from .images import Image, find_image, image_dir, probe

TOOLKIT_ENTRY = "sagemaker-tensorflow-training==20.5.0"
HOROVOD = "0.28.1"
# The TensorFlow releases Horovod 0.28.1 compiles against (its C++ ops use TensorFlow's
# headers): tried here in the images of 2.9 (py310), 2.13 (py311), 2.15 (py311, .venv-hvd) and
# 2.18 (py311: horovod.tensorflow runs; horovod.tensorflow.keras needs Keras 2 there,
# TF_USE_LEGACY_KERAS=1). It does not build against 2.21 (its compile fails there); 2.16, 2.17,
# 2.19 and 2.20 were not tried.
HOROVOD_TF = ((2, 9), (2, 18))
HOROVOD_ENV = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITHOUT_PYTORCH": "1",
               "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1"}


def _toolkit(version: tuple[int, int]) -> list[str]:
    """SageMaker's training toolkit for a TensorFlow version, and the protobuf both accept.
    TensorFlow 2.8-2.11 name no upper bound on numpy but break under numpy 2."""
    if version < (2, 12):
        return ["sagemaker-training==4.8.3", "protobuf<3.20", "numpy<2"]
    if version < (2, 18):
        # 2.16 and 2.17 too: sagemaker-training 5.1.4 wants protobuf >= 5.28, which they refuse.
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


def ensure_image(framework_version: str, py_version: str | None, say=print,
                 horovod: bool = False) -> Image:
    """The image of framework_version: one that exists, else built now (needs the package
    index: call it outside the job's namespaces). With `horovod`, one with Horovod: an image
    built here without it gets it (build_image); check horovod_blockers first."""
    try:
        image = find_image(framework_version, py_version)
    except ConfigError as missing:
        if not re.fullmatch(r"2\.\d+", framework_version):
            raise missing
        return build_image(framework_version, py_version, say, horovod=horovod)
    if not horovod or image.horovod:
        return image
    refuse_horovod_blockers(framework_version, image)
    return build_image(framework_version, image.py_version, say, horovod=True)


def built_here(image: Image) -> bool:
    """Whether an image is one this module built (in the cache), which a step may be added to;
    the project's venvs and CTRTRAIN_IMAGES' Pythons are not changed."""
    return Path(image.python).parent.parent == image_dir(image.framework_version,
                                                         image.py_version)


def _cmake_major(cmake: str) -> int | None:
    r = subprocess.run([cmake, "--version"], capture_output=True, text=True, timeout=60)
    m = re.search(r"version (\d+)\.", r.stdout)
    return int(m.group(1)) if r.returncode == 0 and m else None


def horovod_blockers(framework_version: str, image: Image | None = None) -> list[str]:
    """What keeps Horovod from being compiled into the image of framework_version here (empty:
    nothing), found in a moment, before any build: g++, cmake < 4 (gloo's CMakeLists asks for
    a minimum cmake 4 no longer accepts), a TensorFlow release Horovod 0.28.1 builds against,
    and an image this module built (`image`: the existing one, if any)."""
    out = []
    if shutil.which("g++") is None:
        out.append("no g++ on PATH (Horovod's C++ ops are compiled)")
    cmake = shutil.which("cmake")
    if cmake is None:
        out.append("no cmake on PATH (cmake < 4 builds Horovod's gloo; `pip install 'cmake<4'` "
                   "or the system's package)")
    else:
        major = _cmake_major(cmake)
        if major is None or major >= 4:
            out.append(f"{cmake} is cmake {major if major is not None else '(unknown version)'}"
                       ": Horovod's gloo needs cmake < 4 (`pip install 'cmake<4'` puts one on "
                       "PATH)")
    v = tuple(map(int, framework_version.split(".")[:2]))
    lo, hi = (".".join(map(str, x)) for x in HOROVOD_TF)
    if not HOROVOD_TF[0] <= v <= HOROVOD_TF[1]:
        out.append(f"Horovod {HOROVOD} is not known to build against TensorFlow "
                   f"{framework_version} (it builds against {lo} to {hi}; not against 2.21)")
    elif image is not None and not built_here(image):
        out.append(f"the {framework_version} image ({image.python}) is a project environment "
                   "or one CTRTRAIN_IMAGES names, not one ctrtrain built, and is not changed "
                   "(install Horovod into it yourself, or offer it no more)")
    return out


def refuse_horovod_blockers(framework_version: str, image: Image | None = None) -> None:
    """A ConfigError naming horovod_blockers', if any."""
    blockers = horovod_blockers(framework_version, image)
    if blockers:
        raise ConfigError(f"framework_version {framework_version}: Horovod cannot be built into "
                          f"its image here: {'; '.join(blockers)}")


def build_image(framework_version: str, py_version: str | None = None, say=print,
                horovod: bool = False) -> Image:
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
    if horovod:
        refuse_horovod_blockers(framework_version)
    target = image_dir(framework_version, py)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # one build of an image at a time
        image = None
        if target.exists() and not (target / INCOMPLETE_NAME).exists():
            image = probe(str(target / "bin" / "python"))
            if image and (image.horovod or not horovod):
                return image
        start = time.monotonic()
        if image:
            # Built without Horovod: it is added as the build's last step would have, the
            # image marked incomplete meanwhile (an interrupted step: the image is rebuilt).
            _run_steps(target, framework_version, _horovod_steps(target, py), say,
                       "adding Horovod to")
        else:
            if target.exists():
                remove_tree(target)
            _build(target, base, framework_version, dotted, say, horovod)
        probe.cache_clear()
        image = probe(str(target / "bin" / "python"))
        size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file() and not f.is_symlink())
        say(f"image {framework_version} ({py}) built in {time.monotonic() - start:.1f} s: "
            f"{target}, {size / 1e9:.2f} GB" + (f", Horovod {image.horovod}" if image.horovod
                                                 else ""))
        return image


def _build(target: Path, base: str, version: str, dotted: str, say, horovod: bool) -> None:
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
    if horovod:
        steps += _horovod_steps(target, f"py{dotted.replace('.', '')}")
    target.mkdir(parents=True)
    say(f"building the framework image {version} in {target} ({len(steps)} steps"
        + ("" if pipemode else "; no PipeModeDataset was published for this version") + ")")
    _run_steps(target, version, steps, say)


def _run_steps(target: Path, version: str, steps: list, say, doing: str = "") -> None:
    """Runs a build's steps, the image marked incomplete until the last one is done. A step is
    a command, or a function that runs its own (and raises ConfigError when one fails)."""
    (target / INCOMPLETE_NAME).write_text("being built; removed by the build's last step\n")
    if doing:
        say(f"{doing} the framework image {version} in {target} ({len(steps)} steps)")
    for i, (what, cmd) in enumerate(steps, 1):
        t = time.monotonic()
        say(f"[image {version} {i}/{len(steps)}] {what} ...")
        if callable(cmd):
            cmd(lambda line, i=i: say(f"[image {version} {i}/{len(steps)}] {line}"))
        else:
            _run(cmd, f"building the framework image {version} ({target}) failed at '{what}'")
        say(f"[image {version} {i}/{len(steps)}] done in {time.monotonic() - t:.1f} s")
    (target / INCOMPLETE_NAME).unlink()


def _run(cmd: list[str], failed: str, env: dict[str, str] | None = None,
         timeout: int = 3600, compiler: bool = False) -> None:
    """A build command, pip's progress shown as it goes; ConfigError with its errors if it
    fails (with `compiler`, the compiler's and cmake's error lines too)."""
    sys.stdout.flush()      # before pip's own lines, in order, when stdout is a pipe
    r = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})},
                       timeout=timeout)
    if r.returncode != 0:
        lines = r.stderr.splitlines()
        errors = [ln for ln in lines if ln.startswith("ERROR")]
        if compiler:
            errors = [ln for ln in lines if re.search(r"error\b|Error", ln)][:20] + lines[-10:]
        raise ConfigError(f"{failed}:\n" + "\n".join(errors or lines[-10:]))


def horovod_wheels(tensorflow: str, py: str) -> Path:
    """Where the Horovod wheel compiled against TensorFlow `tensorflow` (2.9.3) on Python `py`
    is kept."""
    return cache_dir("wheels", f"horovod-{HOROVOD}-tf{tensorflow}-{py}")


def _horovod_steps(target: Path, py: str) -> list:
    """Horovod compiled against the image's TensorFlow, once per TensorFlow release and Python
    (the wheel kept: horovod_wheels), then installed with its dependencies."""
    python = str(target / "bin" / "python")
    state = {}

    def compile_(say):
        tf = subprocess.run([python, "-c", "import importlib.metadata as m; "
                             "print(m.version('tensorflow-cpu'))"], capture_output=True,
                            text=True, timeout=120).stdout.strip()
        wheels = horovod_wheels(tf, py)
        for stale in wheels.glob(".build-*"):    # an interrupted compile's (under the lock)
            remove_tree(stale)
        found = sorted(wheels.glob(f"horovod-{HOROVOD}-*.whl"))
        if found:
            say(f"compiled before against TensorFlow {tf} ({py}): {found[0]}")
        else:
            say(f"compiling Horovod {HOROVOD} against TensorFlow {tf} ({py}) with g++ and "
                "cmake: minutes; pip's lines show it is running")
            build = Path(tempfile.mkdtemp(prefix=".build-", dir=wheels))
            try:
                _run([python, "-m", "pip", "wheel", "--progress-bar", "on", "--no-deps",
                      "--no-build-isolation", "--no-cache-dir", "-w", str(build),
                      f"horovod=={HOROVOD}"],
                     f"compiling Horovod {HOROVOD} against TensorFlow {tf} ({py}) failed",
                     {**HOROVOD_ENV, "MAKEFLAGS": os.environ.get(
                         "MAKEFLAGS", f"-j{min(os.cpu_count() or 1, 8)}")}, timeout=7200,
                     compiler=True)
                made = sorted(build.glob("horovod-*.whl"))
                os.replace(made[0], wheels / made[0].name)   # whole, or not there
            finally:
                remove_tree(build)
            found = sorted(wheels.glob(f"horovod-{HOROVOD}-*.whl"))
        state["wheel"] = str(found[0])

    def install(say):
        _run([python, "-m", "pip", "install", "--progress-bar", "on", state["wheel"]],
             f"installing {state['wheel']} failed")

    return [(f"Horovod {HOROVOD} compiled against the image's TensorFlow", compile_),
            (f"Horovod {HOROVOD} and its dependencies", install)]


def remove_image(framework_version: str, py_version: str | None = None) -> Path:
    target = image_dir(framework_version, py_version or this_py())
    if not target.exists():
        raise ConfigError(f"framework_version {framework_version}: no built image at {target} "
                          "(the project's .venv and .venv-hvd are removed by hand)")
    remove_tree(target)
    return target
