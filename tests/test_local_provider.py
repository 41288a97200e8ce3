"""The local provider with real processes: sshd VMs in PID+mount namespaces, real SSH logins
(host keys pinned), real metadata endpoints, real kills. Nothing is mocked."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
from polling import wait_until
from spotrun.providers import Instance, InstanceState, LaunchSpec, get_provider, supports
from spotrun.providers.local.provider import LocalProvider

from spotrun.errors import NotFoundError, ProviderError
from spotrun.node.notices import NoticeWatcher

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="local VMs need root for namespaces")


# -- fixtures and helpers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[paramiko.PKey, str]:
    path = tmp_path_factory.mktemp("key") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path)), path.with_suffix(".pub").read_text()


@pytest.fixture(scope="module")
def vm_roots() -> Iterator[list[Path]]:
    """Every provider root used here; after the module no process may still refer to one."""
    roots: list[Path] = []
    yield roots
    assert not [p for root in roots for p in _processes_mentioning(str(root))]


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _sleepers(marker: str) -> list[int]:
    """Pids of the `sleep <marker>` processes (not the shells that started them)."""
    found = []
    for pid in _processes_mentioning(marker):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0"):
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.fixture()
def local_vms(tmp_path: Path, vm_roots: list[Path]) -> Iterator[Callable[..., LocalProvider]]:
    """Build LocalProviders on a temp root; teardown terminates and purges every VM and checks
    that no sshd, unshare or init process of them is left."""
    made: list[LocalProvider] = []

    def make(**config: object) -> LocalProvider:
        provider = LocalProvider(root=tmp_path / f"local{len(made)}", **config)
        made.append(provider)
        vm_roots.append(provider.root)
        return provider

    yield make
    for provider in made:
        vms = provider.root / "vms"
        dirs = list(vms.iterdir()) if vms.is_dir() else []
        for cluster in {json.loads((d / "labels.json").read_text())["cluster"] for d in dirs}:
            provider.purge(cluster)
        assert not _processes_mentioning(str(provider.root))
        assert not vms.is_dir() or not any(vms.iterdir())


def _spec(provider: LocalProvider, key: str, count: int = 1, idem: str | None = None, cluster: str = "t") -> LaunchSpec:
    return LaunchSpec(
        cluster=cluster,
        offer=provider.offers()[0],
        count=count,
        ssh_public_key=key,
        idempotency_key=idem or secrets.token_hex(4),
    )


def _ssh(inst: Instance, pkey: paramiko.PKey, host_key: str | None = None) -> paramiko.SSHClient:
    """A client that accepts only the pinned host key (RejectPolicy; never AutoAddPolicy)."""
    client = paramiko.SSHClient()
    keytype, b64 = (host_key or inst.host_public_key).split()
    client.get_host_keys().add(
        f"[{inst.host}]:{inst.ssh_port}", keytype, paramiko.PKey.from_type_string(keytype, base64.b64decode(b64))
    )
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        inst.host,
        port=inst.ssh_port,
        username=inst.ssh_user,
        pkey=pkey,
        allow_agent=False,
        look_for_keys=False,
        timeout=10,
        banner_timeout=10,
        auth_timeout=10,
    )
    return client


def _run(client: paramiko.SSHClient, command: str) -> str:
    _, stdout, stderr = client.exec_command(command, timeout=20)
    out, status = stdout.read().decode(), stdout.channel.recv_exit_status()
    assert status == 0, f"{command!r} exited {status}: {stderr.read().decode()}"
    return out


def _alive(pid: int) -> bool:
    """Running, not a zombie (this sandbox's PID 1 may never reap what it adopts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _listening(port: int) -> bool:
    needle = f"0100007F:{port:04X}"
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return any(r[1] == needle and r[3] == "0A" for r in rows)


def _by_id(provider: LocalProvider, cluster: str = "t") -> dict[str, Instance]:
    return {i.id: i for i in provider.instances(cluster)}


# -- tests ------------------------------------------------------------------------------------
def test_registry_offers_and_capabilities(tmp_path: Path) -> None:
    provider = get_provider(
        "local", root=tmp_path, prices={"x-1": {"spot": 0.1, "on_demand": 0.4, "cpus": 1, "gpus": 0}}
    )
    assert isinstance(provider, LocalProvider) and supports(provider, "preempt") and not supports(provider, "resize")
    spot, on_demand = provider.offers()
    assert (spot.instance_type, spot.price, on_demand.price) == ("x-1", 0.1, 0.4)
    with pytest.raises(ProviderError, match=r"known providers: .*\blocal\b"):
        get_provider("ibm")


def test_three_vms_in_parallel_with_pinned_ssh_own_home_and_env(local_vms, cluster_key) -> None:
    pkey, pub = cluster_key
    provider = local_vms()
    host_view = (Path("/run/sshd").exists(), Path("/etc/profile").read_text(), sorted(os.listdir(Path.home())))
    started = time.monotonic()
    ids = provider.launch(_spec(provider, pub, count=3))
    elapsed = time.monotonic() - started
    vms = _by_id(provider)
    assert sorted(vms) == sorted(ids) and len(set(ids)) == 3
    assert all(v.state is InstanceState.RUNNING for v in vms.values()), vms
    assert elapsed < 10
    venv_bin = os.path.dirname(sys.executable)

    for vm_id, inst in vms.items():
        client = _ssh(inst, pkey)
        try:
            node, path, pwd, spotrun_bin, login_path = _run(
                client, "echo $SPOTRUN_NODE_ID; echo $PATH; pwd; command -v spotrun; bash -lc 'echo $PATH'"
            ).split()
        finally:
            client.close()
        assert (node, pwd, spotrun_bin) == (vm_id, "/root", f"{venv_bin}/spotrun")
        assert path == login_path == f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    first, second = (vms[i] for i in ids[:2])
    with _ssh(first, pkey) as client:
        _run(client, "echo mine > ~/only-here; echo mine > /dev/shm/spotrun-only-here")
    assert not Path("/dev/shm/spotrun-only-here").exists(), "a VM's host memory (/dev/shm) leaked to the host"
    with _ssh(second, pkey) as client:
        assert _run(client, "ls -A ~; test ! -e ~/only-here && echo absent").split()[-1] == "absent"
        assert _run(client, "test ! -e /dev/shm/spotrun-only-here && echo absent").strip() == "absent"
        env = _run(client, "env")
    assert "SPOTRUN_CLUSTER=t" in env and f"SPOTRUN_METADATA_URL={second.metadata_url}" in env
    assert (Path(first.extra["vm_dir"]) / "home" / "only-here").read_text() == "mine\n"
    # Pinning works: the first VM's host key is refused by the second VM's port.
    with pytest.raises(paramiko.SSHException):
        _ssh(second, pkey, host_key=first.host_public_key)
    # The VMs' mounts stay in their namespaces.
    assert (Path("/run/sshd").exists(), Path("/etc/profile").read_text(), sorted(os.listdir(Path.home()))) == host_view


def test_launch_is_idempotent_per_key(local_vms, cluster_key) -> None:
    provider = local_vms()
    spec = _spec(provider, cluster_key[1], idem="launch-1")
    first = provider.launch(spec)
    assert provider.launch(spec) == first and len(provider.instances("t")) == 1
    grown = provider.launch(_spec(provider, cluster_key[1], count=2, idem="launch-1"))
    assert grown[0] == first[0] and len(grown) == 2 and len(provider.instances("t")) == 2
    assert {i.labels["idempotency_key"] for i in provider.instances("t")} == {"launch-1"}
    assert provider.instances("other") == []


def test_boot_s_delays_ssh_like_a_cloud_vm_boot(local_vms, cluster_key) -> None:
    prices = {"cpu-small": {"spot": 0.1, "on_demand": 0.4, "cpus": 2, "gpus": 0, "boot_s": 1.5}}
    provider = local_vms(prices=prices)
    started = time.monotonic()
    (vm,) = provider.launch(_spec(provider, cluster_key[1]))
    took = time.monotonic() - started
    (inst,) = provider.instances("t")
    assert took >= 1.5 and inst.id == vm and inst.state.value == "running"


def test_terminate_kills_every_process_of_the_vm(local_vms, cluster_key) -> None:
    pkey, pub = cluster_key
    provider = local_vms()
    (vm_id,) = provider.launch(_spec(provider, pub))
    inst = _by_id(provider)[vm_id]
    marker = f"4242.{secrets.randbelow(10**6)}"
    with _ssh(inst, pkey) as client:
        # A double fork into a new session, as torchrun workers or daemons do.
        _run(client, f"setsid -f sh -c 'sleep {marker} </dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1")
    # Wait for the sleep itself: the session's shells also mention the marker while they exit.
    assert wait_until(lambda: len(_sleepers(marker)) == 1, 10)
    (orphan,) = _sleepers(marker)
    init = inst.extra["init_pid"]
    assert (
        os.readlink(f"/proc/{orphan}/ns/pid") == os.readlink(f"/proc/{init}/ns/pid") != os.readlink("/proc/self/ns/pid")
    )
    assert os.getsid(orphan) != os.getsid(init)

    provider.terminate([vm_id])
    assert not _alive(orphan) and not _alive(init)
    after = _by_id(provider)[vm_id]
    assert after.state is InstanceState.TERMINATED
    metadata_port = int(inst.metadata_url.rsplit(":", 1)[1])
    for port in (inst.ssh_port, metadata_port):
        assert not _listening(port)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()
    vm_dir = Path(inst.extra["vm_dir"])
    assert not (vm_dir / "home").exists() and not (vm_dir / "ssh_host_ed25519_key").exists()
    assert (vm_dir / "logs" / "vm.log").exists()
    provider.terminate([vm_id, "t-nonexistent"])  # idempotent
    provider.purge("t")
    assert not vm_dir.exists() and provider.instances("t") == []


def test_preempt_notice_reaches_all_three_protocols_then_the_vm_dies(local_vms, cluster_key) -> None:
    pkey, pub = cluster_key
    provider = local_vms(notice_protocol="gcp")
    (vm_id,) = provider.launch(_spec(provider, pub))
    inst = _by_id(provider)[vm_id]
    assert NoticeWatcher("aws", inst.metadata_url).poll() is None

    gcp_result: list[object] = []
    gcp = threading.Thread(
        target=lambda: gcp_result.append(NoticeWatcher("gcp", inst.metadata_url, long_poll_s=5).wait(threading.Event()))
    )
    gcp.start()
    time.sleep(0.3)  # the GCP watcher is now inside a wait_for_change long poll
    deadline = provider.preempt(vm_id, 2.0)
    aws = NoticeWatcher("aws", inst.metadata_url).poll()
    azure = NoticeWatcher("azure", inst.metadata_url).poll()
    gcp.join(timeout=2)
    assert aws is not None and int(deadline) == aws.deadline
    assert azure is not None and int(deadline) == azure.deadline
    assert gcp_result and gcp_result[0].source == "gcp"
    # The VM's own processes see the notice too, through the environment sshd sets.
    with _ssh(inst, pkey) as client:
        out = _run(
            client,
            "python -c 'from spotrun.node.notices import NoticeWatcher as W; "
            "w = W.from_env(); print(w.protocol, w.poll() is not None)'",
        )
    assert out.split() == ["gcp", "True"]
    assert _by_id(provider)[vm_id].state is InstanceState.RUNNING

    assert wait_until(lambda: _by_id(provider)[vm_id].state is InstanceState.PREEMPTED, 5)
    assert time.time() >= deadline - 0.05
    gone = _by_id(provider)[vm_id]
    assert gone.reason.startswith("spot preemption: notice at ") and "deadline" in gone.reason
    assert not _alive(inst.extra["init_pid"]) and not _listening(inst.ssh_port)


def test_preempt_with_no_notice_kills_at_once(local_vms, cluster_key) -> None:
    provider = local_vms()
    (vm_id,) = provider.launch(_spec(provider, cluster_key[1]))
    provider.preempt(vm_id, 0)
    assert _by_id(provider)[vm_id].state is InstanceState.PREEMPTED
    with pytest.raises(ProviderError, match="preempted"):
        provider.preempt(vm_id, 5)
    with pytest.raises(NotFoundError):
        provider.preempt("t-missing", 5)


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"sshd_extra_config": ["NoSuchOption yes"]}, "Bad configuration option"),
        ({"sshd": "/bin/false"}, "sshd exited with status 1"),
        ({"sshd": "HANGS", "launch_timeout": 2}, "not ready within 2s"),
    ],
    ids=["bad-config", "bad-binary", "hangs"],
)
def test_vm_whose_sshd_cannot_start_fails_cleanly(local_vms, cluster_key, tmp_path, config, expected) -> None:
    if config.get("sshd") == "HANGS":
        hangs = tmp_path / "sshd-that-hangs"
        # Answers the version probe like sshd, then never listens.
        hangs.write_text('#!/bin/sh\n[ "$1" = -V ] && { echo OpenSSH_9.2 >&2; exit 0; }\nexec sleep 600\n')
        hangs.chmod(0o755)
        config = {**config, "sshd": str(hangs)}
    provider = local_vms(**{"launch_timeout": 8, **config})
    started = time.monotonic()
    with pytest.raises(ProviderError) as err:
        provider.launch(_spec(provider, cluster_key[1]))
    assert time.monotonic() - started < provider.launch_timeout + 1
    (inst,) = provider.instances("t")
    assert inst.state is InstanceState.FAILED and expected in inst.reason
    assert inst.id in str(err.value) and inst.extra["log"] in str(err.value) and expected in str(err.value)
    assert not _processes_mentioning(str(provider.root))
