"""A local job in namespaces of its own. `ctrtrain launch` runs itself again, through
`unshare` (a user namespace: no privilege needed), as the first process of

- a new PID namespace: when that process ends -- normally, or killed by any signal -- the
  kernel kills every process left in the namespace, including those a user's entry point
  started and detached (a daemon, a double fork, Horovod's ranks). Nothing outlives a job;
- with `--network loopback` (the default), a new network namespace holding only a loopback
  interface: TensorFlow's gRPC servers and the tf.data service bind the wildcard address
  whatever address they are given, so on its own a local job would be reachable from the
  network. Inside, every process reaches the others on 127.0.0.1 and nothing outside
  reaches them.

The process the user started stays outside as a thin parent: it forwards SIGTERM, SIGHUP and
SIGINT (the job is torn down, SIGTERM reaching the trainers so they checkpoint) and exits when
the launcher inside has exited. If the parent itself is SIGKILLed, `unshare --kill-child`
still delivers SIGTERM to the launcher inside. Whether a process is inside is read from the
namespace itself (PID 1, only a loopback interface), never from an environment variable a
user could set. Where the kernel or a container forbids user namespaces the job runs without
them, with a warning saying what is then not promised.

PIDs in <run>/logs/pids are the namespace's own; `host_pid` maps them to this machine's.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
PR_SET_PDEATHSIG = 1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, req)[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


def _unshare_args(network: str) -> list[str]:
    args = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child=SIGTERM",
            "--mount-proc"]
    return args + (["--net"] if network == "loopback" else [])


def available(network: str = "loopback") -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(_unshare_args(network) + ["true"], capture_output=True)
    return r.returncode == 0


def inside(network: str) -> bool:
    """Whether this process is the first of its own PID namespace (and, for loopback, sees
    no interface but lo): facts of the namespace, not a variable anyone could set."""
    return os.getpid() == 1 and (network == "host" or interfaces() == ["lo"])


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def isolate(argv: list[str], network: str = "loopback") -> str:
    """Inside: brings loopback up, makes SIGTERM/SIGHUP tear the job down, returns "inside".
    Outside: runs this command inside new namespaces, waits for it and exits with its status
    (never returns); returns "unavailable" where namespaces cannot be made."""
    if inside(network):
        if network == "loopback":
            _loopback_up()
        # The first process of a PID namespace ignores signals it has no handler for.
        signal.signal(signal.SIGTERM, _raise_interrupt)
        signal.signal(signal.SIGHUP, _raise_interrupt)
        return "inside"
    if not available(network):
        return "unavailable"
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(_unshare_args(network) + ["--", sys.executable, "-m", "ctrtrain.cli",
                                                      *argv],
                            pass_fds=(write_end,), preexec_fn=_die_with_parent)
    os.close(write_end)
    received: list[int] = []

    def forward(signum, frame):
        # unshare ignores SIGTERM and SIGINT while it waits; ending it makes --kill-child
        # deliver SIGTERM to the launcher inside, which tears the job down.
        received.append(signum)
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, forward)
    code = proc.wait()
    # The job is over when the launcher inside has exited: it alone holds the pipe's other
    # end, and the kernel ends the whole namespace with it.
    while os.read(read_end, 1):
        pass
    sys.stdout.flush()
    os._exit(128 + received[0] if received else code)


def host_pid(pid_in_job: int, namespace: str) -> int | None:
    """This machine's PID of the process that is `pid_in_job` inside the job's PID namespace
    (`namespace` as <run>/logs/pidns holds it, e.g. "pid:[4026532179]"); None once gone."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            with open(f"/proc/{entry}/status") as f:
                nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if len(nspid) > 1 and int(nspid[-1]) == pid_in_job:
            return int(entry)
    return None


def job_processes(run_dir) -> list[tuple[int | None, str]]:
    """(this machine's PID or None once gone, label) of every process a launch started, from
    <run>/logs/pids (and logs/pidns when the job had its own PID namespace)."""
    from pathlib import Path
    logs = Path(run_dir) / "logs"
    ns = (logs / "pidns").read_text().strip() if (logs / "pidns").exists() else None
    out = []
    for line in (logs / "pids").read_text().splitlines():
        pid, label = line.split(maxsplit=1)
        out.append((host_pid(int(pid), ns) if ns else int(pid), label))
    return out
