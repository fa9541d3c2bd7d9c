"""The run directory of a local job: claimed and locked, each simulated host's /opt/ml tree
(hosts/<host>/), the code packed as the SDK uploads it, failure files, and the model collected
as SageMaker's model.tar.gz step does."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tarfile
from pathlib import Path

from ..data.files import remove_tree
from ..errors import CtrError
from .spec import JobSpec


class JobFailed(CtrError):
    """A job that did not finish. `retryable`: a process or host died, which starting again
    from the checkpoints may get past (max_retry_attempts); not when the job never started, or
    a process exited 2 (its input or settings are wrong: another attempt fails the same)."""

    def __init__(self, message: str, retryable: bool = False, exited_by_itself: bool = False):
        super().__init__(message)
        self.retryable = retryable
        # The failed process ended with a non-zero status of its own (not a signal): what
        # the same code on the same input tends to do again.
        self.exited_by_itself = exited_by_itself


RUN_MARKER = "ctrtrain-run.json"


def claim_run_dir(run_dir: Path, spec: JobSpec):
    """The run directory must be new, empty, or this job's own earlier run (to resume), and
    no other launch may use it at the same time: returns the open lock file, held until the
    launcher exits. A symlink, a directory of other files, another job's run: refused, and
    nothing in them is touched."""
    if run_dir.is_symlink():
        raise JobFailed(f"output directory {run_dir} is a symbolic link; give a real directory")
    if run_dir.exists() and not run_dir.is_dir():
        raise JobFailed(f"output directory {run_dir} exists and is not a directory")
    marker = run_dir / RUN_MARKER
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if not marker.exists():
            raise JobFailed(f"output directory {run_dir} is not empty and is not a ctrtrain run "
                            f"(no {RUN_MARKER}); a launch needs a new or empty directory, or "
                            "its own earlier run to resume")
        try:
            owner = json.loads(marker.read_text()).get("job")
        except (ValueError, AttributeError):
            owner = None
        if owner != spec.name:
            raise JobFailed(f"output directory {run_dir} holds the run of job {owner!r}, not "
                            f"{spec.name!r}; choose another output_dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = open(run_dir / ".lock", "a")
    except OSError as e:
        raise JobFailed(f"cannot create the output directory {run_dir}: {e.strerror}") from e
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise JobFailed(f"another launch is running in {run_dir} (its lock is held); wait for it "
                        "or choose another output_dir") from None
    marker.write_text(json.dumps({"job": spec.name, "spec": spec.spec_path}) + "\n")
    return lock


def host_base(run_dir: Path, host: str) -> Path:
    return run_dir / "hosts" / host


def prepare_run(spec: JobSpec, run_dir: Path) -> None:
    if not os.access(run_dir, os.W_OK):
        raise JobFailed(f"output directory {run_dir} is not writable")
    free_mb = shutil.disk_usage(run_dir).free / 2**20
    if free_mb < spec.min_free_disk_mb:
        raise JobFailed(f"only {free_mb:,.0f} MB free on the disk of {run_dir}; the job asks for "
                        f"min_free_disk_mb={spec.min_free_disk_mb:g} (checkpoints, logs, model)")
    for stale in ("model", "model.tar.gz", "failure"):
        path = run_dir / stale
        if path.is_dir():
            remove_tree(path)
        elif path.exists():
            path.unlink()


def pack_code(spec: JobSpec, run_dir: Path) -> str:
    """The job's code as the SDK uploads it: source_dir (or the entry point's file alone)
    packed into sourcedir.tar.gz. Returns the tarball's path (sagemaker_submit_directory)."""
    src = run_dir / "source"
    if src.exists():
        remove_tree(src)
    src.mkdir()
    tar_path = src / "sourcedir.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        if spec.entry_point.kind == "script":
            if spec.source_dir:
                for item in sorted(os.listdir(spec.source_dir)):
                    tar.add(os.path.join(spec.source_dir, item), arcname=item)
            else:
                tar.add(spec.entry_point.target, arcname=os.path.basename(spec.entry_point.target))
    return str(tar_path)


def unpack_code(tar_path: str, code_dir: Path) -> None:
    if code_dir.exists():
        remove_tree(code_dir)
    code_dir.mkdir(parents=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(code_dir, filter="data")


def share_checkpoints(tree: Path, shared: Path, containers: bool) -> None:
    """/opt/ml/checkpoints: SageMaker syncs every host's copy with one S3 prefix, so a
    re-launched job restores the same checkpoint everywhere; here they are one directory --
    bound there in containers (the tree holds the mount point), a link otherwise."""
    ckpt = tree / "checkpoints"
    if containers:
        if ckpt.is_symlink():
            ckpt.unlink()
        ckpt.mkdir(exist_ok=True)
    elif not ckpt.is_symlink():
        if ckpt.is_dir():
            ckpt.rmdir()   # the mount point of an earlier run in containers
        ckpt.symlink_to(shared.resolve(), target_is_directory=True)


def failure_files(run_dir: Path, hosts: list[str]) -> dict[str, str]:
    out = {}
    for h in hosts:
        f = host_base(run_dir, h) / "output" / "failure"
        if f.exists():
            out[h] = f.read_text(errors="replace")
    return out


def write_failure(run_dir: Path, hosts: list[str], outcome) -> None:
    """/opt/ml/output/failure of the host whose process failed (every host when the failure
    is no one host's: a time limit, horovodrun), as SageMaker's FailureReason; where the
    toolkit wrote its own, that one stays."""
    failed = outcome.failed.split("/")[0] if outcome.failed else None
    for h in [failed] if failed in hosts else hosts:
        f = host_base(run_dir, h) / "output" / "failure"
        if not f.exists():
            f.write_text("\n".join([outcome.reason, *outcome.tail]) + "\n")


def collect_model(model_dirs: list[tuple[str, Path]], run_dir: Path
                  ) -> tuple[str, list[str], list[str]]:
    """The hosts' /opt/ml/model, merged, become the job's output, like SageMaker's
    model.tar.gz step (every host's files: a Horovod script whose ranks each save a file
    finds them all). `model_dirs`: (host, its model directory), the master first; a file
    name two hosts wrote is the first one's (the master's). Returns (the merged copy's path,
    the files it holds, a line per file another host's copy of was left out)."""
    out = run_dir / "model"
    if out.exists():
        remove_tree(out)
    out.mkdir()
    owner, clashes = {}, []
    for host, model_dir in model_dirs:
        for src in sorted(model_dir.rglob("*")):
            rel = src.relative_to(model_dir)
            dst = out / rel
            if src.is_dir() and not src.is_symlink():
                dst.mkdir(exist_ok=True)
            elif str(rel) in owner or dst.exists():
                clashes.append(f"{host} wrote /opt/ml/model/{rel} too: model.tar.gz holds "
                               f"{owner.get(str(rel), 'another host')}'s")
            elif src.exists():      # a dangling link is nothing to pack
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
                owner[str(rel)] = host
    with tarfile.open(run_dir / "model.tar.gz", "w:gz") as tar:
        for item in sorted(out.iterdir()):
            tar.add(item, arcname=item.name)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return str(out), files, clashes
