import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("CTRTRAIN_NO_PROGRESS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def shared_data() -> Path:
    """The real Criteo/Avazu samples: ../shared/data beside the repository (as in CI)."""
    p = Path(os.environ.get("CTRTRAIN_SHARED_DATA", ROOT.parent / "shared" / "data"))
    assert p.is_dir(), f"real data samples not found at {p} (set CTRTRAIN_SHARED_DATA)"
    return p


@pytest.fixture(scope="session")
def shared():
    return shared_data()


def run_cli(*args, check=True, cwd=None, env=None, timeout=600):
    """Runs the real `ctrtrain` entry point in a subprocess."""
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, env=e, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"ctrtrain {' '.join(map(str, args))} failed ({r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def random_rows(n=1000, f=39, feature_size=10_000, seed=0):
    from ctrtrain.data.libsvm import Rows
    rng = np.random.default_rng(seed)
    values = np.where(np.arange(f) < 13, np.round(rng.random((n, f)) * 5, 4), 1).astype(np.float32)
    return Rows(rng.integers(0, 2, n).astype(np.float32), rng.integers(0, feature_size, (n, f)),
                values)
