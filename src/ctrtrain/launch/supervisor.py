"""Starts a job's processes, prefixes and files their logs, and tears the whole group down:
on the first failure (with its log tail), when the time limit passes, when no training
process has made progress for the watchdog's time (progress: a line of output, a touch of
its heartbeat file -- ctrtrain's trainer touches it every step and evaluation batch -- or
bytes a Pipe channel's feeder handed to a reader), when a
process stays stopped (SIGSTOP: it can neither fail nor finish, and its peers wait on it), on
Ctrl-C, and -- for servers that never exit on their own -- when every finishing process has
finished. Some processes may die without failing the job
(`tolerated`: parameter-server workers, whose steps the coordinator reschedules): their deaths
are reported and recorded, and the job fails only when all of them are gone. No process outlives the supervisor: each child is
in its own process group (killed as a group) and dies with its parent (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from .. import heartbeat
from .container import entered
from .forkserver import ForkedProcess, ForkServers

PR_SET_PDEATHSIG = 1
STOPPED_LIMIT_S = 10.0   # a process stopped this long fails the job
MARKER_GRACE_S = 10.0    # how long a process may take to exit after reporting success


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


@dataclasses.dataclass
class Managed:
    label: str
    proc: subprocess.Popen | ForkedProcess
    server: bool
    log_path: Path
    tail: collections.deque
    last_output: float                 # wall-clock time of its last line
    heartbeat: Path | None = None
    stopped_since: float | None = None
    returncode: int | None = None
    tolerated: bool = False
    finished_marker: Path | None = None   # a file whose presence means "done" (see finished)
    pump: threading.Thread | None = None  # copies its output to the log and the tail

    def finished(self) -> bool:
        """Exited 0, or -- for an entry that reports success in a file and may then linger
        (SageMaker's toolkit writes /opt/ml/output/success; a parameter server it forked can
        keep its process from exiting) -- that file has existed for MARKER_GRACE_S."""
        if self.returncode is not None:
            return self.returncode == 0
        try:
            return time.time() - self.finished_marker.stat().st_mtime > MARKER_GRACE_S
        except (AttributeError, OSError):
            return False

    def last_progress(self) -> float:
        """Wall-clock time of its last output or heartbeat."""
        age = heartbeat.age(str(self.heartbeat)) if self.heartbeat else None
        return max(self.last_output, time.time() - age) if age is not None else self.last_output


@dataclasses.dataclass
class JobOutcome:
    ok: bool
    reason: str
    exit_codes: dict[str, int | None]
    failed: str | None = None
    tail: list[str] = dataclasses.field(default_factory=list)
    tolerated: list[dict] = dataclasses.field(default_factory=list)
    stopped: bool = False       # ended from outside (a signal to the launcher), not failed
    # False where another attempt cannot do better: the job's time is up (the time limit
    # bounds the whole job, as SageMaker's MaxRuntime), or it hung (the watchdog).
    retryable: bool = True


class Supervisor:
    def __init__(self, log_dir: Path, console=True, time_limit: float | None = None,
                 watchdog: float | None = None, grace: float = 5.0, tail_lines: int = 30,
                 stopped_limit: float = STOPPED_LIMIT_S, job_time_limit: float | None = None):
        """`time_limit`: seconds this run may take; `job_time_limit`: the limit it is what is
        left of (a retried job's), named when it is reached."""
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.console, self.time_limit, self.watchdog = console, time_limit, watchdog
        self.job_time_limit = job_time_limit or time_limit
        self.stopped_limit = stopped_limit
        self.grace, self.tail_lines = grace, tail_lines
        self.procs: list[Managed] = []
        self.forks = ForkServers(self.log_dir)
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self.pid_file = self.log_dir / "pids"
        self.tolerated: list[dict] = []   # failures the job survived
        # Wall-clock times of progress the processes do not report themselves: a Pipe
        # feeder handing bytes to a reader (see add_progress).
        self._progress_sources: list = []

    def start(self, label: str, cmd: list[str], env: dict, cwd: str | None = None,
              server: bool = False, tolerated: bool = False,
              finished_marker: Path | None = None) -> Managed:
        log_path = self.log_dir / (label.replace("/", "-") + ".log")
        beat = self.heartbeat_path(label)
        env = {**env, heartbeat.ENV: str(beat)}
        proc = self._fork(cmd, env, cwd) or subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        m = Managed(label, proc, server, log_path, collections.deque(maxlen=self.tail_lines),
                    time.time(), heartbeat=beat, tolerated=tolerated,
                    finished_marker=finished_marker)
        self.procs.append(m)
        with open(self.pid_file, "a") as f:
            f.write(f"{proc.pid} {label}\n")
        m.pump = threading.Thread(target=self._pump, args=(m,), daemon=True)
        m.pump.start()
        return m

    def _fork(self, cmd: list[str], env: dict, cwd: str | None) -> ForkedProcess | None:
        """`cmd` forked from one of the job's fork servers (forkserver.py), if it runs a module
        they fork; None: start it as a new process."""
        holder, inner = None, cmd
        inside = entered(cmd)
        if inside is not None:
            holder, cwd, inner = inside
        try:
            return self.forks.fork(inner, env, cwd, holder)
        except OSError as e:
            with self._lock:
                print(f"[launcher] {e}; starting a new process instead", flush=True)
            return None

    def heartbeat_path(self, label: str) -> Path:
        """The heartbeat file of a process (CTRTRAIN_HEARTBEAT): its progress, as the
        watchdog sees it."""
        return self.log_dir / (label.replace("/", "-") + ".heartbeat")

    def add_progress(self, last_progress) -> None:
        """A callable giving the wall-clock time of the job's latest progress seen elsewhere
        (a Pipe feeder's last bytes): the watchdog holds the job alive while it is fresh."""
        self._progress_sources.append(last_progress)

    def report_error(self, message: str) -> None:
        """For helpers (pipe feeders): fails the job with this message."""
        with self._lock:
            self._errors.append(message)

    def pids(self) -> list[int]:
        """Every live process of the job: the children and whatever they started (each child
        leads its own process group)."""
        groups = {m.proc.pid for m in self.procs if m.proc.poll() is None}
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    if int(fields[2]) in groups:  # field 5 of stat: the process group
                        out.append(int(entry))
                except (OSError, IndexError, ValueError):
                    continue
        return out

    def _pump(self, m: Managed):
        with open(m.log_path, "ab") as log:
            for raw in iter(m.proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                m.tail.append(line)
                m.last_output = time.time()
                if self.console:
                    with self._lock:
                        print(f"[{m.label}] {line}", flush=True)

    def wait(self) -> JobOutcome:
        start = time.monotonic()
        try:
            while True:
                for m in self.procs:
                    if m.returncode is None:
                        m.returncode = m.proc.poll()
                if self._errors:
                    return self._fail(self._errors[0], None)
                self._note_tolerated(start)
                tolerable = [m for m in self.procs if m.tolerated]
                if tolerable and all(m.returncode is not None for m in tolerable):
                    return self._fail(f"all {len(tolerable)} tolerated processes "
                                      f"({', '.join(m.label for m in tolerable)}) died", tolerable[-1])
                failed = [m for m in self.procs if m.returncode not in (None, 0)
                          and not m.tolerated]
                if failed:
                    # Several may be seen dead in one poll on a loaded machine: one killed by a
                    # signal is the cause, the others' errors (a peer gone) its consequence.
                    bad = min(failed, key=lambda m: m.returncode > 0)
                    return self._fail(f"{bad.label} exited with status {bad.returncode}", bad)
                workers = [m for m in self.procs if not m.server]
                if workers and all(m.finished() for m in workers):
                    self._teardown()
                    return JobOutcome(True, "all training processes finished", self._codes(),
                                      tolerated=self.tolerated)
                servers_gone = [m for m in self.procs if m.server and m.returncode is not None
                                and not m.tolerated]
                if servers_gone:
                    m = servers_gone[0]
                    return self._fail(f"{m.label} (a server) exited with status {m.returncode} "
                                      "while training was running", m)
                now = time.monotonic()
                if self.time_limit and now - start > self.time_limit:
                    return self._fail(f"time limit of {self.job_time_limit:g} s reached", None,
                                      retryable=False)
                stopped = self._stopped(now)
                if stopped is not None:
                    return self._fail(f"{stopped.label} has been stopped (SIGSTOP or a debugger) "
                                      f"for {self.stopped_limit:g} s: the job cannot progress "
                                      "without it, torn down", stopped)
                if self.watchdog:
                    quiet = [m for m in workers if m.returncode is None and not m.finished()]
                    wall = time.time()
                    fed = any(wall - src() <= self.watchdog for src in self._progress_sources)
                    if quiet and not fed and all(wall - m.last_progress() > self.watchdog
                                                 for m in quiet):
                        states = ", ".join(f"{m.label} [{_state(m.proc.pid)}]" for m in quiet)
                        return self._fail(
                            f"no progress for {self.watchdog:g} s (no output or training "
                            f"heartbeat from {states}): stuck, torn down", quiet[0], stuck=quiet,
                            retryable=False)
                time.sleep(0.1)
        except KeyboardInterrupt:
            self._teardown()
            raise

    def _stopped(self, now: float) -> Managed | None:
        """The first live process stopped for longer than stopped_limit, if any."""
        for m in self.procs:
            if m.returncode is not None:
                continue
            if _state(m.proc.pid) == "stopped":
                m.stopped_since = m.stopped_since or now
                if now - m.stopped_since >= self.stopped_limit:
                    return m
            else:
                m.stopped_since = None
        return None

    def _note_tolerated(self, start: float) -> None:
        for m in self.procs:
            if m.tolerated and m.returncode is not None and \
                    not any(t["label"] == m.label for t in self.tolerated):
                self.tolerated.append({"label": m.label, "returncode": m.returncode,
                                       "after_s": round(time.monotonic() - start, 1)})
                with self._lock:
                    print(f"[launcher] {m.label} exited with status {m.returncode}; tolerated: "
                          "the job goes on without it", flush=True)

    def stopped(self) -> JobOutcome:
        """What a job stopped from outside (wait raised KeyboardInterrupt: SIGTERM, SIGHUP or
        SIGINT to the launcher) came to, once wait has torn it down."""
        return JobOutcome(False, "stopped by a signal to the launcher (SIGTERM, SIGHUP or "
                          "SIGINT); its processes were asked to end (the recipe checkpoints)",
                          self._codes(), tolerated=self.tolerated, stopped=True)

    def _codes(self):
        return {m.label: m.returncode for m in self.procs}

    def _fail(self, reason: str, who: Managed | None, stuck=None,
              retryable: bool = True) -> JobOutcome:
        tails = []
        for m in ([who] if who else []) + [s for s in (stuck or []) if s is not who]:
            # The last lines: an exited process's pump ends at the end of its output (a
            # fixed pause lost that race on a loaded machine: an empty tail); a live one's
            # pump is given a moment. Bounded: a detached child may hold the pipe open.
            if m.pump is not None:
                m.pump.join(timeout=5.0 if m.proc.poll() is not None else 0.2)
            tails += [f"--- last lines of {m.label} ({m.log_path}) ---", *list(m.tail)]
        self._teardown()
        return JobOutcome(False, reason, self._codes(), who.label if who else None, tails,
                          tolerated=self.tolerated, retryable=retryable)

    def _teardown(self):
        live = [m for m in self.procs if m.proc.poll() is None]
        for m in live:
            _signal_group(m.proc, signal.SIGTERM)
            _signal_group(m.proc, signal.SIGCONT)   # a stopped process must run to see SIGTERM
        deadline = time.monotonic() + self.grace
        for m in live:
            try:
                m.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for m in self.procs:
            _signal_group(m.proc, signal.SIGKILL)  # also any grandchildren left in the group
            try:
                m.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if m.returncode is None:
                m.returncode = m.proc.returncode
        self.forks.close()


_STATES = {"R": "running", "S": "waiting", "D": "in I/O", "T": "stopped", "t": "traced",
           "Z": "exited"}


def _state(pid: int) -> str:
    """What a stuck process is doing, from /proc: a stopped rank reads "stopped", ranks
    blocked in a collective waiting for it read "waiting"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            code = f.read().rsplit(")", 1)[1].split()[0]
        return _STATES.get(code, code)
    except (OSError, IndexError):
        return "gone"


def _signal_group(proc: subprocess.Popen, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
