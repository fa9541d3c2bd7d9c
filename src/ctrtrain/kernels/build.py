"""Builds the fused kernels (ctr_kernels.cc) against the TensorFlow this Python imports.

    python -m ctrtrain.kernels.build

The install scripts (scripts/env.sh: TensorFlow 2.21; scripts/horovod_env.sh: 2.15) run it.
The library goes into the environment that imports it (or $CTRTRAIN_KERNELS_DIR), named by
TensorFlow's version and the source's hash (`library_path`), so that another TensorFlow or a
changed kernel is never served a stale library: it is simply not found, and the TensorFlow ops
run instead (kernels/__init__.py). Beside it, its SHA-256 (`checksum_path`): a library that
does not match is neither loaded nor kept (a rebuild replaces it).

-fno-math-errno and -fno-trapping-math let the compiler vectorize the per-row loops (sqrt,
division under a condition); nothing here reads errno or floating-point exception flags.
-fopenmp-simd honours `#pragma omp simd` alone (no OpenMP runtime): a dot product marked so
is summed in vector lanes, a reordering the compiler may not make of a float sum by itself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("ctr_kernels.cc")


def library_path() -> Path:
    """Where the library for this TensorFlow and this source is (or would be)."""
    import tensorflow as tf
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    where = os.environ.get("CTRTRAIN_KERNELS_DIR") or Path(sys.prefix) / "lib" / "ctrtrain-kernels"
    return Path(where) / f"tf{tf.__version__}-{digest}.so"


def checksum_path(library: Path) -> Path:
    """The library's SHA-256 as the build wrote it: a file changed, cut or replaced since
    (a foreign library under its name, a truncated copy) is not loaded."""
    return library.with_name(library.name + ".sha256")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def intact(library: Path) -> bool:
    """The library is the one the build wrote (its recorded checksum matches)."""
    recorded = checksum_path(library)
    return (library.is_file() and recorded.is_file()
            and recorded.read_text().strip() == sha256(library))


def damage(library: Path) -> str | None:
    """Why the library is not the file the build wrote, or None: its recorded checksum differs
    (or none was recorded), or it is not a whole ELF library (a copy cut short whose checksum
    was recomputed from the cut file: loading it maps pages past the file's end, a Bus error)."""
    if not intact(library):
        return "its checksum differs or was not recorded"
    return elf_incomplete(library)


def elf_incomplete(path: Path) -> str | None:
    """What of an ELF file lies past its end (the program header table, a loaded segment, the
    section header table), or that it is no ELF file; None for a whole one."""
    import struct
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) \
                or head[5] not in (1, 2):
            return "it is not an ELF library"
        end = "<" if head[5] == 1 else ">"
        wide = head[4] == 2          # ELFCLASS64
        if wide and len(head) < 64:
            return "it is cut short: its ELF header is incomplete"
        phoff, shoff = struct.unpack_from(end + ("QQ" if wide else "II"), head, 32 if wide else 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head,
                                                                 54 if wide else 42)
        parts = [("its program headers", phoff, phentsize * phnum),
                 ("its section headers", shoff, shentsize * shnum)]
        if phoff + phentsize * phnum <= size:
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                kind, = struct.unpack_from(end + "I", table, i * phentsize)
                if kind == 1:        # PT_LOAD: mapped from the file at load
                    off, filesz = struct.unpack_from(end + ("Q16xQ" if wide else "I8xI"), table,
                                                     i * phentsize + (8 if wide else 4))
                    parts.append((f"loaded segment {i}", off, filesz))
    for what, start, length in parts:
        if length and start + length > size:
            return (f"it is cut short: the file ends at byte {size:,}, before the end of "
                    f"{what} (byte {start + length:,})")
    return None


def build(force: bool = False) -> Path:
    """Compiles the library (g++ with TensorFlow's own compile and link flags) unless it is
    there; written under a temporary name and renamed, so a build cut short leaves nothing a
    process could load. Raises RuntimeError with the compiler's message when it fails."""
    import tensorflow as tf
    out = library_path()
    if damage(out) is None and not force:
        return out
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler ({compiler}) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [compiler, "-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp-simd", "-shared",
           "-fPIC", "-w",
           str(SOURCE), "-o", tmp, *tf.sysconfig.get_compile_flags(),
           *tf.sysconfig.get_link_flags()]
    t = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
    checksum_path(out).write_text(sha256(Path(tmp)) + "\n")
    os.replace(tmp, out)
    print(f"built {out} ({time.monotonic() - t:.1f} s, TensorFlow {tf.__version__})", flush=True)
    return out


def main() -> int:
    try:
        build(force="--force" in sys.argv[1:])
    except RuntimeError as e:
        print(f"ctrtrain kernels not built: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
