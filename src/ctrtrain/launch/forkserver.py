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

A parent that runs many jobs in a row (the test suite, `bench matrix`) may keep a *pool*
(forkpool.py): a server per interpreter that has imported TensorFlow once and listens on a
socket in the folder CTRTRAIN_FORK_POOL names. A job whose server would import what a pool's
did, in the same import-time environment, connects to it instead of starting its own; the pool
forks a server for that connection, which serves the job as its own would have and ends when
the connection closes (the job done, or its supervisor gone). Otherwise, as without a pool.

Protocol (a SOCK_SEQPACKET socket pair, one JSON message a datagram): the supervisor sends
{"module", "args", "env", "cwd", "enter"} with the child's output pipe as a passed descriptor
(its stdout and stderr; or two, stdout's and stderr's apart, as a benchmark's runs want them);
the server answers {"pid"} (or {"error"}), and later {"exit": pid, "code"} when it reaps the
child (the code as subprocess gives it: -N for a signal). The server ends when the socket
closes, and with the supervisor (PR_SET_PDEATHSIG); its children end with it. A server forked
by a pool first says {"server": its pid, "env": its import-time environment}, and ends with
the pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

OFF = "CTRTRAIN_FORK_SERVER"
POOL = "CTRTRAIN_FORK_POOL"
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
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


def interpreter(python: str) -> str:
    """What names an interpreter: a venv's bin/python links to its base Python, so the real
    path alone takes every venv of one Python for the same (they import different packages:
    .venv's TensorFlow 2.21, .venv-hvd's 2.15)."""
    path = os.path.abspath(python)
    return os.path.join(os.path.realpath(os.path.dirname(path)),
                        os.path.basename(os.path.realpath(path)))


def pool_socket(folder: str, python: str, preload: tuple[str, ...] | None, env: dict) -> Path:
    """Where a pool (forkpool.py) of `python`'s servers, importing `preload` (None:
    ctrtrain's own) in the environment `env`, listens in `folder`."""
    import hashlib
    key = json.dumps([interpreter(python), preload, _import_env(env)], sort_keys=True)
    return Path(folder) / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock"


# Modules of other packages forked from a plain server, with what it imports first: the
# toolkit's entry on a framework image's host (see above).
PLAIN = {"sagemaker_training.cli.train": ("tensorflow",)}


def forking_off(env: dict) -> bool:
    """Whether nothing is forked for a process of environment `env`: CTRTRAIN_FORK_SERVER=0,
    or a coverage run (coverage patches new processes only)."""
    return env.get(OFF, os.environ.get(OFF)) == "0" or any(k.startswith("COVERAGE") for k in env)


def forkable(cmd: list[str], env: dict) -> tuple[str, tuple[str, ...] | None] | None:
    """(the module `cmd` runs as `python -m MODULE ...`, what a plain server imports first, or
    None for ctrtrain's own server), or None where it must start as a new process: a ctrtrain
    module with this interpreter, or one of PLAIN's with any."""
    if forking_off(env) or len(cmd) < 3 or cmd[1] != "-m":
        return None
    module = cmd[2]
    if module in PLAIN:
        return module, PLAIN[module]
    if not (module == "ctrtrain" or module.startswith("ctrtrain.")):
        return None
    if interpreter(cmd[0]) != interpreter(sys.executable):
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
        self._pooled: int | None = None    # the server's PID where a pool forked it
        self._ended = threading.Event()    # the server closed its end (it ended)
        self._env: dict | None = None
        self._gone = False

    def can_fork(self, cmd: list[str], env: dict) -> str | None:
        """The module to fork for `cmd`, or None: not forkable by this server, or the server
        (started with another import-time environment, or no longer running) cannot."""
        found = forkable(cmd, env)
        if found is None or found[1] != self.preload or self._gone:
            return None
        if interpreter(cmd[0]) != interpreter(self.python):
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
        if self._pooled is not None:
            return None if self._ended.is_set() else self._pooled
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def exit_code(self, pid: int) -> int | None:
        with self.changed:
            return self._codes.get(pid)

    def close(self) -> None:
        """Ends the server once every child it forked has been reaped (the supervisor's
        teardown has waited for them)."""
        if self._sock is None:
            return
        self._gone = True
        if self._pooled is not None:
            # Not this process's child: its end is its end of the socket closing.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)
            if not self._ended.wait(timeout=10):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pooled, signal.SIGKILL)
                self._ended.wait(timeout=10)
            self._sock.close()
        else:
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
        if not self._from_pool(env):
            self._start_own(env)
        threading.Thread(target=self._read, daemon=True, name="ctrtrain-fork-server").start()

    def _from_pool(self, env: dict) -> bool:
        """Connects to a server forked by the pool of this interpreter and preload, if there
        is one (CTRTRAIN_FORK_POOL) and it imported in the environment `env` would."""
        folder = os.environ.get(POOL)
        if not folder:
            return False
        path = pool_socket(folder, self.python, self.preload, env)
        if not path.exists():
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.settimeout(30)
            sock.connect(str(path))
            hello = json.loads(sock.recv(_MAX_MESSAGE) or b"{}")
            sock.settimeout(None)
        except (OSError, ValueError):
            sock.close()
            return False
        if "server" not in hello or hello.get("env") != _import_env(env):
            sock.close()     # the server it forked ends as the socket closes
            return False
        self._sock, self._env, self._pooled = sock, hello["env"], hello["server"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"[fork server] pid {self._pooled}, forked by the pool at {path}\n")
        return True

    def _start_own(self, env: dict) -> None:
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
                    self._ended.set()
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
        key = (interpreter(cmd[0]), found[1])
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


def _prctl(option: int, value) -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)


def _die_with_parent():
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _name_by_role(env: dict) -> None:
    """A job's forked process named by its role in ps and top ("worker/1", "ps/0"), where
    every one would show the server's `python`: which role spends the CPU is seen without
    reading each one's TF_CONFIG. (The kernel keeps 15 bytes; the command line is unchanged.)"""
    role = env.get("CTRTRAIN_ROLE")
    if role:
        index = env.get("CTRTRAIN_TASK_INDEX")
        name = (role if index is None else f"{role}/{index}").encode()[:15]
        _prctl(PR_SET_NAME, ctypes.c_char_p(name))


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
    _name_by_role(request["env"])
    # `python -m` puts the working directory first on the path.
    sys.path[0] = os.getcwd()
    importlib.invalidate_caches()
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def _pool(path: str) -> socket.socket:
    """A pool's loop: listens at `path` and forks for each connection; returns, in the server
    made for it (_server_for), its connection. The pool is killed by its owner or with it;
    what it forked ends with it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)        # ready when the name is there: imports done
    # What it forks is reaped here, so that their CPU time is the pool's children's (its
    # owner's, in turn): ignored, the kernel would reap them and their times would be lost.
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        conn, _ = listener.accept()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _die_with_parent()
            return _server_for(conn)
        conn.close()


def _reap(*_) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


# Joined in this order: the user namespace first, whose capabilities the others need.
_NAMESPACES = ("user", "mnt", "net", "uts", "ipc", "pid")


def _server_for(conn: socket.socket) -> socket.socket:
    """In the pool's fork for a connection: joins the namespaces of the supervisor at the
    other end (a launch's own: isolation.py; its PID namespace for what is forked next), then
    forks the job's server there, which returns its connection (its hello sent); this process
    waits for it and ends with it. A job's processes are thus in its namespaces, as those of
    a server it started would be, and end with it."""
    peer = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               struct.calcsize("3i")))[0]
    try:
        _take_on(peer)
        _join(peer)
    except OSError as e:
        _send(conn, {"error": f"becoming the job's server: {e}"})
        os._exit(1)
    server = os.fork()
    if server == 0:
        _die_with_parent()
        _send(conn, {"server": os.getpid(), "env": _import_env(os.environ)})
        return conn
    conn.close()
    os.waitpid(server, 0)
    os._exit(0)


def _take_on(pid: int) -> None:
    """What a process started by process `pid` would inherit from it beyond its namespaces:
    the CPUs it may run on, its nice value, resource limits and umask (a launch run under
    `taskset`, `nice` or `ulimit` runs its job so). Its control groups are not moved into:
    where they are not the pool's (a launch under `systemd-run`, say), OSError, and the job
    starts its own server."""
    import resource
    with open(f"/proc/{pid}/cgroup") as theirs, open("/proc/self/cgroup") as mine:
        if theirs.read() != mine.read():
            raise OSError(f"process {pid} is in other control groups than the pool")
    os.sched_setaffinity(0, os.sched_getaffinity(pid))
    with contextlib.suppress(PermissionError):     # a lower nice value needs privilege
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, pid))
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            which = getattr(resource, name)
            with contextlib.suppress(ValueError, PermissionError):   # a higher hard limit
                resource.setrlimit(which, resource.prlimit(pid, which))
    with open(f"/proc/{pid}/status") as f:
        umask = next((line.split()[1] for line in f if line.startswith("Umask:")), None)
    if umask is not None:
        os.umask(int(umask, 8))


def _join(pid: int) -> None:
    """Into process `pid`'s namespaces where they are not this process's (setns)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fds = []
    try:
        for name in _NAMESPACES:
            theirs = f"/proc/{pid}/ns/{name}"
            if os.readlink(theirs) != os.readlink(f"/proc/self/ns/{name}"):
                fds.append((name, os.open(theirs, os.O_RDONLY)))
        for name, fd in fds:
            if libc.setns(fd, 0) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {name} of process {pid}: {os.strerror(err)}")
    finally:
        for _, fd in fds:
            os.close(fd)


def main() -> None:
    """`forkserver FD [MODULE...]`: a job's server on the socket FD; `forkserver --pool PATH
    [MODULE...]`: a pool listening at PATH (forkpool.py). MODULEs: a plain server's imports."""
    pool = sys.argv[2] if sys.argv[1] == "--pool" else None
    preload = sys.argv[3:] if pool else sys.argv[2:]
    if preload:
        # A plain server (PLAIN), run by path: the modules named, imported as the module it
        # forks would import them; sys.path[0] as `python -m` gives it (this file's directory
        # would otherwise shadow packages with ctrtrain's module names).
        import importlib
        sys.path[0] = os.getcwd()
        for name in preload:
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
    sock = _pool(pool) if pool else socket.socket(fileno=int(sys.argv[1]))
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
