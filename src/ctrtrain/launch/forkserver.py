"""A job's own processes forked from one that has already imported TensorFlow.

A new Python spends about 3 CPU-seconds importing ctrtrain and TensorFlow before its first
line of work: a job's trainers, parameter servers and tf.data service workers each paid that,
every attempt, all at once on the same cores. The supervisor now starts one *fork server* per
job (`python -m ctrtrain.launch.forkserver`) that imports them once; each of the job's
processes that runs a ctrtrain module (`python -m ctrtrain...`) is then a fork of it: the child
enters its simulated host's namespaces (network, mount, UTS: what `nsenter` does), takes its
own environment, working directory, process group and output pipe, and runs the module as
`python -m` would (runpy, `__main__`, its arguments in sys.argv). Its end is the module's own
(ctrtrain's commands and recipe end through shutdown.end_process; any other module with a
normal interpreter exit, its atexit handlers run).

What a fork inherits that a new process would not have: the imported modules (nothing of
TensorFlow's runtime: the server runs no op, so its thread pools, eager context and servers are
made in the child, with the child's environment), and the server's Python-level state at import
(`random` reseeds itself in a child). Only a command that runs a `ctrtrain.` module with this
interpreter and the same environment for what is read at import (PYTHON*, TensorFlow's C++
logging and oneDNN switches, Keras's home, ctrtrain's import hooks) is forked; anything else --
a user's script or module, a coverage run -- starts as a new process, as before.
`CTRTRAIN_FORK_SERVER=0` turns forking off.

A framework image job's hosts each start SageMaker's training toolkit (`python -m
sagemaker_training.cli.train`, framework.py), whose TensorFlow container module imports
TensorFlow (about 4.5 CPU-s with Keras) before it runs the user's script as a new process. Those
entries fork from a *plain* server of the image's own Python, run by this file's path (the image
need not have ctrtrain): it imports TensorFlow as the entry would (Keras with it) and nothing of
the toolkit, whose modules read the host's environment at import. The user's script is still
the toolkit's own new process: only the entry, whose own code is the toolkit's, is a fork.

Protocol (a SOCK_SEQPACKET socket pair, one JSON message a datagram): the supervisor sends
{"module", "args", "env", "cwd", "enter"} with the child's output pipe as a passed descriptor
(its stdout and stderr; or two, stdout's and stderr's apart, as a benchmark's runs want them);
the server answers {"pid"} (or {"error"}), and later {"exit": pid, "code"} when it reaps the
child (the code as subprocess gives it: -N for a signal). The server ends when the socket
closes, and with the supervisor (PR_SET_PDEATHSIG); its children end with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

OFF = "CTRTRAIN_FORK_SERVER"
PR_SET_PDEATHSIG = 1
_MAX_MESSAGE = 1 << 20
# What a process reads from its environment while it imports ctrtrain and TensorFlow: a child
# whose value differs from the server's must import them itself (a new process).
_IMPORT_TIME = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE",
                "TF_ENABLE_ONEDNN_OPTS", "TF_USE_LEGACY_KERAS", "LD_PRELOAD",
                "LD_LIBRARY_PATH", "CTRTRAIN_VERBOSE", "CTRTRAIN_TF_KERAS", "KERAS_BACKEND",
                "KERAS_HOME", "HOME")
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000


def _import_env(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith("PYTHON") or k.startswith("COVERAGE") or k in _IMPORT_TIME}


# Modules of other packages forked from a plain server, with what it imports first: the
# toolkit's entry on a framework image's host (see above).
PLAIN = {"sagemaker_training.cli.train": ("tensorflow",)}


def forkable(cmd: list[str], env: dict) -> tuple[str, tuple[str, ...] | None] | None:
    """(the module `cmd` runs as `python -m MODULE ...`, what a plain server imports first, or
    None for ctrtrain's own server), or None where it must start as a new process: a ctrtrain
    module with this interpreter, or one of PLAIN's with any."""
    if env.get(OFF, os.environ.get(OFF)) == "0" or len(cmd) < 3 or cmd[1] != "-m":
        return None
    if any(k.startswith("COVERAGE") for k in env):   # coverage patches new processes only
        return None
    module = cmd[2]
    if module in PLAIN:
        return module, PLAIN[module]
    if not (module == "ctrtrain" or module.startswith("ctrtrain.")):
        return None
    if os.path.realpath(cmd[0]) != os.path.realpath(sys.executable):
        return None
    return module, None


class ForkedProcess:
    """What the supervisor uses of a subprocess.Popen, for a child of the fork server."""

    def __init__(self, server: ForkServer, pid: int, stdout, stderr=None):
        self._server, self.pid, self.stdout, self.stderr = server, pid, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._server.changed:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
                if not self._server.changed.wait(timeout=left):
                    continue
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes | None]:
        """As Popen.communicate: stdout (and stderr) read to their ends, then the exit awaited;
        past `timeout` the child is killed and TimeoutExpired raised."""
        pipes = [f for f in (self.stdout, self.stderr) if f is not None]
        read: list[bytes] = [b""] * len(pipes)

        def drain(i):
            read[i] = pipes[i].read()
        readers = [threading.Thread(target=drain, args=(i,), daemon=True)
                   for i in range(len(pipes))]
        for t in readers:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for t in readers:
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()      # its pipes are left to their readers, which end at EOF
            self.wait()
            raise
        for f in pipes:
            f.close()
        return read[0], (read[1] if self.stderr is not None else None)

    def send_signal(self, sig) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The supervisor's side: starts the server on first use, forks children through it.
    `python` and `preload`: a plain server's (PLAIN); by default ctrtrain's own, in this
    interpreter."""

    def __init__(self, log_path: Path, python: str | None = None,
                 preload: tuple[str, ...] | None = None):
        self.log_path = Path(log_path)
        self.python, self.preload = python or sys.executable, preload
        self.changed = threading.Condition()
        self._codes: dict[int, int] = {}
        self._pids: set[int] = set()       # every child forked
        self._answers: list[dict] = []
        self._lock = threading.Lock()      # one request at a time
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._env: dict | None = None
        self._gone = False

    def can_fork(self, cmd: list[str], env: dict) -> str | None:
        """The module to fork for `cmd`, or None: not forkable by this server, or the server
        (started with another import-time environment, or no longer running) cannot."""
        found = forkable(cmd, env)
        if found is None or found[1] != self.preload or self._gone:
            return None
        if os.path.realpath(cmd[0]) != os.path.realpath(self.python):
            return None
        if self._env is not None and _import_env(env) != self._env:
            return None
        return found[0]

    def spawn(self, module: str, args: list[str], env: dict, cwd: str | None,
              enter: int | None, stderr: bool = False) -> ForkedProcess:
        """The child's stdout and stderr on one pipe (ForkedProcess.stdout), or with
        `stderr`, stderr on its own (ForkedProcess.stderr)."""
        with self._lock:
            if self._sock is None:
                self._start(env)
            pipes = [os.pipe() for _ in range(2 if stderr else 1)]
            try:
                msg = json.dumps({"module": module, "args": args, "env": env,
                                  "cwd": cwd or os.getcwd(), "enter": enter}).encode()
                socket.send_fds(self._sock, [msg], [w for _, w in pipes])
                answer = self._answer()
            except OSError as e:
                answer = {"error": f"it is gone: {e}"}
            finally:
                for _, w in pipes:
                    os.close(w)
            if "pid" not in answer:
                for r, _ in pipes:
                    os.close(r)
                raise OSError(f"the fork server could not start {module}: "
                              f"{answer.get('error', 'it ended')} ({self.log_path})")
            with self.changed:
                self._pids.add(answer["pid"])
            return ForkedProcess(self, answer["pid"], *(os.fdopen(r, "rb") for r, _ in pipes))

    @property
    def server_pid(self) -> int | None:
        """The fork server's PID while it runs (the parent of every process it forked)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def exit_code(self, pid: int) -> int | None:
        with self.changed:
            return self._codes.get(pid)

    def close(self) -> None:
        """Ends the server once every child it forked has been reaped (the supervisor's
        teardown has waited for them)."""
        if self._sock is not None:
            self._gone = True
            with contextlib.suppress(OSError):   # already gone
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._sock = None

    def _start(self, env: dict) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.preload is None:
            cmd, cwd = [self.python, "-m", "ctrtrain.launch.forkserver"], None
        else:   # by path, from / (its sys.path[0] while it imports, as `python -m` there)
            cmd, cwd = [self.python, str(Path(__file__).resolve())], "/"
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*cmd, str(theirs.fileno()), *(self.preload or ())], cwd=cwd,
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                pass_fds=[theirs.fileno()], preexec_fn=_die_with_parent)
        theirs.close()
        self._sock, self._env = ours, _import_env(env)
        threading.Thread(target=self._read, daemon=True, name="ctrtrain-fork-server").start()

    def _answer(self) -> dict:
        with self.changed:
            while not self._answers:
                if self._gone:
                    return {}
                self.changed.wait()
            return self._answers.pop(0)

    def _read(self) -> None:
        sock = self._sock
        while True:
            try:
                data = sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            with self.changed:
                if not data:
                    # The server ended: a child it had not reaped died with it
                    # (PR_SET_PDEATHSIG), as SIGKILLed.
                    self._gone = True
                    for pid in self._pids - self._codes.keys():
                        self._codes[pid] = -signal.SIGKILL
                    self.changed.notify_all()
                    return
                msg = json.loads(data)
                if "exit" in msg:
                    self._codes[msg["exit"]] = msg["code"]
                else:
                    self._answers.append(msg)
                self.changed.notify_all()


class ForkServers:
    """A job's fork servers, each started on first use: ctrtrain's own, and a plain one for
    each framework image's Python its hosts run the toolkit with."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self._servers: dict[tuple, ForkServer] = {}

    def fork(self, cmd: list[str], env: dict, cwd: str | None,
             enter: int | None) -> ForkedProcess | None:
        """`cmd` forked from its server, or None where it must start as a new process
        (OSError: the server could not fork it)."""
        found = forkable(cmd, env)
        if found is None:
            return None
        key = (os.path.realpath(cmd[0]), found[1])
        if key not in self._servers:
            name = "fork-server" + (f"-{len(self._servers)}" if self._servers else "")
            self._servers[key] = ForkServer(self.log_dir / f"{name}.log", cmd[0], found[1])
        server = self._servers[key]
        module = server.can_fork(cmd, env)
        return None if module is None else server.spawn(module, cmd[3:], env, cwd, enter)

    @property
    def server_pids(self) -> list[int]:
        """The servers running, ctrtrain's own first."""
        servers = sorted(self._servers.items(), key=lambda kv: kv[0][1] is not None)
        return [s.server_pid for _, s in servers if s.server_pid is not None]

    def close(self) -> None:
        for server in self._servers.values():
            server.close()


def _die_with_parent():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# ---- the server ----

def _serve(sock: socket.socket):
    """Forks a child per request until the socket closes; returns, in a child, what it runs."""
    import selectors
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is sock:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 4)
                except OSError:
                    data, fds = b"", []
                if not data:
                    return None
                request = json.loads(data)
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError as e:
                    _send(sock, {"error": f"fork: {e}"})
                    continue
                if pid == 0:
                    sel.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    sock.close()
                    return lambda: _child(request, *fds[:2])
                for fd in fds:
                    os.close(fd)
                _send(sock, {"pid": pid})
            else:
                os.read(wake_r, 4096)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, msg: dict) -> None:
    try:
        sock.send(json.dumps(msg).encode())
    except OSError:
        pass   # the supervisor is gone: its children end with this server


def _enter(holder: int) -> None:
    """Into a simulated host's namespaces, as `nsenter --net --mount --uts` (setns on its
    /proc/PID/ns files; entering the mount namespace also moves the root and working
    directory to its root)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for name, kind in (("net", _CLONE_NEWNET), ("mnt", _CLONE_NEWNS), ("uts", _CLONE_NEWUTS)):
        fd = os.open(f"/proc/{holder}/ns/{name}", os.O_RDONLY)
        try:
            if libc.setns(fd, kind) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {name} of process {holder}: {os.strerror(err)}")
        finally:
            os.close(fd)


def _child(request: dict, out: int, err: int | None = None) -> None:
    """In the forked child: becomes the process `python -m MODULE ARGS` would have been."""
    import importlib
    import runpy
    os.setsid()                       # its own process group, killed as one
    _die_with_parent()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out if err is None else err, 2)
    os.close(null)
    os.close(out)
    if err is not None:
        os.close(err)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if request["enter"]:
        _enter(request["enter"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # `python -m` puts the working directory first on the path.
    sys.path[0] = os.getcwd()
    importlib.invalidate_caches()
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    if len(sys.argv) > 2:
        # A plain server (PLAIN), run by path: the modules named, imported as the module it
        # forks would import them; sys.path[0] as `python -m` gives it (this file's directory
        # would otherwise shadow packages with ctrtrain's module names).
        import importlib
        sys.path[0] = os.getcwd()
        for name in sys.argv[2:]:
            importlib.import_module(name)
        # Out of the collector's reach: a child's collections would otherwise visit (and so
        # copy) every page of them (an entry 1.1-1.2 -> 0.35-0.4 CPU-s, 3 hosts measured).
        import gc
        gc.freeze()
    else:
        # The package's import (as this module's parent) installed its hooks: TensorFlow's
        # banner filtered, Keras on first use, its objects frozen after the import (tf_start).
        from ..tf_start import own_process
        own_process()
        import tensorflow  # noqa: F401
    child = _serve(sock)
    if child is None:
        # The job is over: TensorFlow here was imported, never run, and the interpreter's
        # teardown of it (about 0.5 CPU-s) would write nothing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    child()


if __name__ == "__main__":
    main()
