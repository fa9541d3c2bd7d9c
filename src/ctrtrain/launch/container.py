"""Simulated hosts as containers without Docker. The launcher already runs as the first
process of the job's own user, PID, mount and network namespaces (isolation.py); there it
makes a bridge, and for every simulated host a *holder* process in new mount, UTS and network
namespaces, which

- mounts the host's tree (<run>/hosts/<host>) at /opt/ml, over a private copy of /opt: the
  machine's real /opt (and /opt/ml, if it has one) is never written;
- mounts a private /tmp (<run>/tmp/<host>), in which the few paths the job itself needs and
  that happen to live under the machine's /tmp (the framework image's Python, ctrtrain's
  source, the run directory) are bound back at the same place;
- lays a writable layer (overlayfs) over the framework image, so a `pip install` of the
  user's requirements.txt changes this host's copy only, as in a container;
- sets the hostname `algo-N`, binds an /etc/hosts naming every host, and brings up `eth0`
  with the host's address on the job's bridge, which exists only inside the job's network
  namespace (no route out).

Every process of the host then enters the holder's namespaces with `nsenter`. The holder
waits on its stdin and ends when the launcher does; the job's PID namespace ends everything
else. Mount calls are made through libc (no helper binaries), with directories of the
covered /opt and /tmp reached through file descriptors opened before they were covered.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ..errors import CtrError

BRIDGE = "ctr0"
SUBNET = "10.77.0"
PREFIX_LEN = 24
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1


class ContainerError(CtrError):
    pass


def bridge_address() -> str:
    return f"{SUBNET}.1"


def host_address(index: int) -> str:
    """algo-1 is .2, algo-2 .3, ...: .1 is the bridge (the launcher's side)."""
    return f"{SUBNET}.{index + 2}"


def hosts_file(hosts: list[str]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{host_address(i)}\t{h}" for i, h in enumerate(hosts)]
    return "\n".join(lines) + "\n"


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise ContainerError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def make_bridge() -> None:
    """The job's switch, in the job's own network namespace: made by the first attempt, kept
    by a retried one (the namespace lives as long as the launcher)."""
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        return
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{bridge_address()}/{PREFIX_LEN}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def _die_with_parent():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class HostContainer:
    """One simulated host: its holder process and the command prefix that enters it."""

    def __init__(self, name: str, index: int, opt_ml: Path, scratch: Path, hosts: list[str],
                 keep: list[str], images: list[str], binds: dict[str, str] | None = None):
        """`keep`: paths under the machine's /tmp the host must still see; `images`: Python
        prefixes that get a writable layer; `binds`: target path (inside) -> directory."""
        self.name, self.index = name, index
        self.config = {"hostname": name, "address": host_address(index), "opt_ml": str(opt_ml),
                       "scratch": str(scratch), "hosts_file": hosts_file(hosts),
                       "keep": sorted(set(keep)), "images": sorted(set(images)),
                       "binds": dict(binds or {})}
        self.scratch = scratch
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        (self.scratch / "tmp").mkdir(parents=True, exist_ok=True)
        (self.scratch / "layers").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["unshare", "--net", "--mount", "--uts", "--propagation", "private", "--",
             sys.executable, "-m", "ctrtrain.launch.container"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent)
        veth = f"veth{self.index}"
        # The holder says when it is in its own namespaces: a link made before would land in
        # the job's.
        if self.proc.stdout.readline().strip() != "started":
            self.stop()
            raise ContainerError(f"simulated host {self.name}: its holder did not start")
        try:
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
                str(self.proc.pid))
            _ip("link", "set", veth, "master", BRIDGE)
            _ip("link", "set", veth, "up")
        except ContainerError:
            self.stop()
            raise
        self.proc.stdin.write(json.dumps(self.config) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer != "ready":
            self.stop()
            raise ContainerError(f"simulated host {self.name} could not be set up: "
                                 f"{answer or 'its holder exited'}")

    def enter(self, cmd: list[str], cwd: str = "/") -> list[str]:
        """`cmd` run inside this host: its files, hostname and network."""
        return ["nsenter", "-t", str(self.proc.pid), "--net", "--mount", "--uts",
                f"--wdns={cwd}", "--", *cmd]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def entered(cmd: list[str]) -> tuple[int, str, list[str]] | None:
    """(holder's PID, working directory, command) of a command HostContainer.enter made."""
    if len(cmd) < 8 or cmd[0] != "nsenter" or cmd[3:6] != ["--net", "--mount", "--uts"] \
            or not cmd[6].startswith("--wdns=") or cmd[7] != "--":
        return None
    return int(cmd[2]), cmd[6][len("--wdns="):], cmd[8:]


# ---- inside the holder (new mount, UTS and network namespaces) ----

_libc = None


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None):
    global _libc
    _libc = _libc or ctypes.CDLL("libc.so.6", use_errno=True)
    def enc(s):
        return s.encode() if s is not None else None
    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise ContainerError(f"mount {source} on {target}: {os.strerror(err)}")


def _placeholder(like: str, path: str) -> None:
    if os.path.isdir(like):
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()


def _cover(directory: str, source: str | None, keep: list[str]) -> None:
    """Mounts `source` (a directory, or a fresh tmpfs when None) over `directory` and binds
    back, at the same paths, the entries of the old content listed in `keep` (paths inside
    `directory`). The old content is reached through a descriptor opened before it was
    covered."""
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        if source is None:
            _mount("tmpfs", directory, "tmpfs", 0, "mode=755")
        else:
            _mount(source, directory, None, MS_BIND | MS_REC)
        for path in keep:
            rel = os.path.relpath(path, directory)
            old = f"/proc/self/fd/{fd}/{rel}"
            if not os.path.exists(old):
                continue
            _placeholder(old, path)
            _mount(old, path, None, MS_BIND | MS_REC)
    finally:
        os.close(fd)


def _under(path: str, directory: str) -> bool:
    return os.path.commonpath([os.path.abspath(path), directory]) == directory


def _setup(cfg: dict) -> None:
    scratch = cfg["scratch"]
    # /opt/ml: the host's tree, on a private /opt that keeps the machine's other entries.
    if os.path.isdir("/opt/ml"):
        _mount(cfg["opt_ml"], "/opt/ml", None, MS_BIND | MS_REC)
    elif os.path.isdir("/opt"):
        _cover("/opt", None, [f"/opt/{e}" for e in os.listdir("/opt")])
        os.mkdir("/opt/ml")
        _mount(cfg["opt_ml"], "/opt/ml", None, MS_BIND | MS_REC)
    else:
        raise ContainerError("this machine has no /opt to hold a simulated /opt/ml")
    for target, source in cfg["binds"].items():
        _mount(source, target, None, MS_BIND | MS_REC)
    # A private /tmp; what the job needs from the machine's /tmp stays where it was.
    _cover("/tmp", os.path.join(scratch, "tmp"),
           [k for k in cfg["keep"] if _under(k, "/tmp") and k != "/tmp"])
    # The framework image (a Python prefix) gets a writable layer of this host's own.
    for i, image in enumerate(cfg["images"]):
        upper = os.path.join(scratch, "layers", f"{i}-upper")
        work = os.path.join(scratch, "layers", f"{i}-work")
        os.makedirs(upper, exist_ok=True)
        os.makedirs(work, exist_ok=True)
        layer = f"lowerdir={image},upperdir={upper},workdir={work}"
        # userxattr: in a user namespace overlayfs keeps its own marks (a file deleted from
        # the image, an opaque directory) in user.* attributes; without it, pip replacing a
        # package the image holds (requirements.txt pinning protobuf) fails with EIO on the
        # old package's __pycache__. Kernels before 5.11 lack the option: mounted as before.
        try:
            _mount("overlay", image, "overlay", 0, layer + ",userxattr")
        except ContainerError:
            _mount("overlay", image, "overlay", 0, layer)
    hosts = os.path.join(scratch, "hosts")
    with open(hosts, "w") as f:
        f.write(cfg["hosts_file"])
    _mount(hosts, "/etc/hosts", None, MS_BIND)
    with open(os.path.join(scratch, "hostname"), "w") as f:
        f.write(cfg["hostname"] + "\n")
    if os.path.exists("/etc/hostname"):
        _mount(os.path.join(scratch, "hostname"), "/etc/hostname", None, MS_BIND)
    socket.sethostname(cfg["hostname"])
    _ip("link", "set", "lo", "up")
    _ip("addr", "add", f"{cfg['address']}/{PREFIX_LEN}", "dev", "eth0")
    _ip("link", "set", "eth0", "up")


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the launcher decides when hosts end
    print("started", flush=True)
    try:
        _setup(json.loads(sys.stdin.readline()))
    except Exception as e:  # reported to the launcher, which fails the job with it
        print(f"{type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print("ready", flush=True)
    sys.stdin.read()   # until the launcher closes it, or dies


if __name__ == "__main__":
    main()
