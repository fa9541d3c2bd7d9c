"""Framework images: the Python environments a job spec's `framework_version` names, as a
SageMaker estimator's framework_version names a TensorFlow container. An image here is a
Python prefix (a venv) with that TensorFlow and SageMaker's training toolkits installed; each
simulated host runs it under a writable layer of its own (container.py).

Where they come from: the project's scripts build `.venv` (TensorFlow 2.21, scripts/env.sh)
and `.venv-hvd` (TensorFlow 2.15.1, Keras 2, Horovod, scripts/horovod_env.sh), both with
sagemaker-training and sagemaker-tensorflow-training; any other version pip can install is
built on demand into the cache (image_build.py), with Horovod compiled in for a job that
needs it (2.9 to 2.18). Other Pythons can be offered with
CTRTRAIN_IMAGES (paths of python executables, separated by ':'). A Python is the image of
version X.Y when its installed TensorFlow is X.Y.*; found by reading package metadata (no
TensorFlow import)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ..data.manifest import INCOMPLETE_NAME
from ..errors import ConfigError
from .cache import cache_dir

TOOLKIT_MODULE = "sagemaker_tensorflow_container.training:main"

_PROBE = r"""
import json, sys, importlib.metadata as m
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
def training_env_keys():
    # The keys of SM_TRAINING_ENV differ between toolkit versions (5.x added `topology`):
    # the image's own toolkit says which it writes.
    try:
        from sagemaker_training.environment import Environment
    except Exception:
        return None
    return sorted(n for n in dir(Environment) if isinstance(getattr(Environment, n), property))
print(json.dumps({"prefix": sys.prefix, "python": "py%d%d" % sys.version_info[:2],
                  "tensorflow": v("tensorflow-cpu") or v("tensorflow"),
                  "toolkit": v("sagemaker-training"),
                  "tf_toolkit": v("sagemaker-tensorflow-training"), "horovod": v("horovod"),
                  "pipemode": v("sagemaker-tensorflow"),
                  "training_env_keys": training_env_keys()}))
"""


@dataclasses.dataclass(frozen=True)
class Image:
    python: str          # the interpreter, as a path inside the image
    prefix: str          # sys.prefix: what the host's writable layer covers
    py_version: str      # py311
    tensorflow: str
    toolkit: str | None  # sagemaker-training's version
    horovod: str | None = None
    training_env_keys: tuple[str, ...] | None = None  # SM_TRAINING_ENV's keys in its toolkit
    pipemode: str | None = None   # sagemaker-tensorflow's version (PipeModeDataset)

    @property
    def framework_version(self) -> str:
        return ".".join(self.tensorflow.split(".")[:2])

    @property
    def bin_dir(self) -> str:
        return str(Path(self.python).parent)


def image_dir(framework_version: str, py_version: str) -> Path:
    """Where the image of a version built on demand lives. Both names become a path that
    `images remove` deletes: anything but a version (2.14) and a Python tag (py311) is
    refused, so no name can lead outside the cache."""
    if not re.fullmatch(r"\d+\.\d+", str(framework_version)):
        raise ConfigError(f"framework_version {framework_version!r}: expected MAJOR.MINOR (2.14)")
    if not re.fullmatch(r"py\d{2,3}", str(py_version)):
        raise ConfigError(f"py_version {py_version!r}: expected py followed by the Python "
                          "version's digits (py311)")
    return cache_dir("images") / f"tensorflow-{framework_version}-{py_version}"


def built_pythons() -> list[str]:
    """The pythons of every complete built image (an image carries the incomplete-output
    marker until its build's last step)."""
    root = cache_dir("images")
    return [str(d / "bin" / "python") for d in sorted(root.iterdir())
            if d.is_dir() and not (d / INCOMPLETE_NAME).exists() and (d / "bin" / "python").exists()]


def candidates() -> list[str]:
    """Every Python that may be an image: this one, CTRTRAIN_IMAGES, the project's venvs,
    the built ones."""
    out = [sys.executable]
    out += [p for p in os.environ.get("CTRTRAIN_IMAGES", "").split(":") if p]
    repo = Path(__file__).resolve().parents[3]
    for venv in (".venv", ".venv-hvd"):
        out.append(str(repo / venv / "bin" / "python"))
    return list(dict.fromkeys(out + built_pythons()))


@functools.lru_cache(maxsize=None)
def probe(python: str) -> Image | None:
    if not os.path.exists(python):
        return None
    key = _probe_key(python)
    kept = cache_dir("images") / ".probes.json"
    try:
        d = json.loads(kept.read_text()).get(python) if key else None
    except (OSError, ValueError):
        d = None
    if d is None or d.get("key") != key:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            return None
        d = {**json.loads(r.stdout), "key": key}
        if key:
            _keep_probe(kept, python, d)
    if not d["tensorflow"]:
        return None
    # The venv's own python path (not the interpreter it links to): its bin/ holds pip and
    # the console scripts the toolkit runs.
    keys = tuple(d["training_env_keys"]) if d["training_env_keys"] else None
    return Image(python, d["prefix"], d["python"], d["tensorflow"], d["toolkit"], d["horovod"],
                 keys, d["pipemode"])


def _probe_key(python: str) -> list | None:
    """What a venv's probe depends on, read without running it: its interpreter, and the
    directories installing or removing a package rewrites (site-packages, where each
    distribution's .dist-info lies: a new version renames it). None for a Python that is not
    a venv of its own (its packages may lie elsewhere): probed every time. A probe runs the
    image's Python and imports the toolkit, about 0.2 CPU-s a launch."""
    prefix = Path(python).parent.parent
    try:
        cfg = (prefix / "pyvenv.cfg").read_text()
        if re.search(r"include-system-site-packages\s*=\s*true", cfg, re.I):
            return None
        sites = sorted(prefix.glob("lib/python*/site-packages"))
        return [[str(p), os.stat(p).st_mtime_ns] for p in [Path(python), *sites]] if sites \
            else None
    except OSError:
        return None


def _keep_probe(kept: Path, python: str, found: dict) -> None:
    """Adds a probe to the cache file (written whole, then renamed: a reader never sees half)."""
    try:
        probes = json.loads(kept.read_text())
    except (OSError, ValueError):
        probes = {}
    probes[python] = found
    tmp = kept.with_name(f"{kept.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(probes))
        os.replace(tmp, kept)
    except OSError:
        tmp.unlink(missing_ok=True)   # a read-only cache: probed again next time


def find_image(framework_version: str, py_version: str | None = None) -> Image:
    """The image of a framework version, with the toolkit installed; refused by name when
    there is none."""
    seen = []
    for python in candidates():
        image = probe(python)
        if image is None:
            continue
        seen.append(f"{image.framework_version} ({python})")
        if image.framework_version != framework_version:
            continue
        if py_version and image.py_version != py_version:
            raise ConfigError(f"framework_version {framework_version}: its image ({python}) runs "
                              f"{image.py_version}, not py_version {py_version}")
        if image.toolkit is None:
            raise ConfigError(f"framework_version {framework_version}: {python} has no "
                              "sagemaker-training; rebuild it with the project's script "
                              "(scripts/env.sh or scripts/horovod_env.sh)")
        return image
    raise ConfigError(f"framework_version {framework_version}: no image of it here (found: "
                      f"{', '.join(seen) or 'none'}); `ctrtrain images build "
                      f"{framework_version}` builds it (`ctrtrain launch` does so on demand), "
                      "`bash scripts/horovod_env.sh` builds 2.15, or name another Python in "
                      "CTRTRAIN_IMAGES")


def own_image() -> Image:
    """The launcher's own environment: the image of ctrtrain's native modes."""
    image = probe(sys.executable)
    if image is None:
        raise ConfigError(f"{sys.executable} has no TensorFlow installed")
    return image
