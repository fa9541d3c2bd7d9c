"""Loopback-only local jobs. TensorFlow's gRPC servers and the tf.data service bind the wildcard
address whatever address they are given, so on its own a local job would be reachable from the
network. `ctrtrain launch` therefore re-runs itself in a new network namespace that holds only
a loopback interface (`unshare --net --map-root-user`: a user namespace, no privilege needed):
every process of the job can reach the others on 127.0.0.1 and nothing outside can reach them.
Where the kernel or a container forbids user namespaces, the job runs as before, with a warning.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys

INSIDE = "CTRTRAIN_NETNS"
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, req)[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def available() -> bool:
    unshare = shutil.which("unshare")
    if not unshare:
        return False
    r = subprocess.run([unshare, "--net", "--map-root-user", "true"], capture_output=True)
    return r.returncode == 0


def isolate(argv: list[str]) -> str:
    """Re-executes this command inside a loopback-only network namespace (same PID: unshare
    execs it), or returns why not. Inside, brings the loopback interface up and returns "inside"."""
    if os.environ.get(INSIDE) == "1":
        _loopback_up()
        return "inside"
    if not available():
        return "unavailable"
    os.environ[INSIDE] = "1"
    os.execvp("unshare", ["unshare", "--net", "--map-root-user", "--",
                          sys.executable, "-m", "ctrtrain.cli", *argv])
    return "unreachable"


def interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())
