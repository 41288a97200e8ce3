"""The local provider: every "VM" is a real sshd on loopback, in its own PID and mount namespace.

Layout: `<root>/vms/<id>/` holds labels.json (cluster, idempotency key, offer: written before
the VM starts), vm.json (what its init needs), state.json (written by the init: host pid,
ports), notice.json (an armed preemption), terminated.json / failed.json, `home/` (mounted over
the login user's home inside the VM), its host key, authorized_keys, and logs/vm.log.

Each VM is `unshare --pid --fork --kill-child --mount --propagation private python -m
spotrun.providers.local.vm <dir>`, detached in its own session; see vm.py for what the
init does. Killing the init (SIGKILL) kills every process of the VM. Needs root (namespaces)
and OpenSSH's sshd.
"""

from __future__ import annotations

import fcntl
import functools
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any

from spotrun.providers import DEFAULT_NOTICE_PROTOCOL, notice_protocols
from spotrun.providers.base import Instance, InstanceState, LaunchSpec, NoticeProtocol, Offer
from spotrun.providers.local.catalog import DEFAULT_PRICES
from spotrun.providers.local.metadata import arm_notice, iso_utc, read_json, read_notice, write_json_atomic
from spotrun.providers.local.vm import MODULE, SHARED, VmFiles, VmStartError, log_tail

from spotrun import log
from spotrun.errors import CapacityError, NotFoundError, ProviderError
from spotrun.paths import spotrun_home

_log = log.get("providers.local")

REGION, ZONE = "local", "local-a"
KILL_WAIT_S = 5.0


class LocalProvider:
    """VMs on this machine; see the module docstring. Cheap to build; nothing starts until launch."""

    name = "local"
    supports_preempt = True
    supports_purge = True
    supports_capacity = True  # set_capacity(): a trace replay limits how many VMs a cluster may get

    def __init__(
        self,
        root: Path | None = None,
        prices: Mapping[str, Mapping[str, Any]] | None = None,
        notice_protocol: NoticeProtocol = DEFAULT_NOTICE_PROTOCOL,
        *,
        sshd: str | None = None,
        sshd_extra_config: Sequence[str] = (),
        launch_timeout: float = 20.0,
    ) -> None:
        """`prices`: {instance_type: {spot, on_demand, cpus, gpus[, gpu_name, boot_s]}}; `boot_s`
        delays each VM's sshd like a cloud VM's boot (default 0). `sshd`: the sshd
        binary (absolute). `sshd_extra_config`: lines appended to every VM's sshd_config.
        `launch_timeout`: seconds a VM may take to accept SSH before it counts as failed."""
        if notice_protocol not in notice_protocols():
            raise ProviderError(f"notice_protocol {notice_protocol!r} is not one of {', '.join(notice_protocols())}")
        self.root = Path(root) if root is not None else spotrun_home() / "local"
        self.prices = {k: dict(v) for k, v in (prices or DEFAULT_PRICES).items()}
        self.notice_protocol: NoticeProtocol = notice_protocol
        self.sshd = sshd or shutil.which("sshd", path=f"/usr/sbin:/usr/local/sbin:{os.environ.get('PATH', '')}")
        self.sshd_extra_config = list(sshd_extra_config)
        self.launch_timeout = launch_timeout
        self.login_user = pwd.getpwuid(os.geteuid()).pw_name

    # -- protocol -----------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        """A spot and an on-demand offer per instance type of the price table. Non-blocking."""
        return [
            Offer(
                provider=self.name,
                region=REGION,
                zone=ZONE,
                instance_type=itype,
                cpus=int(p["cpus"]),
                gpus=int(p.get("gpus", 0)),
                gpu_name=p.get("gpu_name"),
                spot_price=float(p["spot"]),
                on_demand_price=float(p["on_demand"]),
                spot=spot,
            )
            for itype, p in sorted(self.prices.items())
            for spot in (True, False)
        ]

    def launch(self, spec: LaunchSpec) -> list[str]:
        """Start the VMs of `spec` in parallel; blocks until each accepts SSH and its metadata
        endpoint answers (or `launch_timeout` passes). Idempotent per (cluster, idempotency key):
        existing VMs are returned and only the missing ones started. A VM that fails to start
        stays in state failed with the log tail as reason; then ProviderError names it and its log.
        """
        self._check_host()
        with self._launch_lock():
            existing = self._ids_with_key(spec.cluster, spec.idempotency_key)
            wanted = spec.count - len(existing)
            room = self._room(spec.cluster)
            if wanted > 0 and room == 0:
                raise CapacityError(
                    f"local cloud: no capacity for cluster {spec.cluster!r} (trace replay)",
                    hint="capacity returns when the trace says so",
                )
            new = [self._create(spec) for _ in range(min(wanted, room))]
        if new:
            with ThreadPoolExecutor(max_workers=min(len(new), 16)) as pool:
                failures = [f for f in pool.map(lambda vm_id: self._boot(vm_id, spec), new) if f]
            if failures:
                raise _launch_error(failures, len(new))
        return existing + new

    def instances(self, cluster: str) -> list[Instance]:
        """Every VM of `cluster` in any state, observed now (processes, ports, files). Non-blocking."""
        found = []
        ports = _listening_ports()  # one read of /proc/net/tcp for all VMs: it is long on a busy host
        for files in self._all_vms():
            labels = read_json(files.labels)
            if labels is not None and labels.get("cluster") == cluster:
                found.append(self._instance(files, labels, ports))
        return sorted(found, key=lambda i: (i.launched_at, i.id))

    def terminate(self, ids: Sequence[str]) -> None:
        """Kill each VM (its whole namespace), wait until gone, mark it terminated and delete its
        home, keys and config; records and logs stay until `purge`. Idempotent; unknown ids are
        ignored. Raises ProviderError if a VM survives SIGKILL for KILL_WAIT_S."""
        targets = [f for f in (self._files(i) for i in ids) if f.labels.exists() and not f.terminated.exists()]
        for files in targets:
            self._signal_vm(files)
        for files in targets:
            self._wait_gone(files)
            write_json_atomic(files.terminated, {"at": time.time()})
            _remove(files.run_files())
            _log.info("terminated local VM", extra=log.kv(id=files.root.name))

    # -- optional operations ------------------------------------------------------------------
    def preempt(self, instance_id: str, notice_seconds: float) -> float:
        """Give a VM a spot preemption notice; its init kills the whole VM at the deadline, so the
        caller need not stay. `notice_seconds <= 0` kills it now. Returns the deadline (epoch s).
        Raises NotFoundError for an unknown id, ProviderError for a VM that is not running."""
        files = self._files(instance_id)
        labels = read_json(files.labels)
        if labels is None:
            raise NotFoundError(f"local VM {instance_id!r} does not exist", hint=f"looked in {self.root / 'vms'}")
        state, _ = self._observe(files, labels, _listening_ports())
        if state not in (InstanceState.RUNNING, InstanceState.PENDING):
            raise ProviderError(f"local VM {instance_id} is {state.value}; only a running VM can be preempted")
        notice = arm_notice(files.root, notice_seconds)
        if notice_seconds <= 0:
            self._signal_vm(files)
            self._wait_gone(files)
        _log.info("preemption armed", extra=log.kv(id=instance_id, deadline=iso_utc(notice.deadline)))
        return notice.deadline

    def purge(self, cluster: str) -> None:
        """Terminate what still runs of `cluster` and delete all its VM dirs, logs and shared
        directory (checkpoints) included. Idempotent."""
        for files in self._all_vms():
            labels = read_json(files.labels)
            if labels is not None and labels.get("cluster") == cluster:
                self.terminate([files.root.name])
                shutil.rmtree(files.root, ignore_errors=True)
        shutil.rmtree(self.root / "shared" / cluster, ignore_errors=True)
        self.set_capacity(cluster, None)

    def set_capacity(self, cluster: str, nodes: int | None) -> None:
        """Limit the VMs `cluster` may have running (None: unlimited), as a spot market would."""
        path = self.root / "capacity" / f"{cluster}.json"
        if nodes is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {"nodes": int(nodes)})

    def _room(self, cluster: str) -> int:
        """How many more VMs `cluster` may start now under its capacity (a large number if unlimited)."""
        limit = (read_json(self.root / "capacity" / f"{cluster}.json") or {}).get("nodes")
        if limit is None:
            return 1 << 30
        live = sum(1 for i in self.instances(cluster) if not i.state.is_gone and not i.extra.get("notice_deadline"))
        return max(0, int(limit) - live)

    def shared_dir(self, cluster: str) -> Path:
        """The host directory every VM of `cluster` sees at SHARED (it stands in for a bucket);
        it outlives the VMs, so checkpoints survive `down` until `purge`."""
        path = self.root / "shared" / cluster
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- launch internals ---------------------------------------------------------------------
    def _check_host(self) -> None:
        if os.geteuid() != 0:
            raise ProviderError(
                "the local provider needs root (it creates PID and mount namespaces)",
                hint="run spotrun as root, e.g. in a container or VM",
            )
        if not self.sshd or not os.path.isabs(self.sshd) or not shutil.which("unshare"):
            raise ProviderError(
                f"the local provider needs OpenSSH's sshd (absolute path) and unshare; sshd={self.sshd!r}",
                hint="install openssh-server and util-linux",
            )

    @contextmanager
    def _launch_lock(self) -> Iterator[None]:
        """Serializes the labelling step of launches, across processes, so a key is used once."""
        (self.root / "vms").mkdir(parents=True, exist_ok=True)
        with open(self.root / ".launch.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _ids_with_key(self, cluster: str, key: str) -> list[str]:
        matches = []
        for files in self._all_vms():
            labels = read_json(files.labels) or {}
            if labels.get("cluster") == cluster and labels.get("idempotency_key") == key:
                matches.append((labels.get("created_at", 0.0), files.root.name))
        return [vm_id for _, vm_id in sorted(matches)]

    def _create(self, spec: LaunchSpec) -> str:
        """Make the VM dir and label it (cluster, key, offer) before anything runs."""
        while True:
            vm_id = f"{spec.cluster}-{secrets.token_hex(3)}"
            root = self.root / "vms" / vm_id
            try:
                root.mkdir(parents=True)
                break
            except FileExistsError:
                continue
        files = VmFiles(root)
        write_json_atomic(
            files.labels,
            {
                "id": vm_id,
                "cluster": spec.cluster,
                "idempotency_key": spec.idempotency_key,
                "offer": asdict(spec.offer),
                "labels": dict(spec.labels),
                "created_at": time.time(),
            },
        )
        return vm_id

    def _boot(self, vm_id: str, spec: LaunchSpec) -> tuple[str, str, Path] | None:
        """Prepare, start and wait for one VM; a failure is returned as (id, reason, log)."""
        files, proc = self._files(vm_id), None
        try:
            self._prepare(files, vm_id, spec)
            proc = self._spawn(files)
            self._wait_ready(files, vm_id, proc)
        except (VmStartError, OSError, subprocess.CalledProcessError) as exc:
            reason = str(exc).strip() or type(exc).__name__
            self._signal_vm(files)
            self._wait_gone(files)
            if proc is not None:
                proc.wait()
            write_json_atomic(files.failed, {"at": time.time(), "reason": reason})
            _log.warning("local VM failed to start", extra=log.kv(id=vm_id, log=files.log))
            return vm_id, reason, files.log
        threading.Thread(target=proc.wait, name=f"reap-{vm_id}", daemon=True).start()
        return None

    def _prepare(self, files: VmFiles, vm_id: str, spec: LaunchSpec) -> None:
        files.logs.mkdir(exist_ok=True)
        files.home.mkdir(mode=0o700, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", vm_id, "-f", str(files.host_key)],
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        files.authorized_keys.write_text(spec.ssh_public_key.strip() + "\n")
        files.authorized_keys.chmod(0o600)
        path = vm_path()
        files.profile.write_text(PROFILE.format(path=path))
        host_key = " ".join(files.host_key.with_name(files.host_key.name + ".pub").read_text().split()[:2])
        write_json_atomic(
            files.config,
            {
                "id": vm_id,
                "cluster": spec.cluster,
                "notice_protocol": self.notice_protocol,
                "zone": spec.offer.zone,
                "instance_type": spec.offer.instance_type,
                "login_user": self.login_user,
                "sshd": self.sshd,
                "sshd_extra": sshd_version_options(self.sshd) + self.sshd_extra_config,
                "path": path,
                "ready_timeout": self.launch_timeout,
                "host_public_key": host_key,
                "boot_s": self._boot_s(spec.offer.instance_type),
                "shared_dir": str(self.shared_dir(spec.cluster)),
            },
        )

    def _boot_s(self, instance_type: str) -> float:
        """Emulated launch-to-SSH time of this type (price table key `boot_s`, default 0)."""
        return float(self.prices.get(instance_type, {}).get("boot_s", 0.0))

    def _spawn(self, files: VmFiles) -> subprocess.Popen[bytes]:
        cmd = init_command(files.root)
        with open(files.log, "ab") as out:
            # Own session and no terminal: the VM outlives the spotrun process that launched it.
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd="/"
            )
        write_json_atomic(files.launch, {"pid": proc.pid, "at": time.time()})
        return proc

    def _wait_ready(self, files: VmFiles, vm_id: str, proc: subprocess.Popen[bytes]) -> None:
        """Until sshd sends its banner and the metadata endpoint knows the VM. Raises VmStartError."""
        config = read_json(files.config) or {}
        deadline = time.monotonic() + self.launch_timeout + float(config.get("boot_s") or 0.0)
        while time.monotonic() < deadline:
            state = read_json(files.state) or {}
            if state.get("phase") == "failed":
                raise VmStartError(state.get("reason") or log_tail(files.log) or "the VM init failed")
            if state.get("phase") == "running" and _answers(vm_id, state):
                return
            if proc.poll() is not None:
                raise VmStartError(log_tail(files.log) or f"the VM init exited with status {proc.returncode}")
            time.sleep(0.02)
        raise VmStartError(f"not ready within {self.launch_timeout:g}s: {log_tail(files.log, 3)}")

    # -- observation and killing --------------------------------------------------------------
    def _files(self, vm_id: str) -> VmFiles:
        if not vm_id or "/" in vm_id or vm_id.startswith("."):
            raise NotFoundError(f"{vm_id!r} is not a local VM id")
        return VmFiles(self.root / "vms" / vm_id)

    def _all_vms(self) -> list[VmFiles]:
        vms = self.root / "vms"
        return [VmFiles(p) for p in sorted(vms.iterdir()) if p.is_dir()] if vms.is_dir() else []

    def _pids(self, files: VmFiles) -> list[int]:
        """Live processes of this VM as the host sees them: the init, else the unshare parent."""
        init = (read_json(files.state) or {}).get("pid")
        launcher = (read_json(files.launch) or {}).get("pid")
        pids = [init] if isinstance(init, int) and _is_ours(init, files.root, MODULE) else []
        if isinstance(launcher, int) and _is_ours(launcher, files.root, "unshare"):
            pids.append(launcher)
        return pids

    def _signal_vm(self, files: VmFiles) -> None:
        """SIGKILL the init: the kernel then kills every process of its namespace, and unshare,
        its parent, reaps it and exits. unshare is killed only when there is no init (yet):
        killing both at once would leave the init a zombie of whoever adopts it."""
        for pid in self._pids(files)[:1]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _wait_gone(self, files: VmFiles) -> None:
        deadline = time.monotonic() + KILL_WAIT_S
        while self._pids(files):
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"local VM {files.root.name} survived SIGKILL for {KILL_WAIT_S:g}s",
                    hint=f"check processes {self._pids(files)}",
                )
            time.sleep(0.01)

    def _observe(
        self, files: VmFiles, labels: Mapping[str, Any], ports: frozenset[int]
    ) -> tuple[InstanceState, str | None]:
        """The VM's state; `ports` are the loopback ports something listens on (_listening_ports)."""
        if files.terminated.exists():
            return InstanceState.TERMINATED, None
        if (failed := read_json(files.failed)) is not None:
            return InstanceState.FAILED, failed.get("reason")
        state = read_json(files.state) or {}
        if self._pids(files):
            running = state.get("phase") == "running" and int(state.get("ssh_port", 0)) in ports
            return (InstanceState.RUNNING if running else InstanceState.PENDING), None
        if (notice := read_notice(files.root)) is not None:
            return InstanceState.PREEMPTED, (
                f"spot preemption: notice at {iso_utc(notice.notice_at)}, deadline {iso_utc(notice.deadline)}"
            )
        if not files.launch.exists() and time.time() - float(labels.get("created_at", 0)) < self.launch_timeout:
            return InstanceState.PENDING, None  # labelled, its launcher has not started it yet
        return InstanceState.FAILED, state.get("reason") or f"the VM's processes are gone (log: {files.log})"

    def _instance(self, files: VmFiles, labels: Mapping[str, Any], ports: frozenset[int]) -> Instance:
        config, state = read_json(files.config) or {}, read_json(files.state) or {}
        offer, (vm_state, reason) = labels.get("offer", {}), self._observe(files, labels, ports)
        notice = read_notice(files.root)
        spot = bool(offer.get("spot", True))
        return Instance(
            id=files.root.name,
            cluster=labels["cluster"],
            provider=self.name,
            zone=offer.get("zone", ZONE),
            instance_type=offer.get("instance_type", ""),
            state=vm_state,
            reason=reason,
            host="127.0.0.1",
            ssh_port=int(state.get("ssh_port", 0)),
            ssh_user=config.get("login_user", self.login_user),
            host_public_key=config.get("host_public_key", ""),
            metadata_url=f"http://127.0.0.1:{state['metadata_port']}" if "metadata_port" in state else "",
            price_per_hour=float(offer.get("spot_price" if spot else "on_demand_price", 0.0)),
            on_demand_per_hour=float(offer.get("on_demand_price", 0.0)),
            launched_at=float(state.get("started_at", labels.get("created_at", 0.0))),
            labels={
                **labels.get("labels", {}),
                "cluster": labels["cluster"],
                "idempotency_key": labels["idempotency_key"],
            },
            extra={
                "vm_dir": str(files.root),
                "log": str(files.log),
                "init_pid": state.get("pid"),
                "shared_dir": str(SHARED) if config.get("shared_dir") else None,
                "notice_protocol": config.get("notice_protocol", self.notice_protocol),
                "notice_deadline": notice.deadline if notice else None,
            },
        )


PROFILE = """\
# /etc/profile of a spotrun local VM, bind-mounted by its init: login shells keep the PATH that
# sshd sets (spotrun's environment first) instead of the host's.
export PATH="{path}"
if [ "${{PS1-}}" ] && [ "${{BASH-}}" ] && [ "$BASH" != /bin/sh ] && [ -f /etc/bash.bashrc ]; then
  . /etc/bash.bashrc
fi
"""


def _launch_error(failures: Sequence[tuple[str, str, Path]], launched: int) -> ProviderError:
    """One message for the VMs of a launch that failed: each with its log tail and log path."""
    lines = [f"local VM {vm_id} failed to start: {reason.replace(chr(10), ' | ')}" for vm_id, reason, _ in failures]
    logs = ", ".join(str(log_path) for _, _, log_path in failures)
    prefix = f"{len(failures)} of {launched} VMs failed; " if launched > 1 else ""
    return ProviderError(prefix + "; ".join(lines), hint=f"log: {logs}")


def init_command(vm_dir: Path) -> list[str]:
    """The command that runs a VM: its init as PID 1 of new PID and mount namespaces."""
    return [
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--propagation",
        "private",
        sys.executable,
        "-u",
        "-m",
        MODULE,
        str(vm_dir),
    ]


def vm_path() -> str:
    """PATH inside a VM: the running environment's bin dir first, so `spotrun` resolves there."""
    return f"{os.path.dirname(sys.executable)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@functools.lru_cache(maxsize=8)
def sshd_version_options(sshd: str) -> list[str]:
    """Options some sshd versions need: 9.8+ would penalize our banner probes from 127.0.0.1."""
    try:
        out = subprocess.run([sshd, "-V"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return []  # not a working sshd: starting it will fail and say why
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    version = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    return ["PerSourcePenalties no"] if version >= (9, 8) else []


def _is_ours(pid: int, vm_dir: Path, marker: str) -> bool:
    """pid is alive (not a zombie) and its command line names this VM dir and `marker`; this
    guards against pid reuse after the VM died."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return str(vm_dir) in args and any(marker == a or a.endswith(f"/{marker}") for a in args)


def _listening_ports() -> frozenset[int]:
    """Ports something listens on at 127.0.0.1 (read from /proc, so sshd sees no connection)."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return frozenset()
    rows = (line.split() for line in lines)
    return frozenset(int(f[1][9:], 16) for f in rows if f[3] == "0A" and f[1].startswith("0100007F:"))


def _answers(vm_id: str, state: Mapping[str, Any]) -> bool:
    """sshd sends its banner and the metadata endpoint names this VM."""
    try:
        with socket.create_connection(("127.0.0.1", int(state["ssh_port"])), timeout=1.0) as sock:
            if not sock.recv(8).startswith(b"SSH-"):
                return False
        req = urllib.request.Request(
            f"http://127.0.0.1:{state['metadata_port']}/computeMetadata/v1/instance/id",
            headers={"Metadata-Flavor": "Google"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=1.0) as resp:
            return resp.read().decode() == vm_id
    except (OSError, KeyError, ValueError):
        return False


def _remove(paths: Sequence[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
