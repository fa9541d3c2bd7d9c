import contextlib
import io
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
    """The small real Criteo/Avazu/MovieLens samples, kept in tests/data (its README names each
    file's source and licence); CTRTRAIN_SHARED_DATA points at another folder of that layout."""
    p = Path(os.environ.get("CTRTRAIN_SHARED_DATA", ROOT / "tests" / "data"))
    assert p.is_dir(), f"real data samples not found at {p} (set CTRTRAIN_SHARED_DATA)"
    return p


def pytest_collection_modifyitems(config, items):
    """A `serial` test runs alone after the 2.21 pass's parallel part (scripts/test.sh); the
    2.15 pass has no serial part, so a test marked serial and tf215 (or tf215_only) would
    never run there."""
    both = [i.nodeid for i in items if i.get_closest_marker("serial") and
            (i.get_closest_marker("tf215") or i.get_closest_marker("tf215_only"))]
    if both:
        raise pytest.UsageError(f"marked both serial and tf215 (scripts/test.sh): {both}")


@pytest.fixture(scope="session", autouse=True)
def fork_pool():
    """A pool of warm fork servers for this worker's launches (launch/forkpool.py), as a
    program that runs job after job keeps: each job's server a fork of it instead of a new
    process importing TensorFlow. Jobs run as without it (test_forkserver.py holds both ways
    to the same); none in a coverage run, nor where CTRTRAIN_FORK_POOL is set already. Not
    waited for: launches before its import is done start their own servers."""
    from ctrtrain.launch.forkpool import pooled_launches
    with pooled_launches(wait=0) as pooled:
        os.environ.update(pooled)
        try:
            yield
        finally:
            for k in pooled:
                del os.environ[k]


@pytest.fixture(scope="session")
def shared():
    return shared_data()


@pytest.fixture(scope="session")
def synth_data(tmp_path_factory):
    """synth_data(rows, feature_size, seed) -> (root, info): synthesized splits (root/raw,
    root/tf), made once per session for all the tests that read them."""
    from trainutil import SynthCache
    return SynthCache(tmp_path_factory)


@pytest.fixture(scope="session")
def single(synth_data, tmp_path_factory):
    """single[batch, epochs]: single-process DeepFM runs (result.json) on test_distributed.py's
    data, the baselines of the distributed and fault tests, each trained once per session."""
    from test_distributed import DATA, SingleBaselines
    return SingleBaselines(synth_data(**DATA)[0] / "tf", tmp_path_factory)


@pytest.fixture(scope="session")
def declared(tmp_path_factory):
    """Synthesized splits with 2 numeric, 5 categorical, 2 multi_hot fields (bags of 0 to 4
    ids, an empty bag in one row of five) and a sequence field (0 to 6 ids, of which the
    hidden model uses the last 3): test_fields.py's, and the model family's in a multi-process
    job (test_models.py)."""
    from trainutil import made_once
    return made_once(tmp_path_factory, "declared", lambda d: ctrtrain_here(
        "data", "synth", "--out", d / "data", "--rows", 30_000, "--feature-size", 4_000,
        "--seed", 2, "--numeric-fields", 2, "--categorical-fields", 5, "--multi-hot-fields", 2,
        "--multi-hot-len", 4, "--multi-hot-vocab", 300, "--sequence-fields", 1,
        "--sequence-len", 3, "--files-per-split", 2))[0] / "data"


def run_cli(*args, check=True, cwd=None, env=None, timeout=600):
    """Runs the real `ctrtrain` entry point in a subprocess; `env`: set in its environment
    (None: taken out of it)."""
    e = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, env=e, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"ctrtrain {' '.join(map(str, args))} failed ({r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def cli(*args):
    """(exit status, stdout, stderr) of `ctrtrain ARGS` run in this process: cli.main, all that
    the command runs but the process's start and end. A new process spends ~3 s of CPU
    importing TensorFlow, most of a short run (issue 28). For runs a test reads the output
    of, and for refusals; what only a process shows (its end on a signal, what TensorFlow's C++
    side prints) is tested through run_cli. The trainer seeds each run itself (train/sync.py),
    so runs in one process repeat as runs in new ones do."""
    from ctrtrain.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:   # argparse's refusals
            code = e.code
    return code, out.getvalue(), err.getvalue()


def ctrtrain_here(*args) -> str:
    """`ctrtrain ARGS` in this process (cli), which must succeed; returns its stdout."""
    code, out, err = cli(*args)
    assert code == 0, f"ctrtrain {' '.join(map(str, args))} failed ({code}):\n{out[-3000:]}\n" \
                      f"{err[-3000:]}"
    return out


def random_rows(n=1000, f=39, feature_size=10_000, seed=0):
    from ctrtrain.data.libsvm import Rows
    rng = np.random.default_rng(seed)
    values = np.where(np.arange(f) < 13, np.round(rng.random((n, f)) * 5, 4), 1).astype(np.float32)
    return Rows(rng.integers(0, 2, n).astype(np.float32), rng.integers(0, feature_size, (n, f)),
                values)
