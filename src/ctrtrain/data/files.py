"""Finding input files and cutting them into line ranges, shared by every data tool."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import DataError, named
from .manifest import INCOMPLETE_NAME, MANIFEST_NAME, check_readable, refuse_incomplete

_BLOCK = 1 << 24


# Files a ctrtrain tool writes beside data (never data themselves).
METADATA_NAMES = (MANIFEST_NAME, "vocab.json", "split.json")
# What marks a directory as a ctrtrain tool's output (convert/featurize, split, synth).
OUTPUT_MARKERS = (MANIFEST_NAME, "split.json", "synth.json", "stream.json", INCOMPLETE_NAME)


def list_inputs(paths: list[str] | str) -> list[str]:
    """Files named directly, or the data files of a named directory: those its manifest lists,
    else every regular file in it (sorted by name; ctrtrain's own metadata files aside). A
    directory holding anything else -- sub-folders, hidden or temporary files, other JSON --
    is refused rather than read in part: name the data files explicitly then. A missing path
    or an empty directory is an error."""
    from .manifest import read_manifest
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in map(Path, paths):
        if p.exists():
            refuse_incomplete(p)
        if p.is_dir():
            if (p / MANIFEST_NAME).exists():
                out += read_manifest(p).paths(p)
                continue
            entries = sorted(p.iterdir())
            odd = [e.name + ("/" if e.is_dir() else "") for e in entries
                   if e.name not in METADATA_NAMES and (not e.is_file() or e.name.startswith(".")
                                                        or e.name.endswith((".tmp", ".json")))]
            if odd:
                raise DataError(f"directory holds entries that are not plain data files "
                                f"({', '.join(odd[:5])}{' ...' if len(odd) > 5 else ''}); "
                                "name the data files explicitly", path=str(p))
            found = [str(e) for e in entries if e.is_file() and e.name not in METADATA_NAMES]
            if not found:
                raise DataError("directory has no data files", path=str(p))
            out += found
        elif p.is_file():
            check_readable(p)
            out.append(str(p))
        elif p.exists():
            raise DataError("not a regular file or directory", path=str(p))
        else:
            raise DataError("no such file or directory", path=str(p))
    return out


def count_lines(path: str) -> int:
    """Lines in a text file; a last line without its newline counts."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def line_offsets(path: str, lines: list[int]) -> dict[int, int]:
    """Byte offset where each requested 0-based line starts (the file size for the line count)."""
    want = sorted(set(lines))
    found, base, seen = {}, 0, 0
    i = 0
    while i < len(want) and want[i] == 0:
        found[0] = 0
        i += 1
    with open(path, "rb") as f:
        while i < len(want) and (block := f.read(_BLOCK)):
            nl = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
            while i < len(want) and want[i] - seen <= nl.size:
                found[want[i]] = base + int(nl[want[i] - seen - 1]) + 1
                i += 1
            seen += nl.size
            base += len(block)
    size = os.path.getsize(path)
    for w in want[i:]:
        found[w] = size  # the line after a final unterminated line
    return found


@dataclasses.dataclass
class Segment:
    """Lines [first_line, first_line + lines) of one file, starting at byte `offset`."""
    path: str
    first_line: int   # 0-based
    lines: int
    offset: int


def split_ranges(files: list[str], counts: list[int], parts: int) -> list[list[Segment]]:
    """Cuts the concatenation of the files into `parts` runs of consecutive lines whose sizes
    differ by at most one; each run is a list of per-file segments."""
    total = sum(counts)
    bounds = [total * k // parts for k in range(parts + 1)]
    file_start = np.cumsum([0] + counts)
    wanted: dict[int, list[int]] = {}
    runs = []
    for k in range(parts):
        segs = []
        lo, hi = bounds[k], bounds[k + 1]
        for fi, path in enumerate(files):
            a, b = max(lo, file_start[fi]), min(hi, file_start[fi + 1])
            if a < b:
                first = int(a - file_start[fi])
                segs.append([fi, first, int(b - a)])
                wanted.setdefault(fi, []).append(first)
        runs.append(segs)
    offsets = {fi: line_offsets(files[fi], ls) for fi, ls in wanted.items()}
    return [[Segment(files[fi], first, n, offsets[fi][first]) for fi, first, n in segs]
            for segs in runs]


def read_line_blocks(seg: Segment, block_lines: int):
    """Yields (first_line_0based, bytes of whole lines) blocks of at most block_lines lines."""
    with open(seg.path, "rb") as f:
        f.seek(seg.offset)
        left, line = seg.lines, seg.first_line
        carry = b""
        while left > 0:
            want = min(block_lines, left)
            data = carry
            while data.count(b"\n") < want:
                more = f.read(max(1 << 20, want * 512))
                if not more:
                    break
                data += more
            nl = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
            if nl.size >= want:
                cut, n = int(nl[want - 1]), want
            elif data and not data.endswith(b"\n"):
                cut, n = len(data) - 1, nl.size + 1  # a last line without newline
            else:
                cut, n = len(data) - 1, nl.size
            if n == 0:
                raise DataError("file is shorter than when it was counted (changed while reading?)",
                                path=seg.path, line=line + 1)
            yield line, data[:cut + 1]
            carry = data[cut + 1:]
            left -= n
            line += n


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_not_input(out: str | os.PathLike, inputs, what: str = "output") -> None:
    """Refuses an output that is an input, lies inside an input directory, or contains an
    input: writing (or replacing) it would destroy the data before it is read."""
    o = Path(out).resolve()
    for i in ([inputs] if isinstance(inputs, (str, os.PathLike)) else inputs or []):
        if _overlap(o, Path(i).resolve()):
            raise DataError(f"{what} {out} overlaps the input {i}; choose a path outside the "
                            "inputs", path=str(out))


def prepare_output_dir(out_dir: str | os.PathLike, overwrite: bool, inputs=()) -> Path:
    """An output directory must be new or empty, or -- with overwrite -- a ctrtrain output
    (OUTPUT_MARKERS) that is none of the inputs: never an arbitrary directory, never mixed."""
    out = Path(out_dir)
    check_not_input(out, inputs, "output directory")
    if out.exists() and not out.is_dir():
        raise DataError("output exists and is not a directory", path=str(out))
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise DataError("output directory is not empty (pass --overwrite to replace it)",
                            path=str(out))
        if not any((out / n).exists() for n in OUTPUT_MARKERS):
            raise DataError("--overwrite replaces only an empty directory or a ctrtrain output "
                            f"(one with a {', '.join(OUTPUT_MARKERS)}); this one is neither, so "
                            "it is left as it is", path=str(out))
        shutil.rmtree(out.resolve() if out.is_symlink() else out)
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise DataError("output directory is not writable", path=str(out))
    (out / INCOMPLETE_NAME).write_text(
        f"being written by a ctrtrain data tool (pid {os.getpid()}); this file is removed "
        "when the output is complete\n")
    return out


def remove_tree(path: str | os.PathLike) -> None:
    """shutil.rmtree of a directory a tool made and replaces (a run's `model/`, `source/`),
    refusing a symbolic link in its place by name: Python's own refusal ("Cannot call rmtree
    on a symbolic link") names no path, so the CLI said "I/O: ...". The link and what it
    points to are left as they are."""
    if os.path.islink(path):
        raise OSError(None, "is a symbolic link where a directory of ctrtrain's own belongs: "
                      "nothing removed (what it points to may be anyone's); remove the link",
                      str(path))
    shutil.rmtree(path)


def write_figure(fig, path) -> None:
    """A matplotlib figure as a PNG under `path`, written whole (staged), then closed (pyplot
    keeps every open figure alive)."""
    import matplotlib.pyplot as plt
    try:
        with staged(path, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
    finally:
        plt.close(fig)


@contextlib.contextmanager
def staged(path: str | os.PathLike, mode: str = "wb"):
    """Write-then-rename: a file object whose contents appear under `path` only when the
    block ends, so a file under its final name is always complete. Written unnamed where
    the filesystem allows (O_TMPFILE, linked in at the end), so a process killed mid-write
    (SIGKILL, the OOM killer) leaves nothing behind; elsewhere as `<path>.tmp`, removed when
    the block raises. A write or close that fails (a full disk) names the file."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o666)
        tmp = None
    except (AttributeError, OSError):       # not Linux, or a filesystem without it
        fd, tmp = None, f"{path}.tmp"
    f = os.fdopen(fd, mode) if fd is not None else open(tmp, mode)
    try:
        try:
            yield f
            f.flush()
            if tmp is None:
                tmp = f"{path}.{os.getpid()}.tmp"   # named for the instant of the rename
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
                _link_unnamed(f.fileno(), tmp)
            f.close()
        except OSError as e:
            raise named(e, tmp or path) from e
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # its flush fails again on a full disk
            f.close()
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        raise


def _link_unnamed(fd: int, name: str) -> None:
    """Gives an O_TMPFILE file a name: linkat(2) following /proc/self/fd/N (os.link calls
    link(2), which does not follow it); where that fails, its bytes copied to `name`."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, at_symlink_follow = -100, 0x400
    if libc.linkat(at_fdcwd, f"/proc/self/fd/{fd}".encode(), at_fdcwd, os.fsencode(name),
                   at_symlink_follow) == 0:
        return
    with open(f"/proc/self/fd/{fd}", "rb") as src, open(name, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def abandon_output_dir(out: str | os.PathLike) -> None:
    """A failed tool's last act, once it has removed what it wrote: the marker goes, and the
    directory too when nothing else is in it, so nothing is left behind."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(Path(out) / INCOMPLETE_NAME)
    with contextlib.suppress(OSError):      # not empty: someone else's files stay
        Path(out).rmdir()


def finish_output_dir(out: str | os.PathLike) -> None:
    """The tool's last act, after its manifest (or split.json, synth.json): the output is
    complete and readable."""
    os.remove(Path(out) / INCOMPLETE_NAME)
