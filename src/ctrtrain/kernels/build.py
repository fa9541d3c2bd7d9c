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


def build(force: bool = False) -> Path:
    """Compiles the library (g++ with TensorFlow's own compile and link flags) unless it is
    there; written under a temporary name and renamed, so a build cut short leaves nothing a
    process could load. Raises RuntimeError with the compiler's message when it fails."""
    import tensorflow as tf
    out = library_path()
    if intact(out) and not force:
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
