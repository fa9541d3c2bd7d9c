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
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from ..data.files import remove_tree
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
        remove_tree(path)
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


# pip's requirements-file options whose argument names a file, a directory or a URL
# (req_file.SUPPORTED_OPTIONS), by every name optparse accepts for them.
_PATH_OPTIONS = {"-r": "--requirement", "-c": "--constraint", "-e": "--editable",
                 "-f": "--find-links", "-i": "--index-url", "--requirement": "--requirement",
                 "--constraint": "--constraint", "--editable": "--editable",
                 "--find-links": "--find-links", "--index-url": "--index-url",
                 "--pypi-url": "--index-url", "--extra-index-url": "--extra-index-url"}
_INCLUDES = ("--requirement", "--constraint")
_INDEXES = ("--index-url", "--extra-index-url")
# What pip reads as a URL (vcs.is_url); `file:` and a VCS's `+file:` name local paths.
_URLS = set("http https ftp file git+http git+https git+ssh git+git git+file hg+file hg+http "
            "hg+https hg+ssh hg+static-http svn+ssh svn+http svn+https svn+svn svn+file "
            "bzr+http bzr+https bzr+ssh bzr+sftp bzr+ftp bzr+lp bzr+file".split())
_ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz", ".tar.xz", ".txz",
             ".tlz", ".tar.lz", ".tar.lzma")                # pip's utils.filetypes
_COMMENT = re.compile(r"(^|\s+)#.*$")                       # pip's req_file.COMMENT_RE
_ENV_VAR = re.compile(r"(\$\{([A-Z0-9_]+)\})")              # pip's req_file.ENV_VAR_RE


def resolvable_lines(requirements: Path) -> list[str]:
    """The requirement lines (includes flattened, local paths made absolute) for the
    launcher's dry run. A local path outside the job's code directory is refused: SageMaker
    installs from the code it uploads, and pip would build it here, in the launcher's own
    process, before any host is isolated. Local directories and source archives are left
    out of the dry run (building them runs their setup code): the host installs them, with
    their dependencies from the image or from the file's other lines. Lines are read as pip
    reads them (continuations, comments, ${VARS}, options glued to their argument, PEP 508
    `name @ url`, file: and VCS +file: URLs): a path is checked however it is spelled."""
    code = requirements.parent.resolve()
    return _lines(requirements.absolute(), code, seen=set())


def _lines(path: Path, code: Path, seen: set) -> list[str]:
    if path.resolve() in seen:
        return []
    seen.add(path.resolve())
    out = []
    for n, line in _logical_lines(path):
        try:
            items, rest = _parse(_expand(line), path.parent, code)
        except ValueError as e:     # unbalanced quotes: pip refuses the line too
            raise ConfigError(f"{path}, line {n}: pip cannot read {line!r}: {e}") from None
        for _, arg, local in items:
            if local is not None and not _inside(local, code):
                raise ConfigError(f"{path}, line {n}: {arg!r} is outside the job's code "
                                  f"directory {code} (SageMaker installs only what it uploads "
                                  "with the code; copy the package into source_dir)")
        # pip acts on a line's requirement (or -e), else on its includes, else on its options
        # (req_file.handle_line, _parse_and_recurse); the others are ignored.
        requirement = next((i for i in items if i[0] in ("", "--editable")), None)
        if all(local is None for _, _, local in ([requirement] if requirement else items)):
            out.append(line)    # as written: the dry run's pip expands its ${VARS} as checked
            continue
        new = []
        if requirement:
            option, _, local = requirement
            if not option and local.is_file() and local.name.endswith(".whl"):
                new.append(str(local))
            # A directory, an sdist or an editable: built by the host, not here.
        elif any(option in _INCLUDES for option, _, _ in items):
            for option, arg, local in items:
                if option in _INCLUDES and local and not local.is_file():
                    raise ConfigError(f"{path}, line {n}: {arg!r}: no such file")
                if option in _INCLUDES and local:
                    out.extend(_lines(local, code, seen))
                elif option in _INCLUDES:
                    new.append(f"{option} {shlex.quote(arg)}")      # from a URL
        else:   # --find-links, --index-url ...: absolute, as the flat file is elsewhere
            for option, arg, local in items:
                value = arg if local is None else local.as_uri() if option in _INDEXES \
                    else str(local)
                new.append(f"{option} {shlex.quote(value)}")
            new += [shlex.join(rest)] if rest else []
        for text in new:    # expanded already: pip would expand (or cut at ' #') once more
            if _COMMENT.search(text) or _expand(text) != text:
                raise ConfigError(f"{path}, line {n}: {text!r} would change when pip reads it "
                                  "again (a '${...}' or ' #' inside a value)")
        out.extend(new)
    return out


def _logical_lines(path: Path):
    """(number, line) of each line pip reads in a requirements file (req_file.join_lines,
    ignore_comments): a line ending in a backslash goes on into the next, comments and blank
    lines are dropped."""
    joined, first = [], 0
    for n, raw in enumerate(path.read_text(encoding="utf-8-sig", errors="replace")
                            .splitlines(), 1):
        if raw.endswith("\\") and not _COMMENT.match(raw):
            joined.append(raw.strip("\\"))
            first = first or n
            continue
        joined.append(" " + raw if _COMMENT.match(raw) else raw)
        yield from _uncommented(first or n, "".join(joined))
        joined, first = [], 0
    yield from _uncommented(first, "".join(joined))


def _uncommented(n: int, line: str):
    # A backslash left at the end (`pkg \ # note`) would join the next line of the flat file.
    line = _COMMENT.sub("", line).strip().rstrip("\\").strip()
    if line:
        yield n, line


def _expand(line: str) -> str:
    """`${NAME}` replaced by its value as pip does (req_file.expand_env_variables): only that
    form, in the order they appear, and an unset or empty variable left as it is."""
    for var, name in _ENV_VAR.findall(line):
        if os.environ.get(name):
            line = line.replace(var, os.environ[name])
    return line


def _parse(line: str, base: Path, code: Path) -> tuple[list[tuple[str, str, Path | None]],
                                                        list[str]]:
    """What one requirements-file line names, read as pip reads it: (option, argument or URL,
    the local path pip would read or build, or None) for its requirement (option '') and for
    each option that takes a path or URL; and its other options' words. As in pip
    (req_file.break_args_options), the requirement is the words before the first one starting
    with '-' (markers and all); the rest are split like a shell's and read like optparse's,
    which takes `-e../x`, `-e ../x`, `--editable=../x` and `--edit ../x` for the same option."""
    words = line.split(" ")
    cut = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
    requirement = " ".join(words[:cut]).strip()
    items = [("", requirement, _local_path("", requirement, base, code))] if requirement else []
    rest, tokens = [], iter(shlex.split(" ".join(words[cut:])))
    for token in tokens:
        option, value = _option(token)
        if not option:
            rest.append(token)
            continue
        value = next(tokens, "") if value is None else value
        items.append((option, value, _local_path(option, value, base, code)))
    return items, rest


def _option(token: str) -> tuple[str, str | None]:
    """(the path option `token` is, by its long name; its argument if glued to it, else None),
    or ('', None). Short options take the rest of the word (`-r../x`); long ones `=value`, and
    any unique prefix of the name (`--edit`): optparse's rules, which pip's parser follows."""
    if token[:2] in _PATH_OPTIONS:
        return _PATH_OPTIONS[token[:2]], token[2:] or None
    name, eq, value = token.partition("=")
    names = {_PATH_OPTIONS[o] for o in _PATH_OPTIONS if len(name) > 2 and o.startswith(name)}
    if name.startswith("--") and len(names) == 1:
        return names.pop(), value if eq else None
    return "", None


def _local_path(option: str, arg: str, base: Path, code: Path) -> Path | None:
    """The file or directory pip reads or builds for a requirement (option '') or an option's
    argument, or None for what it fetches (`numpy==1.26`, `pkg @ https://...`). Relative paths
    as pip takes them: an include's from the file naming it, find-links' from there when that
    exists, the rest from pip's working directory: the code, for the dry run and the host."""
    if urllib.parse.urlsplit(arg).scheme in _URLS:     # pip's is_url; markers after '; '
        return _url_path(arg.split("; ", 1)[0] if not option else arg, code)
    if option in _INCLUDES:
        return base / arg
    if option == "--find-links":    # pip expands `~` in find-links only
        return Path(arg).expanduser() if arg.startswith("~") else \
            base / arg if (base / arg).exists() else code / arg
    if option in _INDEXES:
        return code / arg
    # A requirement or an editable (pip's req.constructors): markers split off first, then a
    # project directory, an archive, a PEP 508 `name @ url`, or a name for the index.
    name = arg if option else arg.split(";", 1)[0].strip()
    before, at, url = name.partition("@")
    url = url.split()[0] if at and url.split() and not _looks_like_path(before) else None
    path = Path(re.sub(r"(.)\[[^\]]+\]$", r"\1", os.path.normpath(code / name)))  # [extras]
    if option:      # -e: `name @ url`, a directory, `git:...` read as `git+git:...`, a path
        if url is not None:
            return _url_path(url, code)
        vcs = urllib.parse.urlsplit(name).scheme in ("git", "hg", "svn", "bzr")
        return None if vcs and not path.is_dir() else path
    if (_looks_like_path(name) and path.is_dir() or (path / "setup.py").is_file()
            or (path / "pyproject.toml").is_file()):
        return path
    if str(path).lower().endswith(_ARCHIVES) and (path.is_file() or url is None):
        return path
    if url is not None:
        return _url_path(url, code)
    return path if _looks_like_path(name) else None


def _looks_like_path(name: str) -> bool:
    return "/" in name or name.startswith(".")      # pip's req.constructors._looks_like_path


def _url_path(url: str, code: Path) -> Path | None:
    """The directory or file a URL makes pip read or build: a `file:` (or VCS `+file:`)
    URL's path, a relative one from the working directory, joined with its `#subdirectory=`
    as pip joins it (os.path.join: an absolute one replaces it); None for a remote source,
    unless its `#subdirectory=` leaves the temporary directory pip unpacks it in."""
    parts = urllib.parse.urlsplit(url)
    found = re.search(r"[#&]subdirectory=([^&]*)", url)    # pip's Link.subdirectory_fragment
    sub = found.group(1) if found else ""
    if parts.scheme == "file" or parts.scheme.endswith("+file"):
        path = parts.path if parts.scheme == "file" else parts.path.rsplit("@", 1)[0]  # @rev
        host = "" if parts.netloc in ("", "localhost") else f"//{parts.netloc}"
        return code / urllib.request.url2pathname(host + path) / sub
    if os.path.isabs(sub) or os.path.normpath(sub).split(os.sep)[0] == "..":
        return Path(tempfile.gettempdir(), "pip-unpack", sub)
    return None


def _inside(local: Path, code: Path) -> bool:
    """Whether `local` is in the code directory both as pip spells it out (`a/../b` taken
    literally, like os.path.normpath) and as the file system follows it (symlinks first)."""
    return all(p.resolve().is_relative_to(code) for p in (local, Path(os.path.normpath(local))))


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
            why = ""
            if re.search(r"\(from versions: (?!none\))", r.stderr):
                # The package exists, but not the release asked for, as pip sees it from the
                # image's Python: "from versions" lists only what installs on that Python.
                py = image.py_version
                why = (f"\n(pip lists the releases it can install on the {image.framework_version} "
                       f"image's Python, {py[2]}.{py[3:]}; the one asked for may be published "
                       "only for other Pythons: pin a listed one, or give the job the "
                       "`py_version` it was published for, e.g. py310)")
            raise ConfigError(f"{requirements}: pip cannot install it into the "
                              f"{image.framework_version} image:\n" + _pip_errors(r.stderr) + why)
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
