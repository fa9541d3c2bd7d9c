"""Nothing left half-written (issue 30): a data tool killed, or out of space, leaves nothing
that looks finished, no process behind it, and advice that works when followed. Each test is
one finding of the issue, run as a user meets it: the real command in a real process."""

import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from conftest import cli, run_cli


def session_processes(sid: int) -> list[int]:
    """Live processes of session `sid` (the killed tool's, started with a new session)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":   # field 6 of stat: the session
            found.append(int(d.name))
    return found


def read_to_end(pipe, deadline: float) -> bool:
    """Reads the pipe until EOF (every holder of its write end has ended) or the deadline."""
    while (left := deadline - time.monotonic()) > 0:
        if select.select([pipe], [], [], left)[0] and not os.read(pipe.fileno(), 1 << 16):
            return True
    return False


def libsvm_rows(path: Path, rows: int, fields: int = 3) -> Path:
    """`rows` lines of `label id:value ...`, varied ids (what convert's parser must read)."""
    rng = np.random.default_rng(0)
    block = [f"{rng.integers(0, 2)} " + " ".join(f"{rng.integers(0, 500)}:1" for _ in range(fields))
             for _ in range(10_000)]
    text = "\n".join(block) + "\n"
    with open(path, "w") as f:
        for _ in range(rows // len(block)):
            f.write(text)
    return path


def test_killed_convert_leaves_nothing_that_trains_and_no_process(tmp_path):
    """Finding 1: SIGKILL while convert runs (8 shards, 2 processes), once a shard has its
    final name. Before: those shards trained as if they were all the data (exit 0), the
    workers lived on holding the caller's stdout, and --overwrite refused the leftovers."""
    src = libsvm_rows(tmp_path / "day.libsvm", 1_500_000)
    out = tmp_path / "tf"
    args = [sys.executable, "-m", "ctrtrain.cli", "data", "convert", str(src), "--out", str(out),
            "--field-size", "3", "--shards", "8", "--processes", "2"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("part-*.tfrecord")):
        assert p.poll() is None, "convert ended before a shard was written"
        assert time.monotonic() < deadline, "no shard after 120 s"
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert read_to_end(p.stdout, killed + 2), "the caller's stdout was still held 2 s after"
    p.wait()
    while session_processes(p.pid) and time.monotonic() - killed < 2:
        time.sleep(0.05)
    assert session_processes(p.pid) == [], "convert's workers outlived it by 2 s"
    shards = sorted(x.name for x in out.glob("part-*.tfrecord"))
    assert shards and len(shards) < 8 and not (out / "manifest.json").exists(), shards

    code, _, err = cli("train", "--train", out, "--model-dir", tmp_path / "m", "--steps", 1)
    assert code == 2 and "never finished" in err and str(out) in err, err
    assert not (tmp_path / "m").exists()

    r = run_cli(*args[3:], check=False)           # the advice: pass --overwrite
    assert r.returncode == 2 and "--overwrite" in r.stderr, r.stderr
    run_cli(*args[3:], "--overwrite")             # ... and it works
    assert (out / "manifest.json").exists() and not (out / ".ctrtrain-incomplete").exists()
    assert len(list(out.glob("part-*.tfrecord"))) == 8


def _file_limit(size: int):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the write fails instead (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


def test_split_out_of_space_names_the_file_and_leaves_nothing(tmp_path):
    """Finding 2: a split whose writes fail part-way (here the file-size limit, as a full disk
    fails them) names the file it was writing and leaves no .tmp behind, its input intact."""
    src = libsvm_rows(tmp_path / "day.libsvm", 40_000)
    before = src.read_bytes()
    out = tmp_path / "parts"
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", "data", "split", str(src), "--out",
                        str(out)], capture_output=True, text=True, timeout=120,
                       preexec_fn=_file_limit(200_000))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"{out / 'train.libsvm'}.tmp" in r.stderr and "File too large" in r.stderr, r.stderr
    left = sorted(x.name for x in out.iterdir()) if out.exists() else []
    assert left == [], left
    assert src.read_bytes() == before
    # Followed as it says (no --overwrite needed: nothing was left), the split succeeds.
    run_cli("data", "split", src, "--out", out)
    assert (out / "split.json").exists() and not (out / ".ctrtrain-incomplete").exists()


def test_convert_out_of_space_names_the_shard(tmp_path):
    """A shard's write that fails part-way names the shard; the output goes."""
    src = libsvm_rows(tmp_path / "day.libsvm", 40_000)
    out = tmp_path / "tf"
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", "data", "convert", str(src), "--out",
                        str(out), "--field-size", "3", "--shards", "1"],
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=_file_limit(100_000))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"{out / 'part-00000-of-00001.tfrecord'}" in r.stderr, r.stderr
    assert not out.exists()


def test_a_writer_killed_mid_file_leaves_nothing(tmp_path):
    """F42: a SIGKILLed `predict` left `<out>.tmp` (no handler runs on SIGKILL). Outputs
    written through data/files.py `staged` (predict's, convert's shards, featurize's) are
    unnamed until complete: the kernel drops them with the process."""
    out = tmp_path / "out"
    out.mkdir()
    code = ("import os, signal\n"
            "from ctrtrain.data.files import staged\n"
            f"with staged({str(out / 'p.csv')!r}, 'w') as f:\n"
            "    f.write('row,prob\\n' * 100_000)\n"
            "    f.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == -9, r.stderr
    assert list(out.iterdir()) == []


def test_a_checkpoint_cut_short_leaves_no_partial_directory(tmp_path):
    """F42: a checkpoint whose write failed (a full disk; here the file-size limit, which
    fails writes the same way) left `ckpt-N_temp/` beside the checkpoints. The failed save
    is named and its partial directory removed; a restore removes any left by a kill."""
    src = libsvm_rows(tmp_path / "day.libsvm", 10_000)
    md = tmp_path / "m"
    # A table of 300,000 rows: its checkpoint (with Adam's slots) is far over 8 MB.
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", "train", "--train", str(src),
                        "--model-dir", str(md), "--feature-size", "300000", "--steps", "2",
                        "--batch-size", "256"], capture_output=True, text=True, timeout=300,
                       preexec_fn=_file_limit(8 << 20))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "cannot write the checkpoint of step 2" in r.stderr, r.stderr[-2000:]
    assert "File too large" in r.stderr and "function_node" not in r.stderr
    assert not list((md / "checkpoints").glob("*_temp*"))
    # One left by a process killed mid-save goes when the next run restores.
    (md / "checkpoints" / "ckpt-2_temp").mkdir()
    (md / "checkpoints" / "ckpt-2_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    run_cli("train", "--train", src, "--model-dir", md, "--steps", 2, "--batch-size", 256,
            "--feature-size", 600)
    assert not list((md / "checkpoints").glob("*_temp*"))
    assert list((md / "checkpoints").glob("ckpt-2.index"))
