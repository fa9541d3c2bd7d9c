"""A job's requirements.txt from the package index, as SageMaker installs it -- on hosts that
have no route out. Before the hosts start (in the launcher's own network, outside the job's
namespaces), the image's pip resolves the requirements against what the image already holds
(`pip install --dry-run --report`) and downloads what is missing into a wheelhouse; each
host's toolkit then installs `requirements.txt` from it with no index (PIP_NO_INDEX,
PIP_FIND_LINKS). A wheelhouse is kept per requirements file and image, so a second launch
downloads nothing. A requirement that cannot be had fails the job before any host starts,
with pip's message. Local requirements (`./vendor/x.whl`, as SageMaker users vendor wheels)
are installed from the code directory as before."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..data.manifest import INCOMPLETE_NAME
from ..errors import ConfigError
from .cache import cache_dir
from .images import Image

REQUIREMENTS = "requirements.txt"


def requirements_file(source_dir: str | None) -> Path | None:
    """The requirements.txt the toolkit installs (at the top of the job's code), if any."""
    if not source_dir:
        return None
    path = Path(source_dir) / REQUIREMENTS
    return path if path.is_file() else None


def wheelhouse_path(requirements: Path, image: Image) -> Path:
    """Where this requirements file's wheels for this image are kept."""
    key = hashlib.sha256(requirements.read_bytes() + f"\0{image.python}\0{image.tensorflow}"
                         f"\0{image.py_version}".encode()).hexdigest()[:16]
    return cache_dir("wheelhouses") / key


def ready(requirements: Path, image: Image) -> Path | None:
    """The wheelhouse, if it was made before (and its making finished)."""
    path = wheelhouse_path(requirements, image)
    return path if path.is_dir() and not (path / INCOMPLETE_NAME).exists() else None


def prepare(requirements: Path, image: Image, say=print) -> Path:
    """The wheelhouse of `requirements` for `image`: reused when it exists, else resolved and
    downloaded now (needs the package index: call it outside the job's namespaces)."""
    path = ready(requirements, image)
    if path:
        wheels = sorted(p.name for p in path.glob("*.whl"))
        say(f"{requirements}: {len(wheels)} package(s) from the wheelhouse {path} (nothing to "
            "download)")
        return path
    start = time.monotonic()
    say(f"{requirements}: resolving against the {image.framework_version} image "
        f"({image.python}) ...")
    wanted = _resolve(requirements, image)
    path = wheelhouse_path(requirements, image)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / INCOMPLETE_NAME).write_text("being filled; removed when every package is in\n")
    if wanted:
        say(f"{requirements}: downloading {len(wanted)} package(s): {', '.join(wanted)}")
        sys.stdout.flush()      # before pip's own lines, in order, when stdout is a pipe
        r = subprocess.run([image.python, "-m", "pip", "download", "--no-deps", "--progress-bar",
                            "on", "-d", str(path), *wanted], cwd=requirements.parent,
                           stderr=subprocess.PIPE, text=True, timeout=3600)
        if r.returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            raise ConfigError(f"{requirements}: pip could not download {' '.join(wanted)}:\n"
                              + _pip_errors(r.stderr))
    size = sum(f.stat().st_size for f in path.iterdir() if f.name != INCOMPLETE_NAME)
    (path / INCOMPLETE_NAME).unlink()
    say(f"{requirements}: wheelhouse {path}: {len(wanted)} package(s), {size / 1e6:.1f} MB, "
        f"in {time.monotonic() - start:.1f} s")
    return path


def _resolve(requirements: Path, image: Image) -> list[str]:
    """`name==version` of every package pip would install into the image for the file, from
    the index (local files and directories are left to the host's install)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        env.pop("PIP_NO_INDEX", None)
        r = subprocess.run([image.python, "-m", "pip", "install", "--dry-run", "--quiet",
                            "--report", str(report), "-r", str(requirements)],
                           cwd=requirements.parent, capture_output=True, text=True,
                           env=env, timeout=3600)
        if r.returncode != 0:
            raise ConfigError(f"{requirements}: pip cannot install it into the "
                              f"{image.framework_version} image:\n" + _pip_errors(r.stderr))
        installs = json.loads(report.read_text()).get("install", [])
    out = []
    for item in installs:
        url = item.get("download_info", {}).get("url", "")
        if url.startswith("file:"):
            continue
        meta = item["metadata"]
        out.append(f"{meta['name']}=={meta['version']}")
    return out


def _pip_errors(stderr: str) -> str:
    """pip's own error lines (they name the requirement), else its last lines."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("ERROR")]
    return "\n".join(lines or stderr.strip().splitlines()[-10:])
