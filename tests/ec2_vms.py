"""EC2 instances that really run: each running moto instance of a spotrun cluster becomes a local
VM with its own network namespace, so `spotrun up` on an AWS recipe can SSH to it.

moto keeps EC2's books (instances, tags, key pairs, security groups, IPs) but runs nothing. This
test helper plays the hypervisor and the VPC:

- one network for the test: a bridge in a network namespace the helper creates, reached from
  the host through a veth with HOST_IP (moto's server listens there, so a head VM's controller
  can call EC2 too);
- per instance: a network namespace holding the instance's private and public IPs (a /32 each,
  with an on-link default route, so every VM and the host reach each other over the bridge),
  169.254.169.254 on its loopback, and spotrun's local VM init (providers/local_vm.py: sshd as
  PID 1's child in new PID and mount namespaces) serving SSH on port 22 and the emulated
  metadata endpoint on 169.254.169.254:80;
- the instance's cloud-init user data (spotrun's #cloud-config) is applied the way cloud-init
  would: its ed25519 host key becomes sshd's only host key, its user's authorized key is the
  only one accepted;
- a moto instance that leaves "running" (terminated by spotrun) loses its VM; `interrupt()` does
  what EC2 does to a spot instance: the metadata endpoint announces the interruption, the VM dies
  at the deadline, and the instance turns terminated with reason Server.SpotInstanceTermination.

Needs root, iproute2 and OpenSSH's sshd; everything it creates is removed by `close()`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from spotrun.providers.local.metadata import arm_notice, read_json, write_json_atomic
from spotrun.providers.local.provider import PROFILE, init_command, sshd_version_options, vm_path
from spotrun.providers.local.vm import VmFiles

HOST_IP = "100.64.0.1"
METADATA_IP = "169.254.169.254"
MOTO_PUBLIC_RANGE = "54.214.0.0/16"  # moto.ec2.utils.random_public_ip
RUNNING_STATES = ("pending", "running")


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@dataclass
class _Vm:
    instance_id: str
    netns: str
    root: Path
    ips: list[str]
    proc: subprocess.Popen[bytes]


class Ec2Vms:
    """See the module docstring. Use as a context manager; `start()` begins realizing instances."""

    def __init__(
        self, backend, root: Path, clusters: set[str], *, login_user: str = "root", poll_s: float = 0.1
    ) -> None:
        """Realizes the instances tagged with one of `clusters` (moto's backend is per process,
        shared with other tests)."""
        self.backend, self.root, self.clusters = backend, root, clusters
        self.login_user, self.poll_s = login_user, poll_s
        self.tag = secrets.token_hex(2)
        self.bridge_ns = f"spc{self.tag}"
        self.host_if = f"sh{self.tag}"
        self.vms: dict[str, _Vm] = {}
        self.gone: set[str] = set()  # instance ids whose VM ran and died
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ec2-vms", daemon=True)
        self._lock = threading.Lock()
        self.errors: list[str] = []

    # -- network --------------------------------------------------------------------------------
    def __enter__(self) -> Ec2Vms:
        _ip("netns", "add", self.bridge_ns)
        _ip("link", "set", "lo", "up", ns=self.bridge_ns)
        _ip("link", "add", "br0", "type", "bridge", ns=self.bridge_ns)
        _ip("link", "set", "br0", "up", ns=self.bridge_ns)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", f"sb{self.tag}")
        _ip("link", "set", f"sb{self.tag}", "netns", self.bridge_ns)
        _ip("link", "set", f"sb{self.tag}", "master", "br0", "up", ns=self.bridge_ns)
        _ip("addr", "add", f"{HOST_IP}/32", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        # Every public IP moto hands out is in this range: route it all to the test network, so
        # a connection to an instance not realized (yet) fails here instead of leaving the machine.
        _ip("route", "replace", MOTO_PUBLIC_RANGE, "dev", self.host_if)
        return self

    def start(self) -> None:
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for vm in list(self.vms.values()):
            self._kill(vm)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.bridge_ns], capture_output=True)

    def _attach(self, ips: list[str]) -> str:
        """A network namespace on the bridge holding `ips`; returns its name."""
        self._count += 1
        ns, a, b = f"spv{self.tag}{self._count}", f"v{self.tag}{self._count}a", f"v{self.tag}{self._count}b"
        _ip("netns", "add", ns)
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        _ip("link", "set", a, "netns", self.bridge_ns)
        _ip("link", "set", a, "master", "br0", "up", ns=self.bridge_ns)
        _ip("link", "set", b, "netns", ns)
        _ip("link", "set", b, "name", "eth0", ns=ns)
        for address in ips:  # the first (private) is the primary: what the VM sends from
            _ip("addr", "add", f"{address}/32", "dev", "eth0", ns=ns)
        _ip("link", "set", "eth0", "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        _ip("addr", "add", f"{METADATA_IP}/32", "dev", "lo", ns=ns)
        _ip("route", "add", "default", "dev", "eth0", ns=ns)
        for address in ips[:1]:  # the public one is covered by MOTO_PUBLIC_RANGE
            _ip("route", "replace", f"{address}/32", "dev", self.host_if)
        return ns

    # -- instances ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # keep going; the test reads `errors` when something hangs
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

    def tick(self) -> None:
        with self._lock:
            for inst in list(self.backend.all_instances()):
                state = inst._state.name
                vm = self.vms.get(inst.id)
                if vm is None and state == "running" and inst.id not in self.gone and self._is_spotrun(inst):
                    self.gone.add(inst.id)  # a failed boot is not retried: the instance stays dead
                    self.vms[inst.id] = self._boot(inst)
                    self.gone.discard(inst.id)
                elif vm is not None and state not in RUNNING_STATES:
                    self._kill(vm)
                elif vm is not None and vm.proc.poll() is not None:  # died at its interruption deadline
                    self._kill(vm)
                    self._terminate_in_moto(inst)

    def _is_spotrun(self, inst) -> bool:
        tags = {t["key"]: t["value"] for t in self.backend.describe_tags(filters={"resource-id": [inst.id]})}
        return tags.get("spotrun-cluster") in self.clusters

    def _boot(self, inst) -> _Vm:
        config = json.loads(base64.b64decode(str(inst.user_data)).decode().split("\n", 1)[1])
        user = next(u for u in config["users"] if isinstance(u, dict))
        root = self.root / inst.id
        files = VmFiles(root)
        files.logs.mkdir(parents=True)
        files.home.mkdir(mode=0o700)
        files.host_key.write_text(config["ssh_keys"]["ed25519_private"])
        files.host_key.chmod(0o600)
        files.host_key.with_name(files.host_key.name + ".pub").write_text(config["ssh_keys"]["ed25519_public"] + "\n")
        files.authorized_keys.write_text("\n".join(user["ssh_authorized_keys"]) + "\n")
        files.profile.write_text(PROFILE.format(path=vm_path()))
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        write_json_atomic(
            files.config,
            {
                "id": inst.id,
                "cluster": "",
                "notice_protocol": "aws",
                "zone": inst._placement.zone,
                "instance_type": inst.instance_type,
                "login_user": self.login_user,
                "sshd": sshd,
                "sshd_extra": sshd_version_options(sshd),
                "path": vm_path(),
                "ready_timeout": 20.0,
                "listen_address": "0.0.0.0",
                "ssh_port": 22,
                "metadata_host": METADATA_IP,
                "metadata_port": 80,
            },
        )
        ips = [ip for ip in (inst.private_ip, inst.public_ip) if ip]
        ns = self._attach(ips)
        with open(files.log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, *init_command(root)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",
            )
        return _Vm(inst.id, ns, root, ips, proc)

    def _kill(self, vm: _Vm) -> None:
        """Power off: SIGKILL the init (its PID namespace dies with it), drop its network."""
        self.vms.pop(vm.instance_id, None)
        self.gone.add(vm.instance_id)
        pid = (read_json(VmFiles(vm.root).state) or {}).get("pid")
        for target in filter(None, (pid, vm.proc.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            vm.proc.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", vm.netns], capture_output=True)
        subprocess.run(["ip", "route", "del", f"{vm.ips[0]}/32", "dev", self.host_if], capture_output=True)

    def _terminate_in_moto(self, inst) -> None:
        from moto.ec2.models.instances import StateReason

        inst._state.name, inst._state.code = "terminated", 48
        inst.state_reason = StateReason(
            "Server.SpotInstanceTermination: Spot instance termination", "Server.SpotInstanceTermination"
        )

    # -- what tests do ----------------------------------------------------------------------------
    def interrupt(self, instance_id: str, notice_s: float) -> None:
        """EC2's spot interruption: the two-minute warning (here `notice_s`), then termination."""
        with self._lock:
            arm_notice(self.vms[instance_id].root, notice_s)

    def ssh_answers(self, instance_id: str) -> bool:
        vm = self.vms.get(instance_id)
        if vm is None:
            return False
        try:
            with socket.create_connection((vm.ips[-1], 22), timeout=1.0) as sock:
                return sock.recv(8).startswith(b"SSH-")
        except OSError:
            return False

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no realized VM is left (after `down`)."""
        deadline = time.monotonic() + timeout
        while self.vms and time.monotonic() < deadline:
            time.sleep(self.poll_s)
