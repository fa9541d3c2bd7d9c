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
import urllib.parse
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
    index_lines = resolvable_lines(requirements)
    path = ready(requirements, image)
    if path:
        wheels = sorted(p.name for p in path.glob("*.whl"))
        say(f"{requirements}: {len(wheels)} package(s) from the wheelhouse {path} (nothing to "
            "download)")
        return path
    start = time.monotonic()
    say(f"{requirements}: resolving against the {image.framework_version} image "
        f"({image.python}) ...")
    wanted = _resolve(requirements, index_lines, image)
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


# Options whose argument is a file or directory (pip's requirements-file syntax).
_PATH_OPTIONS = ("-r", "--requirement", "-c", "--constraint", "-e", "--editable",
                 "-f", "--find-links")
_INCLUDES = ("-r", "--requirement", "-c", "--constraint")
_ARCHIVES = (".whl", ".tar.gz", ".tgz", ".zip", ".tar.bz2")


def resolvable_lines(requirements: Path) -> list[str]:
    """The requirement lines (includes flattened, local paths made absolute) for the
    launcher's dry run. A local path outside the job's code directory is refused: SageMaker
    installs from the code it uploads, and pip would build it here, in the launcher's own
    process, before any host is isolated. Local directories and source archives are left
    out of the dry run (building them runs their setup code): the host installs them, with
    their dependencies from the image or from the file's other lines."""
    code = requirements.parent.resolve()
    return _lines(requirements, code, seen=set())


def _lines(path: Path, code: Path, seen: set) -> list[str]:
    if path.resolve() in seen:
        return []
    seen.add(path.resolve())
    out = []
    for n, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = raw.split(" #")[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        words = line.split(None, 1)
        option, arg = (words[0], words[1].strip() if len(words) > 1 else "") \
            if words[0] in _PATH_OPTIONS else ("", line)
        for opt in _PATH_OPTIONS:       # `--requirement=other.txt`
            if not option and line.startswith(opt + "=") and opt.startswith("--"):
                option, arg = opt, line[len(opt) + 1:]
        local = _local_path(arg, path.parent, bool(option))
        if local is None:
            out.append(line)
            continue
        if not local.resolve().is_relative_to(code):
            raise ConfigError(f"{path}, line {n}: {arg!r} is outside the job's code directory "
                              f"{code} (SageMaker installs only what it uploads with the code; "
                              "copy the package into source_dir)")
        if option in _INCLUDES:
            out.extend(_lines(local, code, seen))
        elif option in ("-f", "--find-links") or (local.is_file() and local.name.endswith(".whl")):
            out.append(f"{option} {local}".strip())
        # A directory, an sdist or an editable: built by the host, not here.
    return out


def _local_path(arg: str, base: Path, is_option_arg: bool) -> Path | None:
    """The file or directory a requirement line's argument names, or None for a requirement
    the index resolves (`name==1.0`, `name @ https://...`)."""
    if arg.startswith("file:"):
        return Path(urllib.parse.urlparse(arg).path)
    if "://" in arg or (not is_option_arg and not arg.startswith((".", "/", "~"))
                        and not arg.endswith(_ARCHIVES)):
        return None
    return (base / Path(arg).expanduser()) if not arg.startswith("/") else Path(arg)


def _resolve(requirements: Path, lines: list[str], image: Image) -> list[str]:
    """`name==version` of every package pip would install into the image for the file, from
    the index (local files and directories are left to the host's install)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        flat = Path(tmp) / REQUIREMENTS
        flat.write_text("".join(line + "\n" for line in lines))
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        env.pop("PIP_NO_INDEX", None)
        r = subprocess.run([image.python, "-m", "pip", "install", "--dry-run", "--quiet",
                            "--report", str(report), "-r", str(flat)],
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
