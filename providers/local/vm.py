"""PID 1 of a local VM: `python -m spotrun.providers.local.vm <vm_dir>`, run by LocalProvider as
`unshare --pid --fork --kill-child --mount --propagation private ...`.

Being PID 1 of its own PID namespace is what makes the VM a unit: when this process dies, the
kernel kills every process of the VM, including ones that started new sessions (torchrun
workers, `setsid` daemons). The init:

1. mounts a private view: tmpfs on /run (sshd needs /run/sshd; the host's /run stays untouched)
   and on /dev/shm (the trainer's host snapshots: a VM that dies takes them with it, as on a cloud),
   the VM dir at /run/spotrun/vm, a fresh /proc, the VM's `home/` over the login user's home and
   the VM's `profile` over /etc/profile (so logins keep the PATH sshd sets); paths under those
   that the VM still needs (the Python install, the resolver config) are bound back;
2. serves the emulated metadata endpoint (providers/metadata.py) on a free loopback port;
3. runs `sshd -D -e` on a free loopback port (retrying another port if the bind races);
4. writes state.json atomically, reaps orphans, and exits when sshd dies or the preemption
   deadline in notice.json passes.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from spotrun.providers.local.metadata import MetadataServer, read_json, read_notice, write_json_atomic

INSIDE = Path("/run/spotrun/vm")  # where the VM dir is mounted inside the VM
SHARED = Path("/run/spotrun/shared")  # the cluster's shared directory (stands in for a bucket)
MODULE = "spotrun.providers.local.vm"
PORT_ATTEMPTS = 5
SUPERVISE_TICK_S = 0.2  # how often the init reaps and checks the preemption deadline

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC = 0x2, 0x4, 0x8, 0x1000, 0x4000


class VmFiles:
    """The layout of one VM directory, shared by the provider (host side) and the init."""

    def __init__(self, root: Path) -> None:
        self.root = root

    labels = property(lambda self: self.root / "labels.json")  # cluster, key, offer (launch writes first)
    config = property(lambda self: self.root / "vm.json")  # what the init needs to start
    state = property(lambda self: self.root / "state.json")  # init: pid, ports, phase
    launch = property(lambda self: self.root / "launch.json")  # host: pid of unshare
    failed = property(lambda self: self.root / "failed.json")  # host: why launch gave up
    terminated = property(lambda self: self.root / "terminated.json")
    home = property(lambda self: self.root / "home")
    profile = property(lambda self: self.root / "profile")
    host_key = property(lambda self: self.root / "ssh_host_ed25519_key")
    authorized_keys = property(lambda self: self.root / "authorized_keys")
    sshd_config = property(lambda self: self.root / "sshd_config")
    logs = property(lambda self: self.root / "logs")
    log = property(lambda self: self.root / "logs" / "vm.log")

    def run_files(self) -> list[Path]:
        """What terminate removes: the disk and secrets of a VM, not its records and logs."""
        key = self.host_key
        return [self.home, key, key.with_name(key.name + ".pub"), self.authorized_keys, self.sshd_config, self.profile]


class VmStartError(Exception):
    """The VM could not start; the message is what the host shows as the reason."""


def log_tail(path: Path, lines: int = 8, start: int = 0) -> str:
    """The last `lines` non-empty lines of a log (from byte `start`), for error messages."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


# -- mounts -----------------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _mount(source: str, target: str | Path, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    if (
        _libc.mount(
            source.encode(),
            str(target).encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise VmStartError(f"mount {source} on {target} failed: {os.strerror(err)}")


def _covered_paths(home: Path) -> list[Path]:
    """Paths under the home or /run (both get covered) that the VM still needs from the host.

    The Python that runs spotrun may live in the home (pyenv puts it in ~/.pyenv), and on
    systemd hosts /etc/resolv.conf points into /run.
    """
    wanted = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *sys.path,
    }
    resolv = os.path.realpath("/etc/resolv.conf")
    if resolv.startswith("/run/"):
        wanted.add(os.path.dirname(resolv))
    covered = [
        Path(p)
        for p in wanted
        if p
        and os.path.isdir(p)
        and (Path(p).is_relative_to(home) or Path(p).is_relative_to("/run"))
        and Path(p) not in (home, Path("/run"))
    ]
    # Keep only the outermost: binding a parent brings its children along.
    return sorted(p for p in covered if not any(p != q and p.is_relative_to(q) for q in covered))


def setup_mounts(vm_dir: Path, home: Path, shared: Path | None = None) -> None:
    """Build the VM's private view of the filesystem (see the module docstring)."""
    held = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in _covered_paths(home)]
    # Opened before the home is covered: the shared dir may live under it ($SPOTRUN_HOME).
    shared_fd = os.open(shared, os.O_PATH | os.O_DIRECTORY) if shared else None
    _mount("tmpfs", "/run", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755")
    if Path("/dev/shm").is_dir():  # the VM's own host memory, gone with the VM (as a cloud VM's is)
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    for d in (Path("/run/sshd"), INSIDE):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
    _mount(str(vm_dir), INSIDE, flags=_MS_BIND)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _mount(str(INSIDE / "home"), home, flags=_MS_BIND)
    _mount(str(INSIDE / "profile"), "/etc/profile", flags=_MS_BIND)
    for path, fd in held:
        path.mkdir(parents=True, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, flags=_MS_BIND | _MS_REC)
        os.close(fd)
    if shared_fd is not None:
        SHARED.mkdir(parents=True, exist_ok=True)
        _mount(f"/proc/self/fd/{shared_fd}", SHARED, flags=_MS_BIND)
        os.close(shared_fd)


# -- sshd -------------------------------------------------------------------------------------
def render_sshd_config(config: dict[str, Any], port: int, metadata_url: str) -> str:
    """sshd_config of the VM; paths are as the VM sees them (under /run/spotrun/vm)."""
    env = {
        "SPOTRUN_NODE_ID": config["id"],
        "SPOTRUN_CLUSTER": config["cluster"],
        "SPOTRUN_METADATA_URL": metadata_url,
        "SPOTRUN_NOTICE_PROTOCOL": config["notice_protocol"],
        "PATH": config["path"],
    }
    lines = [
        "# Written by the VM init (spotrun.providers.local.vm); paths are as seen inside the VM.",
        f"ListenAddress {config.get('listen_address', '127.0.0.1')}",
        f"Port {port}",
        f"HostKey {INSIDE / 'ssh_host_ed25519_key'}",
        f"AuthorizedKeysFile {INSIDE / 'authorized_keys'}",
        "StrictModes no",  # keys live in temp dirs with loose modes
        "UsePAM no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "MaxStartups 100:30:200",  # the default 10:30:100 drops parallel bootstrap logins
        "PidFile none",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "Subsystem sftp internal-sftp",
        # Only the first SetEnv line counts, so every variable goes on this one.
        "SetEnv " + " ".join(f'"{k}={v}"' for k, v in env.items()),
        *config.get("sshd_extra", []),
    ]
    return "\n".join(lines) + "\n"


def _reserve_port(port: int = 0) -> socket.socket:
    """A bound, not listening, SO_REUSEADDR socket on a free loopback port (or on `port`).

    Holding it until sshd listens keeps other port-0 binds (other VMs starting in parallel) off
    the port, while sshd (which also sets SO_REUSEADDR) can still bind it.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def _sshd_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            return sock.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _wait_sshd(proc: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
    """True once sshd sends its banner; False if it exits or the timeout passes (then killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if _sshd_answers(port):
            return True
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    return False


def start_sshd(files: VmFiles, config: dict[str, Any], metadata_url: str) -> tuple[subprocess.Popen[bytes], int]:
    """Start sshd on a free port, retrying when the port was taken meanwhile. Raises VmStartError."""
    for _ in range(PORT_ATTEMPTS):
        reserved = _reserve_port(int(config.get("ssh_port", 0)))
        port = reserved.getsockname()[1]
        files.sshd_config.write_text(render_sshd_config(config, port, metadata_url))
        offset = files.log.stat().st_size
        proc = subprocess.Popen([config["sshd"], "-D", "-e", "-f", str(files.sshd_config)], stdin=subprocess.DEVNULL)
        try:
            ready = _wait_sshd(proc, port, float(config.get("ready_timeout", 15.0)))
        finally:
            reserved.close()
        if ready:
            return proc, port
        tail = log_tail(files.log, start=offset) or f"sshd exited with status {proc.returncode}"
        if "Address already in use" not in tail:
            raise VmStartError(tail)
    raise VmStartError(f"sshd found no free port in {PORT_ATTEMPTS} attempts")


# -- supervision ------------------------------------------------------------------------------
def _reap(watched: int) -> bool:
    """Reap every exited child (orphans of the VM land here); True if `watched` was one."""
    seen = False
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return seen
        if pid == 0:
            return seen
        seen = seen or pid == watched


def supervise(files: VmFiles, sshd: subprocess.Popen[bytes]) -> str:
    """Block until sshd dies or the preemption deadline passes; returns why."""
    while True:
        if _reap(sshd.pid):
            return "sshd exited"
        notice, now = read_notice(files.root), time.time()
        if notice is not None and now >= notice.deadline:
            return f"preempted at deadline {notice.deadline:.3f}"
        wait = SUPERVISE_TICK_S if notice is None else min(SUPERVISE_TICK_S, notice.deadline - now)
        time.sleep(max(0.0, wait))


def _write_state(files: VmFiles, **state: Any) -> None:
    current = read_json(files.state) or {}
    write_json_atomic(files.state, {**current, **state})


def run(vm_dir: Path) -> int:
    """The whole life of the VM; returns the exit status (the VM dies with this process)."""
    host_pid = int(os.readlink("/proc/self"))  # the host's /proc is still mounted here
    config = read_json(vm_dir / "vm.json")
    if config is None:
        print(f"spotrun-vm: {vm_dir}/vm.json is missing or invalid", flush=True)
        return 2
    shared = Path(config["shared_dir"]) if config.get("shared_dir") else None
    setup_mounts(vm_dir, Path(pwd.getpwnam(config["login_user"]).pw_dir), shared)
    files = VmFiles(INSIDE)
    _write_state(files, pid=host_pid, phase="starting", started_at=time.time())
    if config.get("boot_s"):  # a cloud VM's launch-to-SSH time, when the recipe emulates one
        _write_state(files, phase="booting")
        time.sleep(float(config["boot_s"]))
    identity = {
        "id": config["id"],
        "name": config["id"],
        "zone": config["zone"],
        "instance_type": config["instance_type"],
    }
    # A VM with its own network (tests/ec2_vms.py) serves metadata where clouds do, 169.254.169.254:80.
    metadata = MetadataServer(
        INSIDE, identity, host=config.get("metadata_host", "127.0.0.1"), port=int(config.get("metadata_port", 0))
    )
    metadata.start()
    sshd, port = start_sshd(files, config, metadata.url)
    _write_state(files, phase="running", ssh_port=port, metadata_port=metadata.port, sshd_pid_in_vm=sshd.pid)
    print(f"spotrun-vm: {config['id']} running ssh_port={port} metadata={metadata.url}", flush=True)
    print(f"spotrun-vm: {config['id']} stopping: {supervise(files, sshd)}", flush=True)
    return 0


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit(f"usage: python -m {MODULE} VM_DIR")
    # As PID 1 we get no default SIGTERM action; exiting on it takes the whole VM down.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    vm_dir = Path(argv[1])
    try:
        status = run(vm_dir)
    except Exception as exc:  # report every start failure in state.json, then die with the VM
        reason = str(exc) or type(exc).__name__
        if not isinstance(exc, VmStartError):
            traceback.print_exc()  # a bug, not a bad host: keep the whole story in the log
        print(f"spotrun-vm: failed: {reason.splitlines()[-1]}", flush=True)
        state_dir = INSIDE if INSIDE.joinpath("vm.json").exists() else vm_dir
        _write_state(VmFiles(state_dir), phase="failed", reason=reason)
        status = 1
    sys.stdout.flush()
    os._exit(status)  # no interpreter teardown: daemon threads die with the namespace anyway


if __name__ == "__main__":
    main(sys.argv)
