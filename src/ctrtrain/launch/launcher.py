"""`ctrtrain launch job.yaml`: a multi-host job on this machine. Each simulated host is a
container without Docker (container.py): its /opt/ml is <run dir>/hosts/<host>/, written as
the SageMaker platform writes it (config files, channels, code), its hostname algo-N, its
address on the job's private bridge. A framework image job (`framework_version`) runs
SageMaker's own training toolkit on every host; ctrtrain's own modes run their roles with the
same environment (plus TF_CONFIG and ranks). The master host's /opt/ml/model is collected
into <run dir>/model and model.tar.gz; a failure is in <run dir>/hosts/<host>/output/failure.
Without containers (--isolation loopback|host) hosts are directories sharing this machine's
filesystem and loopback, on free ports."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path

from .. import heartbeat
from ..errors import ConfigError
from ..cluster.plan import plan_cluster
from ..cluster.process_env import process_command, process_env
from ..cluster.sagemaker import container_env, sdk_hyperparameters, write_config_files
from ..mode import Mode
from .channels import (PipeFeeder, assign, channel_files, check_pipe_files,
                       materialize_file_channel)
from .container import HostContainer, bridge_address, make_bridge
from .framework import SHARED, model_dir_hyperparameter, model_hosts, start_framework_hosts
from .horovod import horovod_command, horovodrun, rank_places
from .images import find_image, own_image
from .run_dir import (JobFailed, claim_run_dir, collect_model, failure_files, host_base,
                      pack_code, prepare_run, share_checkpoints, unpack_code, write_failure)
from .spec import JobSpec
from .supervisor import Supervisor

__all__ = ["JobFailed", "PortAllocator", "claim_run_dir", "host_base", "launch"]


class PortAllocator:
    """Free loopback ports, never the same twice in one job; gives up after `tries` (a
    machine whose ephemeral ports are used up would otherwise loop forever)."""

    def __init__(self, tries: int = 1000):
        self.used: set[int] = set()
        self.tries = tries

    def get(self) -> int:
        for _ in range(self.tries):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in self.used:
                self.used.add(port)
                return port
        raise JobFailed(f"no free loopback port after {self.tries} tries "
                        f"({len(self.used)} taken by this job)")


# Signals a process raises on itself (abort(), a bad memory access, an arithmetic or illegal
# instruction): its own code failing, as an exit status of its own does. SIGKILL, SIGTERM and
# SIGHUP come from outside (a killed host, the OOM killer): another attempt may pass.
SELF_INFLICTED = {int(s) for s in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                                   signal.SIGILL)}


def check_runtime(spec: JobSpec) -> None:
    """What the mode needs installed, checked before anything starts."""
    import importlib.util
    if spec.topology.mode is Mode.HOROVOD and (importlib.util.find_spec("horovod") is None
                                            or horovodrun() is None):
        raise JobFailed("distribution mode 'horovod' needs Horovod (and its horovodrun), which is "
                        "not installed in this Python. Horovod 0.28.1 does not build against "
                        "TensorFlow 2.21; `bash scripts/horovod_env.sh` builds it against "
                        "tensorflow-cpu==2.15.1 in .venv-hvd (run the launch from there). Or use "
                        "mode 'allreduce' for the same synchronous training on TensorFlow's own "
                        "collectives.")


def launch(spec: JobSpec, console: bool = True, cores: int | None = None,
           containers: bool | None = None) -> dict:
    """Runs the job to its end. `containers`: each simulated host in namespaces of its own
    (container.py; needs the job's own namespaces, isolation.py); default: when the launcher
    runs inside them."""
    check_runtime(spec)
    if containers is None:
        from .isolation import inside
        containers = inside("loopback")
    if spec.framework_version and not containers:
        raise JobFailed(f"job {spec.name}: a framework image job (framework_version "
                        f"{spec.framework_version}) runs in simulated containers, which need "
                        "user namespaces (`ctrtrain launch` with the default --isolation "
                        "containers); SageMaker scripts expect their own /opt/ml, hostname and "
                        "network")
    run_dir = Path(spec.output_dir)
    lock = claim_run_dir(run_dir, spec)
    try:
        return _with_retries(spec, run_dir, lambda limit: _launch(spec, run_dir, console, cores,
                                                                  containers, limit))
    finally:
        lock.close()


def prepare_outside(spec: JobSpec):
    """What a framework image job needs from the package index, fetched before the hosts
    start (by `ctrtrain launch` before it enters the job's namespaces, where nothing routes
    out; found ready here then): its image, built on demand, and its requirements.txt's
    wheelhouse. An `mpi` job's image gets Horovod (compiled in if it has none). Returns the
    wheelhouse's path (None without a requirements.txt)."""
    if not spec.framework_version:
        return None
    from .image_build import ensure_image
    from .wheelhouse import prepare, requirements_file, resolvable_lines
    req = requirements_file(spec.source_dir)
    if req:
        resolvable_lines(req)   # a path outside the code is refused before an image is built
    refuse_mpi_without_horovod(spec)
    image = ensure_image(spec.framework_version, spec.py_version,
                         horovod=bool(spec.framework_params.get("sagemaker_mpi_enabled")))
    say_pipe_mode_dataset(spec, image)
    return prepare(req, image) if req else None


def refuse_mpi_without_horovod(spec: JobSpec) -> None:
    """An `mpi` job needs Horovod in its image. An image without it gets it compiled in at
    launch (image_build.py: a TensorFlow Horovod 0.28.1 builds against, with g++ and
    cmake < 4); where that cannot be done, the job is refused here, in a moment, before any
    image is built or compiled, naming what is missing and what works."""
    if not spec.framework_params.get("sagemaker_mpi_enabled"):
        return
    from .image_build import HOROVOD, HOROVOD_TF, horovod_blockers
    from .images import find_image
    try:
        image = find_image(spec.framework_version, spec.py_version)
    except ConfigError:
        image = None        # would be built now, Horovod with it
    if image is not None and image.horovod:
        return
    blockers = horovod_blockers(spec.framework_version, image)
    if blockers:
        lo, hi = (".".join(map(str, v)) for v in HOROVOD_TF)
        raise ConfigError(f"job {spec.name}: distribution mpi runs Horovod, which the "
                          f"{spec.framework_version} image does not have, and it cannot be "
                          f"built into it here: {'; '.join(blockers)}. What works: "
                          f"framework_version {lo} to {hi} (Horovod {HOROVOD} compiled into "
                          "the image at launch, on a machine with g++ and cmake < 4), or "
                          "'2.15', whose image .venv-hvd has it (`bash scripts/horovod_env.sh`)")


def say_pipe_mode_dataset(spec: JobSpec, image) -> None:
    """Says before the job starts when its hosts get ctrtrain's PipeModeDataset, not one the
    image has (framework.pipe_mode_standin)."""
    from .framework import pipe_mode_standin
    if not pipe_mode_standin(spec, image):
        return
    pipes = sorted(name for name, c in spec.channels.items() if c.input_mode == "Pipe")
    has = (f"its sagemaker-tensorflow {image.pipemode} is TensorFlow "
           f"{'.'.join(image.pipemode.split('.')[:2])}'s, whose bare iterator crashes there"
           if image.pipemode else "AWS published it for TensorFlow 2.11 to 2.14")
    print(f"Pipe channel(s) {', '.join(pipes)}: the {image.framework_version} image has no "
          f"PipeModeDataset built for its TensorFlow ({has}); its hosts import ctrtrain's "
          "(sagemaker_tensorflow.PipeModeDataset, reading the channel's FIFOs as SageMaker's "
          "does; docs/cluster.md)", flush=True)


RETRY_BACKOFF_S = 2.0   # between attempts: the torn-down job's ports and files settle


def _with_retries(spec: JobSpec, run_dir: Path, attempt) -> dict:
    """Runs `attempt` (one whole job: start, supervise, tear down, report) and, while it fails
    in a way another attempt may get past (JobFailed.retryable) and max_retry_attempts allows,
    again after a short backoff: the recipe resumes from the shared checkpoints. job.json
    lists every attempt (when it started, cause, step resumed from, step reached, seconds) and
    the final state. `attempt(time_limit)`: the job's time_limit bounds all attempts together
    (SageMaker's MaxRuntime), each is given what is left.

    Not retried: a failure JobFailed marks final (bad input, the time limit, a hang), and an
    attempt that failed on its own (a process's non-zero exit, not a signal) with no new
    checkpoint when the attempt before it did the same: a script that fails at start-up fails
    every time. A killed process (a fault, a lost host) is retried whatever it reached."""
    attempts = []
    job_began = time.monotonic()
    while True:
        began, resumed = time.time(), saved_step(run_dir / "checkpoints")
        entry = {"attempt": len(attempts) + 1, "started": round(began, 3),
                 "resumed_from_step": resumed}
        left = spec.time_limit - (time.monotonic() - job_began) if spec.time_limit else None
        try:
            attempt(left)
        except JobFailed as failure:
            entry.update(cause=str(failure).splitlines()[0], seconds=round(time.time() - began, 1),
                         step_reached=saved_step(run_dir / "checkpoints"),
                         no_progress=failure.exited_by_itself and
                         saved_step(run_dir / "checkpoints") == resumed)
            attempts.append(entry)
            stuck = entry["no_progress"] and len(attempts) > 1 and attempts[-2]["no_progress"]
            final = (not failure.retryable or stuck
                     or len(attempts) > spec.max_retry_attempts)
            if stuck:
                entry["not_retried"] = ("two attempts in a row failed on their own before any "
                                        "new checkpoint: another would fail the same")
            elif final and failure.retryable is False and len(attempts) <= spec.max_retry_attempts:
                entry["not_retried"] = "another attempt cannot get past this failure"
            time_up = None
            if not final and spec.time_limit and \
                    spec.time_limit - (time.monotonic() - job_began) <= RETRY_BACKOFF_S:
                # The time limit ends during the wait: no attempt is started (one was, and
                # recorded, failing at once on the limit: an attempt that never ran).
                final, time_up = True, (f"time limit of {spec.time_limit:g} s reached (over "
                                        "all attempts) while waiting to retry")
                entry["not_retried"] = (f"the job's time limit ({spec.time_limit:g} s) ends "
                                        "before another attempt could start")
            _record_attempts(run_dir, attempts, "failed" if final else "retrying",
                             **({"reason": time_up} if time_up else {}))
            if final:
                if "not_retried" in entry and spec.max_retry_attempts:
                    print(f"[launcher] not retried: {entry['not_retried']}", flush=True)
                if time_up:
                    raise JobFailed(f"{time_up}: attempt {len(attempts)} failed "
                                    f"({entry['cause']})") from None
                raise
            print(f"[launcher] attempt {len(attempts)} failed ({entry['cause']}); starting "
                  f"again from step {entry['step_reached'] or 0} in {RETRY_BACKOFF_S:g} s "
                  f"(retry {len(attempts)} of {spec.max_retry_attempts})", flush=True)
            time.sleep(RETRY_BACKOFF_S)
            continue
        except KeyboardInterrupt:
            entry.update(cause="stopped by a signal", seconds=round(time.time() - began, 1),
                         step_reached=saved_step(run_dir / "checkpoints"))
            if (run_dir / "job.json").exists():
                _record_attempts(run_dir, attempts + [entry], "stopped")
            raise
        entry.update(cause=None, seconds=round(time.time() - began, 1),
                     step_reached=saved_step(run_dir / "checkpoints"))
        attempts.append(entry)
        return _record_attempts(run_dir, attempts, "completed")


def _record_attempts(run_dir: Path, attempts: list[dict], state: str, **over) -> dict:
    """job.json (as the last attempt's report wrote it) with every attempt and the job's state
    (`over`: what ended the job, where that is not the last attempt's own reason)."""
    path = run_dir / "job.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.update(attempts=attempts, state=state, **over)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _launch(spec: JobSpec, run_dir: Path, console: bool, cores: int | None,
            containers: bool, time_limit: float | None = None) -> dict:
    prepare_run(spec, run_dir)
    cores = cores or os.cpu_count() or 1
    hosts = [h for h, _ in spec.topology.host_names()]
    if containers:
        # Every simulated host has its own address: the ports SageMaker's and TensorFlow's
        # conventions fix (2222, ...) are free on each, as on real hosts.
        procs = plan_cluster(spec.topology)
    else:
        ports = PortAllocator()
        procs = plan_cluster(spec.topology, address=lambda host, slot: f"127.0.0.1:{ports.get()}")
    framework = spec.framework_version is not None
    image = find_image(spec.framework_version, spec.py_version) if framework else own_image()
    wheels = prepare_outside(spec) if framework else None
    training_hosts = hosts if framework else sorted(
        {p.host for p in procs if p.role in ("chief", "worker")}, key=hosts.index)
    shares, warnings = {}, []
    for ch in spec.channels.values():
        shares[ch.name], w = assign(ch, training_hosts)
        warnings += w
    for w in warnings:
        print(f"warning: {w}", flush=True)

    channel_modes = {c.name: c.as_dict() for c in spec.channels.values()}
    data_hosts = {p.host for p in procs if p.role == "data_worker"} if containers else set()
    if time_limit is not None and time_limit <= 0:
        raise JobFailed(f"time limit of {spec.time_limit:g} s reached (over all attempts)")
    sup = Supervisor(run_dir / "logs", console=console, time_limit=time_limit,
                     watchdog=spec.watchdog, job_time_limit=spec.time_limit)
    if sup.pid_file.exists():
        sup.pid_file.unlink()
    # PIDs in logs/pids are this namespace's when the job has its own (isolation.host_pid).
    pidns = sup.log_dir / "pidns"
    if os.getpid() == 1:
        pidns.write_text(os.readlink("/proc/self/ns/pid") + "\n")
    elif pidns.exists():
        pidns.unlink()
    source_tar = pack_code(spec, run_dir)
    hyperparameters = sdk_hyperparameters(
        spec.hyperparameters, program=spec.program, submit_directory=source_tar,
        job_name=spec.name, region=spec.region, log_level=spec.container_log_level,
        model_dir=model_dir_hyperparameter(spec), framework=spec.framework_params)
    interface = "eth0" if containers else "lo"
    shared_ckpt = run_dir / "checkpoints"
    shared_ckpt.mkdir(exist_ok=True)
    shared = run_dir / "shared"
    (shared / "model").mkdir(parents=True, exist_ok=True)
    feeders, boxes = [], {}
    for host in hosts:
        tree = host_base(run_dir, host)
        for sub in ("model", "output/data", "output/intermediate", "input/data", "code", "shared"):
            (tree / sub).mkdir(parents=True, exist_ok=True)
        (tree / "output" / "failure").unlink(missing_ok=True)
        (tree / "output" / "success").unlink(missing_ok=True)
        if not framework:
            # The toolkit unpacks the code itself in a framework image; ctrtrain's own
            # modes find it unpacked, in the same place.
            unpack_code(source_tar, tree / "code")
        share_checkpoints(tree, shared_ckpt, containers)
        write_config_files(tree, spec.topology, host, channel_modes, hyperparameters, interface)
        for ch in spec.channels.values():
            files = shares[ch.name].get(host, [])
            if host in data_hosts and ch.input_mode == "File":
                # A tf.data service worker reads the files the trainers' pipelines name,
                # wherever they are: its host holds every channel whole.
                files = channel_files(ch)
            if ch.input_mode == "File":
                materialize_file_channel(ch, files, tree / "input" / "data" / ch.name)
            elif host in training_hosts:
                check_pipe_files(ch, files)
                feeders.append(PipeFeeder(tree / "input" / "data", ch.name, files,
                                          spec.pipe_epochs, sup.pids, sup.report_error))
        if containers:
            boxes[host] = HostContainer(
                host, hosts.index(host), tree, run_dir / "tmp" / host, hosts,
                keep=[image.prefix, str(Path(__file__).resolve().parents[2]), str(run_dir),
                      *([str(wheels)] if wheels else [])],
                images=[image.prefix], binds={"/opt/ml/checkpoints": str(shared_ckpt),
                                              SHARED: str(shared)})
    try:
        if containers:
            make_bridge()
            for box in boxes.values():
                box.start()
        started = time.time()
        if framework:
            start_framework_hosts(spec, sup, image, hosts, boxes, hyperparameters, channel_modes,
                                   cores, run_dir)
        else:
            _start_processes(spec, sup, image, procs, boxes, hyperparameters, channel_modes,
                             cores, run_dir, containers)
        for f in feeders:
            sup.add_progress(lambda f=f: f.last_fed)
            f.start()
        try:
            outcome = sup.wait()
        except KeyboardInterrupt:
            # Preemption, `timeout`, Ctrl-C: wait has torn the job down; its record says so
            # and where the job can resume from, then the launcher ends as signalled.
            _report(spec, run_dir, hosts, procs, image, sup.stopped(), time.time() - started,
                    warnings)
            raise
        finally:
            for f in feeders:
                f.stop.set()
            # Ended before the next attempt makes its FIFOs: a feeder that ran on would
            # unlink the new attempt's `<channel>_0` as it finished its own.
            for f in feeders:
                if f.is_alive():
                    f.join(timeout=10)
    finally:
        for box in boxes.values():
            box.stop()
    return _report(spec, run_dir, hosts, procs, image, outcome, time.time() - started, warnings)


def _report(spec, run_dir, hosts, procs, image, outcome, seconds, warnings) -> dict:
    """job.json, the failure files and the model; raises JobFailed for a failed job."""
    framework = spec.framework_version is not None
    summary = {"job": spec.name, "ok": outcome.ok, "reason": outcome.reason,
               "seconds": seconds, "exit_codes": outcome.exit_codes,
               "framework_version": spec.framework_version, "image": image.python,
               "processes": [{"label": p.label, "host": p.host, "group": p.group, "role": p.role,
                              "index": p.index, "rank": p.rank,
                              "address": p.address, "tf_config": p.tf_config} for p in procs]
               if not framework else [{"label": f"{h}/train", "host": h} for h in hosts],
               "warnings": warnings, "tolerated_failures": outcome.tolerated,
               "stopped": outcome.stopped, "step_saved": saved_step(run_dir / "checkpoints")}
    if outcome.stopped:
        (run_dir / "job.json").write_text(json.dumps(summary, indent=2) + "\n")
        where = (f"the last checkpoint is of step {summary['step_saved']}"
                 if summary["step_saved"] is not None else "no checkpoint was saved")
        print(f"job {spec.name} stopped: {where}; the same launch resumes it "
              f"({run_dir / 'job.json'})", flush=True)
        return summary
    if outcome.ok:
        # A SageMaker script's job packs every host's model directory (the master's first);
        # ctrtrain's own trainers save the model on the chief's host only.
        packed = model_hosts(spec, hosts) if framework else \
            [next(p for p in procs if p.is_chief).host]
        summary["model"], summary["model_files"], clashes = collect_model(
            [(h, host_base(run_dir, h) / "model") for h in packed], run_dir)
        if not summary["model_files"]:
            who = f"{packed[0]} wrote" if len(packed) == 1 else "no host wrote"
            clashes.append(f"{who} nothing into /opt/ml/model: model.tar.gz is empty")
        summary["warnings"] += clashes
        for line in clashes:
            print(f"warning: {line}", flush=True)
    else:
        write_failure(run_dir, hosts, outcome)
        summary["failure"] = failure_files(run_dir, hosts)
    (run_dir / "job.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not outcome.ok:
        first = next(iter(summary["failure"].values()), "")
        msg = "\n".join([f"job {spec.name} failed: {outcome.reason}", *outcome.tail] +
                        (["--- /opt/ml/output/failure ---", first.strip()[-2000:]]
                         if first and framework else []))
        failed_code = outcome.exit_codes.get(outcome.failed)
        raise JobFailed(msg, retryable=outcome.retryable and 2 not in outcome.exit_codes.values(),
                        exited_by_itself=failed_code is not None and (
                            failed_code > 0 or -failed_code in SELF_INFLICTED))
    return summary


def saved_step(checkpoints: Path) -> int | None:
    """The step of the newest checkpoint under the job's shared checkpoint directory (the
    recipe's model dir), None without one: what TensorFlow's `checkpoint` state files name,
    or a newer `<prefix>-<step>.index` beside one. TensorFlow writes a checkpoint's index
    before it updates the state file, and a process killed between the two resumes from the
    index (train/model_dir.py restores the newest that restores): so must this say."""
    steps = []
    for state in checkpoints.rglob("checkpoint"):
        try:
            text = state.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        found = re.search(r'^model_checkpoint_path: ".*?-(\d+)"', text, re.MULTILINE)
        if found:
            steps.append(int(found.group(1)))
        steps += [int(m.group(1)) for p in state.parent.glob("*.index")
                  if (m := re.fullmatch(r".*-(\d+)\.index", p.name))]
    return max(steps, default=None)


def _start_processes(spec, sup, image, procs, boxes, hyperparameters, channel_modes, cores,
                     run_dir, containers):
    """ctrtrain's own modes: each role a process of its host, with the SageMaker variables."""
    ranks = []
    for p in procs:
        tree = host_base(run_dir, p.host)
        base = Path("/opt/ml") if containers else tree
        env = dict(os.environ)
        if containers:
            env["PATH"] = f"{image.bin_dir}:{env.get('PATH', '')}"
        env.update(container_env(base, spec.topology, p.host, channel_modes, hyperparameters,
                                 spec.name, num_cpus=cores,
                                 interface="eth0" if containers else "lo",
                                 training_env_keys=image.training_env_keys))
        env.update(spec.environment)
        env.update(process_env(p, procs, cores, spec.processing_mode, spec.topology.mode))
        target = spec.entry_point.target
        if spec.entry_point.kind == "script":
            target = str(base / "code" / spec.program)
        # The arguments SM_USER_ARGS names: the hyperparameters as the toolkit passes them.
        cmd = process_command(p, spec.entry_point.kind, target, spec.entry_point.args,
                              json.loads(env["SM_USER_ARGS"]))
        cwd = str(base / "code")
        if containers:
            cmd, cwd = boxes[p.host].enter(cmd, cwd), None
        if spec.topology.mode is Mode.HOROVOD and not p.is_server:
            # Every rank's training heartbeat counts as horovodrun's progress.
            env[heartbeat.ENV] = str(sup.heartbeat_path("horovodrun"))
            # horovodrun runs in the job's namespace and its rendezvous server listens on
            # every interface there: ranks in containers reach it over the bridge.
            override = ({"HOROVOD_GLOO_RENDEZVOUS_ADDR": bridge_address(),
                         "HOROVOD_GLOO_IFACE": "eth0"} if containers else {})
            override.update(rank_places([q.host for q in procs if q.rank is not None])[p.rank])
            ranks.append({"rank": p.rank, "env": env, "cmd": cmd, "cwd": cwd or "/",
                          "override": override})
        else:
            # A parameter-server worker may die: the coordinator reschedules its steps.
            sup.start(p.label, cmd, env, cwd=cwd, server=p.is_server,
                      tolerated=spec.topology.mode.asynchronous and p.role == "worker")
    if ranks:
        sup.start("horovodrun", horovod_command(ranks, run_dir), dict(os.environ),
                  cwd=str(run_dir), server=False)


