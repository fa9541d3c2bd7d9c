"""`ctrtrain bench chaos SPEC`: what faults cost a job. The spec runs once undisturbed, then
again while a random process of the job (a trainer, parameter server, dispatcher, tf.data
worker) or a whole simulated host (every process of it) is SIGKILLed every few seconds; the
report puts the two runs side by side: finished, steps, attempts, seconds lost per fault,
test AUC and its difference, processes and temporary files left.

A fault is injected only once the job has saved a checkpoint newer than the one at the
fault before (or, for the first, its first checkpoint) and `every` seconds have passed: each
fault then lands on a job that has made progress, and the run measures what a fault costs,
not whether a job killed faster than it starts can finish. The spec's `max_retry_attempts`
is what lets the job survive (`--retries` overrides it for both runs).

Whether a fault costs an attempt depends on where it lands (a kill in the job's last seconds,
of a process that has already finished its part, costs nothing), so the report says of each
fault which attempt it hit and whether that attempt failed: the job's attempts are then one
more than the attempts lost to faults, whatever the draw.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..data.manifest import INCOMPLETE_NAME
from ..errors import CtrError
from ..launch.isolation import job_processes
from ..launch.launcher import saved_step
from ..launch.run_dir import RUN_MARKER
from ..launch.spec import load_spec
from ..progress import bar

# A process's kind, from its label (<host>/<role>/<index>).
KINDS = {"chief": "trainer", "worker": "trainer", "ps": "parameter server",
         "dispatcher": "dispatcher", "data_worker": "data worker", "train": "trainer"}
LEFT_BEHIND = (".tmp", INCOMPLETE_NAME)


def _clear_earlier_run(path: Path, job: str) -> None:
    """Removes this bench's earlier run of that name (and its log beside it); anything else
    there is the user's, and refused: the bench deletes only a run a launch of the same job
    made (its run marker naming the job), as `launch` resumes only its own job's run."""
    log = Path(f"{path}.log")
    if not (path.exists() or path.is_symlink()):
        if log.exists() or log.is_symlink():
            raise CtrError(f"{log} exists and is not the log of a run of this bench (no run "
                           f"{path.name}/ beside it): move it or choose another --work-dir")
        return
    if path.is_symlink() or not path.is_dir() or not (path / RUN_MARKER).is_file():
        raise CtrError(f"{path} exists and is not a run of this bench (no {RUN_MARKER}); the "
                       "bench writes its runs there: move it or choose another --work-dir")
    try:
        owner = json.loads((path / RUN_MARKER).read_text()).get("job")
    except (ValueError, AttributeError):
        owner = None
    if owner != job:
        raise CtrError(f"{path} holds the run of job {owner!r}, not {job!r}: move it or choose "
                       "another --work-dir")
    shutil.rmtree(path)


def _launch(spec: str, out: Path, retries: int | None) -> subprocess.Popen:
    """The launch, its output in <out>.log: a pipe nobody reads while the run goes on would
    fill and stall the job."""
    extra = ["--max-retry-attempts", str(retries)] if retries is not None else []
    with open(f"{out}.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "ctrtrain.cli", "launch", spec,
                                 "--output-dir", str(out), "--quiet", *extra], stdout=log,
                                stderr=subprocess.STDOUT,
                                env={**os.environ, "CTRTRAIN_NO_PROGRESS": "1"})


def _victims(run: Path, kinds: set[str]) -> list[tuple[str, str, list[int]]]:
    """(kind, what, PIDs) that can be killed now: each live process of a wanted kind, and
    with "host" each simulated host with a live process (all of its processes)."""
    try:
        live = [(pid, label) for pid, label in job_processes(run) if pid is not None]
    except OSError:     # logs/pids not written yet
        return []
    def kind(label):
        return KINDS.get(label.split("/")[1] if "/" in label else "")
    out = [(kind(label), label, [pid]) for pid, label in live if kind(label) in kinds]
    if "host" in kinds:
        hosts = sorted({label.split("/")[0] for _, label in live})
        out += [("host", f"host {h}", [pid for pid, label in live if label.startswith(f"{h}/")])
                for h in hosts]
    return out


def _choose(victims, injected: list[dict], rng: random.Random):
    """The kind hit least so far (ties at random), then one of its victims at random: faults
    spread over the kinds asked for."""
    hits = {k: sum(f["kind"] == k for f in injected) for k, _, _ in victims}
    fewest = min(hits.values())
    kind = rng.choice(sorted(k for k, n in hits.items() if n == fewest))
    return rng.choice([v for v in victims if v[0] == kind])


def _left_behind(run: Path) -> dict:
    """Processes of the job still alive, and temporary or incomplete files in its run."""
    try:
        alive = [label for pid, label in job_processes(run) if pid is not None]
    except OSError:
        alive = []
    files = [str(p.relative_to(run)) for p in run.rglob("*")
             if p.name.endswith(LEFT_BEHIND) and "logs" not in p.parts]
    return {"processes": alive, "files": files}


def _timings(run: Path, launched: float) -> dict:
    """From the job's metrics log: seconds from the launch to its first training step (the
    first attempt's start-up), and the median seconds between checkpoints."""
    path = run / "checkpoints" / "metrics.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    first = next((e["time"] for e in events if e["event"] == "train"), None)
    saves = [e["time"] for e in events if e["event"] == "checkpoint"]
    gaps = sorted(b - a for a, b in zip(saves, saves[1:]) if b > a)
    return {"start_up_s": round(first - launched, 1) if first else None,
            "checkpoint_interval_s": round(gaps[len(gaps) // 2], 1) if gaps else None}


def _attempts_hit(injected: list[dict], run: Path) -> int:
    """Sets each fault's `attempt` (the one running when it was injected, from job.json's
    start times) and `cost_attempt` (that attempt failed, and this was its first fault);
    returns the number of failed attempts that a fault hit."""
    path = run / "job.json"
    attempts = json.loads(path.read_text()).get("attempts", []) if path.exists() else []
    failed = set()
    for f in injected:
        hit = next((a for a in reversed(attempts) if a.get("started", f["at"] + 1) <= f["at"]),
                   None)
        f["attempt"] = hit["attempt"] if hit else None
        f["cost_attempt"] = bool(hit and hit["cause"] and hit["attempt"] not in failed)
        if f["cost_attempt"]:
            failed.add(hit["attempt"])
    return len(failed)


def _outcome(proc: subprocess.Popen, run: Path, seconds: float, launched: float) -> dict:
    proc.wait()
    err = Path(f"{run}.log").read_text(errors="replace").strip()
    job = json.loads((run / "job.json").read_text()) if (run / "job.json").exists() else {}
    result_path = run / "model" / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    return {"finished": proc.returncode == 0, "exit": proc.returncode,
            "seconds": round(seconds, 1), "attempts": len(job.get("attempts", [])) or None,
            "state": job.get("state"), "step": result.get("step"),
            "test_auc": (result.get("test") or {}).get("auc"),
            "error": err.splitlines()[-1] if proc.returncode and err else None,
            **_timings(run, launched), "left_behind": _left_behind(run)}


def run_chaos_bench(spec: str, work_dir: str, faults: int = 3, every: float = 15.0,
                    kinds=("trainer", "parameter server", "dispatcher", "data worker", "host"),
                    seed: int = 0, retries: int | None = None, json_path: str | None = None,
                    timeout: float = 3600) -> dict:
    job = load_spec(spec).name   # a spec that cannot run is refused before anything is touched
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for name in ("undisturbed", "chaos"):
        _clear_earlier_run(work / name, job)
    print(f"[chaos] undisturbed run of {spec} ...", flush=True)
    t0, launched = time.monotonic(), time.time()
    proc = _launch(spec, work / "undisturbed", retries)
    proc.wait(timeout=timeout)
    undisturbed = _outcome(proc, work / "undisturbed", time.monotonic() - t0, launched)
    if not undisturbed["finished"]:
        raise CtrError(f"the undisturbed run of {spec} failed, so faults cannot be measured "
                       f"against it: {undisturbed['error']}")

    print(f"[chaos] the same with {faults} faults (every {every:g} s or more) ...", flush=True)
    rng = random.Random(seed)
    run = work / "chaos"
    injected: list[dict] = []
    t0 = last = time.monotonic()
    launched, last_step = time.time(), None
    proc = _launch(spec, run, retries)
    with bar(total=faults, desc="faults", unit="fault") as pb:
        while proc.poll() is None and time.monotonic() - t0 < timeout:
            time.sleep(0.2)
            if len(injected) >= faults:
                continue
            step = saved_step(run / "checkpoints")
            if step is None or (last_step is not None and step <= last_step) \
                    or time.monotonic() - last < every:
                continue
            victims = _victims(run, set(kinds))
            if not victims:
                continue
            kind, what, pids = _choose(victims, injected, rng)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            last, last_step = time.monotonic(), step
            injected.append({"at_s": round(last - t0, 1), "at": time.time(), "kind": kind,
                             "killed": what,
                             "pids": len(pids),
                             "checkpoint_step": step})
            print(f"[chaos] fault {len(injected)}: SIGKILL {what} at step {step}", flush=True)
            pb.update(1)
    if proc.poll() is None:
        proc.kill()
    chaos = _outcome(proc, run, time.monotonic() - t0, launched)
    chaos["attempts_lost_to_faults"] = _attempts_hit(injected, run)
    lost = chaos["seconds"] - undisturbed["seconds"]
    report = {"spec": spec, "faults": injected, "undisturbed": undisturbed, "chaos": chaos,
              "seconds_lost_per_fault": round(lost / len(injected), 1) if injected else None,
              "auc_difference": (chaos["test_auc"] - undisturbed["test_auc"])
              if chaos["test_auc"] is not None and undisturbed["test_auc"] is not None else None}
    print(format_report(report), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return report


def format_report(r: dict) -> str:
    u, c = r["undisturbed"], r["chaos"]

    def show(v, fmt="{}"):
        return "-" if v is None else fmt.format(v)
    rows = [("finished", show(u["finished"]), show(c["finished"])),
            ("state", show(u["state"]), show(c["state"])),
            ("steps", show(u["step"]), show(c["step"])),
            ("attempts", show(u["attempts"]), show(c["attempts"])),
            ("seconds", show(u["seconds"]), show(c["seconds"])),
            ("start-up s (launch to first step)", show(u["start_up_s"]), show(c["start_up_s"])),
            ("seconds between checkpoints", show(u["checkpoint_interval_s"]),
             show(c["checkpoint_interval_s"])),
            ("test AUC", show(u["test_auc"], "{:.4f}"), show(c["test_auc"], "{:.4f}")),
            ("processes left", str(len(u["left_behind"]["processes"])),
             str(len(c["left_behind"]["processes"]))),
            ("temporary files left", str(len(u["left_behind"]["files"])),
             str(len(c["left_behind"]["files"])))]
    lines = ["| | undisturbed | with faults |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {d} |" for a, b, d in rows]
    lines.append(f"faults: {len(r['faults'])} ({', '.join(f['killed'] for f in r['faults'])}); "
                 f"attempts lost to them: {show(c.get('attempts_lost_to_faults'))}; "
                 f"seconds lost per fault: {show(r['seconds_lost_per_fault'])}; "
                 f"AUC difference: {show(r['auc_difference'], '{:+.4f}')}")
    if c["error"]:
        lines.append(f"the run with faults ended: {c['error']}")
    return "\n".join(lines)
